#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/strings.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/philox.h"

namespace lmserve::kernels {

absl::Status SamplingParams::Validate() const {
  if (num_rows < 0 || vocab_size <= 0 || vocab_size > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        StrCat("Sample: bad shape [", num_rows, ", ", vocab_size, "]"));
  }
  if (logits_stride != 0 && logits_stride < vocab_size) {
    return absl::InvalidArgumentError("Sample: logits_stride is smaller than a row");
  }
  if (num_rows > 0 && (logits == nullptr || output == nullptr || temperature == nullptr ||
                       seeds == nullptr || steps == nullptr)) {
    return absl::InvalidArgumentError("Sample: null logits, output, temperature, seeds or steps");
  }
  return absl::OkStatus();
}

SamplingDecision SampleRow(const float* logits, int64_t vocab_size, float temperature,
                           int32_t top_k, float top_p, float min_p, float uniform) {
  const auto n = static_cast<size_t>(vocab_size);
  SamplingDecision d;
  d.kept.assign(n, false);
  d.weights.assign(n, 0.0);
  std::vector<float> z(n);
  float max_z = -INFINITY;
  bool any = false;
  const float inv_temperature = 1.0f / temperature;
  for (size_t i = 0; i < n; ++i) {
    z[i] = logits[i] * inv_temperature;
    if (!std::isnan(z[i])) {
      max_z = any ? std::max(max_z, z[i]) : z[i];
      any = true;
    }
  }
  if (!any) return d;  // every logit NaN: token 0, nothing kept
  std::vector<int32_t> order;  // non-NaN tokens by z descending (index ascending among ties)
  order.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isnan(z[i])) order.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
  std::vector<double> w(n, 0.0);
  for (int32_t i : order) w[i] = std::exp(static_cast<double>(z[i]) - static_cast<double>(max_z));

  // Top-k: a prefix of `order`, extended over ties.
  size_t kept_count = order.size();
  if (top_k > 0 && static_cast<size_t>(top_k) < order.size()) {
    const float kth = z[order[static_cast<size_t>(top_k) - 1]];
    kept_count = static_cast<size_t>(top_k);
    while (kept_count < order.size() && z[order[kept_count]] == kth) ++kept_count;
  }
  // Top-p over the top-k set: walk groups of equal z, keeping a group while the weight above it is
  // below p * (weight of the set).
  if (top_p < 1.0f) {
    double set_weight = 0;
    for (size_t r = 0; r < kept_count; ++r) set_weight += w[order[r]];
    const double limit = top_p > 0 ? static_cast<double>(top_p) * set_weight : 0.0;
    double above = 0;
    size_t r = 0;
    while (r < kept_count) {
      if (r > 0 && !(above < limit)) break;  // the maximum's group is always kept
      size_t end = r;
      double group = 0;
      while (end < kept_count && z[order[end]] == z[order[r]]) group += w[order[end++]];
      above += group;
      r = end;
    }
    kept_count = r;
  }
  for (size_t r = 0; r < kept_count; ++r) {
    const int32_t i = order[r];
    if (min_p > 0 && w[i] < static_cast<double>(min_p)) continue;
    d.kept[i] = true;
    d.weights[i] = w[i];
  }
  double total = 0;
  int32_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (d.kept[i]) {
      total += d.weights[i];
      last = static_cast<int32_t>(i);
    }
  }
  d.target = static_cast<double>(uniform) * total;
  d.token = last;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!d.kept[i]) continue;
    cumulative += d.weights[i];
    if (cumulative > d.target) {
      d.token = static_cast<int32_t>(i);
      break;
    }
  }
  return d;
}

void Sample(const SamplingParams& p) {
  CheckValid(p.Validate(), "Sample");
  const int64_t stride = p.logits_stride != 0 ? p.logits_stride : p.vocab_size;
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* row = p.logits + r * stride;
    if (!(p.temperature[r] > 0)) {
      ArgmaxParams argmax{row, p.output + r, 1, p.vocab_size};
      Argmax(argmax);
      continue;
    }
    const float u = UniformFromSeed(p.seeds[r], p.steps[r]);
    p.output[r] = SampleRow(row, p.vocab_size, p.temperature[r],
                            p.top_k != nullptr ? p.top_k[r] : 0,
                            p.top_p != nullptr ? p.top_p[r] : 1.0f,
                            p.min_p != nullptr ? p.min_p[r] : 0.0f, u)
                      .token;
  }
}

}  // namespace lmserve::kernels
