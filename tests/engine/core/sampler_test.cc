#include "engine/core/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/sampling.h"

namespace lmserve::engine {
namespace {

// ---- Chi-square goodness of fit --------------------------------------------------------------
// The p-value is the chi-square survival function Q(df/2, statistic/2), the regularized upper
// incomplete gamma function (series below a + 1, Lentz's continued fraction above).
double UpperIncompleteGammaQ(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double sum = 1.0 / a, term = sum;
    for (int n = 1; n < 10000 && std::fabs(term) > 1e-17 * std::fabs(sum); ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

struct ChiSquare {
  double statistic = 0.0;
  int degrees_of_freedom = 0;
  double p_value = 1.0;
  bool impossible_draw = false;  // a draw where the expected probability is zero
};

ChiSquare ChiSquareTest(const std::vector<int>& counts, const std::vector<double>& expected_probs) {
  const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
  ChiSquare result;
  int categories = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected_probs[i] <= 0.0) {
      if (counts[i] > 0) result.impossible_draw = true;
      continue;
    }
    const double expected = total * expected_probs[i];
    result.statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++categories;
  }
  result.degrees_of_freedom = categories - 1;
  result.p_value = result.impossible_draw ? 0.0
                                          : UpperIncompleteGammaQ(result.degrees_of_freedom / 2.0,
                                                                  result.statistic / 2.0);
  return result;
}

// A deterministic threshold: with fixed seeds the draws are fixed, and a correct sampler lands far
// above it, while a wrong distribution lands far below it.
constexpr double kPValueThreshold = 1e-6;
constexpr int kNumDraws = 40000;

TEST(ChiSquareTest, PValuesMatchKnownQuantiles) {
  // Chi-square quantiles: df 1, p 0.05 -> 3.841; df 7, p 0.01 -> 18.475; df 3, p 1e-6 -> 30.66.
  EXPECT_NEAR(UpperIncompleteGammaQ(0.5, 3.841459 / 2), 0.05, 1e-6);
  EXPECT_NEAR(UpperIncompleteGammaQ(3.5, 18.475307 / 2), 0.01, 1e-6);
  EXPECT_NEAR(UpperIncompleteGammaQ(1.5, 30.664 / 2), 1e-6, 2e-8);
}

// ---- The reference distribution, written out from the definitions ------------------------------
const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.6f, 0.2f, -0.5f, -1.0f, -2.5f};

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - max_logit) / temperature);
    sum += p[i];
  }
  for (double& value : p) value /= sum;
  return p;
}

// kLogits are sorted, so "the k most likely" are indices [0, k).
std::vector<double> Expected(double temperature, int top_k, double top_p, double min_p) {
  std::vector<double> p = Softmax(kLogits, temperature);
  if (top_k > 0) {
    for (size_t i = static_cast<size_t>(top_k); i < p.size(); ++i) p[i] = 0.0;
  }
  double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& value : p) value /= sum;
  // Smallest prefix of the sorted distribution whose mass reaches top_p.
  double cumulative = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (cumulative >= top_p) p[i] = 0.0;
    cumulative += p[i];
  }
  const double top = p[0];
  for (double& value : p) {
    if (value < min_p * top) value = 0.0;
  }
  sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& value : p) value /= sum;
  return p;
}

// kNumDraws draws of one request's sample 0, at positions 0, 1, 2, ...
std::vector<int> Draw(const SamplingParams& params, uint64_t seed) {
  Sampler sampler(static_cast<int64_t>(kLogits.size()));
  std::vector<int> counts(kLogits.size(), 0);
  const uint64_t key = kernels::SampleStreamKey(seed, 0);
  for (int i = 0; i < kNumDraws; ++i) {
    const int32_t token = sampler.Sample(kLogits, params, {}, {}, {}, key, i);
    ++counts[static_cast<size_t>(token)];
  }
  return counts;
}

struct DistributionCase {
  const char* name;
  double temperature;
  int top_k;
  double top_p;
  double min_p;
};

class SamplerDistributionTest : public ::testing::TestWithParam<DistributionCase> {};

