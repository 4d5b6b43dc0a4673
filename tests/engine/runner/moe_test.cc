// Mixture of experts on the CPU runner: the Mixtral fixture (tests/fixtures/hf-families/
// mixtral-moe: 4 experts, top 2) against Hugging Face's float64 logits and greedy tokens, whole
// and in chunks, batched against alone; its GGUF forms (llama architecture with expert tensors, as
// llama.cpp writes Mixtral) against its safetensors form; and dummy weights.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/families/llama.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

constexpr char kMixtral[] = "mixtral-moe";
constexpr int32_t kBlockSize = 16;

std::unique_ptr<ModelRunner> CpuRunner(const Checkpoint& checkpoint,
                                       LoadFormat format = LoadFormat::kCheckpoint) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
  config.kv_cache_bytes = int64_t{16} << 20;
  config.num_threads = 1;
  config.load_format = format;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

// The logits of every position of `prompt`, in steps of `chunk` tokens (0: one step).
std::vector<float> PromptLogits(ModelRunner& runner, const std::vector<int32_t>& prompt,
                                size_t chunk) {
  return testing::PromptLogits(runner, prompt, chunk);
}

// max |a - b| / max(1, the row's largest |b| / 10), over rows of `vocab`.
double MaxScaledError(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t row = 0; row * vocab < b.size(); ++row) {
    double scale = 1;
    for (int64_t v = 0; v < vocab; ++v)
      scale = std::max(scale, double{std::abs(b[row * vocab + v])});
    for (int64_t v = 0; v < vocab; ++v) {
      const size_t i = row * vocab + v;
      worst = std::max(worst, std::abs(double{a[i]} - b[i]) / std::max(1.0, scale / 10));
    }
  }
  return worst;
}

TEST(MoeTest, MixtralFixtureDescribesItsExperts) {
  auto checkpoint = OpenCheckpoint(testing::HfFamilyDir(kMixtral));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const ModelConfig& c = (*checkpoint)->config();
  EXPECT_EQ(c.family, "mixtral");
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, c.intermediate_size);
  EXPECT_TRUE(c.norm_topk_prob);
  auto model = DescribeModel(c);
  ASSERT_TRUE(model.ok()) << model.status();
  const WeightPlan& plan = (*model)->weights();
  EXPECT_TRUE(plan.OfKind("gate_up").empty());
  const std::vector<Weight> gate_up = plan.OfKind("moe_gate_up");
  ASSERT_EQ(gate_up.size(), 2u);
  const WeightSpec& spec = plan[gate_up[1]];
  EXPECT_EQ(spec.rows, 4 * 2 * c.moe_intermediate_size);
  EXPECT_EQ(spec.cols, c.hidden_size);
  ASSERT_EQ(spec.parts.size(), 8u);
  EXPECT_EQ(spec.parts[2].name, "model.layers.1.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(spec.parts[3].name, "model.layers.1.block_sparse_moe.experts.1.w3.weight");
  const std::vector<Weight> down = plan.OfKind("moe_down");
  ASSERT_EQ(down.size(), 2u);
  EXPECT_EQ(plan[down[0]].rows, 4 * c.hidden_size);
  EXPECT_EQ(plan[down[0]].parts[3].name, "model.layers.0.block_sparse_moe.experts.3.w2.weight");
  ASSERT_EQ(plan.OfKind("moe_router").size(), 2u);
}

TEST(MoeTest, SparseLayersFollowDecoderSparseStepAndMlpOnlyLayers) {
  ModelConfig c;
  EXPECT_FALSE(IsMoeLayer(c, 0));
  c.num_experts = 8;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  // Qwen3-MoE: sparse when (l + 1) % step == 0 and l is not an MLP-only layer.
  EXPECT_FALSE(IsMoeLayer(c, 0));
  EXPECT_TRUE(IsMoeLayer(c, 1));
  EXPECT_FALSE(IsMoeLayer(c, 2));
  EXPECT_FALSE(IsMoeLayer(c, 3));
  EXPECT_TRUE(IsMoeLayer(c, 5));
}

