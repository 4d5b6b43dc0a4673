// cuTensorMapEncodeTiled (the driver's TMA descriptors) through the runtime's driver entry
// point, so that nothing links libcuda: null where the driver does not give it.

#ifndef LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_
#define LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_

#include <cuda.h>  // CUtensorMap and the encoder's types (no driver call is linked)

namespace lmserve::kernels::cuda {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn EncodeTiled();

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_
