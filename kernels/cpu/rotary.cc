#include "kernels/cpu/rotary.h"

#include <cmath>

#include "common/strings.h"
#include "kernels/cpu/check.h"

namespace lmserve::kernels {
namespace {

// Rotates the first rotary_dim dimensions of every head of one token. cos/sin hold rotary_dim / 2
// values.
void RotateHeads(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                 RotaryLayout layout, const float* cos, const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* head = x + h * head_dim;
    if (layout == RotaryLayout::kHalfSplit) {
      for (int64_t k = 0; k < half; ++k) {
        const float a = head[k];
        const float b = head[k + half];
        head[k] = a * cos[k] - b * sin[k];
        head[k + half] = a * sin[k] + b * cos[k];
      }
    } else {
      for (int64_t k = 0; k < half; ++k) {
        const float a = head[2 * k];
        const float b = head[2 * k + 1];
        head[2 * k] = a * cos[k] - b * sin[k];
        head[2 * k + 1] = a * sin[k] + b * cos[k];
      }
    }
  }
}

}  // namespace

absl::Status RotaryParams::Validate() const {
  if (num_tokens < 0) return absl::InvalidArgumentError("Rotary: num_tokens is negative");
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(StrCat(
        "Rotary: head_dim ", head_dim, " is not supported (even, at most ", kMaxHeadDim, ")"));
  }
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return absl::InvalidArgumentError(StrCat("Rotary: rotary_dim ", rotary_dim,
                                             " is not supported (even, at most head_dim ",
                                             head_dim, "; 0 for head_dim)"));
  }
  if (!(attention_factor > 0) || !std::isfinite(attention_factor)) {
    return absl::InvalidArgumentError(
        StrCat("Rotary: attention_factor ", attention_factor, " must be positive and finite"));
  }
  if (num_heads <= 0 || (key != nullptr && num_kv_heads <= 0)) {
    return absl::InvalidArgumentError(
        StrCat("Rotary: head counts must be positive (", num_heads, ", ", num_kv_heads, ")"));
  }
  if (num_tokens > 0 && (query == nullptr || positions == nullptr || inv_freq == nullptr)) {
    return absl::InvalidArgumentError("Rotary: null query, positions or inv_freq");
  }
  if ((query_stride != 0 && query_stride < num_heads * head_dim) ||
      (key != nullptr && key_stride != 0 && key_stride < num_kv_heads * head_dim)) {
    return absl::InvalidArgumentError("Rotary: a row stride is smaller than a row");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (positions[t] < 0) {
      return absl::InvalidArgumentError(
          StrCat("Rotary: token ", t, " has negative position ", positions[t]));
    }
  }
  return absl::OkStatus();
}

void ApplyRotary(const RotaryParams& p) {
  CheckValid(p.Validate(), "ApplyRotary");
  const int64_t rotary_dim = p.RotaryDim();
  const int64_t half = rotary_dim / 2;
  const int64_t q_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * p.head_dim;
  const int64_t k_stride = p.key_stride != 0 ? p.key_stride : p.num_kv_heads * p.head_dim;
  float cos[RotaryParams::kMaxHeadDim / 2];
  float sin[RotaryParams::kMaxHeadDim / 2];
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const double position = p.positions[t];
    for (int64_t k = 0; k < half; ++k) {
      const double angle = position * p.inv_freq[k];
      cos[k] = static_cast<float>(std::cos(angle) * p.attention_factor);
      sin[k] = static_cast<float>(std::sin(angle) * p.attention_factor);
    }
    RotateHeads(p.query + t * q_stride, p.num_heads, p.head_dim, rotary_dim, p.layout, cos, sin);
    if (p.key != nullptr) {
      RotateHeads(p.key + t * k_stride, p.num_kv_heads, p.head_dim, rotary_dim, p.layout, cos,
                  sin);
    }
  }
}

}  // namespace lmserve::kernels
