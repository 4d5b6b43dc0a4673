// RMSNorm, plain and fused with the residual addition that precedes it in a pre-norm decoder.
//
//   RmsNorm:          out = x / sqrt(mean(x^2) + eps) * weight
//   FusedAddRmsNorm:  residual += x;  out = RmsNorm(residual)
//
// fp32 in and out; the mean of squares is accumulated in double, so the result is the correctly
// rounded fp32 value of the exact formula up to a few ulps, whatever the hidden size.

#ifndef LMSERVE_KERNELS_CPU_NORM_H_
#define LMSERVE_KERNELS_CPU_NORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct RmsNormParams {
  const float* input = nullptr;   // [num_tokens, hidden_size], row stride input_stride
  const float* weight = nullptr;  // [hidden_size]
  float* output = nullptr;  // [num_tokens, hidden_size], row stride output_stride; may be input
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int64_t input_stride = 0;   // elements between rows; 0 means hidden_size
  int64_t output_stride = 0;  // elements between rows; 0 means hidden_size
  double epsilon = 1e-6;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void RmsNorm(const RmsNormParams& params);

struct FusedAddRmsNormParams {
  float* residual = nullptr;  // [num_tokens, hidden_size], contiguous: updated in place (+= input)
  const float* input = nullptr;   // [num_tokens, hidden_size], contiguous: added to residual
  const float* weight = nullptr;  // [hidden_size]
  float* output = nullptr;  // [num_tokens, hidden_size], contiguous; may be input, not residual
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  double epsilon = 1e-6;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void FusedAddRmsNorm(const FusedAddRmsNormParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_NORM_H_
