// The CPU state-space kernels (kernels/cpu/ssm.h) against the definitions written out here in
// double, token by token: the conv1d over its window (zeros before position 0) and the
// recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t. Awkward sizes:
// 3 sequences of 1, 17 and 97 tokens in slots 4, 0 and 2, chunks of 5 (so the SSD form crosses
// chunk boundaries), 6 heads of 5 in 3 groups, state 7; then a second step continuing each
// sequence; and the gated norm per group. Seeded random inputs; states and outputs start as NaN
// (a sequence that starts must not read its slot).

#include "kernels/cpu/ssm.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lmserve::kernels {
namespace {

constexpr int64_t kHeads = 6, kHeadDim = 5, kState = 7, kGroups = 3, kKernel = 4, kSlots = 5;
constexpr int64_t kInner = kHeads * kHeadDim;
constexpr int64_t kConvDim = kInner + 2 * kGroups * kState;

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double Softplus(double v) { return v > 20 ? v : std::log1p(std::exp(v)); }
double Silu(double v) { return v / (1 + std::exp(-v)); }

TEST(SsmCpuTest, ConvAndScanFollowTheRecurrenceAcrossSteps) {
  std::mt19937 rng(20);
  const std::vector<float> conv_w = Random(kConvDim * kKernel, rng, 0.5f);
  const std::vector<float> conv_b = Random(kConvDim, rng, 0.1f);
  const std::vector<float> dt_bias = Random(kHeads, rng, 0.5f, -1.0f);
  const std::vector<float> a_log = Random(kHeads, rng, 0.5f);
  const std::vector<float> d = Random(kHeads, rng);
  const std::vector<int32_t> slots = {4, 0, 2};
  std::vector<float> conv_states(kSlots * (kKernel - 1) * kConvDim, NAN);
  std::vector<float> ssm_states(kSlots * kHeads * kHeadDim * kState, NAN);
  // The whole history of each sequence (raw conv inputs, dt) for the reference.
  std::vector<std::vector<std::vector<float>>> history(3);
  std::vector<std::vector<double>> h(3, std::vector<double>(kHeads * kHeadDim * kState, 0.0));
  const std::vector<std::vector<int32_t>> steps = {{1, 17, 97}, {3, 1, 40}};
  std::vector<int32_t> context = {0, 0, 0};
  for (const std::vector<int32_t>& lens : steps) {
    std::vector<int32_t> query_start = {0};
    for (size_t i = 0; i < 3; ++i) {
      query_start.push_back(query_start.back() + lens[i]);
      context[i] += lens[i];
    }
    const int64_t tokens = query_start.back();
    const int64_t stride = kConvDim + kHeads + 3;  // x B C, dt, padding
    const std::vector<float> in = Random(tokens * stride, rng);
    const SsmSequences seqs{.query_start = query_start.data(),
                            .context_lens = context.data(),
                            .state_slots = slots.data(),
                            .num_seqs = 3,
                            .num_slots = kSlots};
    std::vector<float> xbc(tokens * kConvDim, NAN), y(tokens * kInner, NAN);
    CausalConv1d({.seqs = seqs,
                  .input = in.data(),
                  .input_stride = stride,
                  .weight = conv_w.data(),
                  .bias = conv_b.data(),
                  .output = xbc.data(),
                  .conv_states = conv_states.data(),
                  .channels = kConvDim,
                  .kernel = kKernel,
                  .num_threads = 2});
    SsmScan({.seqs = seqs,
             .xbc = xbc.data(),
             .xbc_stride = kConvDim,
             .dt = in.data() + kConvDim,
             .dt_stride = stride,
             .dt_bias = dt_bias.data(),
             .a_log = a_log.data(),
             .d = d.data(),
             .output = y.data(),
             .ssm_states = ssm_states.data(),
             .num_heads = kHeads,
             .head_dim = kHeadDim,
             .state_size = kState,
             .n_groups = kGroups,
             .chunk_size = 5,
             .num_threads = 2});
    for (size_t i = 0; i < 3; ++i) {
      for (int32_t t = query_start[i]; t < query_start[i + 1]; ++t) {
        history[i].emplace_back(in.begin() + t * stride, in.begin() + (t + 1) * stride);
        const int64_t pos = static_cast<int64_t>(history[i].size()) - 1;
        // conv
        std::vector<double> conv(kConvDim);
        for (int64_t c = 0; c < kConvDim; ++c) {
          double acc = conv_b[c];
          for (int64_t k = 0; k < kKernel; ++k) {
            const int64_t q = pos - (kKernel - 1) + k;
            if (q >= 0) acc += double{conv_w[c * kKernel + k]} * history[i][q][c];
          }
          conv[c] = Silu(acc);
          ASSERT_NEAR(xbc[t * kConvDim + c], conv[c], 1e-5 * (1 + std::abs(conv[c])))
              << "conv, sequence " << i << " position " << pos << " channel " << c;
        }
        // the recurrence, from the kernel's conv outputs (as fp32)
        for (int64_t head = 0; head < kHeads; ++head) {
          const int64_t g = head / (kHeads / kGroups);
          const double dt = Softplus(double{history[i][pos][kConvDim + head]} + dt_bias[head]);
          const double decay = std::exp(-std::exp(double{a_log[head]}) * dt);
          for (int64_t p = 0; p < kHeadDim; ++p) {
            const double x = xbc[t * kConvDim + head * kHeadDim + p];
            double out = double{d[head]} * x;
            for (int64_t n = 0; n < kState; ++n) {
              double& s = h[i][(head * kHeadDim + p) * kState + n];
              s = s * decay + dt * x * xbc[t * kConvDim + kInner + g * kState + n];
              out += s * xbc[t * kConvDim + kInner + (kGroups + g) * kState + n];
            }
            ASSERT_NEAR(y[t * kInner + head * kHeadDim + p], out, 1e-5 * (1 + std::abs(out)))
                << "scan, sequence " << i << " position " << pos << " head " << head;
          }
        }
      }
      // The slot holds the state after the step.
      for (int64_t k = 0; k < kHeads * kHeadDim * kState; ++k) {
        const double want = h[i][k];
        ASSERT_NEAR(ssm_states[slots[i] * kHeads * kHeadDim * kState + k], want,
                    1e-5 * (1 + std::abs(want)));
      }
    }
  }
}

TEST(SsmCpuTest, GatedRmsNormNormalizesEachGroup) {
  std::mt19937 rng(21);
  const int64_t tokens = 3, width = 12, stride = 20;
  const std::vector<float> y = Random(tokens * width, rng), z = Random(tokens * stride, rng);
  const std::vector<float> w = Random(width, rng, 0.1f, 1.0f);
  for (int64_t group : {12, 4}) {
    std::vector<float> out(tokens * width, NAN);
    GatedRmsNorm({.input = y.data(),
                  .gate = z.data(),
                  .gate_stride = stride,
                  .weight = w.data(),
                  .output = out.data(),
                  .num_tokens = tokens,
                  .width = width,
                  .group_size = group,
                  .epsilon = 1e-5});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t g0 = 0; g0 < width; g0 += group) {
        double sum = 0;
        for (int64_t k = g0; k < g0 + group; ++k) {
          const double v = y[t * width + k] * Silu(z[t * stride + k]);
          sum += v * v;
        }
        const double scale = 1 / std::sqrt(sum / group + 1e-5);
        for (int64_t k = g0; k < g0 + group; ++k) {
          const double want = w[k] * y[t * width + k] * Silu(z[t * stride + k]) * scale;
          EXPECT_NEAR(out[t * width + k], want, 1e-5 * (1 + std::abs(want)));
        }
      }
    }
  }
}

TEST(SsmCpuTest, BadShapesAreRefused) {
  SsmScanParams scan;
  scan.num_heads = 6;
  scan.head_dim = 4;
  scan.state_size = 8;
  scan.n_groups = 4;  // does not divide the heads
  scan.xbc_stride = 1000;
  scan.dt_stride = 6;
  EXPECT_FALSE(scan.Validate().ok());
  scan.n_groups = 3;
  EXPECT_TRUE(scan.Validate().ok()) << scan.Validate();
  const int32_t query_start[2] = {0, 2}, context[1] = {2}, slot[1] = {5};
  scan.seqs = {.query_start = query_start, .context_lens = context, .state_slots = slot,
               .num_seqs = 1, .num_slots = 5};  // slot 5 of 5
  EXPECT_FALSE(scan.Validate().ok());
  CausalConv1dParams conv;
  conv.channels = 8;
  conv.kernel = 9;  // beyond 8
  conv.input_stride = 8;
  EXPECT_FALSE(conv.Validate().ok());
}

}  // namespace
}  // namespace lmserve::kernels
