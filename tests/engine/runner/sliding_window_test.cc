// Sliding-window attention on the CPU runner (float32) against Hugging Face's float64 logits of the
// mistral-sliding fixture (window 16, blocks of 16; prompts of 1, 7, 33 and 130 tokens):
// teacher-forced logits with whole tables; the same logits from prefills in chunks of several
// sizes, and greedy decoding, with the block tables the engine's block manager keeps, whose
// entries before the window are dropped (-1) and their blocks reused.
//
// Bounds as tests/engine/runner/family_test.cc's: logits within 1e-4 absolute (times |logit| / 10
// beyond 10); greedy tokens equal up to the first step whose reference margin is 1e-3 or less.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "engine/core/block_manager.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAre;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kWindow = 16;
constexpr const char* kFixture = "mistral-sliding";

std::unique_ptr<ModelRunner> MistralRunner(const Checkpoint& checkpoint) {
  RunnerConfig config;
  config.block_size_tokens = kBlockSize;
  config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
  config.kv_cache_bytes = int64_t{8} << 20;
  config.num_threads = 2;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

using testing::ScaledError;

class SlidingWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::HfFamilyDir(kFixture);
    auto checkpoint = OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    runner_ = MistralRunner(*checkpoint_);
    ASSERT_NE(runner_, nullptr);
    ref_ = testing::LoadReference(dir_);
    ASSERT_EQ(ref_.prompts.size(), 4u);
    vocab_ = runner_->model_config().vocab_size;
  }

  // Teacher-forced logits of `prompt` in chunks of `chunk` tokens, each chunk's tables as `blocks`
  // keeps them (dropping what left the window first). Counts the dropped entries the runner saw
  // and the most blocks the sequence held.
  std::vector<float> ChunkedLogits(const std::vector<int32_t>& prompt, size_t chunk,
                                   BlockManager::SeqId seq, BlockManager& blocks,
                                   int64_t* num_dropped_seen, int32_t* most_held) {
    std::vector<float> all;
    for (size_t start = 0; start < prompt.size(); start += chunk) {
      const size_t count = std::min(chunk, prompt.size() - start);
      EXPECT_TRUE(blocks.Allocate(seq, static_cast<int64_t>(start + count), {},
                                  static_cast<int64_t>(start)));
      const std::span<const int32_t> table = blocks.BlockTable(seq);
      *num_dropped_seen += std::count(table.begin(), table.end(), BlockManager::kNoBlock);
      *most_held = std::max(*most_held, blocks.num_used_blocks(0));
      StepBatch batch;
      batch.AddSequence(std::span(prompt).subspan(start, count), static_cast<int32_t>(start), table,
                        LogitsMode::kAll);
      StepOutput output;
      const absl::Status status = runner_->Execute(batch, &output);
      EXPECT_TRUE(status.ok()) << status;
      if (!status.ok()) return {};
      all.insert(all.end(), output.logits.begin(), output.logits.end());
    }
    blocks.Free(seq);
    return all;
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<ModelRunner> runner_;
  testing::HfTinyReference ref_;
  int64_t vocab_ = 0;
};

TEST_F(SlidingWindowTest, EveryLayerIsOneWindowedKvCacheGroup) {
  EXPECT_EQ(checkpoint_->config().family, "mistral");
  EXPECT_EQ(checkpoint_->config().sliding_window, kWindow);
  // No context cap: the model's context, not the window.
  EXPECT_EQ(checkpoint_->config().max_position_embeddings, 1024);
  EXPECT_THAT(runner_->kv_group_windows(), ElementsAre(kWindow));
}

TEST_F(SlidingWindowTest, TeacherForcedLogitsMatchTheReference) {
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    const std::vector<int32_t>& prompt = ref_.prompts[j];
    std::vector<int32_t> table((prompt.size() + kBlockSize - 1) / kBlockSize);
    std::iota(table.begin(), table.end(), 0);
    StepBatch batch;
    batch.AddSequence(prompt, 0, table, LogitsMode::kAll);
    StepOutput output;
    ASSERT_TRUE(runner_->Execute(batch, &output).ok());
    const std::vector<float> want = testing::LoadReferenceLogits(dir_, static_cast<int>(j));
    ASSERT_EQ(output.logits.size(), want.size());
    const double error = ScaledError(output.logits, want);
    std::printf("[ logits   ] %s prompt %zu (%3zu tokens): scaled max |error| %.3g\n", kFixture, j,
                prompt.size(), error);
    EXPECT_LE(error, 1e-4) << "prompt " << j;
  }
}

