// Greedy selection: the index of the largest value of each row (the lowest index among equal
// maxima; NaN never wins unless the whole row is NaN, which gives 0).

#ifndef LMSERVE_KERNELS_CPU_ARGMAX_H_
#define LMSERVE_KERNELS_CPU_ARGMAX_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct ArgmaxParams {
  const float* input = nullptr;  // [num_rows, row_size], contiguous
  int32_t* output = nullptr;     // [num_rows]
  int64_t num_rows = 0;
  int64_t row_size = 0;  // in [1, 2^31)

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void Argmax(const ArgmaxParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_ARGMAX_H_
