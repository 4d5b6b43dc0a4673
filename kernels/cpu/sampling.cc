#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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

namespace {

// One row (temperature > 0) under the definition in sampling.h. Fills ws->candidates with the
// kept tokens in vocabulary order (its first `*num_kept` entries) and ws->weights with their w_i;
// returns the token and sets *target. All of it in `ws`'s buffers: no allocation once they have
// grown to the vocabulary.
int32_t SampleRowInto(const float* logits, int64_t vocab_size, float temperature, int32_t top_k,
                      float top_p, float min_p, float uniform, SamplingWorkspace* ws,
                      size_t* num_kept, double* target) {
  const auto n = static_cast<size_t>(vocab_size);
  *num_kept = 0;
  *target = 0;
  std::vector<float>& z = ws->z;
  z.resize(n);
  const float inv_temperature = 1.0f / temperature;
  float max_z = -INFINITY;
  size_t num_valid = 0;
  for (size_t i = 0; i < n; ++i) {
    z[i] = logits[i] * inv_temperature;
    if (!std::isnan(z[i])) {
      max_z = num_valid == 0 ? z[i] : std::max(max_z, z[i]);
      ++num_valid;
    }
  }
  // Every logit NaN or -inf: token 0, nothing kept (as the CUDA sampler does).
  if (num_valid == 0 || max_z == -INFINITY) return 0;

  // Top-k: every token whose z is at least the k-th largest (ties at the boundary kept).
  std::vector<int32_t>& candidates = ws->candidates;
  candidates.clear();
  if (top_k > 0 && static_cast<size_t>(top_k) < num_valid) {
    std::vector<float>& selection = ws->selection;
    selection.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!std::isnan(z[i])) selection.push_back(z[i]);
    }
    const auto kth = selection.begin() + (top_k - 1);
    std::nth_element(selection.begin(), kth, selection.end(), std::greater<float>());
    const float threshold = *kth;
    for (size_t i = 0; i < n; ++i) {
      if (z[i] >= threshold) candidates.push_back(static_cast<int32_t>(i));  // false for NaN
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (!std::isnan(z[i])) candidates.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<double>& w = ws->weights;
  w.resize(n);
  for (int32_t i : candidates) {
    w[i] = std::exp(static_cast<double>(z[i]) - static_cast<double>(max_z));
  }

  // Top-p over the top-k set: keep the groups of equal z, from the largest, while the weight above
  // a group is below p * (weight of the set); the maximum's group always. Found by selection, not
  // by sorting: [0, lo) of `order` is kept, [lo, hi) undecided, [hi, end) dropped, every undecided
  // z above every dropped one; each round partitions the undecided part around its median z.
  size_t kept = candidates.size();
  if (top_p < 1.0f) {
    double set_weight = 0;
    for (int32_t i : candidates) set_weight += w[i];
    const double limit = top_p > 0 ? static_cast<double>(top_p) * set_weight : 0.0;
    std::vector<int32_t>& order = ws->order;
    order.assign(candidates.begin(), candidates.end());
    auto larger_z = [&z](int32_t a, int32_t b) { return z[a] > z[b]; };
    size_t lo = 0, hi = order.size();
    double above = 0;  // the weight of [0, lo)
    while (lo < hi) {
      const auto first = order.begin() + static_cast<std::ptrdiff_t>(lo);
      const auto last = order.begin() + static_cast<std::ptrdiff_t>(hi);
      const auto middle = first + static_cast<std::ptrdiff_t>((hi - lo) / 2);
      std::nth_element(first, middle, last, larger_z);
      const float pivot = z[*middle];
      const auto gt_end = std::partition(first, last, [&](int32_t i) { return z[i] > pivot; });
      const auto eq_end = std::partition(gt_end, last, [&](int32_t i) { return z[i] == pivot; });
      double gt_weight = 0, eq_weight = 0;
      for (auto it = first; it != gt_end; ++it) gt_weight += w[*it];
      for (auto it = gt_end; it != eq_end; ++it) eq_weight += w[*it];
      if (gt_end != first && !(above + gt_weight < limit)) {
        hi = static_cast<size_t>(gt_end - order.begin());  // the cutoff is above the pivot's group
      } else if (gt_end == first && !(above < limit) && lo > 0) {
        hi = lo;  // the pivot's group is the first with too much weight above it
      } else {
        lo = static_cast<size_t>(eq_end - order.begin());  // everything down to the pivot's group
        above += gt_weight + eq_weight;
      }
    }
    kept = lo;
    if (kept < candidates.size()) {  // back to vocabulary order, without sorting
      std::vector<uint8_t>& flags = ws->flags;
      flags.assign(n, 0);
      for (size_t r = 0; r < kept; ++r) flags[order[r]] = 1;
      size_t out = 0;
      for (int32_t i : candidates) {
        if (flags[i] != 0) candidates[out++] = i;
      }
    }
  }
  // Min-p, then the draw: the first kept token, in vocabulary order, whose cumulative weight
  // exceeds u * total.
  if (min_p > 0) {
    size_t out = 0;
    for (size_t r = 0; r < kept; ++r) {
      if (!(w[candidates[r]] < static_cast<double>(min_p))) candidates[out++] = candidates[r];
    }
    kept = out;
  }
  *num_kept = kept;
  if (kept == 0) return 0;  // min-p above 1
  double total = 0;
  for (size_t r = 0; r < kept; ++r) total += w[candidates[r]];
  *target = static_cast<double>(uniform) * total;
  double cumulative = 0;
  for (size_t r = 0; r < kept; ++r) {
    cumulative += w[candidates[r]];
    if (cumulative > *target) return candidates[r];
  }
  return candidates[kept - 1];
}

}  // namespace

