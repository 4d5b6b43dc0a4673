#include "engine/runner/cuda/cuda_buffer.h"

#include <algorithm>

#include "common/strings.h"

namespace lmserve::engine::cuda {

absl::Status CudaError(cudaError_t error, std::string_view what) {
  return absl::InternalError(StrCat("CUDA runner: ", what, ": ", cudaGetErrorString(error)));
}

absl::StatusOr<CudaBuffer> CudaBuffer::Allocate(MemorySpace space, int64_t bytes,
                                                std::string_view what) {
  CudaBuffer buffer;
  buffer.space_ = space;
  buffer.bytes_ = std::max<int64_t>(bytes, 16);
  const size_t size = static_cast<size_t>(buffer.bytes_);
  if (space == MemorySpace::kPinnedHost) {
    if (const cudaError_t e = cudaMallocHost(&buffer.ptr_, size); e != cudaSuccess) {
      cudaGetLastError();
      buffer.ptr_ = nullptr;
      return CudaError(e, StrCat("pinned memory for ", what));
    }
    return buffer;
  }
  if (const cudaError_t e = cudaMalloc(&buffer.ptr_, size); e != cudaSuccess) {
    cudaGetLastError();
    buffer.ptr_ = nullptr;
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(StrCat("CUDA runner: cannot allocate ", buffer.bytes_,
                                               " bytes for ", what, " (", free_bytes, " of ",
                                               total_bytes, " bytes free)"));
  }
  return buffer;
}

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    space_ = other.space_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void CudaBuffer::Free() {
  if (ptr_ == nullptr) return;
  if (space_ == MemorySpace::kPinnedHost) {
    cudaFreeHost(ptr_);
  } else {
    cudaFree(ptr_);
  }
  ptr_ = nullptr;
}

}  // namespace lmserve::engine::cuda