TEST_P(SamplerDistributionTest, MatchesTheDefinitionAndRejectsAWrongOne) {
  const DistributionCase& c = GetParam();
  SamplingParams params;
  params.temperature = c.temperature;
  params.top_k = c.top_k;
  params.top_p = c.top_p;
  params.min_p = c.min_p;
  const std::vector<int> counts = Draw(params, /*seed=*/20240601);
  const ChiSquare fit = ChiSquareTest(counts, Expected(c.temperature, c.top_k, c.top_p, c.min_p));
  EXPECT_FALSE(fit.impossible_draw) << "drew a token the filters exclude";
  EXPECT_GT(fit.p_value, kPValueThreshold)
      << "chi2 " << fit.statistic << " df " << fit.degrees_of_freedom;

  // The same test rejects a subtly wrong expectation: temperature off by 15%.
  const ChiSquare wrong_temperature =
      ChiSquareTest(counts, Expected(c.temperature * 1.15, c.top_k, c.top_p, c.min_p));
  EXPECT_LT(wrong_temperature.p_value, kPValueThreshold)
      << "chi2 " << wrong_temperature.statistic << " df " << wrong_temperature.degrees_of_freedom;
  std::printf("%s: p %.3g (right), %.3g (temperature x1.15)\n", c.name, fit.p_value,
              wrong_temperature.p_value);
  // ... and the untruncated distribution, where a filter is on.
  if (c.top_k > 0 || c.top_p < 1.0 || c.min_p > 0.0) {
    const ChiSquare unfiltered = ChiSquareTest(counts, Expected(c.temperature, 0, 1.0, 0.0));
    EXPECT_LT(unfiltered.p_value, kPValueThreshold);
  }
}

INSTANTIATE_TEST_SUITE_P(Filters, SamplerDistributionTest,
                         ::testing::Values(DistributionCase{"temperature_1", 1.0, 0, 1.0, 0.0},
                                           DistributionCase{"temperature_0_5", 0.5, 0, 1.0, 0.0},
                                           DistributionCase{"temperature_1_7", 1.7, 0, 1.0, 0.0},
                                           DistributionCase{"top_k_3", 1.0, 3, 1.0, 0.0},
                                           DistributionCase{"top_p_0_8", 1.0, 0, 0.8, 0.0},
                                           DistributionCase{"min_p_0_1", 1.0, 0, 1.0, 0.1},
                                           DistributionCase{"all_filters", 1.3, 6, 0.95, 0.05}),
                         [](const ::testing::TestParamInfo<DistributionCase>& info) {
                           return info.param.name;
                         });

TEST(SamplerTest, TheFixtureDistributionsReallyAreTruncated) {
  // Guards the cases above against vacuous filters.
  const std::vector<double> top_p = Expected(1.0, 0, 0.8, 0.0);
  EXPECT_EQ(std::count(top_p.begin(), top_p.end(), 0.0), 4);
  const std::vector<double> min_p = Expected(1.0, 0, 1.0, 0.1);
  EXPECT_EQ(std::count(min_p.begin(), min_p.end(), 0.0), 3);
  const std::vector<double> all = Expected(1.3, 6, 0.95, 0.05);
  EXPECT_GE(std::count(all.begin(), all.end(), 0.0), 2);
}