SamplingDecision SampleRow(const float* logits, int64_t vocab_size, float temperature,
                           int32_t top_k, float top_p, float min_p, float uniform) {
  SamplingWorkspace ws;
  size_t num_kept = 0;
  SamplingDecision d;
  d.token = SampleRowInto(logits, vocab_size, temperature, top_k, top_p, min_p, uniform, &ws,
                          &num_kept, &d.target);
  d.kept.assign(static_cast<size_t>(vocab_size), false);
  d.weights.assign(static_cast<size_t>(vocab_size), 0.0);
  for (size_t r = 0; r < num_kept; ++r) {
    const int32_t i = ws.candidates[r];
    d.kept[i] = true;
    d.weights[i] = ws.weights[i];
  }
  return d;
}

void Sample(const SamplingParams& p) {
  CheckValid(p.Validate(), "Sample");
  const int64_t stride = p.logits_stride != 0 ? p.logits_stride : p.vocab_size;
  SamplingWorkspace own;
  SamplingWorkspace* ws = p.workspace != nullptr ? p.workspace : &own;
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* row = p.logits + r * stride;
    if (!(p.temperature[r] > 0)) {
      ArgmaxParams argmax{row, p.output + r, 1, p.vocab_size};
      Argmax(argmax);
      continue;
    }
    const float u = UniformFromSeed(p.seeds[r], p.steps[r]);
    size_t num_kept = 0;
    double target = 0;
    p.output[r] =
        SampleRowInto(row, p.vocab_size, p.temperature[r], p.top_k != nullptr ? p.top_k[r] : 0,
                      p.top_p != nullptr ? p.top_p[r] : 1.0f,
                      p.min_p != nullptr ? p.min_p[r] : 0.0f, u, ws, &num_kept, &target);
  }
}

void ApplyTokenBitmask(float* logits, const uint32_t* bitmask, int64_t vocab_size) {
  for (int64_t t = 0; t < vocab_size; ++t) {
    if (((bitmask[t >> 5] >> (t & 31)) & 1u) == 0) {
      logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace lmserve::kernels
