#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/parallel.h"

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
  if (split_k < 0 || num_threads < 1) {
    return absl::InvalidArgumentError(StrCat(
        "Linear: split_k (", split_k, ") must be >= 0 and num_threads (", num_threads, ") >= 1"));
  }
  return absl::OkStatus();
}

namespace {

// Up to this many tokens go through one sgemv each: OpenBLAS's sgemm packs all of W even for a
// few rows, and took 6x one sgemv for two rows and 8x for four (SmolLM2-135M's gate/up, 2-core
// EPYC), where a second sgemv over the same W, fresh in the cache, takes about one more. Each row
// is then what it would be alone (a decode step mixed with a short prefill chunk, issue 27).
constexpr int64_t kMaxGemvTokens = 4;

// y = x W^T + beta y through OpenBLAS: sgemv a token up to kMaxGemvTokens, else sgemm.
void BlasLinear(const LinearParams& p, int64_t ldx, int64_t ldy, float beta) {
  const auto n = static_cast<blasint>(p.out_features);
  const auto k = static_cast<blasint>(p.in_features);
  if (p.num_tokens <= kMaxGemvTokens) {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, p.weight, k, p.input + t * ldx, 1, beta,
                  p.output + t * ldy, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(p.num_tokens), n, k,
              1.0f, p.input, static_cast<blasint>(ldx), p.weight, k, beta, p.output,
              static_cast<blasint>(ldy));
}

// The double sum of fp32 dot products over chunks of `chunk` features; each chunk keeps eight fp32
// partial sums, combined in a fixed order, so the result does not depend on the instruction set.
inline double SplitDot(const float* x, const float* w, int64_t n, int64_t chunk) {
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    float lanes[8] = {};
    int64_t k = begin;
    for (; k + 8 <= end; k += 8) {
      for (int l = 0; l < 8; ++l) lanes[l] += x[k + l] * w[k + l];
    }
    float tail = 0;
    for (; k < end; ++k) tail += x[k] * w[k];
    total += static_cast<double>(((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                                 ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7])) + tail);
  }
  return total;
}

// Output features [out_begin, out_end) of the split form, for every token. AVX2 where the CPU has
// it: the same operations in wider registers (no FMA: adding "fma" here would let the compiler
// contract a*b+c and change the rounding from one CPU to another).
__attribute__((target_clones("avx2", "default"))) void SplitLinearRange(const LinearParams& p,
                                                                        int64_t ldx, int64_t ldy,
                                                                        int64_t out_begin,
                                                                        int64_t out_end) {
  for (int64_t o = out_begin; o < out_end; ++o) {
    const float* w = p.weight + o * p.in_features;
    const double bias = p.bias != nullptr ? double{p.bias[o]} : 0.0;
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      float* y = p.output + t * ldy + o;
      const double base = (p.accumulate ? double{*y} : 0.0) + bias;
      *y = static_cast<float>(base + SplitDot(p.input + t * ldx, w, p.in_features, p.split_k));
    }
  }
}

// The split form over threads, each a contiguous range of output features.
void SplitLinear(const LinearParams& p, int64_t ldx, int64_t ldy) {
  constexpr int64_t kMinWorkPerThread = int64_t{1} << 20;  // multiply-adds
  const int64_t work = p.num_tokens * p.out_features * p.in_features;
  const int64_t num_workers = ThreadsForWork(work, kMinWorkPerThread, p.num_threads);
  const int64_t per_worker = (p.out_features + num_workers - 1) / num_workers;
  ParallelFor(num_workers, static_cast<int>(num_workers), [&](int64_t begin, int64_t end) {
    SplitLinearRange(p, ldx, ldy, std::min(p.out_features, begin * per_worker),
                     std::min(p.out_features, end * per_worker));
  });
}

}  // namespace

void Linear(const LinearParams& p) {
  CheckValid(p.Validate(), "Linear");
  if (p.num_tokens == 0) return;
  const int64_t ldx = p.input_stride != 0 ? p.input_stride : p.in_features;
  const int64_t ldy = p.output_stride != 0 ? p.output_stride : p.out_features;
  if (p.split_k > 0) {
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
  BlasLinear(p, ldx, ldy, beta);
}

void SetBlasThreads(int num_threads) {
  if (num_threads <= 0)
    num_threads = PhysicalCoreCount();
  openblas_set_num_threads(num_threads);
}

int GetBlasThreads() { return openblas_get_num_threads(); }

std::string BlasDescription() {
  return StrCat(openblas_get_config(), ", core ", openblas_get_corename());
}

}  // namespace lmserve::kernels
