// The element-wise, normalization, rotary, linear and argmax CPU kernels against naive
// double-precision references computed here, at awkward sizes, with poisoned output buffers.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rotary.h"

namespace lmserve::kernels {
namespace {

using ::testing::HasSubstr;

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Max |a - b| / (atol + rtol |b|) must stay below 1.
void ExpectNear(const std::vector<float>& actual, const std::vector<double>& expected, double atol,
                double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = atol + rtol * std::abs(expected[i]);
    ASSERT_LE(std::abs(actual[i] - expected[i]), tol)
        << what << ": element " << i << " is " << actual[i] << ", expected " << expected[i];
  }
}

std::vector<double> RmsNormReference(const std::vector<float>& x, const std::vector<float>& w,
                                     int64_t tokens, int64_t hidden, double eps) {
  std::vector<double> out(static_cast<size_t>(tokens * hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < hidden; ++i) sum += double{x[t * hidden + i]} * x[t * hidden + i];
    const double inv = 1.0 / std::sqrt(sum / hidden + eps);
    for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] = x[t * hidden + i] * inv * w[i];
  }
  return out;
}

TEST(RmsNormTest, MatchesDoubleReference) {
  for (int64_t hidden : {1, 15, 16, 17, 97, 576, 4096}) {
    for (int64_t tokens : {1, 3, 17}) {
      const auto x = RandomVector(tokens * hidden, 1, 3.0f);
      const auto w = RandomVector(hidden, 2);
      std::vector<float> out(x.size(), kPoison);
      RmsNormParams p{.input = x.data(),
                      .weight = w.data(),
                      .output = out.data(),
                      .num_tokens = tokens,
                      .hidden_size = hidden,
                      .epsilon = 1e-5};
      ASSERT_TRUE(p.Validate().ok());
      RmsNorm(p);
      ExpectNear(out, RmsNormReference(x, w, tokens, hidden, 1e-5), 1e-6, 1e-6,
                 "hidden " + std::to_string(hidden));
    }
  }
}

TEST(RmsNormTest, InPlaceAndStrided) {
  const int64_t hidden = 97, tokens = 5, stride = 100;
  auto x = RandomVector(tokens * stride, 3);
  const auto w = RandomVector(hidden, 4);
  std::vector<float> dense(static_cast<size_t>(tokens * hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < hidden; ++i) dense[t * hidden + i] = x[t * stride + i];
  }
  const std::vector<double> expected = RmsNormReference(dense, w, tokens, hidden, 1e-6);
  const std::vector<float> original = x;
  RmsNorm({.input = x.data(),
           .weight = w.data(),
           .output = x.data(),
           .num_tokens = tokens,
           .hidden_size = hidden,
           .input_stride = stride,
           .output_stride = stride});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < stride; ++i) {
      if (i < hidden) {
        EXPECT_NEAR(x[t * stride + i], expected[t * hidden + i], 1e-5);
      } else {
        EXPECT_EQ(x[t * stride + i], original[t * stride + i]) << "padding was written";
      }
    }
  }
}

