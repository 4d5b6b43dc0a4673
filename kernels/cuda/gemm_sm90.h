// A Hopper (sm_90a) GEMM of our own: y = x W^T (PyTorch's weight layout, as gemm.h), 16-bit
// inputs, fp32 accumulation, with epilogues cuBLASLt does not have: TMA loads of x's and W's tiles
// into a ring of stages, a producer warp group and two consumer warp groups (wgmma), persistent
// blocks, output tiles of 128 x 256 stored by TMA (gemm_sm90.cu says more).
//
// Epilogues:
//   kStore            y[m, n] in the input type.
//   kSiluAndMul,      W is a fused [gate; up] projection (n = 2 I, I a multiple of 128: each
//   kGeluTanhAndMul   tile multiplies 128 gate rows and their 128 up rows), and the kernel writes
//                     act(gate) * up, [m, I]: SiluAndMul's result (activation.h) on the product
//                     rounded to the input type, without writing the product.

#ifndef LMSERVE_KERNELS_CUDA_GEMM_SM90_H_
#define LMSERVE_KERNELS_CUDA_GEMM_SM90_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

enum class Sm90GemmEpilogue { kStore, kSiluAndMul, kGeluTanhAndMul };

struct Sm90GemmParams {
  const void* x = nullptr;  // [m, k], row stride x_stride
  const void* w = nullptr;  // [n, k] contiguous
  void* y = nullptr;        // [m, n] (gated: [m, n / 2]), row stride y_stride
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0;        // 0: k
  int64_t y_stride = 0;        // 0: the output's width
  DType dtype = DType::kBF16;  // kBF16 or kF16
  Sm90GemmEpilogue epilogue = Sm90GemmEpilogue::kStore;
  int group_m = 8;     // tiles' order: groups of group_m row tiles, rows fastest within a group
  int max_blocks = 0;  // persistent blocks; 0: one a multiprocessor
  int cluster = 1;     // 1, or 2: pairs of blocks share W's tiles (TMA multicast)
};

// Whether this device runs the kernel (compute capability 9.0 and the driver's tensor maps).
bool Sm90GemmAvailable();
// Whether the kernel takes these parameters: k, n and the strides multiples of 8, 16-byte
// aligned pointers; gated: n a multiple of 256.
bool Sm90GemmSupports(const Sm90GemmParams& params);
cudaError_t LaunchSm90Gemm(const Sm90GemmParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_GEMM_SM90_H_
