// Memory and status plumbing of the CUDA runner: one owning type for device and pinned host
// allocations, and the conversion of CUDA errors into absl::Status.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_CUDA_BUFFER_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_CUDA_BUFFER_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lmserve::engine::cuda {

// Internal "CUDA runner: <what>: <CUDA's message>".
absl::Status CudaError(cudaError_t error, std::string_view what);

// Returns CudaError(expr's error, what) from the enclosing function when `expr` fails.
#define LMSERVE_RETURN_IF_CUDA_ERROR(expr, what)                                              \
  do {                                                                                        \
    if (const cudaError_t lmserve_cuda_error_ = (expr); lmserve_cuda_error_ != cudaSuccess) { \
      return ::lmserve::engine::cuda::CudaError(lmserve_cuda_error_, what);                   \
    }                                                                                         \
  } while (0)

enum class MemorySpace : uint8_t {
  kDevice,      // cudaMalloc: the GPU's memory
  kPinnedHost,  // cudaMallocHost: page-locked host memory, for asynchronous copies
};

// An owned allocation in one memory space; freed on destruction. Move-only.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  // At least 16 bytes, so that every buffer has an address. Device allocations that fail return
  // ResourceExhausted saying how much of the GPU's memory is free; `what` names the buffer.
  static absl::StatusOr<CudaBuffer> Allocate(MemorySpace space, int64_t bytes,
                                             std::string_view what);
  static absl::StatusOr<CudaBuffer> Device(int64_t bytes, std::string_view what) {
    return Allocate(MemorySpace::kDevice, bytes, what);
  }
  static absl::StatusOr<CudaBuffer> Pinned(int64_t bytes, std::string_view what) {
    return Allocate(MemorySpace::kPinnedHost, bytes, what);
  }

  CudaBuffer(CudaBuffer&& other) noexcept { *this = static_cast<CudaBuffer&&>(other); }
  CudaBuffer& operator=(CudaBuffer&& other) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { Free(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // `offset` bytes into the buffer.
  template <typename T = void>
  T* at(int64_t offset) const {
    return static_cast<T*>(static_cast<void*>(static_cast<unsigned char*>(ptr_) + offset));
  }
  int64_t bytes() const { return ptr_ != nullptr ? bytes_ : 0; }

 private:
  void Free();

  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  MemorySpace space_ = MemorySpace::kDevice;
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_CUDA_BUFFER_H_