TEST(RmsNormTest, ValidateRejectsBadShapes) {
  std::vector<float> buf(16);
  RmsNormParams p{.input = buf.data(),
                  .weight = buf.data(),
                  .output = buf.data(),
                  .num_tokens = 1,
                  .hidden_size = 0};
  EXPECT_THAT(p.Validate().message(), HasSubstr("hidden_size"));
  p.hidden_size = 16;
  p.input_stride = 8;
  EXPECT_EQ(p.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FusedAddRmsNormTest, UpdatesResidualAndNormalizes) {
  for (int64_t hidden : {1, 16, 17, 97, 2048}) {
    const int64_t tokens = 7;
    auto residual = RandomVector(tokens * hidden, 5);
    const auto x = RandomVector(tokens * hidden, 6);
    const auto w = RandomVector(hidden, 7);
    std::vector<float> sum(residual.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + x[i];
    std::vector<float> out(x.size(), kPoison);
    FusedAddRmsNorm({.residual = residual.data(),
                     .input = x.data(),
                     .weight = w.data(),
                     .output = out.data(),
                     .num_tokens = tokens,
                     .hidden_size = hidden,
                     .epsilon = 1e-6});
    EXPECT_EQ(residual, sum) << "residual += x must be the plain fp32 sum";
    ExpectNear(out, RmsNormReference(sum, w, tokens, hidden, 1e-6), 1e-6, 1e-6, "fused");
  }
  std::vector<float> buf(4);
  FusedAddRmsNormParams aliased{.residual = buf.data(),
                                .input = buf.data(),
                                .weight = buf.data(),
                                .output = buf.data(),
                                .num_tokens = 1,
                                .hidden_size = 4};
  EXPECT_THAT(aliased.Validate().message(), HasSubstr("alias"));
}

// Rotary in double: pairs (a, b) of `layout` among the first rotary_dim dims (0: head_dim), angle
// position * inv_freq[k], cos and sin times attention_factor; the other dims unchanged.
std::vector<double> RotaryReference(const std::vector<float>& x, const std::vector<int32_t>& pos,
                                    const std::vector<double>& inv_freq, int64_t heads,
                                    int64_t head_dim, RotaryLayout layout, int64_t rotary_dim = 0,
                                    double attention_factor = 1.0) {
  std::vector<double> out(x.begin(), x.end());
  const int64_t half = (rotary_dim != 0 ? rotary_dim : head_dim) / 2;
  for (size_t t = 0; t < pos.size(); ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double* head = out.data() + (t * heads + h) * head_dim;
      for (int64_t k = 0; k < half; ++k) {
        const int64_t ia = layout == RotaryLayout::kHalfSplit ? k : 2 * k;
        const int64_t ib = layout == RotaryLayout::kHalfSplit ? k + half : 2 * k + 1;
        const double angle = pos[t] * inv_freq[k];
        const double c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
        const double a = head[ia], b = head[ib];
        head[ia] = a * c - b * s;
        head[ib] = a * s + b * c;
      }
    }
  }
  return out;
}

std::vector<double> InvFreq(int64_t head_dim, double theta) {
  std::vector<double> f(static_cast<size_t>(head_dim / 2));
  for (int64_t k = 0; k < head_dim / 2; ++k) f[k] = std::pow(theta, -2.0 * k / head_dim);
  return f;
}

TEST(RotaryTest, MatchesDoubleReferenceInBothLayouts) {
  const std::vector<int32_t> positions = {0, 1, 15, 16, 17, 97, 4095, 131071};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  for (int64_t head_dim : {32, 64, 80, 128}) {
    for (RotaryLayout layout : {RotaryLayout::kHalfSplit, RotaryLayout::kInterleaved}) {
      const int64_t heads = 4, kv_heads = 1;
      const std::vector<double> inv_freq = InvFreq(head_dim, 500000.0);
      auto q = RandomVector(tokens * heads * head_dim, 8);
      auto k = RandomVector(tokens * kv_heads * head_dim, 9);
      const auto q_expected = RotaryReference(q, positions, inv_freq, heads, head_dim, layout);
      const auto k_expected = RotaryReference(k, positions, inv_freq, kv_heads, head_dim, layout);
      RotaryParams p{.query = q.data(),
                     .key = k.data(),
                     .positions = positions.data(),
                     .inv_freq = inv_freq.data(),
                     .num_tokens = tokens,
                     .num_heads = heads,
                     .num_kv_heads = kv_heads,
                     .head_dim = head_dim,
                     .layout = layout};
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      ApplyRotary(p);
      const std::string what = "head_dim " + std::to_string(head_dim);
      ExpectNear(q, q_expected, 2e-6, 2e-6, what);
      ExpectNear(k, k_expected, 2e-6, 2e-6, what);
    }
  }
}

TEST(RotaryTest, LayoutsAgreeAfterPermutation) {
  // Interleaved dim 2k holds half-split dim k; interleaved 2k+1 holds half-split k + d/2.
  const int64_t head_dim = 80, heads = 3, tokens = 17;
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t * 13 + 5);
  const std::vector<double> inv_freq = InvFreq(head_dim, 10000.0);
  auto half_split = RandomVector(tokens * heads * head_dim, 10);
  std::vector<float> interleaved(half_split.size());
  auto permute = [&](const std::vector<float>& in, std::vector<float>* out) {
    for (int64_t row = 0; row < tokens * heads; ++row) {
      for (int64_t k = 0; k < head_dim / 2; ++k) {
        (*out)[row * head_dim + 2 * k] = in[row * head_dim + k];
        (*out)[row * head_dim + 2 * k + 1] = in[row * head_dim + k + head_dim / 2];
      }
    }
  };
  permute(half_split, &interleaved);
  RotaryParams p{.positions = positions.data(),
                 .inv_freq = inv_freq.data(),
                 .num_tokens = tokens,
                 .num_heads = heads,
                 .head_dim = head_dim};
  p.query = half_split.data();
  ApplyRotary(p);
  p.query = interleaved.data();
  p.layout = RotaryLayout::kInterleaved;
  ApplyRotary(p);
  std::vector<float> permuted(half_split.size());
  permute(half_split, &permuted);
  EXPECT_EQ(permuted, interleaved);  // the same fp32 operations on the same pairs: bit-exact
}

