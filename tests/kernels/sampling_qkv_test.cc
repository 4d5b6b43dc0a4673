// CPU twins added for the CUDA kernels: Philox (Random123 known-answer vectors), the sampler's
// definition, the rotary cos/sin table the GPU QKV post-processing reads, and the QKV
// post-processing itself (bias, per-head q/k RMSNorm, partial rotary, cache write) against a naive
// reference.

#include <algorithm>
#include <cmath>
#include <string>
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

// The definition in kernels/cpu/sampling.h written out the plain way: a full sort of the row,
// every weight, flags for the kept set. SampleRow must decide exactly as this does.
SamplingDecision NaiveSampleRow(const float* logits, int64_t vocab_size, float temperature,
                                int32_t top_k, float top_p, float min_p, float uniform) {
  const auto n = static_cast<size_t>(vocab_size);
  SamplingDecision d;
  d.kept.assign(n, false);
  d.weights.assign(n, 0.0);
  std::vector<float> z(n);
  const float inv_temperature = 1.0f / temperature;
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    z[i] = logits[i] * inv_temperature;
    if (!std::isnan(z[i])) order.push_back(static_cast<int32_t>(i));
  }
  if (order.empty()) return d;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
  if (z[order[0]] == -INFINITY) return d;  // no finite maximum: token 0
  const double max_z = z[order[0]];
  std::vector<double> w(n, 0.0);
  for (int32_t i : order) w[i] = std::exp(static_cast<double>(z[i]) - max_z);
  size_t kept_count = order.size();
  if (top_k > 0 && static_cast<size_t>(top_k) < order.size()) {
    kept_count = static_cast<size_t>(top_k);
    while (kept_count < order.size() && z[order[kept_count]] == z[order[top_k - 1]]) ++kept_count;
  }
  if (top_p < 1.0f) {
    double set_weight = 0;
    for (size_t r = 0; r < kept_count; ++r) set_weight += w[order[r]];
    const double limit = top_p > 0 ? static_cast<double>(top_p) * set_weight : 0.0;
    double above = 0;
    size_t r = 0;
    while (r < kept_count && (r == 0 || above < limit)) {
      const float group_z = z[order[r]];
      while (r < kept_count && z[order[r]] == group_z) above += w[order[r++]];
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
  for (size_t i = 0; i < n; ++i) total += d.weights[i];
  d.target = static_cast<double>(uniform) * total;
  double cumulative = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!d.kept[i]) continue;
    d.token = static_cast<int32_t>(i);
    cumulative += d.weights[i];
    if (cumulative > d.target) break;
  }
  return d;
}

// Random rows with ties (logits rounded to a coarse grid), NaNs and -inf, at awkward sizes, under
// every combination of filters: the fast SampleRow keeps the same set, with the same weights, and
// draws the same token as the plain definition. (The two sum the top-p set's weight in different
// orders, so a group whose boundary falls within 1e-15 of p could differ: not in these rows.)
TEST(SamplingTest, SampleRowMatchesThePlainDefinition) {
  std::mt19937 rng(20261125);
  const int32_t kTopK[] = {0, 1, 2, 7, 50, 1000};
  const float kTopP[] = {1.0f, 0.0f, 0.3f, 0.9f, 0.999f};
  const float kMinP[] = {0.0f, 0.01f, 0.2f};
  int64_t rows = 0;
  for (int64_t vocab : {1, 3, 17, 97, 1000, 5003}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> logits = Logits(static_cast<size_t>(vocab), rng(), 2.5f);
      if (trial % 2 == 1) {
        for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;  // many ties
      }
      if (trial % 3 == 2 && vocab > 2) {
        logits[rng() % vocab] = NAN;
        logits[rng() % vocab] = -INFINITY;
      }
      for (int32_t top_k : kTopK) {
        for (float top_p : kTopP) {
          for (float min_p : kMinP) {
            const float temperature = 0.3f + 0.25f * static_cast<float>(rng() % 8);
            const float u = UniformFromSeed(rng(), rng());
            SCOPED_TRACE(::testing::Message()
                         << "vocab " << vocab << " trial " << trial << " k " << top_k << " p "
                         << top_p << " min_p " << min_p << " T " << temperature << " u " << u);
            const SamplingDecision fast =
                SampleRow(logits.data(), vocab, temperature, top_k, top_p, min_p, u);
            const SamplingDecision plain =
                NaiveSampleRow(logits.data(), vocab, temperature, top_k, top_p, min_p, u);
            ASSERT_EQ(fast.kept, plain.kept);
            ASSERT_EQ(fast.weights, plain.weights);
            ASSERT_EQ(fast.target, plain.target);
            ASSERT_EQ(fast.token, plain.token);
            ++rows;
          }
        }
      }
    }
  }
  EXPECT_EQ(rows, 6 * 6 * 6 * 5 * 3);
}

