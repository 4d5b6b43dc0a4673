#include "kernels/cuda/tensor_map.h"

#include <cuda_runtime.h>

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

}  // namespace lmserve::kernels::cuda