TEST(MoeTest, Qwen3MoeKeysAreRead) {
  // The qwen3-moe fixture's config.json, read with Qwen3-MoE's keys (its family is Qwen3's
  // description, which this branch does not have yet).
  std::ifstream file(testing::HfFamilyDir("qwen3-moe") + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(file);
  ModelConfig c;
  c.intermediate_size = 256;
  ASSERT_TRUE(ReadHfMoeConfig(config, "num_experts", /*default_norm_topk_prob=*/false, &c).ok());
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_TRUE(IsMoeLayer(c, 0) && IsMoeLayer(c, 1));
  // transformers' default: no renormalization.
  nlohmann::json bare = config;
  bare.erase("norm_topk_prob");
  bare["mlp_only_layers"] = {1};
  ASSERT_TRUE(ReadHfMoeConfig(bare, "num_experts", /*default_norm_topk_prob=*/false, &c).ok());
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_TRUE(IsMoeLayer(c, 0));
  EXPECT_FALSE(IsMoeLayer(c, 1));
  const MoeTensorNames names = Qwen3MoeNames();
  EXPECT_EQ(names.Expert(3, 5, names.up), "model.layers.3.mlp.experts.5.up_proj.weight");
  EXPECT_EQ(LayerTensorName(3, names.router), "model.layers.3.mlp.gate.weight");
}

TEST(MoeTest, BadExpertCountsAreRejected) {
  nlohmann::json config = {{"architectures", {"MixtralForCausalLM"}},
                           {"vocab_size", 64},
                           {"hidden_size", 16},
                           {"intermediate_size", 32},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"max_position_embeddings", 64},
                           {"num_local_experts", 4},
                           {"num_experts_per_tok", 5}};
  auto parsed = ParseHfConfig(config, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), ::testing::HasSubstr("per token"));
  config["num_experts_per_tok"] = 2;
  EXPECT_TRUE(ParseHfConfig(config, nullptr).ok());
  config.erase("num_local_experts");
  EXPECT_FALSE(ParseHfConfig(config, nullptr).ok());
}

TEST(MoeTest, CpuLogitsMatchTheReferenceWholeAndInChunks) {
  const std::string dir = testing::HfFamilyDir(kMixtral);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner = CpuRunner(**checkpoint);
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->model_config().vocab_size;
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  ASSERT_EQ(ref.prompts.size(), 4u);
  for (size_t j = 0; j < ref.prompts.size(); ++j) {
    const std::vector<float> expected = testing::LoadReferenceLogits(dir, static_cast<int>(j));
    for (size_t chunk : {size_t{0}, size_t{5}}) {
      const std::vector<float> logits = PromptLogits(*runner, ref.prompts[j], chunk);
      ASSERT_EQ(logits.size(), expected.size());
      const double error = MaxScaledError(logits, expected, vocab);
      std::printf(
          "[ logits   ] mixtral-moe prompt %zu (%3zu tokens, chunks of %zu): max scaled "
          "|error| %.3g\n",
          j, ref.prompts[j].size(), chunk, error);
      EXPECT_LT(error, 1e-4) << "prompt " << j << " chunk " << chunk;
    }
  }
}

TEST(MoeTest, CpuGreedyDecodingMatchesTheReference) {
  const std::string dir = testing::HfFamilyDir(kMixtral);
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
    const std::vector<int32_t> blocks =
        testing::ConsecutiveBlocks(*runner, static_cast<int64_t>(sequence.size() + steps));
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
  EXPECT_EQ(compared, 96u);
}

TEST(MoeTest, BatchedPromptsGetTheirAloneLogits) {
  // All four prompts in one step (tokens of several sequences meet in each expert's GEMM).
  const std::string dir = testing::HfFamilyDir(kMixtral);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner = CpuRunner(**checkpoint);
  ASSERT_NE(runner, nullptr);
  const int64_t vocab = runner->model_config().vocab_size;
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  StepBatch batch;
  int32_t first_block = 0;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    const std::vector<int32_t> blocks =
        testing::ConsecutiveBlocks(*runner, static_cast<int64_t>(prompt.size()), first_block);
    first_block += static_cast<int32_t>(blocks.size());
    batch.AddSequence(prompt, 0, blocks, LogitsMode::kAll);
  }
  StepOutput output;
  ASSERT_TRUE(runner->Execute(batch, &output).ok());
  for (size_t j = 0; j < ref.prompts.size(); ++j) {
    const std::vector<float> alone = PromptLogits(*runner, ref.prompts[j], 0);
    const std::vector<float> batched(
        output.logits.begin() + output.logits_row_start[j] * vocab,
        output.logits.begin() + output.logits_row_start[j + 1] * vocab);
    ASSERT_EQ(batched.size(), alone.size());
    EXPECT_LE(MaxScaledError(batched, alone, vocab), 1e-5) << "prompt " << j;
  }
}