TEST(RotaryTest, StridedRowsLeaveTheRestUntouched) {
  // Query and key heads inside a fused [q | k | v] row, as the runner lays them out.
  const int64_t head_dim = 32, heads = 4, kv_heads = 2, tokens = 15;
  const int64_t row = (heads + 2 * kv_heads) * head_dim;
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t);
  const std::vector<double> inv_freq = InvFreq(head_dim, 10000.0);
  auto fused = RandomVector(tokens * row, 11);
  const auto original = fused;
  ApplyRotary({.query = fused.data(),
               .key = fused.data() + heads * head_dim,
               .positions = positions.data(),
               .inv_freq = inv_freq.data(),
               .num_tokens = tokens,
               .num_heads = heads,
               .num_kv_heads = kv_heads,
               .head_dim = head_dim,
               .query_stride = row,
               .key_stride = row});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = (heads + kv_heads) * head_dim; i < row; ++i) {
      ASSERT_EQ(fused[t * row + i], original[t * row + i]) << "v was touched";
    }
  }
  std::vector<float> q0(fused.begin(), fused.begin() + heads * head_dim);
  EXPECT_EQ(q0, std::vector<float>(original.begin(), original.begin() + heads * head_dim))
      << "position 0 must be the identity";
}

// Partial rotary (Phi-3's partial_rotary_factor, GPT-NeoX's rotary_pct) with longrope's
// attention factor: the first rotary_dim dims rotate in pairs of either layout, cos and sin scaled;
// the rest pass through untouched.
TEST(RotaryTest, PartialRotaryWithAttentionFactorMatchesReferenceInBothLayouts) {
  const std::vector<int32_t> positions = {0, 1, 15, 16, 17, 97, 4095, 131071};
  const int64_t tokens = static_cast<int64_t>(positions.size());
  struct Dims {
    int64_t head_dim, rotary_dim;
  };
  for (Dims dims : {Dims{32, 16}, Dims{64, 32}, Dims{80, 24}, Dims{96, 2}, Dims{128, 64},
                    Dims{128, 128}}) {
    for (RotaryLayout layout : {RotaryLayout::kHalfSplit, RotaryLayout::kInterleaved}) {
      for (double factor : {1.0, 1.1902380714238083}) {
        const int64_t heads = 4, kv_heads = 2;
        const std::vector<double> inv_freq = InvFreq(dims.rotary_dim, 10000.0);
        auto q = RandomVector(tokens * heads * dims.head_dim, 8);
        auto k = RandomVector(tokens * kv_heads * dims.head_dim, 9);
        const auto q_in = q, k_in = k;
        const auto q_expected = RotaryReference(q, positions, inv_freq, heads, dims.head_dim,
                                                layout, dims.rotary_dim, factor);
        const auto k_expected = RotaryReference(k, positions, inv_freq, kv_heads, dims.head_dim,
                                                layout, dims.rotary_dim, factor);
        RotaryParams p{.query = q.data(),
                       .key = k.data(),
                       .positions = positions.data(),
                       .inv_freq = inv_freq.data(),
                       .num_tokens = tokens,
                       .num_heads = heads,
                       .num_kv_heads = kv_heads,
                       .head_dim = dims.head_dim,
                       .rotary_dim = dims.rotary_dim,
                       .attention_factor = factor,
                       .layout = layout};
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        ApplyRotary(p);
        const std::string what = "head_dim " + std::to_string(dims.head_dim) + " rotary_dim " +
                                 std::to_string(dims.rotary_dim) + " factor " +
                                 std::to_string(factor);
        ExpectNear(q, q_expected, 3e-6, 3e-6, what);
        ExpectNear(k, k_expected, 3e-6, 3e-6, what);
        for (int64_t row = 0; row < tokens * heads; ++row) {
          for (int64_t d = dims.rotary_dim; d < dims.head_dim; ++d) {
            ASSERT_EQ(q[row * dims.head_dim + d], q_in[row * dims.head_dim + d]) << what;
          }
        }
        for (int64_t row = 0; row < tokens * kv_heads; ++row) {
          for (int64_t d = dims.rotary_dim; d < dims.head_dim; ++d) {
            ASSERT_EQ(k[row * dims.head_dim + d], k_in[row * dims.head_dim + d]) << what;
          }
        }
      }
    }
  }
}