// No finite maximum (every logit -inf, or NaN and -inf): token 0, as the CUDA sampler returns.
TEST(SamplingTest, ARowWithoutAFiniteLogitGivesTokenZero) {
  const std::vector<float> masked = {-INFINITY, -INFINITY, NAN, -INFINITY};
  for (float u : {0.0f, 0.5f, 0.9999f}) {
    const SamplingDecision d = SampleRow(masked.data(), 4, 0.8f, 0, 0.9f, 0.05f, u);
    EXPECT_EQ(d.token, 0);
    EXPECT_EQ(d.kept, std::vector<bool>(4, false));
  }
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

// The table with partial rotary and an attention factor: rows rotary_dim wide, cos and sin scaled
// in double before rounding, exactly as ApplyRotary rotates.
TEST(RotaryTableTest, PartialRotaryWithAttentionFactorMatchesApplyRotary) {
  const int64_t head_dim = 96, rotary_dim = 32, tokens = 4;
  const double factor = 1.1902380714238083;
  std::vector<double> inv_freq(rotary_dim / 2);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / rotary_dim);
  const std::vector<float> table = RotaryCosSinTable(inv_freq.data(), rotary_dim, 5000, factor);
  ASSERT_EQ(table.size(), static_cast<size_t>(5000 * rotary_dim));
  std::vector<float> q = Logits(tokens * head_dim, 4, 1.0f), expected = q;
  std::vector<int32_t> positions = {0, 3, 4097, 4999};
  RotaryParams rotary;
  rotary.query = expected.data();
  rotary.positions = positions.data();
  rotary.inv_freq = inv_freq.data();
  rotary.num_tokens = tokens;
  rotary.num_heads = 1;
  rotary.head_dim = head_dim;
  rotary.rotary_dim = rotary_dim;
  rotary.attention_factor = factor;
  ApplyRotary(rotary);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = table.data() + positions[t] * rotary_dim;
    EXPECT_EQ(row[0], static_cast<float>(std::cos(positions[t] * inv_freq[0]) * factor));
    for (int64_t k = 0; k < half; ++k) {
      const float a = q[t * head_dim + k], b = q[t * head_dim + k + half];
      EXPECT_EQ(a * row[k] - b * row[half + k], expected[t * head_dim + k]);
      EXPECT_EQ(a * row[half + k] + b * row[k], expected[t * head_dim + k + half]);
    }
    for (int64_t d = rotary_dim; d < head_dim; ++d) {
      EXPECT_EQ(q[t * head_dim + d], expected[t * head_dim + d]);
    }
  }
}

// QKV post-processing written out the naive way in double: bias, then each query and key head
// RMS-normed and weighted, then the first rotary_dim dims rotated (cos and sin scaled), then Q out
// and K, V into the slots.
struct QkvCase {
  int64_t tokens = 0, heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;
  RotaryLayout layout = RotaryLayout::kHalfSplit;
  double factor = 1.0;
  bool bias = false, norm = false;
};

