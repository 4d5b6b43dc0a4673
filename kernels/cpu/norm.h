// RMSNorm, plain and fused with the residual addition that precedes it in a pre-norm decoder, and
// per attention head (Qwen3's and Gemma 3's q_norm / k_norm).
//
//   RmsNorm:          out = x / sqrt(mean(x^2) + eps) * weight
//   FusedAddRmsNorm:  residual += x;  out = RmsNorm(residual)
//   HeadRmsNorm:      each head_dim-wide head of each token: x = RmsNorm(x), in place
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
  int num_threads = 1;  // threads to split the tokens across (a prompt's; one row runs on one)

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
  int num_threads = 1;  // threads to split the tokens across (a prompt's; one row runs on one)

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void FusedAddRmsNorm(const FusedAddRmsNormParams& params);

struct HeadRmsNormParams {
  float* data = nullptr;  // [num_tokens, num_heads, head_dim], row stride; normalized in place
  const float* weight = nullptr;  // [head_dim], shared by every head
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t stride = 0;  // elements between tokens' rows; 0 means num_heads * head_dim
  double epsilon = 1e-6;

  absl::Status Validate() const;
};

// Each head as RmsNorm normalizes a row (the same arithmetic). Takes the query or key heads of a
// fused QKV row in place (data = qkv + offset, stride = the QKV row width).
// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void HeadRmsNorm(const HeadRmsNormParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_NORM_H_