// rotary_dim = head_dim and attention factor 1 are the defaults, bit for bit.
TEST(RotaryTest, FullRotaryDimAndUnitFactorAreTheDefaults) {
  const int64_t head_dim = 64, heads = 3, tokens = 9;
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t * 517);
  const std::vector<double> inv_freq = InvFreq(head_dim, 10000.0);
  auto a = RandomVector(tokens * heads * head_dim, 14), b = a;
  RotaryParams p{.query = a.data(),
                 .positions = positions.data(),
                 .inv_freq = inv_freq.data(),
                 .num_tokens = tokens,
                 .num_heads = heads,
                 .head_dim = head_dim};
  ApplyRotary(p);
  p.query = b.data();
  p.rotary_dim = head_dim;
  p.attention_factor = 1.0;
  ApplyRotary(p);
  EXPECT_EQ(a, b);
}

TEST(RotaryTest, ValidateRejectsBadRotaryDimAndFactor) {
  std::vector<float> q(64);
  std::vector<double> f(16);
  std::vector<int32_t> pos = {3};
  RotaryParams p{.query = q.data(),
                 .positions = pos.data(),
                 .inv_freq = f.data(),
                 .num_tokens = 1,
                 .num_heads = 1,
                 .head_dim = 32,
                 .rotary_dim = 34};
  EXPECT_THAT(p.Validate().message(), HasSubstr("rotary_dim 34"));
  p.rotary_dim = 15;
  EXPECT_THAT(p.Validate().message(), HasSubstr("rotary_dim 15"));
  p.rotary_dim = 16;
  EXPECT_TRUE(p.Validate().ok());
  p.attention_factor = 0;
  EXPECT_THAT(p.Validate().message(), HasSubstr("attention_factor"));
}

TEST(RotaryTest, ValidateRejectsOddHeadDimAndNegativePositions) {
  std::vector<float> q(64);
  std::vector<double> f(16);
  std::vector<int32_t> pos = {-1};
  RotaryParams p{.query = q.data(),
                 .positions = pos.data(),
                 .inv_freq = f.data(),
                 .num_tokens = 1,
                 .num_heads = 1,
                 .head_dim = 31};
  EXPECT_THAT(p.Validate().message(), HasSubstr("head_dim 31"));
  p.head_dim = 32;
  EXPECT_THAT(p.Validate().message(), HasSubstr("negative position"));
}

TEST(SiluAndMulTest, MatchesDoubleReference) {
  for (int64_t inter : {1, 15, 16, 17, 97, 1536}) {
    const int64_t tokens = 3;
    const auto gate_up = RandomVector(tokens * 2 * inter, 12, 4.0f);
    std::vector<float> out(static_cast<size_t>(tokens * inter), kPoison);
    SiluAndMul({.gate_up = gate_up.data(),
                .output = out.data(),
                .num_tokens = tokens,
                .intermediate_size = inter});
    std::vector<double> expected(out.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gate_up[t * 2 * inter + i], u = gate_up[t * 2 * inter + inter + i];
        expected[t * inter + i] = g / (1 + std::exp(-g)) * u;
      }
    }
    ExpectNear(out, expected, 1e-6, 1e-6, "silu");
  }
}

