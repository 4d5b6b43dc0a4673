// The mixture-of-experts kernels (kernels/cuda/moe.h) against their CPU twin (kernels/cpu/moe.h):
// routing alone, and the whole MLP on both paths (fused, grouped) in bf16, fp16 and fp32, at
// awkward sizes (17 tokens, 600 tokens: two passes of the grouped path; rows long enough for the
// streaming loops' whole steps and tails), with poisoned outputs.

#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/moe.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::Download;
using testing::FreshSeed;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::Upload;

TEST(MoeRoutingGpuTest, MatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (const auto& [experts, top_k] :
       {std::pair<int64_t, int64_t>{4, 2}, {8, 2}, {60, 4}, {128, 8}, {256, 32}, {3, 3}}) {
    for (bool normalize : {true, false}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << experts << " experts, top " << top_k << ", normalize "
                                        << normalize << ", seed " << seed);
      std::mt19937 rng(seed);
      const int64_t tokens = 17;
      std::vector<float> logits = RandomFloats(tokens * experts, rng, 3.0f);
      logits[experts + 1] = logits[experts];  // a tie in token 1: the lower index first
      // Token 2: -0 and +0 lead (equal, so the lower index, -0, first); the rest below them.
      for (int64_t e = 0; e < experts; ++e) {
        logits[2 * experts + e] = -std::fabs(logits[2 * experts + e]) - 1.0f;
      }
      logits[2 * experts] = -0.0f;
      logits[2 * experts + 1] = 0.0f;
      std::vector<int32_t> ids(tokens * top_k);
      std::vector<float> weights(tokens * top_k);
      kernels::MoeRouting({.logits = logits.data(),
                           .expert_ids = ids.data(),
                           .weights = weights.data(),
                           .num_tokens = tokens,
                           .num_experts = experts,
                           .top_k = top_k,
                           .normalize_top_k = normalize});
      DeviceBuffer<float> d_logits(logits);
      DeviceBuffer<int32_t> d_ids(ids.size());
      DeviceBuffer<float> d_weights(weights.size());
      d_ids.Poison();
      d_weights.Poison();
      CUDA_ASSERT(Launch(MoeRoutingParams{.logits = d_logits.get(),
                                          .expert_ids = d_ids.get(),
                                          .weights = d_weights.get(),
                                          .num_tokens = tokens,
                                          .num_experts = experts,
                                          .top_k = top_k,
                                          .normalize_top_k = normalize},
                         nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_EQ(d_ids.Download(), ids);
      const std::vector<float> got = d_weights.Download();
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], weights[i], 2e-6 * std::max(1.0f, weights[i])) << i;
      }
    }
  }
}

struct Shape {
  int64_t tokens, hidden, inter, experts, top_k;
};

