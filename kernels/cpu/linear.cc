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
  if (split_k < 0 || (split_k > 0 && num_tokens > 0 && split_accumulator == nullptr)) {
    return absl::InvalidArgumentError(
        StrCat("Linear: split_k ", split_k, " needs to be >= 0, and a split_accumulator when > 0"));
  }
  return absl::OkStatus();
}

namespace {

// y = x W^T over features [k_begin, k_begin + k_count), with beta as cblas_sgemm takes it.
void Sgemm(const LinearParams& p, int64_t ldx, int64_t ldy, int64_t k_begin, int64_t k_count,
           float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.num_tokens),
              static_cast<blasint>(p.out_features), static_cast<blasint>(k_count), 1.0f,
              p.input + k_begin, static_cast<blasint>(ldx), p.weight + k_begin,
              static_cast<blasint>(p.in_features), beta, p.output, static_cast<blasint>(ldy));
}

// The split-K form: fp32 GEMMs over chunks of features, summed in double.
void SplitLinear(const LinearParams& p, int64_t ldx, int64_t ldy) {
  const int64_t n = p.out_features;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    double* acc = p.split_accumulator + t * n;
    const float* y = p.output + t * ldy;
    for (int64_t o = 0; o < n; ++o) {
      acc[o] = (p.accumulate ? double{y[o]} : 0.0) + (p.bias != nullptr ? double{p.bias[o]} : 0.0);
    }
  }
  for (int64_t k = 0; k < p.in_features; k += p.split_k) {
    Sgemm(p, ldx, ldy, k, std::min(p.split_k, p.in_features - k), 0.0f);
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      double* acc = p.split_accumulator + t * n;
      const float* y = p.output + t * ldy;
      for (int64_t o = 0; o < n; ++o) acc[o] += y[o];
    }
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const double* acc = p.split_accumulator + t * n;
    float* y = p.output + t * ldy;
    for (int64_t o = 0; o < n; ++o) y[o] = static_cast<float>(acc[o]);
  }
}

}  // namespace

void Linear(const LinearParams& p) {
  CheckValid(p.Validate(), "Linear");
  if (p.num_tokens == 0) return;
  const int64_t ldx = p.input_stride != 0 ? p.input_stride : p.in_features;
  const int64_t ldy = p.output_stride != 0 ? p.output_stride : p.out_features;
  if (p.split_k > 0 && p.split_k < p.in_features) {
    SplitLinear(p, ldx, ldy);
    return;
  }
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
  Sgemm(p, ldx, ldy, 0, p.in_features, beta);
}

void SetBlasThreads(int num_threads) {
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(num_threads);
}

int GetBlasThreads() { return openblas_get_num_threads(); }

std::string BlasDescription() {
  return StrCat(openblas_get_config(), ", core ", openblas_get_corename());
}

}  // namespace lmserve::kernels