// Ulps of float between a and the float nearest the exact value e.
double UlpError(float a, double e) {
  const float nearest = static_cast<float>(e);
  const float next = std::nextafter(nearest, std::numeric_limits<float>::infinity());
  return std::abs(a - e) / (double{next} - nearest);
}

TEST(FastExpTest, WithinTwoUlpOfExpAndExactAtTheEdges) {
  double worst = 0;
  float worst_x = 0;
  for (int64_t i = 0; i <= 2'000'000; ++i) {  // evenly over the range where exp is normal
    const float x = static_cast<float>(-87.33 + (88.72 + 87.33) * static_cast<double>(i) / 2e6);
    const double error = UlpError(FastExp(x), std::exp(double{x}));
    if (error > worst) worst = error, worst_x = x;
  }
  for (float x = -1e-3f; x < 1e-3f; x += 1.3e-7f) {  // near 0, where r is the whole argument
    worst = std::max(worst, UlpError(FastExp(x), std::exp(double{x})));
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(FastExp(0.0f), 1.0f);
  EXPECT_EQ(FastExp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(FastExp(-88.0f), 0.0f);  // exp is subnormal there: flushed
  EXPECT_EQ(FastExp(-1000.0f), 0.0f);
  EXPECT_EQ(FastExp(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(FastExp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<float>::quiet_NaN())));
}

// The AVX2 paths of ExpShifted and SiluMul give the scalar FastExp's bits, at every length's tail
// and for the values at and past the edges.
TEST(FastExpTest, VectorPathGivesTheScalarBits) {
  if (!FastExpVectorized()) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar path runs";
  std::vector<float> values = RandomVector(4099, 31, 30.0f);
  const float specials[] = {0.0f, -0.0f, 88.72f, 88.73f, -87.33f, -87.34f, -104.0f, 1e-30f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials); ++i) values[i * 7] = specials[i];
  const auto up = RandomVector(4099, 32);
  for (int64_t n : {1, 7, 8, 9, 31, 4099}) {
    std::vector<float> vector_exp(values.begin(), values.begin() + n), scalar_exp = vector_exp;
    std::vector<float> vector_silu(static_cast<size_t>(n)), scalar_silu(static_cast<size_t>(n));
    ExpShifted(vector_exp.data(), n, -0.5f);
    SiluMul(values.data(), up.data(), vector_silu.data(), n);
    SetFastExpScalarForTesting(true);
    ExpShifted(scalar_exp.data(), n, -0.5f);
    SiluMul(values.data(), up.data(), scalar_silu.data(), n);
    SetFastExpScalarForTesting(false);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(vector_exp[i]), std::bit_cast<uint32_t>(scalar_exp[i]))
          << "exp, n " << n << ", x " << values[i];
      ASSERT_EQ(std::bit_cast<uint32_t>(vector_silu[i]), std::bit_cast<uint32_t>(scalar_silu[i]))
          << "silu, n " << n << ", x " << values[i];
    }
  }
}

// A prompt's rows split across threads give the bits of one thread.
TEST(SiluAndMulTest, ThreadsGiveTheSameBits) {
  const int64_t tokens = 67, inter = 1536;
  const auto gate_up = RandomVector(tokens * 2 * inter, 13, 4.0f);
  std::vector<float> one(static_cast<size_t>(tokens * inter), kPoison), four = one;
  SiluAndMul({.gate_up = gate_up.data(), .output = one.data(), .num_tokens = tokens,
              .intermediate_size = inter});
  SiluAndMul({.gate_up = gate_up.data(), .output = four.data(), .num_tokens = tokens,
              .intermediate_size = inter, .num_threads = 4});
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0);
}

