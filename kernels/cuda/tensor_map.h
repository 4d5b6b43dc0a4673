// What the sm_90a kernels' hosts share: cuTensorMapEncodeTiled (the driver's TMA descriptors)
// through the runtime's driver entry point, so that nothing links libcuda (null where the driver
// does not give it), and whether the current device runs sm_90a code.

#ifndef LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_
#define LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_

#include <cuda.h>  // CUtensorMap and the encoder's types (no driver call is linked)

#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn EncodeTiled();

// A map over bf16 or fp16 elements (dtype) of `rank` dimensions (innermost first; `strides`:
// bytes between consecutive indices of dimensions 1 .. rank - 1), boxes of `box`, 128-byte
// swizzle, zeros out of bounds. False where the driver refuses it or gives no encoder.
bool EncodeSwizzled16(CUtensorMap* map, DType dtype, const void* base, int rank,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box);

// Whether the current device runs `kernel`, a kernel of the sm_90a objects: compute capability
// 9.0 (sm_90a code runs there alone), the kernel's code loaded, and EncodeTiled available.
// Cached per device and kernel.
bool Sm90KernelRuns(const void* kernel);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_TENSOR_MAP_H_