TEST_F(SlidingWindowTest, ChunkedPrefillWithDroppedBlocksMatchesTheReference) {
  BlockManager blocks(runner_->num_kv_blocks(), kBlockSize, /*enable_prefix_caching=*/false,
                      runner_->kv_group_windows());
  const std::vector<int32_t>& prompt = ref_.prompts[3];  // 130 tokens: 9 blocks, 8 windows
  const std::vector<float> want = testing::LoadReferenceLogits(dir_, 3);
  BlockManager::SeqId seq = 0;
  for (size_t chunk : {1, 5, 16, 17, 40, 130}) {
    int64_t num_dropped = 0;
    int32_t most_held = 0;
    const std::vector<float> got =
        ChunkedLogits(prompt, chunk, seq++, blocks, &num_dropped, &most_held);
    ASSERT_EQ(got.size(), want.size()) << "chunks of " << chunk;
    const double error = ScaledError(got, want);
    std::printf(
        "[ chunked  ] chunks of %3zu: scaled max |error| %.3g, %ld dropped entries seen, "
        "at most %d blocks held\n",
        chunk, error, static_cast<long>(num_dropped), most_held);
    EXPECT_LE(error, 1e-4) << "chunks of " << chunk;
    if (chunk < prompt.size()) {
      EXPECT_GT(num_dropped, 0) << "chunks of " << chunk;
    }
    // A chunk's window and its own tokens: ceil((16 - 1 + chunk) / 16) + 1 blocks at most.
    EXPECT_LE(most_held,
              static_cast<int32_t>((kWindow - 1 + chunk + kBlockSize - 1) / kBlockSize + 1))
        << "chunks of " << chunk;
  }
  blocks.CheckInvariants();
  EXPECT_EQ(blocks.num_free_blocks(), runner_->num_kv_blocks());
}

TEST_F(SlidingWindowTest, GreedyDecodingWithDroppedBlocksMatchesTheReference) {
  BlockManager blocks(runner_->num_kv_blocks(), kBlockSize, false, runner_->kv_group_windows());
  size_t compared = 0, total = 0;
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    const BlockManager::SeqId seq = static_cast<BlockManager::SeqId>(j);
    std::vector<int32_t> sequence = ref_.prompts[j];
    const size_t steps = ref_.greedy[j].size();
    std::vector<int32_t> generated;
    for (size_t step = 0; step < steps; ++step) {
      const size_t computed = step == 0 ? 0 : sequence.size() - 1;
      ASSERT_TRUE(blocks.Allocate(seq, static_cast<int64_t>(sequence.size()), {},
                                  static_cast<int64_t>(computed)));
      // Decoding: the window's block and the current one at most.
      if (step > 0) {
        EXPECT_LE(blocks.num_used_blocks(0), 2);
      }
      StepBatch batch;
      batch.AddSequence(std::span(sequence).subspan(computed), static_cast<int32_t>(computed),
                        blocks.BlockTable(seq), LogitsMode::kLast);
      StepOutput output;
      ASSERT_TRUE(runner_->Execute(batch, &output).ok());
      int32_t token = 0;
      kernels::Argmax(
          {.input = output.logits.data(), .output = &token, .num_rows = 1, .row_size = vocab_});
      generated.push_back(token);
      sequence.push_back(token);
    }
    blocks.Free(seq);
    for (size_t step = 0; step < steps; ++step) {
      if (ref_.greedy_margin[j][step] <= 1e-3) break;  // a float32 engine may pick either here
      EXPECT_EQ(generated[step], ref_.greedy[j][step]) << "prompt " << j << " step " << step;
      ++compared;
    }
    total += steps;
  }
  std::printf("[ greedy   ] %s: %zu of %zu tokens compared\n", kFixture, compared, total);
  EXPECT_GT(compared, total / 2);
}

}  // namespace
}  // namespace lmserve::engine