TEST(RmsNormTest, ThreadsGiveTheSameBits) {
  const int64_t tokens = 71, hidden = 576;
  const auto input = RandomVector(tokens * hidden, 14);
  const auto weight = RandomVector(hidden, 15);
  std::vector<float> one(input.size(), kPoison), four = one;
  RmsNorm({.input = input.data(), .weight = weight.data(), .output = one.data(),
           .num_tokens = tokens, .hidden_size = hidden});
  RmsNorm({.input = input.data(), .weight = weight.data(), .output = four.data(),
           .num_tokens = tokens, .hidden_size = hidden, .num_threads = 4});
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0);
  std::vector<float> residual_one(input.size(), 0.25f), residual_four = residual_one;
  FusedAddRmsNorm({.residual = residual_one.data(), .input = input.data(),
                   .weight = weight.data(), .output = one.data(), .num_tokens = tokens,
                   .hidden_size = hidden});
  FusedAddRmsNorm({.residual = residual_four.data(), .input = input.data(),
                   .weight = weight.data(), .output = four.data(), .num_tokens = tokens,
                   .hidden_size = hidden, .num_threads = 4});
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0);
  EXPECT_EQ(residual_one, residual_four);
}

// GeGLU (Gemma): gelu_tanh(gate) * up, PyTorch's gelu(approximate="tanh") in double.
TEST(SiluAndMulTest, GeluTanhMatchesDoubleReference) {
  for (int64_t inter : {1, 15, 16, 17, 97, 1536}) {
    const int64_t tokens = 3;
    auto gate_up = RandomVector(tokens * 2 * inter, 13, 4.0f);
    gate_up[0] = 0.0f;  // and the far tails, where tanh saturates
    if (inter > 2) gate_up[1] = -30.0f, gate_up[2] = 30.0f;
    std::vector<float> out(static_cast<size_t>(tokens * inter), kPoison);
    const SiluAndMulParams p{.gate_up = gate_up.data(),
                             .output = out.data(),
                             .num_tokens = tokens,
                             .intermediate_size = inter,
                             .activation = GateActivation::kGeluTanh};
    ASSERT_TRUE(p.Validate().ok()) << p.Validate();
    SiluAndMul(p);
    std::vector<double> expected(out.size());
    const double beta = std::sqrt(2.0 / M_PI);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gate_up[t * 2 * inter + i], u = gate_up[t * 2 * inter + inter + i];
        expected[t * inter + i] = 0.5 * g * (1 + std::tanh(beta * (g + 0.044715 * g * g * g))) * u;
      }
    }
    ExpectNear(out, expected, 1e-6, 2e-6, "gelu_tanh");
  }
}

TEST(SiluAndMulTest, ValidateRejectsUnknownActivation) {
  std::vector<float> buf(4);
  const SiluAndMulParams p{.gate_up = buf.data(),
                           .output = buf.data(),
                           .num_tokens = 1,
                           .intermediate_size = 2,
                           .activation = static_cast<GateActivation>(7)};
  EXPECT_THAT(p.Validate().message(), HasSubstr("activation 7"));
}

// Gemma 2's final_logit_softcapping: cap * tanh(x / cap), in place.
TEST(SoftcapTest, MatchesDoubleReference) {
  for (float cap : {30.0f, 50.0f, 1.0f}) {
    auto data = RandomVector(1003, 15, 40.0f);
    data[0] = 0.0f, data[1] = 1e6f, data[2] = -1e6f;
    std::vector<double> expected(data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      expected[i] = double{cap} * std::tanh(double{data[i]} / cap);
    }
    Softcap(data.data(), static_cast<int64_t>(data.size()), cap);
    ExpectNear(data, expected, 1e-6, 2e-6, "softcap " + std::to_string(cap));
    EXPECT_EQ(data[0], 0.0f);
    EXPECT_EQ(data[1], cap);
    EXPECT_EQ(data[2], -cap);
  }
  Softcap(nullptr, 0, 30.0f);  // nothing to do
}

