// Every model family on the CPU runner (float32) against Hugging Face's float64 fixtures
// (tests/fixtures/hf-families): teacher-forced logits, the same logits from a prefill in chunks,
// greedy decoding through the paged cache, and the same logits again after a round trip through
// export-gguf.
//
// Bounds. Logits: 1e-4 absolute, times |logit| / 10 beyond 10 (one fp32 step of a logit of 100 is
// 7.6e-6, and errors grow with the logit's size). Chunked prefill and GGUF F32 against the one-shot
// safetensors run: 5e-5 on the same scale. Both compute the same function in fp32 and differ only
// in rounding: chunks change OpenBLAS's blocking of every projection, and GGUF keeps longrope's
// attention factor as f32; these models carry such rounding to 1.4e-5 - 2.2e-5 in the logits, the
// size of each run's own distance from the float64 reference (at most 2.6e-5).
// Greedy: tokens equal up to the first step whose reference margin is 1e-3 or less, where a
// float32 engine may pick either token.
//
// Phi-3's longrope takes its short factors for contexts up to original_max_position_embeddings
// and its long ones beyond (RopeForContext). Hugging Face switches by the sequence's length, so a
// fixture prompt that stays within the original context (with its greedy tokens) is compared on a
// runner serving that context, and a longer one on a runner serving the model's.

#include "engine/model/family.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;

struct FamilyCase {
  const char* fixture;
  const char* family;
  const char* gguf_family;  // the family its GGUF form opens as: Mistral's is llama's; null:
                            // the family has no GGUF form here yet
};

// The families' fixtures (moe_test.cc tests Mixtral further).
const FamilyCase kCases[] = {
    {"qwen3-qknorm", "qwen3", "qwen3"},
    {"gemma2-softcap-sliding", "gemma2", "gemma2"},
    {"gemma3-local-global", "gemma3", "gemma3"},
    {"gemma3-rope-scaling", "gemma3", "gemma3"},
    {"phi3-fused", "phi3", "phi3"},
    {"phi3-longrope-partial", "phi3", "phi3"},
    {"mistral-sliding", "mistral", "llama"},
    {"qwen3-moe", "qwen3_moe", "qwen3_moe"},
    {"mixtral-moe", "mixtral", "mixtral"},
    {"mamba2-ssm", "mamba2", nullptr},  // ssm_test.cc tests its state further
};

// The context a fixture prompt of `tokens` tokens (greedy ones included) is served at: 0 (the
// model's) but for longrope within its original context.
int64_t ContextFor(const ModelConfig& config, int64_t tokens) {
  if (config.rope.scaling == RopeScaling::kLongRope &&
      tokens <= config.rope.original_max_position_embeddings) {
    return config.rope.original_max_position_embeddings;
  }
  return 0;
}

std::unique_ptr<ModelRunner> CpuRunner(const Checkpoint& checkpoint, int64_t context = 0) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.kv_cache_bytes = int64_t{32} << 20;
  config.num_threads = 2;
  config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
  config.max_context_len = context;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

using testing::ScaledError;

// Teacher-forced logits of `prompt`, fed in chunks of `chunk` tokens (0: at once).
std::vector<float> Logits(ModelRunner& runner, const std::vector<int32_t>& prompt,
                          size_t chunk = 0) {
  return testing::PromptLogits(runner, prompt, chunk);
}

class FamilyTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override {
    dir_ = testing::HfFamilyDir(GetParam().fixture);
    auto checkpoint = OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    ASSERT_EQ(checkpoint_->config().family, GetParam().family);
    ref_ = testing::LoadReference(dir_);
    ASSERT_FALSE(ref_.prompts.empty());
  }

  int64_t Context(size_t j) const {
    return ContextFor(checkpoint_->config(),
                      static_cast<int64_t>(ref_.prompts[j].size() + ref_.greedy[j].size()));
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
  testing::HfTinyReference ref_;
};

