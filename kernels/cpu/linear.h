// The linear layer y = x W^T (+ bias) (+ y), through OpenBLAS, or a direct loop that sums the
// reduction in double over fp32 chunks.
//
// W is fp32 row-major [out_features, in_features], as PyTorch stores nn.Linear weights, so each
// output feature is a contiguous row. Rows of x and y may be strided: a projection can write into a
// slice of a wider buffer (the fused QKV projection's output, for instance).

#ifndef LMSERVE_KERNELS_CPU_LINEAR_H_
#define LMSERVE_KERNELS_CPU_LINEAR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct LinearParams {
  const float* input = nullptr;   // [num_tokens, in_features], row stride input_stride
  const float* weight = nullptr;  // [out_features, in_features], contiguous
  const float* bias = nullptr;    // [out_features], or null for none
  float* output = nullptr;        // [num_tokens, out_features], row stride output_stride
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t input_stride = 0;   // 0 means in_features
  int64_t output_stride = 0;  // 0 means out_features
  bool accumulate = false;    // y += x W^T (+ bias) instead of y = ...; output may not alias input
  // The reduction over in_features. 0: OpenBLAS (sgemm, or sgemv per token up to 4), fp32 sums in
  // its order. k > 0: a direct loop, not BLAS, that sums fp32 dot products over chunks of k
  // features in double, so that outputs carry the rounding of k-term fp32 sums rather than
  // in_features-term ones (for logits, whose magnitude makes that error visible). It runs at
  // memory speed for a few tokens and well below sgemm for many.
  int64_t split_k = 0;
  int num_threads = 1;  // threads for the split_k > 0 loop (BLAS has its own, SetBlasThreads)

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void Linear(const LinearParams& params);

// Sets the number of threads OpenBLAS uses (process-wide); 0 or less means one per core.
void SetBlasThreads(int num_threads);
// The number of threads OpenBLAS uses now.
int GetBlasThreads();
// OpenBLAS's build configuration and the core type whose kernels it chose ("... core Haswell"), for
// benchmark reports.
std::string BlasDescription();

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_LINEAR_H_
