#include "kernels/cuda/tensor_map.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

namespace lmserve::kernels::cuda {

EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult query{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault,
                                         &query) != cudaSuccess ||
        query != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return EncodeTiledFn{nullptr};
    }
    return reinterpret_cast<EncodeTiledFn>(entry);
  }();
  return fn;
}

bool EncodeSwizzled16(CUtensorMap* map, DType dtype, const void* base, int rank,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  const EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr || rank < 1 || rank > 5) return false;
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(map,
                dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool Sm90KernelRuns(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> runs;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, kernel);
  if (const auto it = runs.find(key); it != runs.end()) return it->second;
  int major = 0, minor = 0;
  bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      major == 9 && minor == 0 && EncodeTiled() != nullptr;
  if (ok) {
    cudaFuncAttributes attributes{};
    ok = cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess;
  }
  cudaGetLastError();
  runs[key] = ok;
  return ok;
}

}  // namespace lmserve::kernels::cuda
