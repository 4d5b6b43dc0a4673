#include "kernels/cpu/norm.h"

#include <cmath>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/parallel.h"

namespace lmserve::kernels {
namespace {

absl::Status ValidateShape(const char* kernel, int64_t num_tokens, int64_t hidden_size,
                           double epsilon) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        StrCat(kernel, ": num_tokens is negative (", num_tokens, ")"));
  }
  if (hidden_size <= 0) {
    return absl::InvalidArgumentError(
        StrCat(kernel, ": hidden_size must be positive (got ", hidden_size, ")"));
  }
  if (!(epsilon > 0))
    return absl::InvalidArgumentError(StrCat(kernel, ": epsilon must be positive"));
  return absl::OkStatus();
}

// A thread's least share of a step's rows, in elements (a row of 576 takes about a microsecond).
constexpr int64_t kMinElementsPerThread = int64_t{1} << 14;

// Runs fn(begin, end) over the step's rows, split across threads where they are many.
void ForRows(int64_t num_tokens, int64_t row_elements, int num_threads,
             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  ParallelFor(num_tokens,
              ThreadsForWork(num_tokens * row_elements, kMinElementsPerThread, num_threads), fn);
}

// Writes x / rms(x) * weight; `x` and `out` may alias. The squares are summed in eight partial
// sums (independent additions, where one running sum waited on each).
inline void NormalizeRow(const float* x, const float* weight, float* out, int64_t hidden_size,
                         double epsilon) {
  double partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= hidden_size; i += 8) {
    for (int k = 0; k < 8; ++k) partial[k] += double{x[i + k]} * x[i + k];
  }
  for (; i < hidden_size; ++i) partial[0] += double{x[i]} * x[i];
  const double sum_squares = ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
                             ((partial[2] + partial[6]) + (partial[3] + partial[7]));
  const float inv_rms =
      static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(hidden_size) + epsilon));
  for (int64_t i = 0; i < hidden_size; ++i) out[i] = x[i] * inv_rms * weight[i];
}

}  // namespace

absl::Status RmsNormParams::Validate() const {
  if (absl::Status s = ValidateShape("RmsNorm", num_tokens, hidden_size, epsilon); !s.ok())
    return s;
  if (num_tokens > 0 && (input == nullptr || weight == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("RmsNorm: null input, weight or output");
  }
  if ((input_stride != 0 && input_stride < hidden_size) ||
      (output_stride != 0 && output_stride < hidden_size)) {
    return absl::InvalidArgumentError(StrCat("RmsNorm: row strides (", input_stride, ", ",
                                             output_stride, ") below hidden_size ", hidden_size));
  }
  return absl::OkStatus();
}

void RmsNorm(const RmsNormParams& p) {
  CheckValid(p.Validate(), "RmsNorm");
  const int64_t in_stride = p.input_stride != 0 ? p.input_stride : p.hidden_size;
  const int64_t out_stride = p.output_stride != 0 ? p.output_stride : p.hidden_size;
  ForRows(p.num_tokens, p.hidden_size, p.num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      NormalizeRow(p.input + t * in_stride, p.weight, p.output + t * out_stride, p.hidden_size,
                   p.epsilon);
    }
  });
}

absl::Status FusedAddRmsNormParams::Validate() const {
  if (absl::Status s = ValidateShape("FusedAddRmsNorm", num_tokens, hidden_size, epsilon);
      !s.ok()) {
    return s;
  }
  if (num_tokens > 0 &&
      (residual == nullptr || input == nullptr || weight == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("FusedAddRmsNorm: null residual, input, weight or output");
  }
  if (num_tokens > 0 && output == residual) {
    return absl::InvalidArgumentError("FusedAddRmsNorm: output may not alias residual");
  }
  return absl::OkStatus();
}

void FusedAddRmsNorm(const FusedAddRmsNormParams& p) {
  CheckValid(p.Validate(), "FusedAddRmsNorm");
  ForRows(p.num_tokens, p.hidden_size, p.num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* residual = p.residual + t * p.hidden_size;
      const float* input = p.input + t * p.hidden_size;
      for (int64_t i = 0; i < p.hidden_size; ++i) residual[i] += input[i];
      NormalizeRow(residual, p.weight, p.output + t * p.hidden_size, p.hidden_size, p.epsilon);
    }
  });
}

absl::Status HeadRmsNormParams::Validate() const {
  if (absl::Status s = ValidateShape("HeadRmsNorm", num_tokens, head_dim, epsilon); !s.ok()) {
    return s;
  }
  if (num_heads <= 0) {
    return absl::InvalidArgumentError(StrCat("HeadRmsNorm: num_heads must be positive (got ",
                                             num_heads, ")"));
  }
  if (stride != 0 && stride < num_heads * head_dim) {
    return absl::InvalidArgumentError(
        StrCat("HeadRmsNorm: stride ", stride, " is smaller than a row of ", num_heads * head_dim));
  }
  if (num_tokens > 0 && (data == nullptr || weight == nullptr)) {
    return absl::InvalidArgumentError("HeadRmsNorm: null data or weight");
  }
  return absl::OkStatus();
}

void HeadRmsNorm(const HeadRmsNormParams& p) {
  CheckValid(p.Validate(), "HeadRmsNorm");
  const int64_t stride = p.stride != 0 ? p.stride : p.num_heads * p.head_dim;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      float* head = p.data + t * stride + h * p.head_dim;
      NormalizeRow(head, p.weight, head, p.head_dim, p.epsilon);
    }
  }
}

}  // namespace lmserve::kernels