// Top-p over a large, flat vocabulary (the nucleus holds hundreds of tokens, so the selection's
// growing partial sort must extend several times) picks exactly what the definition in
// kernels/cpu/sampling.h gives with a full sort: z = logit * (1/T) in fp32, w = exp(z - max z),
// the nucleus the tokens with less than p of the weight above them, and the draw walking the
// nucleus in vocabulary order. (The engine's sampler before the one definition walked it in
// probability order; a draw u then picks another token, the distribution being the same.)
TEST(SamplerTest, TopPOnALargeFlatVocabularyMatchesAFullSort) {
  constexpr int kVocab = 5000;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[i] = SampleUniform(99, 0, i) * 3.0f;
  SamplingParams params;
  params.temperature = 1.3;
  params.top_p = 0.7;
  const float inverse_temperature = 1.0f / static_cast<float>(params.temperature);
  std::vector<float> z(kVocab);
  for (int i = 0; i < kVocab; ++i) z[i] = logits[i] * inverse_temperature;
  const float max_z = *std::max_element(z.begin(), z.end());
  std::vector<double> w(kVocab);
  for (int i = 0; i < kVocab; ++i) w[i] = std::exp(double{z[i]} - double{max_z});
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
  double total = 0.0;
  for (int32_t id : order) total += w[id];
  std::vector<bool> kept(kVocab, false);
  double above = 0.0;
  size_t num_kept = 0;
  for (int32_t id : order) {
    if (num_kept > 0 && !(above < static_cast<float>(params.top_p) * total)) break;
    kept[id] = true;
    above += w[id];
    ++num_kept;
  }
  ASSERT_GT(num_kept, 1000u) << "the nucleus should be large";
  double kept_total = 0.0;
  for (int i = 0; i < kVocab; ++i) kept_total += kept[i] ? w[i] : 0.0;

  Sampler sampler(kVocab);
  const uint64_t key = kernels::SampleStreamKey(5, 0);
  for (int draw = 0; draw < 200; ++draw) {
    const double target = double{kernels::UniformFromSeed(key, draw)} * kept_total;
    double running = 0.0;
    int32_t expected = -1;
    for (int i = 0; i < kVocab && expected < 0; ++i) {
      if (!kept[i]) continue;
      running += w[i];
      if (running > target) expected = i;
    }
    ASSERT_EQ(sampler.Sample(logits, params, {}, {}, {}, key, draw), expected) << "draw " << draw;
  }
}

int32_t Greedy(const std::vector<float>& logits, SamplingParams params,
               std::vector<int32_t> prompt = {}, std::vector<int32_t> output = {},
               std::vector<int32_t> eos = {});

// ---- One definition with the device sampler ---------------------------------------------------
// For the same seed, sample index, position and float32 logits, the engine's Sampler (no
// engine-only processing asked for) draws the token that kernels::Sample draws: the CPU twin of
// the CUDA sampler, and what the CPU runner runs for LogitsMode::kSample. kernels::Sample gets
// what engine_core.cc hands the runner: the settings cast to float (0.7 is not a float), Philox
// key kernels::SampleStreamKey(seed, sample index), counter the position. Random rows at awkward
// sizes, every filter combination, ties (logits on a coarse grid), NaN and -inf entries.
TEST(SamplerTest, DrawsWhatTheDeviceSamplersCpuTwinDraws) {
  struct Setting {
    double temperature;
    int32_t top_k;
    double top_p;
    double min_p;
  };
  const std::vector<Setting> settings = {
      {0.0, 0, 1.0, 0.0},  {1.0, 0, 1.0, 0.0},   {0.7, 50, 1.0, 0.0},    {1.0, 1, 1.0, 0.0},
      {1.0, 0, 0.9, 0.0},  {0.8, 40, 0.95, 0.0}, {1.0, 0, 1.0, 0.05},    {1.2, 1000, 0.5, 0.02},
      {1.0, 0, 0.0, 0.0},  {2.0, 0, 0.99, 0.0},  {0.5, 5, 0.3, 0.1},     {1.3, 7, 0.8, 0.05},
      {0.9, 0, 0.6, 0.01}, {1.1, 3, 1.0, 0.2},   {0.6, 20000, 0.97, 0.0}};
  std::mt19937_64 rng(20261125);
  int64_t rows = 0, sampled = 0, distinct_from_greedy = 0;
  for (int64_t vocab : {2, 17, 1000, 32003}) {
    Sampler sampler(vocab);
    for (int trial = 0; trial < 6; ++trial) {
      std::normal_distribution<float> normal(0.0f, trial % 3 == 2 ? 0.1f : 3.0f);
      std::vector<float> logits(static_cast<size_t>(vocab));
      for (float& x : logits) x = normal(rng);
      if (trial % 2 == 1) {
        for (float& x : logits) x = std::round(x * 4.0f) / 4.0f;  // ties
      }
      if (trial == 4 && vocab > 2) {
        logits[rng() % vocab] = NAN;
        logits[rng() % vocab] = -INFINITY;
      }
      for (const Setting& setting : settings) {
        for (int draw = 0; draw < 4; ++draw) {
          const uint64_t seed = rng();
          const auto sample_index = static_cast<int32_t>(rng() % 8);
          const auto position = static_cast<int64_t>(rng() % 100000);
          SamplingParams params;
          params.temperature = setting.temperature;
          params.top_k = setting.top_k;
          params.top_p = setting.top_p;
          params.min_p = setting.min_p;
          const uint64_t key = kernels::SampleStreamKey(seed, static_cast<uint64_t>(sample_index));
          const int32_t engine = sampler.Sample(logits, params, {}, {}, {}, key, position);

          const float temperature = static_cast<float>(setting.temperature);
          const float top_p = static_cast<float>(setting.top_p);
          const float min_p = static_cast<float>(setting.min_p);
          const auto step = static_cast<uint64_t>(position);
          int32_t twin = -1;
          kernels::Sample({.logits = logits.data(),
                           .output = &twin,
                           .temperature = &temperature,
                           .top_k = &setting.top_k,
                           .top_p = &top_p,
                           .min_p = &min_p,
                           .seeds = &key,
                           .steps = &step,
                           .num_rows = 1,
                           .vocab_size = vocab});
          ASSERT_EQ(engine, twin) << "vocab " << vocab << " trial " << trial << " T "
                                  << setting.temperature << " k " << setting.top_k << " p "
                                  << setting.top_p << " min_p " << setting.min_p;
          ++rows;
          if (setting.temperature > 0) {
            ++sampled;
            if (engine != Greedy(logits, params)) ++distinct_from_greedy;
          }
        }
      }
    }
  }
  EXPECT_EQ(rows, 4 * 6 * 15 * 4);
  EXPECT_GT(distinct_from_greedy, sampled / 4) << "the draws should not all be the argmax";
}