std::vector<double> HeadRmsNormReference(const std::vector<float>& x, const std::vector<float>& w,
                                         int64_t tokens, int64_t heads, int64_t head_dim,
                                         int64_t stride, double eps) {
  std::vector<double> out(x.begin(), x.end());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = t * stride + h * head_dim;
      double sum = 0;
      for (int64_t i = 0; i < head_dim; ++i) sum += double{x[base + i]} * x[base + i];
      const double inv = 1.0 / std::sqrt(sum / head_dim + eps);
      for (int64_t i = 0; i < head_dim; ++i) out[base + i] = x[base + i] * inv * w[i];
    }
  }
  return out;
}

// Qwen3's q_norm / k_norm: every head of every token normed on its own, in place inside a strided
// fused row; the dims outside the heads untouched.
TEST(HeadRmsNormTest, NormsEveryHeadInPlace) {
  for (int64_t head_dim : {32, 64, 80, 128, 256}) {
    const int64_t tokens = 17, heads = 3, stride = 7 * head_dim + 8;
    auto x = RandomVector(tokens * stride, 16, 3.0f);
    const auto w = RandomVector(head_dim, 17);
    const auto expected = HeadRmsNormReference(x, w, tokens, heads, head_dim, stride, 1e-6);
    const HeadRmsNormParams p{.data = x.data(),
                              .weight = w.data(),
                              .num_tokens = tokens,
                              .num_heads = heads,
                              .head_dim = head_dim,
                              .stride = stride,
                              .epsilon = 1e-6};
    ASSERT_TRUE(p.Validate().ok()) << p.Validate();
    HeadRmsNorm(p);
    ExpectNear(x, expected, 1e-6, 2e-6, "head_dim " + std::to_string(head_dim));
  }
  std::vector<float> buf(64);
  HeadRmsNormParams bad{.data = buf.data(),
                        .weight = buf.data(),
                        .num_tokens = 1,
                        .num_heads = 2,
                        .head_dim = 32,
                        .stride = 48};
  EXPECT_THAT(bad.Validate().message(), HasSubstr("stride 48"));
}

TEST(EmbeddingTest, GathersRowsAndRejectsOutOfRangeIds) {
  const int64_t vocab = 97, hidden = 17;
  const auto table = RandomVector(vocab * hidden, 13);
  const std::vector<int32_t> ids = {0, 96, 5, 5, 42};
  std::vector<float> out(ids.size() * hidden, kPoison);
  EmbeddingParams p{.table = table.data(),
                    .ids = ids.data(),
                    .output = out.data(),
                    .num_tokens = static_cast<int64_t>(ids.size()),
                    .vocab_size = vocab,
                    .hidden_size = hidden};
  ASSERT_TRUE(p.Validate().ok());
  EmbeddingGather(p);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < hidden; ++i) {
      ASSERT_EQ(out[t * hidden + i], table[ids[t] * hidden + i]);
    }
  }
  const std::vector<int32_t> bad = {3, 97};
  p.ids = bad.data();
  p.num_tokens = 2;
  EXPECT_THAT(p.Validate().message(), HasSubstr("id 97"));
}

TEST(LinearTest, MatchesDoubleReference) {
  for (int64_t tokens : {1, 17, 97}) {
    for (int64_t in : {15, 64, 80}) {
      for (int64_t out_features : {16, 33}) {
        for (bool with_bias : {false, true}) {
          for (bool accumulate : {false, true}) {
            const int64_t ldx = in + 3, ldy = out_features + 5;
            const auto x = RandomVector(tokens * ldx, 14);
            const auto w = RandomVector(out_features * in, 15);
            const auto bias = RandomVector(out_features, 16);
            auto y = RandomVector(tokens * ldy, 17);
            const auto y0 = y;
            Linear({.input = x.data(),
                    .weight = w.data(),
                    .bias = with_bias ? bias.data() : nullptr,
                    .output = y.data(),
                    .num_tokens = tokens,
                    .in_features = in,
                    .out_features = out_features,
                    .input_stride = ldx,
                    .output_stride = ldy,
                    .accumulate = accumulate});
            for (int64_t t = 0; t < tokens; ++t) {
              for (int64_t o = 0; o < ldy; ++o) {
                const float actual = y[t * ldy + o];
                if (o >= out_features) {
                  ASSERT_EQ(actual, y0[t * ldy + o]) << "wrote past the row";
                  continue;
                }
                double expected = accumulate ? y0[t * ldy + o] : 0.0;
                if (with_bias) expected += bias[o];
                for (int64_t i = 0; i < in; ++i) expected += double{x[t * ldx + i]} * w[o * in + i];
                ASSERT_NEAR(actual, expected, 1e-5 * std::sqrt(double(in)))
                    << tokens << "x" << in << "x" << out_features;
              }
            }
          }
        }
      }
    }
  }
}