TEST(MoeTest, GgufFormsGiveTheSafetensorsLogits) {
  const std::string dir = testing::HfFamilyDir(kMixtral);
  auto hf = OpenCheckpoint(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  std::unique_ptr<ModelRunner> hf_runner = CpuRunner(**hf);
  ASSERT_NE(hf_runner, nullptr);
  const int64_t vocab = hf_runner->model_config().vocab_size;
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  // F32 and F16 hold the bf16 weights (F16 all but tiny values): gguf_logits_test.cc's bounds.
  // Q8_0 moves the router's inputs, and a token whose top-k choice flips changes its logits by
  // their own size: its bound is on the rows' top-1 tokens instead (agreement printed).
  struct Form {
    GgufOutputType type;
    const char* name;
    double bound;  // max scaled |error|; 0: top-1 agreement only
  };
  for (const Form& form :
       {Form{GgufOutputType::kF32, "F32", 1e-5}, Form{GgufOutputType::kF16, "F16", 1e-3},
        Form{GgufOutputType::kQ8_0, "Q8_0", 0}}) {
    const std::string path = testing::TempDir() + "/mixtral-moe-" + form.name + ".gguf";
    ASSERT_TRUE(WriteGgufCheckpoint(**hf, form.type, path).ok()) << form.name;
    // As llama.cpp writes Mixtral: llama, with expert counts and 3-D expert tensors.
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->GetString("general.architecture"), "llama");
    EXPECT_EQ((*file)->GetInt("llama.expert_count"), 4);
    EXPECT_EQ((*file)->GetInt("llama.expert_used_count"), 2);
    const GgufTensorInfo* gate = (*file)->FindTensor("blk.1.ffn_gate_exps.weight");
    ASSERT_NE(gate, nullptr);
    EXPECT_EQ(gate->dims, (std::vector<int64_t>{128, 256, 4}));
    const GgufTensorInfo* down = (*file)->FindTensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->dims, (std::vector<int64_t>{256, 128, 4}));
    const GgufTensorInfo* router = (*file)->FindTensor("blk.0.ffn_gate_inp.weight");
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->dims, (std::vector<int64_t>{128, 4}));
    EXPECT_EQ(router->dtype, kernels::DType::kF32);  // llama.cpp's converter keeps it in F32

    auto gguf = OpenCheckpoint(path);
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    EXPECT_EQ((*gguf)->config().family, "mixtral");
    EXPECT_EQ((*gguf)->config().num_experts, 4);
    EXPECT_EQ((*gguf)->config().rope.layout, RopeLayout::kInterleaved);
    std::unique_ptr<ModelRunner> gguf_runner = CpuRunner(**gguf);
    ASSERT_NE(gguf_runner, nullptr);
    double worst = 0;
    int64_t rows = 0, same_top1 = 0;
    for (const std::vector<int32_t>& prompt : ref.prompts) {
      const std::vector<float> got = PromptLogits(*gguf_runner, prompt, 0);
      const std::vector<float> want = PromptLogits(*hf_runner, prompt, 0);
      worst = std::max(worst, MaxScaledError(got, want, vocab));
      for (size_t r = 0; r < prompt.size(); ++r, ++rows) {
        const auto g = got.begin() + r * vocab, w = want.begin() + r * vocab;
        same_top1 += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
      }
    }
    std::printf(
        "mixtral-moe GGUF %-5s max scaled |logit - safetensors logit| = %.3g; top-1 "
        "equal in %lld of %lld rows\n",
        form.name, worst, static_cast<long long>(same_top1), static_cast<long long>(rows));
    if (form.bound > 0) {
      EXPECT_LE(worst, form.bound) << form.name;
    } else {
      EXPECT_GE(same_top1, rows * 9 / 10) << form.name;
    }

    // And exported again from the GGUF form: the same tensors.
    const std::string again = path + ".again.gguf";
    ASSERT_TRUE(WriteGgufCheckpoint(**gguf, GgufOutputType::kF32, again).ok());
    auto reopened = OpenCheckpoint(again);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    EXPECT_EQ((*reopened)->config().family, "mixtral");
    std::remove(again.c_str());
    std::remove(path.c_str());
  }
}

TEST(MoeTest, DummyWeightsRun) {
  auto checkpoint = OpenConfigOnlyCheckpoint(testing::HfFamilyDir(kMixtral));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner = CpuRunner(**checkpoint, LoadFormat::kDummy);
  ASSERT_NE(runner, nullptr);
  const std::vector<float> logits = PromptLogits(*runner, {5, 9, 200, 17, 3}, 0);
  ASSERT_EQ(logits.size(), 5u * runner->model_config().vocab_size);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace lmserve::engine
