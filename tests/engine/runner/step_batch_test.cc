// StepBatch construction, ValidateStepBatch's rejections (with the KV cache left as it was),
// ModelRunner::Create's errors, and the runner dtypes (names, resolution, sizes, the CPU runner's
// float32-only rule).

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StepBatchTest, AddSequenceBuildsTheCsrArrays) {
  StepBatch batch;
  EXPECT_EQ(batch.num_seqs(), 0);
  const std::vector<int32_t> a = {5, 6, 7}, b = {9};
  const std::vector<int32_t> a_blocks = {4}, b_blocks = {0, 2};
  batch.AddSequence(a, 0, a_blocks, LogitsMode::kAll);
  batch.AddSequence(b, 20, b_blocks, LogitsMode::kLast);
  EXPECT_EQ(batch.num_seqs(), 2);
  EXPECT_EQ(batch.num_tokens(), 4);
  EXPECT_THAT(batch.token_ids, ElementsAre(5, 6, 7, 9));
  EXPECT_THAT(batch.query_start, ElementsAre(0, 3, 4));
  EXPECT_THAT(batch.context_lens, ElementsAre(3, 21));
  EXPECT_THAT(batch.block_table_start, ElementsAre(0, 1, 3));
  EXPECT_THAT(batch.block_table_ids, ElementsAre(4, 0, 2));
  EXPECT_THAT(batch.logits_modes, ElementsAre(LogitsMode::kAll, LogitsMode::kLast));
  ModelConfig config;
  config.vocab_size = 10;
  config.max_position_embeddings = 32;
  EXPECT_TRUE(ValidateStepBatch(batch, config, 16, 5).ok());
  batch.Clear();
  EXPECT_EQ(batch.num_seqs(), 0);
  EXPECT_TRUE(batch.query_start.empty());
  EXPECT_TRUE(ValidateStepBatch(batch, config, 16, 5).ok()) << "the empty batch is valid";
  batch.AddSequence(b, 0, b_blocks, LogitsMode::kNone);
  EXPECT_THAT(batch.query_start, ElementsAre(0, 1));
}

TEST(StepBatchTest, TablesPerKvCacheGroupAndTheEntriesAWindowMayDrop) {
  ModelConfig config;
  config.vocab_size = 10;
  config.max_position_embeddings = 64;
  // Group 0 has window 8, group 1 full attention; blocks of 4.
  const std::vector<int32_t> windows = {8, 0};
  StepBatch batch;
  const std::vector<int32_t> a = {1, 2}, b = {3};
  // a: positions 18 and 19. Its first query reads from 11: blocks 0 and 1 (positions 0-7) may be
  // -1 in group 0, block 2 (8-11) may not.
  const std::vector<int32_t> a0 = {-1, -1, 4, 5, 6}, a1 = {0, 1, 2, 3, 7};
  const std::vector<int32_t> b0 = {8}, b1 = {9};
  const std::span<const int32_t> a_tables[] = {a0, a1}, b_tables[] = {b0, b1};
  batch.AddSequence(a, 18, a_tables, LogitsMode::kLast);
  batch.AddSequence(b, 0, b_tables, LogitsMode::kLast);
  EXPECT_EQ(batch.num_kv_groups, 2);
  EXPECT_THAT(batch.block_table_start, ElementsAre(0, 5, 10, 11, 12));
  EXPECT_THAT(batch.BlockTable(0, 1), ElementsAre(0, 1, 2, 3, 7));
  EXPECT_THAT(batch.BlockTable(1, 0), ElementsAre(8));
  EXPECT_TRUE(ValidateStepBatch(batch, config, 4, 16, windows).ok());

  StepBatch too_early = batch;
  too_early.block_table_ids[2] = -1;  // block 2 of group 0: read by the query at 18
  EXPECT_THAT(ValidateStepBatch(too_early, config, 4, 16, windows).message(),
              HasSubstr("block -1 at entry 2 of KV cache group 0"));
  StepBatch full = batch;
  full.block_table_ids[5] = -1;  // group 1 has no window: every entry is read
  EXPECT_THAT(ValidateStepBatch(full, config, 4, 16, windows).message(),
              HasSubstr("block -1 at entry 0 of KV cache group 1"));
  EXPECT_THAT(ValidateStepBatch(batch, config, 4, 16).message(),
              HasSubstr("block tables for 2 KV cache groups; the model has 1"));
  batch.Clear();
  EXPECT_EQ(batch.num_kv_groups, 1);
}

class ValidateStepBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    RunnerConfig config;
    config.kv_cache_bytes = 64 * CpuKvBlockBytes(checkpoint_->config(), 16);  // 64 blocks
    config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
    auto runner = ModelRunner::Create(*checkpoint_, config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    ASSERT_EQ(runner_->num_kv_blocks(), 64);
    // A 20-token sequence in blocks 7 and 3.
    prompt_.resize(20);
    std::iota(prompt_.begin(), prompt_.end(), 100);
    StepBatch batch;
    batch.AddSequence(prompt_, 0, blocks_, LogitsMode::kNone);
    StepOutput output;
    ASSERT_TRUE(runner_->Execute(batch, &output).ok());
  }

  // Decodes token 42 after the prompt: its logits depend on every cached position.
  std::vector<float> DecodeLogits() {
    StepBatch batch;
    const std::vector<int32_t> next = {42};
    batch.AddSequence(next, static_cast<int32_t>(prompt_.size()), blocks_, LogitsMode::kLast);
    StepOutput output;
    EXPECT_TRUE(runner_->Execute(batch, &output).ok());
    return output.logits;
  }

  // A batch whose first sequence is valid and would overwrite the prompt's cached positions 0..4
  // with other tokens; `corrupt` then breaks it.
  StepBatch Poisoned(const std::function<void(StepBatch*)>& corrupt) {
    StepBatch batch;
    const std::vector<int32_t> other = {1, 2, 3, 4, 5};
    batch.AddSequence(other, 0, blocks_, LogitsMode::kLast);
    const std::vector<int32_t> second = {8, 9};
    const std::vector<int32_t> second_blocks = {12};
    batch.AddSequence(second, 3, second_blocks, LogitsMode::kLast);
    corrupt(&batch);
    return batch;
  }

  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<int32_t> prompt_;
  const std::vector<int32_t> blocks_ = {7, 3};
};

TEST_F(ValidateStepBatchTest, RejectsMalformedBatchesWithoutTouchingTheCache) {
  const std::vector<float> before = DecodeLogits();
  ASSERT_FALSE(before.empty());
  struct Case {
    std::string name;
    std::function<void(StepBatch*)> corrupt;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"token id = vocab", [](StepBatch* b) { b->token_ids[6] = 1024; }, "outside the vocabulary"},
      {"negative token id", [](StepBatch* b) { b->token_ids[5] = -1; }, "outside the vocabulary"},
      {"block id = pool size", [](StepBatch* b) { b->block_table_ids[2] = 64; },
       "outside the pool"},
      {"negative block id", [](StepBatch* b) { b->block_table_ids[2] = -1; }, "outside the pool"},
      {"table too short",
       [](StepBatch* b) {
         b->context_lens[1] = 17;  // 2 new tokens after 15 cached: needs 2 blocks
       },
       "blocks of 16 tokens for a context of 17"},
      {"context beyond the model",
       [](StepBatch* b) {
         b->context_lens[1] = 513;
         b->block_table_ids.resize(2 + 33, 1);
         b->block_table_start[2] = 35;
       },
       "beyond the model's 512"},
      {"no new tokens",
       [](StepBatch* b) {
         b->token_ids.resize(5);
         b->query_start[2] = 5;
       },
       "0 new tokens"},
      {"query longer than context", [](StepBatch* b) { b->context_lens[1] = 1; },
       "context of only 1"},
      {"query_start too short", [](StepBatch* b) { b->query_start.pop_back(); }, "query_start"},
      {"logits_modes too short", [](StepBatch* b) { b->logits_modes.pop_back(); }, "logits_modes"},
      {"query_start does not end at num_tokens", [](StepBatch* b) { b->token_ids.push_back(3); },
       "want 0 to num_tokens"},
      {"block_table_start does not end at the ids",
       [](StepBatch* b) { b->block_table_ids.push_back(0); }, "block_table_start runs"},
      {"decreasing query_start",
       [](StepBatch* b) {
         b->query_start[1] = 8;  // sequence 0 has 8, sequence 1 has -1
       },
       "new tokens"},
  };
  for (const Case& c : cases) {
    const StepBatch batch = Poisoned(c.corrupt);
    StepOutput output;
    const absl::Status status = runner_->Execute(batch, &output);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.name;
    EXPECT_EQ(status, ValidateStepBatch(batch, runner_->model_config(), 16, 64)) << c.name;
  }
  EXPECT_EQ(DecodeLogits(), before) << "a rejected batch changed the cache";
  // The control: the uncorrupted batch does change it.
  StepOutput output;
  ASSERT_TRUE(runner_->Execute(Poisoned([](StepBatch*) {}), &output).ok());
  EXPECT_NE(DecodeLogits(), before);
}

