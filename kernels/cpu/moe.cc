#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/linear.h"

namespace lmserve::kernels {
namespace {

template <typename T>
void Grow(std::vector<T>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
}

absl::Status CheckExperts(const char* kernel, int64_t num_experts, int64_t top_k) {
  if (num_experts < 1 || num_experts > kMaxMoeExperts || top_k < 1 ||
      top_k > std::min(num_experts, kMaxMoeTopK)) {
    return absl::InvalidArgumentError(
        StrCat(kernel, ": ", num_experts, " experts, top ", top_k, " are not supported (1 to ",
               kMaxMoeExperts, " experts, top 1 to min(experts, ", kMaxMoeTopK, "))"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRoutingParams::Validate() const {
  if (absl::Status s = CheckExperts("MoeRouting", num_experts, top_k); !s.ok()) return s;
  if (num_tokens < 0) return absl::InvalidArgumentError("MoeRouting: negative num_tokens");
  if (num_tokens > 0 && (logits == nullptr || expert_ids == nullptr || weights == nullptr)) {
    return absl::InvalidArgumentError("MoeRouting: null pointer");
  }
  return absl::OkStatus();
}

void MoeRouting(const MoeRoutingParams& p) {
  CheckValid(p.Validate(), "MoeRouting");
  const int64_t num_experts = p.num_experts, top_k = p.top_k;
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* logits = p.logits + t * num_experts;
    // The top-k of the weights are those of the logits (softmax is monotonic).
    for (int64_t e = 0; e < num_experts; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [logits](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    double max_logit = logits[order[0]];
    double total = 0;
    for (int64_t e = 0; e < num_experts; ++e) total += std::exp(double{logits[e]} - max_logit);
    double top_total = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      top_total += std::exp(double{logits[order[k]]} - max_logit);
    }
    const double denominator = p.normalize_top_k ? top_total : total;
    for (int64_t k = 0; k < top_k; ++k) {
      p.expert_ids[t * top_k + k] = order[k];
      p.weights[t * top_k + k] =
          static_cast<float>(std::exp(double{logits[order[k]]} - max_logit) / denominator);
    }
  }
}

absl::Status MoeGroupParams::Validate() const {
  if (num_experts < 1 || num_experts > kMaxMoeExperts || num_slots < 0) {
    return absl::InvalidArgumentError(
        StrCat("MoeGroupByExpert: ", num_slots, " slots over ", num_experts, " experts"));
  }
  if (expert_offsets == nullptr ||
      (num_slots > 0 && (expert_ids == nullptr || sorted_slots == nullptr))) {
    return absl::InvalidArgumentError("MoeGroupByExpert: null pointer");
  }
  return absl::OkStatus();
}

void MoeGroupByExpert(const MoeGroupParams& p) {
  CheckValid(p.Validate(), "MoeGroupByExpert");
  std::fill(p.expert_offsets, p.expert_offsets + p.num_experts + 1, 0);
  for (int64_t s = 0; s < p.num_slots; ++s) {
    const int32_t e = p.expert_ids[s];
    CheckValid(e >= 0 && e < p.num_experts ? absl::OkStatus()
                                           : absl::InvalidArgumentError("expert id out of range"),
               "MoeGroupByExpert");
    ++p.expert_offsets[e + 1];
  }
  for (int64_t e = 0; e < p.num_experts; ++e) p.expert_offsets[e + 1] += p.expert_offsets[e];
  std::vector<int32_t> cursor(p.expert_offsets, p.expert_offsets + p.num_experts);
  for (int64_t s = 0; s < p.num_slots; ++s) {
    p.sorted_slots[cursor[p.expert_ids[s]]++] = static_cast<int32_t>(s);
  }
}

absl::Status MoeParams::Validate() const {
  if (absl::Status s = CheckExperts("Moe", num_experts, top_k); !s.ok()) return s;
  if (num_tokens < 0 || hidden <= 0 || intermediate <= 0) {
    return absl::InvalidArgumentError(StrCat("Moe: bad shape: ", num_tokens, " tokens, hidden ",
                                             hidden, ", intermediate ", intermediate));
  }
  if (num_tokens > 0 && (input == nullptr || router == nullptr || gate_up == nullptr ||
                         down == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("Moe: null pointer");
  }
  if (num_tokens > 0 && input == output) {
    return absl::InvalidArgumentError("Moe: output may not alias input");
  }
  return absl::OkStatus();
}

void Moe(const MoeParams& p) {
  CheckValid(p.Validate(), "Moe");
  if (p.num_tokens == 0) return;
  MoeWorkspace local;
  MoeWorkspace& w = p.workspace != nullptr ? *p.workspace : local;
  const int64_t tokens = p.num_tokens, hidden = p.hidden, inter = p.intermediate;
  const int64_t experts = p.num_experts, top_k = p.top_k, slots = tokens * top_k;
  Grow(&w.router_logits, tokens * experts);
  Grow(&w.weights, slots);
  Grow(&w.expert_ids, slots);
  Grow(&w.expert_offsets, experts + 1);
  Grow(&w.sorted_slots, slots);
  Linear({.input = p.input,
          .weight = p.router,
          .output = w.router_logits.data(),
          .num_tokens = tokens,
          .in_features = hidden,
          .out_features = experts});
  MoeRouting({.logits = w.router_logits.data(),
              .expert_ids = w.expert_ids.data(),
              .weights = w.weights.data(),
              .num_tokens = tokens,
              .num_experts = experts,
              .top_k = top_k,
              .normalize_top_k = p.normalize_top_k});
  MoeGroupByExpert({.expert_ids = w.expert_ids.data(),
                    .expert_offsets = w.expert_offsets.data(),
                    .sorted_slots = w.sorted_slots.data(),
                    .num_slots = slots,
                    .num_experts = experts});
  std::fill(p.output, p.output + tokens * hidden, 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = w.expert_offsets[e], count = w.expert_offsets[e + 1] - begin;
    if (count == 0) continue;
    Grow(&w.rows, count * hidden);
    Grow(&w.gate_up, count * 2 * inter);
    Grow(&w.act, count * inter);
    Grow(&w.expert_out, count * hidden);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t token = w.sorted_slots[begin + r] / top_k;
      std::copy_n(p.input + token * hidden, hidden, w.rows.data() + r * hidden);
    }
    Linear({.input = w.rows.data(),
            .weight = p.gate_up + e * 2 * inter * hidden,
            .output = w.gate_up.data(),
            .num_tokens = count,
            .in_features = hidden,
            .out_features = 2 * inter});
    SiluAndMul({.gate_up = w.gate_up.data(),
                .output = w.act.data(),
                .num_tokens = count,
                .intermediate_size = inter});
    Linear({.input = w.act.data(),
            .weight = p.down + e * hidden * inter,
            .output = w.expert_out.data(),
            .num_tokens = count,
            .in_features = inter,
            .out_features = hidden});
    // The experts' outputs join each token's sum in expert order (as transformers' index_add_).
    for (int64_t r = 0; r < count; ++r) {
      const int32_t slot = w.sorted_slots[begin + r];
      const float weight = w.weights[slot];
      float* out = p.output + (slot / top_k) * hidden;
      const float* y = w.expert_out.data() + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) out[i] += weight * y[i];
    }
  }
}

}  // namespace lmserve::kernels
