// FP8 (E4M3) weights on the GPU (compute capability 8.9+; CPU twin: kernels/cpu/fp8.h).
//
// - F8QuantizeRows: rows of bf16/fp16/fp32 values to E4M3 bytes with one fp32 scale a row,
//   s = amax / 448 (kernels/cpu/fp8.h states the arithmetic; the bytes and scales equal the CPU's
//   bit for bit). The runner quantizes a bf16 checkpoint's weights with it at load (per output
//   channel) and the activations of large steps before the FP8 GEMM (per token).
// - F8SkinnyGemm: the linear layer for a few tokens, y[m, n] = (x[m, k] Wq[n, k]^T) * s_w[n],
//   with x in bf16/fp16 as it is (W8A16: no activation quantization) and W in E4M3: the skinny
//   GEMM of skinny_gemm.h over one byte a weight, whose time is W's bytes over the memory
//   bandwidth. One token (or where x's fp16 copy would pass 40 KB): a warp takes two rows of W
//   in 16-byte pieces (16 weights), several in flight, on the CUDA cores. 2 to 8 tokens: the
//   tensor cores (mma.sync with W widened to fp16, exactly, and x in fp16 scaled by a power of
//   two a chunk of 64 columns; fp8.cu says how). With silu_and_mul, W is the fused [gate; up]
//   projection and y = act(gate) * up.
// The large-batch product (per-token quantized x times W, both E4M3, through cuBLASLt with
// outer-vector scales) is Fp8 mode of GemmPlan (gemm.h).

#ifndef LMSERVE_KERNELS_CUDA_FP8_H_
#define LMSERVE_KERNELS_CUDA_FP8_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

// Whether a GPU of compute capability major.minor has FP8 tensor cores and conversions (8.9+:
// Ada, Hopper and newer).
inline bool SupportsFp8(int major, int minor) { return major > 8 || (major == 8 && minor >= 9); }

struct F8QuantizeRowsParams {
  const void* src = nullptr;  // [rows, cols] of src_dtype, row stride src_stride; device,
                              // 16-byte aligned
  void* dst = nullptr;        // [rows, cols] E4M3 bytes, row stride dst_stride; device, 8-byte
                              // aligned
  float* scales = nullptr;    // [rows]; device
  int64_t rows = 0;
  int64_t cols = 0;           // multiple of 16
  int64_t src_stride = 0;     // elements, multiple of 8; 0 means cols
  int64_t dst_stride = 0;     // bytes, multiple of 16; 0 means cols
  DType src_dtype = DType::kBF16;  // kBF16, kF16 or kF32

  absl::Status Validate() const;
};

cudaError_t Launch(const F8QuantizeRowsParams& params, cudaStream_t stream);

struct F8SkinnyGemmParams {
  const void* x = nullptr;         // [m, k] of input_dtype, row stride x_stride; device, 16-byte
                                   // aligned
  const void* w = nullptr;         // [n, k] E4M3 bytes, contiguous; device, 16-byte aligned
  const float* w_scales = nullptr;  // [n]: W's scale per output channel; device
  void* y = nullptr;               // [m, n] of output_dtype, row stride y_stride; device
  int64_t m = 0;                   // 1 .. kMaxSkinnyGemmRows (skinny_gemm.h)
  int64_t n = 0;                   // even
  int64_t k = 0;                   // multiple of 16
  int64_t x_stride = 0;            // multiple of 8; 0 means k
  int64_t y_stride = 0;            // 0 means n (n / 2 with silu_and_mul)
  DType input_dtype = DType::kBF16;   // of x: kBF16 or kF16
  DType output_dtype = DType::kBF16;  // input_dtype or kF32
  // As SkinnyGemmParams: y[m, n/2] = act(gate * s) * (up * s'), each rounded to the input type
  // first; the output type must be the input type.
  bool silu_and_mul = false;
  GateActivation activation = GateActivation::kSilu;
  bool late_dependents = true;  // as SkinnyGemmParams::late_dependents
  // As SkinnyGemmParams (skinny_gemm.h): the add + RMSNorm before the product folded in (one row,
  // y in the input type, k at most kMaxSkinnyAddNormK; silu_and_mul allowed), and the residual's
  // add that such a fold leaves, settled before the wait (one row, y in the input type, no
  // silu_and_mul, not with the fold). Null: none.
  const float* add_norm_residual = nullptr;  // [k], fp32; device, 16-byte aligned
  const void* add_norm_weight = nullptr;     // [k] of input_dtype; device, 16-byte aligned
  float add_norm_epsilon = 0.0f;
  float* settle_residual = nullptr;  // [n], fp32; device

  absl::Status Validate() const;
};

cudaError_t Launch(const F8SkinnyGemmParams& params, cudaStream_t stream);
// Whether F8SkinnyGemm may take the tensor cores (on by default). Off, every launch runs on the
// CUDA cores, so that tests reach both kernels. Process-wide (an atomic read at each launch); for
// tests and benchmarks.
void SetF8SkinnyTensorCores(bool allowed);

// y[t, j] *= row_scales[t] * col_scales[j], in place, bf16 (rounded once more): the scales of an
// FP8 GEMM that ran with unit scales (gemm.h's fallback where cuBLASLt has no outer-vector
// scaling).
struct F8ScaleOutputParams {
  void* y = nullptr;                  // [m, n] bf16, row stride y_stride; device, 16-byte aligned
  const float* row_scales = nullptr;  // [m] (x's per token); device
  const float* col_scales = nullptr;  // [n] (W's per channel); device
  int64_t m = 0;
  int64_t n = 0;         // multiple of 8
  int64_t y_stride = 0;  // multiple of 8; 0 means n

  absl::Status Validate() const;
};

cudaError_t Launch(const F8ScaleOutputParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_FP8_H_
