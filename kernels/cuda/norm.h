// RMSNorm on the GPU, plain and fused with the residual addition before it (the CPU twins are in
// kernels/cpu/norm.h):
//
//   RmsNorm:          out = x / sqrt(mean(x^2) + eps) * weight
//   FusedAddRmsNorm:  residual += x (rounded to the residual's type);  out = RmsNorm(residual)
//
// bf16, fp16 or fp32 in and out (weight in the same type), fp32 math; fp32 rows sum their squares
// in double, as the CPU twin does. The residual stream may be fp32 under 16-bit activations (the
// CUDA runner's fp32 residual): RmsNorm then reads an fp32 input (input_dtype) and
// FusedAddRmsNorm an fp32 residual (residual_dtype), which keeps the sum unrounded; the other
// tensors stay in `dtype`. One thread block per token; the row stays in registers, so every
// element is read once and written once.

#ifndef LMSERVE_KERNELS_CUDA_NORM_H_
#define LMSERVE_KERNELS_CUDA_NORM_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct RmsNormParams {
  const void* input = nullptr;   // [num_tokens, hidden_size], row stride input_stride; device
  const void* weight = nullptr;  // [hidden_size]; device
  void* output = nullptr;  // [num_tokens, hidden_size], row stride output_stride; device; may be
                           // input when input_dtype is dtype
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;    // multiple of 8, at most kMaxHiddenSize
  int64_t input_stride = 0;   // elements between rows, multiple of 8; 0 means hidden_size
  int64_t output_stride = 0;  // elements between rows, multiple of 8; 0 means hidden_size
  float epsilon = 1e-6f;
  DType dtype = DType::kBF16;  // of weight and output (and input by default): kBF16, kF16 or kF32
  std::optional<DType> input_dtype = std::nullopt;  // of input: dtype (nullopt: dtype) or kF32

  static constexpr int64_t kMaxHiddenSize = 32768;

  absl::Status Validate() const;
};

struct FusedAddRmsNormParams {
  void* residual = nullptr;      // [num_tokens, hidden_size], contiguous, residual_dtype; device;
                                 // updated in place
  const void* input = nullptr;   // [num_tokens, hidden_size], contiguous; device; added to residual
  const void* weight = nullptr;  // [hidden_size]; device
  void* output = nullptr;  // [num_tokens, hidden_size], contiguous; device; may be input, not residual;
                           // null: the add alone (no norm written)
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;  // multiple of 8, at most kMaxHiddenSize
  float epsilon = 1e-6f;
  DType dtype = DType::kBF16;  // of input, weight and output (and residual by default): kBF16,
                               // kF16 or kF32
  std::optional<DType> residual_dtype = std::nullopt;  // dtype (nullopt: dtype) or kF32
  // input as an FP8 GEMM left it, unscaled (GemmPlan::Run's `unscaled`): each value is first
  // multiplied by input_row_scales[t] * input_col_scales[j] and rounded to bf16, as F8ScaleOutput
  // would have stored it. Both or neither; bf16 only.
  const float* input_row_scales = nullptr;  // [num_tokens]; device
  const float* input_col_scales = nullptr;  // [hidden_size]; device, 16-byte aligned
  // The normed rows quantized per token for an FP8 GEMM instead of written to `output` (null
  // then): E4M3 bytes and a scale a row, bit for bit what F8QuantizeRows (fp8.h) makes of the
  // bf16 rows `output` would have held. bf16 only. f8_output_scales may be input_row_scales (a
  // row's block reads its input scale before it writes its own).
  void* f8_output = nullptr;          // [num_tokens, hidden_size] bytes, contiguous; device,
                                      // 8-byte aligned
  float* f8_output_scales = nullptr;  // [num_tokens]; device

  static constexpr int64_t kMaxHiddenSize = RmsNormParams::kMaxHiddenSize;

  absl::Status Validate() const;
};

// Launchers: return cudaErrorInvalidValue when Validate() fails, else the launch's error.
cudaError_t Launch(const RmsNormParams& params, cudaStream_t stream);
cudaError_t Launch(const FusedAddRmsNormParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_NORM_H_
