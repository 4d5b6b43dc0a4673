// Tensor parallelism's CPU twin (engine/runner/tensor_parallel_runner.h): the sharded plan run on
// N CPU shards in one process (threads; a sum in rank order standing for the all-reduce) against
// the whole model on one runner, on every fixture: teacher-forced logits within 5e-5 (scaled
// beyond |logit| 10 as tests/engine/runner/family_test.cc does), through a prefill in chunks too
// (the KV cache's heads split across the shards), and the same sampled tokens. The bound is the
// one family_test.cc holds a chunked prefill to, for the same reason: the two runs compute one
// function in fp32 and differ in the order of sums only (here each shard sums its part of a
// row-parallel projection and the parts are added after; OpenBLAS blocks the narrower GEMMs
// differently), which these tiny random models carry to 3.2e-5 in the logits. Both stay within
// the float64 reference's 1e-4 (checked too). A size that does not divide the model is refused,
// naming what it does not divide. On the GPU the same plan runs with NCCL
// (tests/engine/runner_gpu/tensor_parallel_gpu_test.cc).

#include "engine/runner/tensor_parallel_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr double kTolerance = 5e-5;      // against the whole model
constexpr double kReferenceBound = 1e-4;  // against float64, as family_test.cc

struct Fixture {
  const char* name;
  bool family;  // hf-families (else hf-tiny)
};

const Fixture kFixtures[] = {
    {"llama-gqa", false},
    {"llama-hd128", false},
    {"llama-mqa-tied-llama3rope", false},
    {"qwen2-bias", false},
    {"qwen3-qknorm", true},
    {"gemma2-softcap-sliding", true},
    {"gemma3-local-global", true},
    {"phi3-fused", true},
    {"phi3-longrope-partial", true},
    {"mistral-sliding", true},
    {"qwen3-moe", true},
    {"mixtral-moe", true},
};

absl::StatusOr<std::unique_ptr<ModelRunner>> Runner(const Checkpoint& checkpoint, int32_t tp) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
  config.kv_cache_bytes = int64_t{16} << 20;
  config.num_threads = 2;
  config.tensor_parallel_size = tp;
  return ModelRunner::Create(checkpoint, config);
}

// Teacher-forced logits of `prompt` fed in chunks of `chunk` tokens (0: at once), and the token
// each chunk's last position draws at temperature 1 with a fixed seed.
struct Outcome {
  std::vector<float> logits;
  std::vector<int32_t> sampled;
};
Outcome Forward(ModelRunner& runner, const std::vector<int32_t>& prompt, size_t chunk) {
  Outcome run;
  std::vector<int32_t> blocks((prompt.size() + kBlockSize - 1) / kBlockSize);
  std::iota(blocks.begin(), blocks.end(), 0);
  if (chunk == 0) chunk = prompt.size();
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    const size_t count = std::min(chunk, prompt.size() - start);
    StepBatch batch;
    testing::AddSequenceToEveryGroup(&batch, runner, std::span(prompt).subspan(start, count),
                                     static_cast<int32_t>(start), blocks, LogitsMode::kAll);
    StepOutput output;
    absl::Status status = runner.Execute(batch, &output);
    EXPECT_TRUE(status.ok()) << status;
    run.logits.insert(run.logits.end(), output.logits.begin(), output.logits.end());
    // The same context again, sampled by the runner (its KV slots rewritten with equal values).
    StepBatch sample;
    testing::AddSequenceToEveryGroup(&sample, runner, std::span(prompt).subspan(start, count),
                                     static_cast<int32_t>(start), blocks, LogitsMode::kSample);
    sample.sampling.push_back({.temperature = 1.0f, .seed = 1234, .step = start + count});
    status = runner.Execute(sample, &output);
    EXPECT_TRUE(status.ok()) << status;
    run.sampled.push_back(output.sampled_tokens.empty() ? -1 : output.sampled_tokens[0]);
  }
  return run;
}

using testing::ScaledError;
double MaxAbsDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double{a[i]} - b[i]));
  return worst;
}

bool UsesLongRope(const ModelConfig& c) { return c.rope.scaling == RopeScaling::kLongRope; }