TEST(LinearTest, SplitReductionIsExactUpToChunkRounding) {
  // Same-signed terms, so that the error bound of a k-term fp32 sum is k ulps of the result: the
  // split form must stay within the bound of its chunk length (bias, accumulate, chunk offsets).
  for (int64_t in : {15, 64, 80, 576}) {
    for (int64_t split : {1, 16, 32, 1000}) {
      const int64_t tokens = 5, out_features = 33;
      auto x = RandomVector(tokens * in, 19);
      auto w = RandomVector(out_features * in, 20);
      for (float& v : x) v = std::abs(v) + 0.5f;
      for (float& v : w) v = std::abs(v) + 0.5f;
      const auto bias = RandomVector(out_features, 21);
      auto y = RandomVector(tokens * out_features, 22);
      const auto y0 = y;
      LinearParams p{.input = x.data(),
                     .weight = w.data(),
                     .bias = bias.data(),
                     .output = y.data(),
                     .num_tokens = tokens,
                     .in_features = in,
                     .out_features = out_features,
                     .accumulate = true,
                     .split_k = split,
                     .num_threads = 3};
      ASSERT_TRUE(p.Validate().ok());
      Linear(p);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t o = 0; o < out_features; ++o) {
          double expected = double{y0[t * out_features + o]} + bias[o];
          for (int64_t i = 0; i < in; ++i) expected += double{x[t * in + i]} * w[o * in + i];
          const double bound = std::min<double>(split, in) * 1.2e-7 * std::abs(expected);
          ASSERT_NEAR(y[t * out_features + o], expected, bound + 6e-8 * std::abs(expected))
              << "in " << in << " split " << split;
        }
      }
    }
  }
  std::vector<float> buf(16);
  LinearParams negative{.input = buf.data(),
                        .weight = buf.data(),
                        .output = buf.data(),
                        .num_tokens = 1,
                        .in_features = 4,
                        .out_features = 4,
                        .split_k = -1};
  EXPECT_THAT(negative.Validate().message(), HasSubstr("split_k"));
}

TEST(LinearTest, ValidateRejectsShortStrides) {
  std::vector<float> buf(64);
  LinearParams p{.input = buf.data(),
                 .weight = buf.data(),
                 .output = buf.data(),
                 .num_tokens = 2,
                 .in_features = 8,
                 .out_features = 4,
                 .input_stride = 4};
  EXPECT_EQ(p.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlasThreadsTest, SetAndGet) {
  SetBlasThreads(1);
  EXPECT_EQ(GetBlasThreads(), 1);
  SetBlasThreads(0);
  EXPECT_GE(GetBlasThreads(), 1);
}

TEST(ArgmaxTest, PicksTheFirstMaximumAndSkipsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> rows = {1,   3,   3,  2,    //
                                   nan, -5,  -1, -1,   //
                                   -1,  nan, 7,  nan,  //
                                   0,   0,   0,  0};
  std::vector<int32_t> out(4, -1);
  Argmax({.input = rows.data(), .output = out.data(), .num_rows = 4, .row_size = 4});
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 2, 0}));
  const auto big = RandomVector(3 * 1031, 18);
  std::vector<int32_t> ids(3);
  Argmax({.input = big.data(), .output = ids.data(), .num_rows = 3, .row_size = 1031});
  for (int r = 0; r < 3; ++r) {
    int32_t best = 0;
    for (int i = 1; i < 1031; ++i) {
      if (big[r * 1031 + i] > big[r * 1031 + best]) best = i;
    }
    EXPECT_EQ(ids[r], best);
  }
}

}  // namespace
}  // namespace lmserve::kernels
