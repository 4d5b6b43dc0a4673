#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "common/strings.h"
#include "kernels/cpu/check.h"

namespace lmserve::kernels {

absl::Status LinearParams::Validate() const {
  constexpr int64_t kMaxBlasInt = std::numeric_limits<blasint>::max();
  if (num_tokens < 0 || in_features <= 0 || out_features <= 0 || num_tokens > kMaxBlasInt ||
      in_features > kMaxBlasInt || out_features > kMaxBlasInt) {
    return absl::InvalidArgumentError(StrCat("Linear: bad shape (tokens ", num_tokens, ", in ",
                                             in_features, ", out ", out_features, ")"));
  }
  if (num_tokens > 0 && (input == nullptr || weight == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("Linear: null input, weight or output");
  }
  if ((input_stride != 0 && input_stride < in_features) ||
      (output_stride != 0 && output_stride < out_features)) {
    return absl::InvalidArgumentError(StrCat("Linear: row strides (", input_stride, ", ",
                                             output_stride, ") smaller than the rows (",
                                             in_features, ", ", out_features, ")"));
  }
  if (std::max(input_stride, output_stride) > kMaxBlasInt) {
    return absl::InvalidArgumentError("Linear: row stride too large for BLAS");
  }
  return absl::OkStatus();
}

void Linear(const LinearParams& p) {
  CheckValid(p.Validate(), "Linear");
  if (p.num_tokens == 0) return;
  const int64_t ldx = p.input_stride != 0 ? p.input_stride : p.in_features;
  const int64_t ldy = p.output_stride != 0 ? p.output_stride : p.out_features;
  float beta = p.accumulate ? 1.0f : 0.0f;
  if (p.bias != nullptr) {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      float* row = p.output + t * ldy;
      if (p.accumulate) {
        for (int64_t o = 0; o < p.out_features; ++o) row[o] += p.bias[o];
      } else {
        std::copy(p.bias, p.bias + p.out_features, row);
      }
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.num_tokens),
              static_cast<blasint>(p.out_features), static_cast<blasint>(p.in_features), 1.0f,
              p.input, static_cast<blasint>(ldx), p.weight, static_cast<blasint>(p.in_features),
              beta, p.output, static_cast<blasint>(ldy));
}

void SetBlasThreads(int num_threads) {
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(num_threads);
}

int GetBlasThreads() { return openblas_get_num_threads(); }

}  // namespace lmserve::kernels