TEST_P(FamilyTest, TeacherForcedLogitsMatchTheReference) {
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    std::unique_ptr<ModelRunner> runner = CpuRunner(*checkpoint_, Context(j));
    ASSERT_NE(runner, nullptr);
    const std::vector<float> got = Logits(*runner, ref_.prompts[j]);
    const std::vector<float> want = testing::LoadReferenceLogits(dir_, static_cast<int>(j));
    ASSERT_EQ(got.size(), want.size());
    const double error = ScaledError(got, want);
    std::printf("[ logits   ] %-24s prompt %zu (%3zu tokens): scaled max |error| %.3g\n",
                GetParam().fixture, j, ref_.prompts[j].size(), error);
    EXPECT_LE(error, 1e-4) << "prompt " << j;
  }
}

TEST_P(FamilyTest, ChunkedPrefillGivesTheSameLogits) {
  const size_t longest =
      std::max_element(ref_.prompts.begin(), ref_.prompts.end(),
                       [](const auto& a, const auto& b) { return a.size() < b.size(); }) -
      ref_.prompts.begin();
  const std::vector<int32_t>& prompt = ref_.prompts[longest];
  std::unique_ptr<ModelRunner> runner = CpuRunner(*checkpoint_, Context(longest));
  ASSERT_NE(runner, nullptr);
  const std::vector<float> whole = Logits(*runner, prompt);
  for (size_t chunk : {1, 7, 32}) {
    const std::vector<float> chunked = Logits(*runner, prompt, chunk);
    ASSERT_EQ(chunked.size(), whole.size());
    EXPECT_LE(ScaledError(chunked, whole), 5e-5) << "chunks of " << chunk;
  }
}

TEST_P(FamilyTest, GreedyDecodingMatchesTheReference) {
  size_t compared = 0, total = 0;
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    std::unique_ptr<ModelRunner> runner = CpuRunner(*checkpoint_, Context(j));
    ASSERT_NE(runner, nullptr);
    const int64_t vocab = runner->model_config().vocab_size;
    std::vector<int32_t> sequence = ref_.prompts[j];
    const size_t steps = ref_.greedy[j].size();
    // Blocks in descending order: the table is not the identity.
    std::vector<int32_t> blocks =
        testing::ConsecutiveBlocks(*runner, static_cast<int64_t>(sequence.size() + steps));
    std::reverse(blocks.begin(), blocks.end());
    std::vector<int32_t> generated;
    for (size_t step = 0; step < steps; ++step) {
      StepBatch batch;
      const size_t computed = step == 0 ? 0 : sequence.size() - 1;
      testing::AddSequenceToEveryGroup(&batch, *runner, std::span(sequence).subspan(computed),
                                       static_cast<int32_t>(computed), blocks, LogitsMode::kLast);
      StepOutput output;
      ASSERT_TRUE(runner->Execute(batch, &output).ok());
      int32_t token = 0;
      kernels::Argmax(
          {.input = output.logits.data(), .output = &token, .num_rows = 1, .row_size = vocab});
      generated.push_back(token);
      sequence.push_back(token);
    }
    for (size_t step = 0; step < steps; ++step) {
      if (ref_.greedy_margin[j][step] <= 1e-3) break;  // a float32 engine may pick either here
      EXPECT_EQ(generated[step], ref_.greedy[j][step]) << "prompt " << j << " step " << step;
      ++compared;
    }
    total += steps;
  }
  std::printf("[ greedy   ] %-24s %zu of %zu tokens compared\n", GetParam().fixture, compared,
              total);
  EXPECT_GT(compared, total / 2);
}

TEST_P(FamilyTest, ExportedGgufGivesTheSafetensorsLogits) {
  if (GetParam().gguf_family == nullptr) GTEST_SKIP() << "no GGUF form of this family yet";
  const std::string path = testing::TempDir() + "/" + GetParam().fixture + ".gguf";
  ASSERT_TRUE(WriteGgufCheckpoint(*checkpoint_, GgufOutputType::kF32, path).ok());
  auto gguf = OpenCheckpoint(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  EXPECT_EQ((*gguf)->config().family, GetParam().gguf_family);
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    std::unique_ptr<ModelRunner> hf = CpuRunner(*checkpoint_, Context(j));
    std::unique_ptr<ModelRunner> from_gguf = CpuRunner(**gguf, Context(j));
    ASSERT_NE(hf, nullptr);
    ASSERT_NE(from_gguf, nullptr);
    const std::vector<float> want = Logits(*hf, ref_.prompts[j]);
    const std::vector<float> got = Logits(*from_gguf, ref_.prompts[j]);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(ScaledError(got, want), 5e-5) << "prompt " << j;
  }
  std::remove(path.c_str());
}