TEST(ModelRunnerCreateTest, ReportsUnsupportedBackendsAndBadConfigs) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("qwen2-bias"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig config;
  config.backend = Backend::kCuda;
  if (!CheckCudaDevice().ok()) {
    // Built without CUDA (Unimplemented) or no GPU here (FailedPrecondition): a clear error.
    auto cuda = ModelRunner::Create(**checkpoint, config);
    EXPECT_FALSE(cuda.ok());
    EXPECT_THAT(cuda.status().message(), HasSubstr("CUDA"));
  }

  config.backend = Backend::kCpu;
  config.kv_cache_bytes = CpuKvBlockBytes((*checkpoint)->config(), 16) - 1;
  auto small = ModelRunner::Create(**checkpoint, config);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("less than one KV block"));

  config.kv_cache_bytes = 1 << 20;
  config.block_size_tokens = 0;
  EXPECT_EQ(ModelRunner::Create(**checkpoint, config).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RunnerDTypeTest, NamesResolutionAndSizes) {
  for (RunnerDType dtype : {RunnerDType::kAuto, RunnerDType::kBFloat16, RunnerDType::kFloat32,
                            RunnerDType::kNative}) {
    EXPECT_EQ(RunnerDTypeFromName(RunnerDTypeName(dtype)), dtype);
  }
  EXPECT_EQ(RunnerDTypeName(RunnerDType::kNative), "native");
  EXPECT_EQ(RunnerDTypeName(RunnerDType::kFloat32), "float32");
  EXPECT_EQ(RunnerDTypeName(RunnerDType::kBFloat16), "bfloat16");
  EXPECT_EQ(RunnerDTypeFromName("half"), std::nullopt);
  EXPECT_EQ(RunnerDTypeFromName("fp32"), std::nullopt);
  EXPECT_EQ(RunnerDTypeFromName("Float32"), std::nullopt);
  EXPECT_EQ(ResolveRunnerDType(RunnerDType::kAuto, Backend::kCuda), RunnerDType::kBFloat16);
  EXPECT_EQ(ResolveRunnerDType(RunnerDType::kAuto, Backend::kCpu), RunnerDType::kNative);
  EXPECT_EQ(ResolveRunnerDType(RunnerDType::kFloat32, Backend::kCuda), RunnerDType::kFloat32);
  EXPECT_EQ(RunnerDTypeBytes(RunnerDType::kBFloat16), 2);
  EXPECT_EQ(RunnerDTypeBytes(RunnerDType::kFloat32), 4);
}

// The CUDA runner's KV block follows its element size (computed without a GPU).
TEST(RunnerDTypeTest, CudaKvBlockBytesFollowTheElementSize) {
  ModelConfig config;
  config.num_layers = 30;
  config.num_kv_heads = 3;
  config.head_dim = 64;
  const int64_t elements = 2 * 30 * 16 * 3 * 64;  // keys and values of every layer, 16 tokens
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kBFloat16), elements * 2);
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kAuto), elements * 2);
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kFloat32), elements * 4);
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kFloat32), CpuKvBlockBytes(config, 16));
}

TEST(RunnerDTypeTest, TheCpuRunnerIsNativeOrFloat32) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig config;
  config.kv_cache_bytes = 1 << 20;
  for (RunnerDType dtype : {RunnerDType::kAuto, RunnerDType::kNative, RunnerDType::kFloat32}) {
    config.dtype = dtype;
    auto runner = ModelRunner::Create(**checkpoint, config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_EQ((*runner)->stats().dtype,
              dtype == RunnerDType::kFloat32 ? RunnerDType::kFloat32 : RunnerDType::kNative);
  }
  config.dtype = RunnerDType::kBFloat16;
  auto bf16 = ModelRunner::Create(**checkpoint, config);
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bf16.status().message(), HasSubstr("dtype bfloat16 is not supported"));
  EXPECT_THAT(bf16.status().message(), HasSubstr("bfloat16 needs the CUDA backend"));
}

// --kv-cache-dtype: names (vLLM's aliases too), an FP8 block's bytes (half bf16's), and the CPU
// runner's refusal of anything but auto (its cache is float32).
TEST(KvCacheDTypeTest, NamesBytesAndTheCpuRunnersRefusal) {
  for (KvCacheDType d : {KvCacheDType::kAuto, KvCacheDType::kBFloat16, KvCacheDType::kFp8}) {
    EXPECT_EQ(KvCacheDTypeFromName(KvCacheDTypeName(d)), d);
  }
  EXPECT_EQ(KvCacheDTypeFromName("bfloat16"), KvCacheDType::kBFloat16);
  EXPECT_EQ(KvCacheDTypeFromName("fp8_e4m3"), KvCacheDType::kFp8);
  EXPECT_EQ(KvCacheDTypeFromName("fp8_e5m2"), std::nullopt);
  EXPECT_EQ(KvCacheDTypeFromName("int8"), std::nullopt);
  ModelConfig config;
  config.num_layers = 30;
  config.num_kv_heads = 3;
  config.head_dim = 64;
  const int64_t elements = 2 * 30 * 16 * 3 * 64;
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kAuto, KvCacheDType::kFp8), elements);
  EXPECT_EQ(CudaKvBlockBytes(config, 16, RunnerDType::kAuto, KvCacheDType::kBFloat16),
            elements * 2);

  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig runner_config;
  runner_config.kv_cache_bytes = 1 << 20;
  for (KvCacheDType d : {KvCacheDType::kBFloat16, KvCacheDType::kFp8}) {
    runner_config.kv_cache_dtype = d;
    auto refused = ModelRunner::Create(**checkpoint, runner_config);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("--kv-cache-dtype"));
    EXPECT_THAT(refused.status().message(), HasSubstr("CUDA backend"));
  }
}

}  // namespace
}  // namespace lmserve::engine