TEST(QkvPostProcessTest, BiasNormAndPartialRotaryMatchNaiveReference) {
  const int64_t block_size = 16;
  const float eps = 1e-6f;
  std::vector<QkvCase> cases;
  for (RotaryLayout layout : {RotaryLayout::kHalfSplit, RotaryLayout::kInterleaved}) {
    cases.push_back({17, 4, 2, 64, 0, layout, 1.0, true, true});      // Qwen3-like with a bias
    cases.push_back({5, 8, 1, 128, 64, layout, 1.0, false, true});    // norm, partial rotary
    cases.push_back({9, 3, 3, 96, 32, layout, 1.19, true, false});    // Phi-3 longrope-like
    cases.push_back({3, 2, 1, 256, 256, layout, 1.0, false, true});   // Gemma 3's head dim
    cases.push_back({4, 2, 2, 80, 16, layout, 0.9, true, true});      // everything at once
  }
  for (const QkvCase& k : cases) {
    const std::string what = "head_dim " + std::to_string(k.head_dim) + " rotary_dim " +
                             std::to_string(k.rotary_dim) + " layout " +
                             std::to_string(static_cast<int>(k.layout)) + " bias " +
                             std::to_string(k.bias) + " norm " + std::to_string(k.norm);
    const int64_t hd = k.head_dim, rd = k.rotary_dim != 0 ? k.rotary_dim : hd;
    const int64_t q_width = k.heads * hd, kv_width = k.kv_heads * hd;
    const int64_t row = q_width + 2 * kv_width, stride = row + 8;
    const std::vector<float> qkv = Logits(k.tokens * stride, 21, 2.0f);
    const std::vector<float> bias = Logits(row, 22, 0.5f);
    const std::vector<float> q_norm = Logits(hd, 23, 1.0f), k_norm = Logits(hd, 24, 1.0f);
    std::vector<double> inv_freq(rd / 2);
    for (int64_t i = 0; i < rd / 2; ++i) inv_freq[i] = std::pow(1e6, -2.0 * i / rd);
    std::vector<int32_t> positions(k.tokens);
    std::vector<int64_t> slots(k.tokens);
    for (int64_t t = 0; t < k.tokens; ++t) {
      positions[t] = static_cast<int32_t>(t * 37 + 3);
      slots[t] = t == 1 ? -1 : (k.tokens - 1 - t) * 3 + 1;  // token 1: padding, no write
    }
    const int64_t num_blocks = (3 * k.tokens + block_size) / block_size + 1;
    const int64_t cache_size = num_blocks * block_size * kv_width;
    std::vector<float> query_out(static_cast<size_t>(k.tokens * q_width), NAN);
    std::vector<float> key_cache(static_cast<size_t>(cache_size), -7.0f), value_cache = key_cache;
    const QkvPostProcessParams p{.qkv = qkv.data(),
                                 .bias = k.bias ? bias.data() : nullptr,
                                 .positions = positions.data(),
                                 .inv_freq = inv_freq.data(),
                                 .q_norm = k.norm ? q_norm.data() : nullptr,
                                 .k_norm = k.norm ? k_norm.data() : nullptr,
                                 .slot_mapping = slots.data(),
                                 .query_out = query_out.data(),
                                 .key_cache = key_cache.data(),
                                 .value_cache = value_cache.data(),
                                 .num_tokens = k.tokens,
                                 .num_heads = k.heads,
                                 .num_kv_heads = k.kv_heads,
                                 .head_dim = hd,
                                 .rotary_dim = k.rotary_dim,
                                 .block_size = block_size,
                                 .num_blocks = num_blocks,
                                 .qkv_stride = stride,
                                 .layout = k.layout,
                                 .attention_factor = k.factor,
                                 .norm_epsilon = eps};
    ASSERT_TRUE(p.Validate().ok()) << what << ": " << p.Validate();
    QkvPostProcess(p);

    for (int64_t t = 0; t < k.tokens; ++t) {
      std::vector<double> x(static_cast<size_t>(row));
      for (int64_t i = 0; i < row; ++i) x[i] = double{qkv[t * stride + i]} + (k.bias ? bias[i] : 0.0);
      for (int64_t h = 0; h < k.heads + 2 * k.kv_heads; ++h) {
        double* head = x.data() + h * hd;
        const bool is_query = h < k.heads, is_key = !is_query && h < k.heads + k.kv_heads;
        if (!is_query && !is_key) continue;
        if (k.norm) {
          // As the kernel: the fp32-rounded sum (bias added in fp32), normed in double.
          double sum = 0;
          for (int64_t d = 0; d < hd; ++d) {
            head[d] = static_cast<float>(head[d]);
            sum += head[d] * head[d];
          }
          const double inv = 1.0 / std::sqrt(sum / hd + eps);
          const std::vector<float>& w = is_query ? q_norm : k_norm;
          for (int64_t d = 0; d < hd; ++d) head[d] *= inv * w[d];
        }
        for (int64_t i = 0; i < rd / 2; ++i) {
          const int64_t ia = k.layout == RotaryLayout::kHalfSplit ? i : 2 * i;
          const int64_t ib = k.layout == RotaryLayout::kHalfSplit ? i + rd / 2 : 2 * i + 1;
          const double angle = positions[t] * inv_freq[i];
          const double c = std::cos(angle) * k.factor, s = std::sin(angle) * k.factor;
          const double a = head[ia], b = head[ib];
          head[ia] = a * c - b * s;
          head[ib] = a * s + b * c;
        }
      }
      for (int64_t i = 0; i < q_width; ++i) {
        ASSERT_NEAR(query_out[t * q_width + i], x[i], 1e-5 + 1e-5 * std::abs(x[i]))
            << what << ": token " << t << " query element " << i;
      }
      for (int64_t i = 0; i < kv_width; ++i) {
        if (slots[t] < 0) continue;
        const float key = key_cache[slots[t] * kv_width + i];
        const float value = value_cache[slots[t] * kv_width + i];
        ASSERT_NEAR(key, x[q_width + i], 1e-5 + 1e-5 * std::abs(x[q_width + i]))
            << what << ": token " << t << " key element " << i;
        ASSERT_NEAR(value, x[q_width + kv_width + i], 1e-6 + 1e-6 * std::abs(x[q_width + kv_width + i]))
            << what << ": token " << t << " value element " << i;
      }
    }
    // Slots nobody wrote keep their contents.
    int64_t untouched = 0;
    for (float v : key_cache) untouched += v == -7.0f;
    EXPECT_EQ(untouched, cache_size - (k.tokens - 1) * kv_width) << what;
  }
}

TEST(QkvPostProcessTest, ValidateRejectsHalfANormAndBadRotaryDim) {
  std::vector<float> qkv(3 * 32), out(32), cache(16 * 32), w(32);
  std::vector<int32_t> pos = {0};
  std::vector<int64_t> slot = {0};
  QkvPostProcessParams p{.qkv = qkv.data(),
                         .positions = pos.data(),
                         .slot_mapping = slot.data(),
                         .query_out = out.data(),
                         .key_cache = cache.data(),
                         .value_cache = cache.data(),
                         .num_tokens = 1,
                         .num_heads = 1,
                         .num_kv_heads = 1,
                         .head_dim = 32,
                         .block_size = 16,
                         .num_blocks = 1};
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  p.q_norm = w.data();
  EXPECT_FALSE(p.Validate().ok());
  p.k_norm = w.data();
  EXPECT_TRUE(p.Validate().ok());
  p.rotary_dim = 33;
  EXPECT_FALSE(p.Validate().ok());
  p.rotary_dim = 64;
  EXPECT_FALSE(p.Validate().ok());
  p.rotary_dim = 16;
  EXPECT_TRUE(p.Validate().ok());
  p.attention_factor = -1;
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace lmserve::kernels