class TensorParallelTest : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    dir_ = GetParam().family ? testing::HfFamilyDir(GetParam().name)
                             : testing::HfTinyDir(GetParam().name);
    auto checkpoint = OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    ref_ = testing::LoadReference(dir_);
    ASSERT_FALSE(ref_.prompts.empty());
  }

  // Every prompt on N shards against one runner; or, where N does not divide the model, the
  // refusal.
  void CompareShards(const Checkpoint& checkpoint, int32_t tp) {
    const ModelConfig& c = checkpoint.config();
    auto whole = Runner(checkpoint, 1);
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto sharded = Runner(checkpoint, tp);
    if (!ShardModelConfig(c, tp, 0).ok()) {
      ASSERT_FALSE(sharded.ok()) << "tp " << tp << " of " << c.num_attention_heads << "/"
                                 << c.num_kv_heads << " heads was accepted";
      EXPECT_EQ(sharded.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(sharded.status().message().find("--tensor-parallel-size"), std::string::npos)
          << sharded.status();
      return;
    }
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    EXPECT_EQ((*sharded)->model_config().num_attention_heads, c.num_attention_heads);
    EXPECT_GT((*sharded)->num_kv_blocks(), 0);
    for (size_t j = 0; j < ref_.prompts.size(); ++j) {
      for (size_t chunk : {size_t{0}, size_t{7}}) {
        const Outcome want = Forward(**whole, ref_.prompts[j], chunk);
        const Outcome got = Forward(**sharded, ref_.prompts[j], chunk);
        ASSERT_EQ(got.logits.size(), want.logits.size());
        const double error = ScaledError(got.logits, want.logits);
        EXPECT_LE(error, kTolerance) << "tp " << tp << ", prompt " << j << ", chunk " << chunk;
        if (chunk == 0 && !UsesLongRope(c)) {  // longrope's prompts: family_test.cc's contexts
          EXPECT_LE(ScaledError(got.logits, testing::LoadReferenceLogits(dir_, static_cast<int>(j))),
                    kReferenceBound)
              << "tp " << tp << ", prompt " << j;
        }
        EXPECT_EQ(got.sampled, want.sampled) << "tp " << tp << ", prompt " << j;
        std::printf("%s tp %d prompt %zu chunk %zu: scaled max |difference| %.3g (absolute %.3g)\n",
                    GetParam().name, tp, j, chunk, error,
                    MaxAbsDifference(got.logits, want.logits));
      }
    }
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
  testing::HfTinyReference ref_;
};

TEST_P(TensorParallelTest, TwoShardsGiveTheWholeModelsLogits) { CompareShards(*checkpoint_, 2); }

TEST_P(TensorParallelTest, FourShardsGiveTheWholeModelsLogits) { CompareShards(*checkpoint_, 4); }

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelTest, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<Fixture>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A GGUF file with Q8_0 weights: row slices keep the blocks; column slices are dequantized first.
TEST(TensorParallelGgufTest, QuantizedFileSplitsAsTheSafetensorsDo) {
  const std::string dir = testing::HfTinyDir("llama-gqa");
  auto hf = OpenCheckpoint(dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  const std::string path = testing::TempDir() + "/tp-llama-gqa-q8_0.gguf";
  ASSERT_TRUE(WriteGgufCheckpoint(**hf, GgufOutputType::kQ8_0, path).ok());
  auto gguf = OpenCheckpoint(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  auto whole = Runner(**gguf, 1);
  auto sharded = Runner(**gguf, 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const Outcome want = Forward(**whole, ref.prompts[0], 0);
  const Outcome got = Forward(**sharded, ref.prompts[0], 0);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  EXPECT_LE(ScaledError(got.logits, want.logits), kTolerance);
  std::remove(path.c_str());
}

TEST(ShardModelConfigTest, SplitsHeadsAndWidthsAndNamesWhatDoesNotDivide) {
  ModelConfig c;
  c.vocab_size = 1001;
  c.num_attention_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  auto two = ShardModelConfig(c, 2, 1);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_attention_heads, 4);
  EXPECT_EQ(two->num_kv_heads, 1);
  EXPECT_EQ(two->intermediate_size, 48);
  EXPECT_EQ(two->moe_intermediate_size, 16);
  EXPECT_EQ(two->tensor_parallel_kv_slices, 2);
  EXPECT_EQ(VocabShardRows(*two), 501);
  // Four ranks share two KV heads: one each, two ranks a head.
  auto four = ShardModelConfig(c, 4, 3);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->num_kv_heads, 1);
  EXPECT_EQ(four->tensor_parallel_kv_slices, 2);
  auto three = ShardModelConfig(c, 3, 0);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("num_attention_heads (8)"), std::string::npos)
      << three.status();
  c.num_kv_heads = 4;
  c.num_attention_heads = 24;
  auto six = ShardModelConfig(c, 6, 0);  // 24 heads divide; 4 KV heads neither divide nor do 6
  ASSERT_FALSE(six.ok());
  EXPECT_NE(six.status().message().find("num_key_value_heads (4)"), std::string::npos)
      << six.status();
  EXPECT_FALSE(ShardModelConfig(c, 2, 2).ok());  // rank out of range
}

}  // namespace
}  // namespace lmserve::engine
