// CPU twins added for the CUDA kernels: Philox (Random123 known-answer vectors), the sampler's
// definition, and the rotary cos/sin table the GPU QKV post-processing reads.

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/qkv_postprocess.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/sampling.h"

namespace lmserve::kernels {
namespace {

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  const Philox4x32 zero = Philox4x32_10(0, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const Philox4x32 ones = Philox4x32_10(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0});
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  const Philox4x32 pi = Philox4x32_10(0x299f31d0a4093822u, 0x85a308d3243f6a88u, 0x0370734413198a2eu);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

std::vector<float> Logits(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

int32_t ArgmaxOf(const std::vector<float>& logits) {
  int32_t best = 0;
  Argmax({logits.data(), &best, 1, static_cast<int64_t>(logits.size())});
  return best;
}

TEST(SamplingTest, TopKOneAndTopPZeroAreGreedy) {
  const std::vector<float> logits = Logits(1000, 1, 3.0f);
  for (float u : {0.0f, 0.3f, 0.9999f}) {
    EXPECT_EQ(SampleRow(logits.data(), 1000, 0.7f, 1, 1.0f, 0.0f, u).token, ArgmaxOf(logits));
    EXPECT_EQ(SampleRow(logits.data(), 1000, 0.7f, 0, 0.0f, 0.0f, u).token, ArgmaxOf(logits));
  }
}

TEST(SamplingTest, FiltersKeepTheDefinedSets) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f, 2.0f, NAN};
  // Top-k 2 keeps both 3.0s; top-k 3 keeps the ties at 2.0 as well.
  SamplingDecision d = SampleRow(logits.data(), 8, 1.0f, 2, 1.0f, 0.0f, 0.5f);
  EXPECT_EQ(d.kept, (std::vector<bool>{false, true, false, true, false, false, false, false}));
  d = SampleRow(logits.data(), 8, 1.0f, 3, 1.0f, 0.0f, 0.5f);
  EXPECT_EQ(d.kept, (std::vector<bool>{false, true, true, true, false, false, true, false}));
  // Min-p 0.3: w = exp(z - 3) >= 0.3 keeps z >= 3 + ln 0.3 = 1.80.
  d = SampleRow(logits.data(), 8, 1.0f, 0, 1.0f, 0.3f, 0.5f);
  EXPECT_EQ(d.kept, (std::vector<bool>{false, true, true, true, false, false, true, false}));
  // Top-p: the two 3.0s hold 2 / 2.97 = 0.67 of the weight; p 0.6 keeps them only, p 0.7 adds 2.0s.
  d = SampleRow(logits.data(), 8, 1.0f, 0, 0.6f, 0.0f, 0.5f);
  EXPECT_EQ(d.kept, (std::vector<bool>{false, true, false, true, false, false, false, false}));
  d = SampleRow(logits.data(), 8, 1.0f, 0, 0.7f, 0.0f, 0.5f);
  EXPECT_EQ(d.kept, (std::vector<bool>{false, true, true, true, false, false, true, false}));
  EXPECT_FALSE(d.kept[7]);  // NaN never
}

TEST(SamplingTest, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f};
  std::vector<float> temperature(1, 1.0f);
  std::vector<double> freq(4, 0.0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const uint64_t seed = 77, step = static_cast<uint64_t>(i);
    int32_t a = -1, b = -1;
    SamplingParams p;
    p.logits = logits.data();
    p.temperature = temperature.data();
    p.seeds = &seed;
    p.steps = &step;
    p.num_rows = 1;
    p.vocab_size = 4;
    p.output = &a;
    Sample(p);
    p.output = &b;
    Sample(p);
    ASSERT_EQ(a, b);
    freq[a] += 1.0 / draws;
  }
  double z = 0;
  for (float x : logits) z += std::exp(x);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(freq[i], std::exp(logits[i]) / z, 0.015) << i;
}

// The table the GPU kernel reads rotates exactly as ApplyRotary does.
TEST(RotaryTableTest, RotatingWithTheTableMatchesApplyRotary) {
  const int64_t head_dim = 64, tokens = 5;
  std::vector<double> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / head_dim);
  const std::vector<float> table = RotaryCosSinTable(inv_freq.data(), head_dim, 4100);
  std::vector<float> q = Logits(tokens * head_dim, 3, 1.0f), expected = q;
  std::vector<int32_t> positions = {0, 1, 17, 4098, 97};
  RotaryParams rotary;
  rotary.query = expected.data();
  rotary.positions = positions.data();
  rotary.inv_freq = inv_freq.data();
  rotary.num_tokens = tokens;
  rotary.num_heads = 1;
  rotary.head_dim = head_dim;
  ApplyRotary(rotary);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = table.data() + positions[t] * head_dim;
    for (int64_t k = 0; k < head_dim / 2; ++k) {
      const float a = q[t * head_dim + k], b = q[t * head_dim + k + head_dim / 2];
      EXPECT_EQ(a * row[k] - b * row[head_dim / 2 + k], expected[t * head_dim + k]);
      EXPECT_EQ(a * row[head_dim / 2 + k] + b * row[k], expected[t * head_dim + k + head_dim / 2]);
    }
  }
}

}  // namespace
}  // namespace lmserve::kernels