// ---- Exact behaviours -----------------------------------------------------------------------
int32_t Greedy(const std::vector<float>& logits, SamplingParams params, std::vector<int32_t> prompt,
               std::vector<int32_t> output, std::vector<int32_t> eos) {
  params.temperature = 0.0;
  Sampler sampler(static_cast<int64_t>(logits.size()));
  return sampler.Sample(logits, params, prompt, output, eos, /*stream_key=*/0, /*position=*/0);
}

TEST(SamplerTest, GreedyPicksTheLowestIdAmongEqualMaxima) {
  EXPECT_EQ(Greedy({0.0f, 3.0f, 1.0f, 3.0f}, {}), 1);
}

TEST(SamplerTest, TopKOfOneIsGreedyAtAnyTemperature) {
  SamplingParams params;
  params.temperature = 5.0;
  params.top_k = 1;
  Sampler sampler(4);
  const std::vector<float> logits = {0.0f, 1.0f, 0.9f, 0.95f};
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(sampler.Sample(logits, params, {}, {}, {}, kernels::SampleStreamKey(1, 0), i), 1);
  }
}

TEST(SamplerTest, LogitBiasIsAddedBeforeEverythingElse) {
  SamplingParams params;
  params.logit_bias = {{2, 1.5f}};
  EXPECT_EQ(Greedy({1.0f, 2.0f, 0.6f}, params), 2);  // 0.6 + 1.5 > 2.0
  params.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Greedy({1.0f, 2.0f, 0.6f}, params), 0);
}