// --load-format dummy: the family's shapes with generated weights (benchmarks of models that are
// not on the machine) run and give finite logits.
TEST_P(FamilyTest, DummyWeightsRun) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.kv_cache_bytes = int64_t{32} << 20;
  config.load_format = LoadFormat::kDummy;
  auto runner = ModelRunner::Create(*checkpoint_, config);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::vector<float> logits = Logits(**runner, ref_.prompts.back());
  ASSERT_FALSE(logits.empty());
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
  EXPECT_NE(logits, testing::LoadReferenceLogits(dir_, static_cast<int>(ref_.prompts.size() - 1)));
}

// GGUF files made by llama.cpp's own converter (tests/fixtures/convert_with_llama_cpp.py, which
// needs torch) give the safetensors logits too: tensor names, norm conventions and metadata as
// llama.cpp writes them. The files are not kept in the repository (12 MB): the test reads them
// from $LMSERVE_LLAMA_CPP_GGUF_DIR/NAME.bf16.gguf and skips without them.
TEST_P(FamilyTest, LlamaCppGgufGivesTheSafetensorsLogits) {
  if (GetParam().gguf_family == nullptr) GTEST_SKIP() << "no GGUF form of this family yet";
  const char* dir = std::getenv("LMSERVE_LLAMA_CPP_GGUF_DIR");
  if (dir == nullptr) GTEST_SKIP() << "LMSERVE_LLAMA_CPP_GGUF_DIR is not set";
  const std::string path = std::string(dir) + "/" + GetParam().fixture + ".bf16.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " does not exist";
  auto gguf = OpenCheckpoint(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  EXPECT_EQ((*gguf)->config().family, GetParam().gguf_family);
  if ((*gguf)->config().sliding_layers != checkpoint_->config().sliding_layers ||
      (*gguf)->config().sliding_window != checkpoint_->config().sliding_window) {
    // What llama.cpp's files cannot say, so that the file is another model: gemma3-rope-scaling's
    // layer_types are not Gemma 3's pattern (the gemma3 GGUF has no key for them: llama.cpp takes
    // every sixth layer as global), and the converter drops Mistral's window (llama architecture).
    GTEST_SKIP() << path << ": llama.cpp's file does not keep the model's sliding window";
  }
  double worst = 0;
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    std::unique_ptr<ModelRunner> hf = CpuRunner(*checkpoint_, Context(j));
    std::unique_ptr<ModelRunner> from_gguf = CpuRunner(**gguf, Context(j));
    ASSERT_NE(hf, nullptr);
    ASSERT_NE(from_gguf, nullptr);
    const std::vector<float> want = Logits(*hf, ref_.prompts[j]);
    const std::vector<float> got = Logits(*from_gguf, ref_.prompts[j]);
    ASSERT_EQ(got.size(), want.size());
    worst = std::max(worst, ScaledError(got, want));
  }
  std::printf("[ llama.cpp] %-24s scaled max |logit - safetensors logit| %.3g\n",
              GetParam().fixture, worst);
  EXPECT_LE(worst, 5e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<FamilyCase>& info) {
                           std::string name = info.param.fixture;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(FamilyRegistryTest, UnknownArchitecturesNameTheSupportedOnes) {
  auto parsed = ParseHfConfig(nlohmann::json{{"architectures", {"GptNeoXForCausalLM"}}}, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnimplemented);
  for (const char* name : {"GptNeoXForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
                           "Gemma3ForCausalLM", "Phi3ForCausalLM"}) {
    EXPECT_NE(parsed.status().message().find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace lmserve::engine
