// A model family added from outside engine/ (phi3_test_family.cc: Phi-3's fused tensors, no new
// op) runs on the CPU runner with no runner edit, and matches Hugging Face's float64 logits.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/runner/model_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kBlockSize = 16;

std::vector<int32_t> Blocks(int64_t tokens) {
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + kBlockSize - 1) / kBlockSize));
  std::iota(blocks.begin(), blocks.end(), 0);
  return blocks;
}

std::unique_ptr<ModelRunner> CpuRunner(const Checkpoint& checkpoint) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.kv_cache_bytes = int64_t{16} << 20;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

TEST(FamilyVariantTest, TheTestFamilyServesPhi3Checkpoints) {
  const ModelFamily* family = FindHfFamily("Phi3ForCausalLM", "");
  ASSERT_NE(family, nullptr);
  EXPECT_EQ(family->name, "phi3");
  auto checkpoint = OpenCheckpoint(testing::HfFamilyDir("phi3-fused"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->config().family, "phi3");
  auto model = DescribeModel((*checkpoint)->config());
  ASSERT_TRUE(model.ok()) << model.status();
  // The fused checkpoint tensors are the runner tensors as they are: one part each.
  const WeightPlan& plan = (*model)->weights();
  const std::vector<Weight> qkv = plan.OfKind("qkv");
  ASSERT_EQ(qkv.size(), 2u);
  EXPECT_EQ(plan[qkv[1]].parts.size(), 1u);
  EXPECT_EQ(plan[qkv[1]].parts[0].name, "model.layers.1.self_attn.qkv_proj.weight");
}

TEST(FamilyVariantTest, CpuLogitsMatchTheReference) {
  const std::string dir = testing::HfFamilyDir("phi3-fused");
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner = CpuRunner(**checkpoint);
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->model_config().vocab_size;
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  ASSERT_EQ(ref.prompts.size(), 4u);
  for (size_t j = 0; j < ref.prompts.size(); ++j) {
    const std::vector<int32_t>& prompt = ref.prompts[j];
    StepBatch batch;
    batch.AddSequence(prompt, 0, Blocks(prompt.size()), LogitsMode::kAll);
    StepOutput output;
    ASSERT_TRUE(runner->Execute(batch, &output).ok());
    const std::vector<float> expected = testing::LoadReferenceLogits(dir, static_cast<int>(j));
    ASSERT_EQ(output.logits.size(), prompt.size() * vocab);
    ASSERT_EQ(expected.size(), output.logits.size());
    double max_error = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      max_error = std::max(max_error, double{std::abs(output.logits[i] - expected[i])});
    }
    std::printf("[ logits   ] phi3-fused prompt %zu (%3zu tokens): max |error| %.3g\n", j,
                prompt.size(), max_error);
    EXPECT_LT(max_error, 1e-4) << "prompt " << j;
  }
}

TEST(FamilyVariantTest, CpuGreedyDecodingMatchesTheReference) {
  const std::string dir = testing::HfFamilyDir("phi3-fused");
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner = CpuRunner(**checkpoint);
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->model_config().vocab_size;
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  size_t compared = 0;
  for (size_t j = 0; j < ref.prompts.size(); ++j) {
    std::vector<int32_t> sequence = ref.prompts[j];
    const size_t steps = ref.greedy[j].size();
    const std::vector<int32_t> blocks = Blocks(sequence.size() + steps);
    std::vector<int32_t> generated;
    for (size_t step = 0; step < steps; ++step) {
      StepBatch batch;
      const size_t computed = step == 0 ? 0 : sequence.size() - 1;
      batch.AddSequence(std::span(sequence).subspan(computed), static_cast<int32_t>(computed),
                        blocks, LogitsMode::kLast);
      StepOutput output;
      ASSERT_TRUE(runner->Execute(batch, &output).ok());
      int32_t token = 0;
      kernels::Argmax(
          {.input = output.logits.data(), .output = &token, .num_rows = 1, .row_size = vocab});
      generated.push_back(token);
      sequence.push_back(token);
    }
    for (size_t step = 0; step < steps; ++step) {
      if (ref.greedy_margin[j][step] <= 1e-3) break;  // a float32 engine may pick either here
      EXPECT_EQ(generated[step], ref.greedy[j][step]) << "prompt " << j << " step " << step;
      ++compared;
    }
  }
  EXPECT_GT(compared, 48u);
}

TEST(FamilyVariantTest, UnknownArchitecturesNameTheRegisteredOnes) {
  nlohmann::json config = {{"architectures", {"GptNeoXForCausalLM"}}};
  auto parsed = ParseHfConfig(config, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(parsed.status().message(), HasSubstr("GptNeoXForCausalLM"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("Phi3ForCausalLM"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("Qwen2ForCausalLM"));
}

}  // namespace
}  // namespace lmserve::engine