TEST(SamplerTest, PenaltiesFollowTheirFormulas) {
  const std::vector<float> logits = {1.0f, 0.9f, -1.0f, -1.1f};
  SamplingParams params;
  // Frequency: 1.0 - 2 * 0.1 = 0.8 < 0.9; with 0.04: 0.92 > 0.9.
  params.frequency_penalty = 0.1;
  EXPECT_EQ(Greedy(logits, params, {}, {0, 0}), 1);
  params.frequency_penalty = 0.04;
  EXPECT_EQ(Greedy(logits, params, {}, {0, 0}), 0);
  // Frequency does not count prompt tokens.
  params.frequency_penalty = 0.1;
  EXPECT_EQ(Greedy(logits, params, {0, 0}, {}), 0);
  // Presence: once, however many times: 1.0 - 0.15 = 0.85 < 0.9; 1.0 - 0.05 = 0.95.
  params = {};
  params.presence_penalty = 0.15;
  EXPECT_EQ(Greedy(logits, params, {}, {0, 0, 0}), 1);
  params.presence_penalty = 0.05;
  EXPECT_EQ(Greedy(logits, params, {}, {0, 0, 0}), 0);
  // Repetition divides a positive logit (1.0 / 1.2 = 0.83 < 0.9), prompt tokens included ...
  params = {};
  params.repetition_penalty = 1.2;
  EXPECT_EQ(Greedy(logits, params, {0}, {}), 1);
  EXPECT_EQ(Greedy(logits, params, {}, {0}), 1);
  // ... and multiplies a negative one: -1.0 * 1.2 = -1.2 < -1.1.
  EXPECT_EQ(Greedy({-1.0f, -1.1f}, params, {0}, {}), 1);
  EXPECT_EQ(Greedy({-1.0f, -1.1f}, params, {1}, {}), 0);
  // Applied once per distinct token, however often it occurs.
  params.repetition_penalty = 1.05;  // 1.0 / 1.05 = 0.952 > 0.9; twice would be 0.907
  EXPECT_EQ(Greedy({1.0f, 0.93f}, params, {0, 0}, {0}), 0);
}

TEST(SamplerTest, MinTokensSuppressesEosAndStopTokensUnlessIgnoreEos) {
  const std::vector<float> logits = {5.0f, 1.0f, 4.0f, 3.0f};  // EOS 0 and stop token 2 lead
  SamplingParams params;
  params.min_tokens = 2;
  params.stop_token_ids = {2};
  EXPECT_EQ(Greedy(logits, params, {1}, {1}, /*eos=*/{0}), 3);     // 1 output < 2
  EXPECT_EQ(Greedy(logits, params, {1}, {1, 1}, /*eos=*/{0}), 0);  // 2 outputs: allowed
  params.ignore_eos = true;
  EXPECT_EQ(Greedy(logits, params, {1}, {1}, /*eos=*/{0}), 0);  // EOS is an ordinary token
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxWithRankAndTopN) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  Sampler sampler(5);
  const PositionLogprobs result = sampler.Logprobs(logits, 2, 3);
  double normalizer = 0.0;
  for (float logit : logits) normalizer += std::exp(logit);
  normalizer = std::log(normalizer);
  EXPECT_EQ(result.token_id, 2);
  EXPECT_NEAR(result.logprob, 2.0 - normalizer, 1e-6);
  EXPECT_EQ(result.rank, 3);
  ASSERT_EQ(result.top.size(), 3u);
  EXPECT_EQ(result.top[0].token_id, 1);  // ties: lower id first
  EXPECT_EQ(result.top[1].token_id, 3);
  EXPECT_EQ(result.top[2].token_id, 2);
  EXPECT_NEAR(result.top[0].logprob, 3.0 - normalizer, 1e-6);
  EXPECT_TRUE(sampler.Logprobs(logits, 4, 0).top.empty());
}

TEST(SamplerTest, SampleUniformIsAPureFunctionOfSeedSampleAndPosition) {
  // The one definition: Philox keyed by the request-sample's stream, the position as counter.
  EXPECT_EQ(SampleUniform(7, 2, 10),
            kernels::UniformFromSeed(kernels::SampleStreamKey(7, 2), /*step=*/10));
  EXPECT_EQ(SampleUniform(7, 0, 10), SampleUniform(7, 0, 10));
  EXPECT_NE(SampleUniform(7, 0, 10), SampleUniform(8, 0, 10));
  EXPECT_NE(SampleUniform(7, 0, 10), SampleUniform(7, 1, 10));
  EXPECT_NE(SampleUniform(7, 0, 10), SampleUniform(7, 0, 11));
  double sum = 0.0;
  for (int i = 0; i < 100000; ++i) {
    const double u = SampleUniform(3, 0, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

}  // namespace
}  // namespace lmserve::engine
