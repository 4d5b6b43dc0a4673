// The CPU mixture-of-experts kernels (kernels/cpu/moe.h) against naive definitions: routing
// against a float64 softmax over every expert and a full sort; the whole MLP against every token
// running its chosen experts one by one.

#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lmserve::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(MoeRoutingTest, MatchesSoftmaxThenSort) {
  std::mt19937 rng(7);
  for (const auto& [experts, top_k] :
       {std::pair<int64_t, int64_t>{4, 2}, {8, 2}, {128, 8}, {60, 4}, {3, 3}, {256, 1}}) {
    for (bool normalize : {true, false}) {
      const int64_t tokens = 17;
      std::vector<float> logits = Random(tokens * experts, rng, 4.0f);
      logits[5] = logits[6];  // a tie: the lower index first
      std::vector<int32_t> ids(tokens * top_k, -1);
      std::vector<float> weights(tokens * top_k, -1);
      MoeRouting({.logits = logits.data(),
                  .expert_ids = ids.data(),
                  .weights = weights.data(),
                  .num_tokens = tokens,
                  .num_experts = experts,
                  .top_k = top_k,
                  .normalize_top_k = normalize});
      for (int64_t t = 0; t < tokens; ++t) {
        const float* row = logits.data() + t * experts;
        std::vector<double> p(experts);
        double total = 0;
        for (int64_t e = 0; e < experts; ++e) total += p[e] = std::exp(double{row[e]});
        for (double& x : p) x /= total;
        std::vector<int32_t> order(experts);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return p[a] > p[b]; });
        double top = 0;
        for (int64_t k = 0; k < top_k; ++k) top += p[order[k]];
        for (int64_t k = 0; k < top_k; ++k) {
          EXPECT_EQ(ids[t * top_k + k], order[k]) << experts << " " << t << " " << k;
          const double want = normalize ? p[order[k]] / top : p[order[k]];
          EXPECT_NEAR(weights[t * top_k + k], want, 1e-7);
        }
      }
    }
  }
}

TEST(MoeGroupTest, GroupsSlotsByExpertInOrder) {
  const std::vector<int32_t> ids = {2, 0, 2, 1, 0, 2};
  std::vector<int32_t> offsets(5), sorted(ids.size());
  MoeGroupByExpert({.expert_ids = ids.data(),
                    .expert_offsets = offsets.data(),
                    .sorted_slots = sorted.data(),
                    .num_slots = 6,
                    .num_experts = 4});
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 2, 3, 6, 6}));
  EXPECT_EQ(sorted, (std::vector<int32_t>{1, 4, 3, 0, 2, 5}));
}

TEST(MoeTest, MatchesEachTokenRunningItsExperts) {
  std::mt19937 rng(3);
  const int64_t tokens = 19, hidden = 24, inter = 40, experts = 6, top_k = 2;
  const std::vector<float> x = Random(tokens * hidden, rng, 1.0f);
  const std::vector<float> router = Random(experts * hidden, rng, 0.5f);
  const std::vector<float> gate_up = Random(experts * 2 * inter * hidden, rng, 0.3f);
  const std::vector<float> down = Random(experts * hidden * inter, rng, 0.3f);
  std::vector<float> out(tokens * hidden, NAN);
  MoeWorkspace workspace;
  for (bool normalize : {true, false}) {
    Moe({.input = x.data(),
         .router = router.data(),
         .gate_up = gate_up.data(),
         .down = down.data(),
         .output = out.data(),
         .num_tokens = tokens,
         .hidden = hidden,
         .intermediate = inter,
         .num_experts = experts,
         .top_k = top_k,
         .normalize_top_k = normalize,
         .workspace = &workspace});
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = x.data() + t * hidden;
      std::vector<double> logits(experts);
      double max_logit = -INFINITY;
      for (int64_t e = 0; e < experts; ++e) {
        for (int64_t i = 0; i < hidden; ++i) logits[e] += double{router[e * hidden + i]} * xt[i];
        max_logit = std::max(max_logit, logits[e]);
      }
      std::vector<int32_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      double total = 0, top = 0;
      for (int64_t e = 0; e < experts; ++e) total += std::exp(logits[e] - max_logit);
      for (int64_t k = 0; k < top_k; ++k) top += std::exp(logits[order[k]] - max_logit);
      std::vector<double> want(hidden, 0.0);
      for (int64_t k = 0; k < top_k; ++k) {
        const int64_t e = order[k];
        const double w = std::exp(logits[e] - max_logit) / (normalize ? top : total);
        std::vector<double> act(inter);
        for (int64_t j = 0; j < inter; ++j) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < hidden; ++i) {
            g += double{gate_up[(e * 2 * inter + j) * hidden + i]} * xt[i];
            u += double{gate_up[(e * 2 * inter + inter + j) * hidden + i]} * xt[i];
          }
          act[j] = g / (1 + std::exp(-g)) * u;
        }
        for (int64_t o = 0; o < hidden; ++o) {
          double y = 0;
          for (int64_t j = 0; j < inter; ++j)
            y += double{down[(e * hidden + o) * inter + j]} * act[j];
          want[o] += w * y;
        }
      }
      for (int64_t o = 0; o < hidden; ++o) {
        EXPECT_NEAR(out[t * hidden + o], want[o], 1e-5) << "token " << t << " feature " << o;
      }
    }
  }
}

}  // namespace
}  // namespace lmserve::kernels