TEST(MoeGpuTest, BothPathsMatchTheCpuTwin) {
  LMSERVE_REQUIRE_GPU();
  // The last two are wide enough for the streaming loops' whole steps and their tails (hidden
  // 2368: 296 pieces of 8; the fused down's items, top_k x inter / 8: 360 and 288, 72 giving
  // fewer pieces than lanes).
  const Shape shapes[] = {{1, 136, 72, 8, 2},    {3, 136, 72, 8, 2},   {17, 136, 72, 8, 2},
                          {600, 64, 40, 8, 2},   {1, 256, 64, 128, 8}, {17, 256, 64, 128, 8},
                          {5, 128, 256, 4, 2},   {1, 2368, 360, 16, 8}, {17, 2368, 72, 32, 32}};
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const Shape& s : shapes) {
      for (MoePath path : {MoePath::kAuto, MoePath::kFused, MoePath::kGrouped}) {
        if (path == MoePath::kFused && s.tokens > kMoeChunkTokens) continue;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << testing::Name(dtype) << " tokens " << s.tokens << " hidden " << s.hidden
                     << " inter " << s.inter << " experts " << s.experts << " top " << s.top_k
                     << " path " << static_cast<int>(path) << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(s.tokens * s.hidden, rng, 1.0f);
        std::vector<float> router = RandomFloats(s.experts * s.hidden, rng, 0.3f);
        std::vector<float> gate_up =
            RandomFloats(s.experts * 2 * s.inter * s.hidden, rng, 1.0f / std::sqrt(s.hidden));
        std::vector<float> down =
            RandomFloats(s.experts * s.hidden * s.inter, rng, 1.0f / std::sqrt(s.inter));
        DeviceBuffer<uint8_t> d_x = Upload(x, dtype);  // rounds the host copies to dtype
        DeviceBuffer<uint8_t> d_router = Upload(router, dtype);
        DeviceBuffer<uint8_t> d_gate_up = Upload(gate_up, dtype);
        DeviceBuffer<uint8_t> d_down = Upload(down, dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(s.tokens * s.hidden, dtype);
        DeviceBuffer<uint8_t> d_workspace(
            MoeParams::WorkspaceBytes(s.tokens, s.experts, s.top_k, s.hidden, s.inter, dtype));
        d_workspace.Poison();
        const MoeParams params{.input = d_x.get(),
                               .router = d_router.get(),
                               .gate_up = d_gate_up.get(),
                               .down = d_down.get(),
                               .output = d_out.get(),
                               .workspace = d_workspace.get(),
                               .num_tokens = s.tokens,
                               .hidden = s.hidden,
                               .intermediate = s.inter,
                               .num_experts = s.experts,
                               .top_k = s.top_k,
                               .normalize_top_k = s.experts != 128,
                               .dtype = dtype,
                               .path = path};
        ASSERT_TRUE(params.Validate().ok()) << params.Validate();
        CUDA_ASSERT(Launch(params, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> ref(s.tokens * s.hidden);
        kernels::Moe({.input = x.data(),
                      .router = router.data(),
                      .gate_up = gate_up.data(),
                      .down = down.data(),
                      .output = ref.data(),
                      .num_tokens = s.tokens,
                      .hidden = s.hidden,
                      .intermediate = s.inter,
                      .num_experts = s.experts,
                      .top_k = s.top_k,
                      .normalize_top_k = s.experts != 128});
        // The 16-bit paths round gate, up, the activation and (grouped) each expert's output to
        // the type; fp32 differs from the CPU only in the order of sums. A router near-tie that
        // flips one token's expert would show as a large error: with these inputs' spread it
        // does not happen.
        const double tolerance = dtype == DType::kF32 ? 1e-5 : dtype == DType::kF16 ? 4e-3 : 2e-2;
        EXPECT_LE(RelativeL2(Download(d_out, dtype), ref), tolerance);
      }
    }
  }
}

TEST(MoeGpuTest, ValidateExplainsUnsupportedShapes) {
  // Host-side only: runs without a GPU.
  MoeParams params{
      .num_tokens = 0, .hidden = 100, .intermediate = 64, .num_experts = 8, .top_k = 2};
  EXPECT_FALSE(params.Validate().ok());  // hidden not a multiple of 8
  params.hidden = 128;
  EXPECT_TRUE(params.Validate().ok());
  params.top_k = 9;
  EXPECT_FALSE(params.Validate().ok());
  params.top_k = 2;
  params.num_experts = 300;
  EXPECT_FALSE(params.Validate().ok());
  params.num_experts = 8;
  params.path = MoePath::kFused;
  params.num_tokens = kMoeChunkTokens + 1;
  EXPECT_FALSE(params.Validate().ok());
  // The auto path: fused for one token, or few slots per expert.
  params.path = MoePath::kAuto;
  params.num_tokens = 1;
  EXPECT_EQ(params.Resolved(), MoePath::kFused);
  params.num_tokens = 3;
  EXPECT_EQ(params.Resolved(), MoePath::kGrouped);
  params.num_experts = 128;
  params.top_k = 8;
  params.num_tokens = 8;
  EXPECT_EQ(params.Resolved(), MoePath::kFused);
  params.num_tokens = 9;
  EXPECT_EQ(params.Resolved(), MoePath::kGrouped);
}

}  // namespace
}  // namespace lmserve::kernels::cuda
