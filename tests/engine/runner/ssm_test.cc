// Mamba-2 (tests/fixtures/hf-families/mamba2-ssm) on the CPU runner in float32, beyond what
// family_test.cc checks for every family: the absolute bound on the teacher-forced logits,
// the recurrent state carried between prefill chunks and decode steps through state slots, and
// the runner's checks of the slots a batch names.
//
// Bounds: teacher-forced logits within 1e-4 absolute of Hugging Face's float64 answer (|logit|
// reaches about 100 here); a prompt fed in chunks of 1, 7, 32 or 50 tokens (chunks cross the SSD
// scan's chunk of 32 and use the single-step recurrence for chunks of 1) within 1e-5 of one chunk,
// and sequences batched together within 1e-5 of each alone, on the fixture tests' scale
// (testing::ScaledError: absolute up to |logit| 10, relative beyond; one fp32 step of a logit of
// 100 is 7.6e-6, so an absolute 1e-5 would ask for bit-identical sums).

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;

double MaxAbsError(std::span<const float> got, std::span<const float> want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double{got[i]} - double{want[i]}));
  }
  return worst;
}

class SsmRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::HfFamilyDir("mamba2-ssm");
    auto checkpoint = OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    ref_ = testing::LoadReference(dir_);
    ASSERT_EQ(ref_.prompts.size(), 4u);
    RunnerConfig config;
    config.block_size_tokens = kBlockSize;
    config.kv_cache_bytes = int64_t{1} << 20;
    config.num_threads = 2;
    config.dtype = RunnerDType::kFloat32;
    config.max_num_seqs = 8;
    auto runner = ModelRunner::Create(*checkpoint_, config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    vocab_ = runner_->model_config().vocab_size;
  }

  // Teacher-forced logits of `prompt` in slot `slot`, fed in chunks of `chunk` (0: at once).
  std::vector<float> Logits(const std::vector<int32_t>& prompt, size_t chunk = 0,
                            int32_t slot = 0) {
    return testing::PromptLogits(*runner_, prompt, chunk, slot);
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
  testing::HfTinyReference ref_;
  std::unique_ptr<ModelRunner> runner_;
  int64_t vocab_ = 0;
};

TEST_F(SsmRunnerTest, ModelHasStateSlotsAndNoKvLayers) {
  EXPECT_EQ(runner_->model_config().family, "mamba2");
  EXPECT_EQ(runner_->num_state_slots(), 8);
  EXPECT_EQ(runner_->kv_group_windows(), std::vector<int32_t>{0});
  // Blocks hold no layer: the KV pool costs nothing, the state slots their states.
  const SsmConfig& ssm = runner_->model_config().ssm;
  EXPECT_EQ(StateSlotBytes(runner_->model_config()),
            2 * ((4 - 1) * 288 + 8 * 32 * 16) * int64_t{sizeof(float)});
  EXPECT_EQ(ssm.conv_dim(), 288);
  EXPECT_EQ(ssm.in_proj_dim(), 552);
}

TEST_F(SsmRunnerTest, TeacherForcedLogitsWithin1e4Absolute) {
  for (size_t j = 0; j < ref_.prompts.size(); ++j) {
    const std::vector<float> got = Logits(ref_.prompts[j], 0, static_cast<int32_t>(j));
    const std::vector<float> want = testing::LoadReferenceLogits(dir_, static_cast<int>(j));
    ASSERT_EQ(got.size(), want.size());
    const double error = MaxAbsError(got, want);
    std::printf("[ logits   ] mamba2-ssm prompt %zu (%3zu tokens): max |error| %.3g\n", j,
                ref_.prompts[j].size(), error);
    EXPECT_LE(error, 1e-4) << "prompt " << j;
  }
}

TEST_F(SsmRunnerTest, ChunkedPrefillCarriesTheState) {
  const std::vector<int32_t>& prompt = ref_.prompts[3];  // 130 tokens
  const std::vector<float> whole = Logits(prompt);
  for (size_t chunk : {1, 7, 32, 50}) {
    const std::vector<float> chunked = Logits(prompt, chunk, 5);
    ASSERT_EQ(chunked.size(), whole.size());
    const double error = testing::ScaledError(chunked, whole);
    std::printf("[ chunks   ] of %2zu: scaled max |logit - one chunk's| %.3g (absolute %.3g)\n",
                chunk, error, MaxAbsError(chunked, whole));
    EXPECT_LE(error, 1e-5) << "chunks of " << chunk;
  }
}

// A slot that held another sequence's state serves a new sequence from zero state: a step at
// position 0 starts afresh.
TEST_F(SsmRunnerTest, ASequenceStartingAtZeroIgnoresTheSlotsOldState) {
  const std::vector<float> alone = Logits(ref_.prompts[1], 0, 2);
  Logits(ref_.prompts[3], 0, 2);
  const std::vector<float> again = Logits(ref_.prompts[1], 0, 2);
  EXPECT_EQ(again, alone);
}

// The four prompts prefilled in one step, then decoded together, in slots that are not their
// batch indices: each sequence's logits are those it has alone.
TEST_F(SsmRunnerTest, BatchedSequencesKeepTheirOwnStates) {
  const int32_t slots[4] = {6, 1, 4, 0};
  constexpr int kDecodeSteps = 5;
  // Alone: the prompt, then the reference's greedy tokens fed one at a time.
  std::vector<std::vector<float>> alone(4);
  for (size_t j = 0; j < 4; ++j) {
    std::vector<int32_t> sequence = ref_.prompts[j];
    sequence.insert(sequence.end(), ref_.greedy[j].begin(), ref_.greedy[j].begin() + kDecodeSteps);
    const std::vector<float> all = Logits(sequence, 0, 7);
    alone[j].assign(all.end() - (kDecodeSteps + 1) * vocab_, all.end());
  }
  std::vector<std::vector<int32_t>> blocks(4);
  for (size_t j = 0; j < 4; ++j) {
    blocks[j] = testing::ConsecutiveBlocks(*runner_, static_cast<int64_t>(ref_.prompts[j].size()) + kDecodeSteps,
                       static_cast<int32_t>(j) * 16);
  }
  for (int step = 0; step <= kDecodeSteps; ++step) {
    StepBatch batch;
    for (size_t j = 0; j < 4; ++j) {
      const std::vector<int32_t>& prompt = ref_.prompts[j];
      if (step == 0) {
        batch.AddSequence(prompt, 0, blocks[j], LogitsMode::kLast, slots[j]);
      } else {
        const int32_t token = ref_.greedy[j][static_cast<size_t>(step - 1)];
        batch.AddSequence(std::span(&token, 1),
                          static_cast<int32_t>(prompt.size()) + step - 1, blocks[j],
                          LogitsMode::kLast, slots[j]);
      }
    }
    StepOutput output;
    ASSERT_TRUE(runner_->Execute(batch, &output).ok());
    for (size_t j = 0; j < 4; ++j) {
      const std::span<const float> got(output.logits.data() + j * vocab_,
                                       static_cast<size_t>(vocab_));
      const std::span<const float> want(alone[j].data() + step * vocab_,
                                        static_cast<size_t>(vocab_));
      EXPECT_LE(testing::ScaledError(got, want), 1e-5) << "sequence " << j << " step " << step;
    }
  }
}

TEST_F(SsmRunnerTest, BadStateSlotsAreRefused) {
  const std::vector<int32_t> prompt = {5, 6, 7};
  const std::vector<int32_t> blocks = testing::ConsecutiveBlocks(*runner_, 3);
  for (int32_t slot : {8, 100}) {
    StepBatch batch;
    batch.AddSequence(prompt, 0, blocks, LogitsMode::kLast, slot);
    StepOutput output;
    const absl::Status status = runner_->Execute(batch, &output);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("state slot"), std::string::npos) << status;
  }
  StepBatch shared;
  shared.AddSequence(prompt, 0, blocks, LogitsMode::kLast, 3);
  shared.AddSequence(prompt, 0, testing::ConsecutiveBlocks(*runner_, 3, 4), LogitsMode::kLast, 3);
  StepOutput output;
  EXPECT_EQ(runner_->Execute(shared, &output).code(), absl::StatusCode::kInvalidArgument);
  StepBatch missing;
  missing.AddSequence(prompt, 0, blocks, LogitsMode::kLast);
  missing.state_slots.clear();
  EXPECT_EQ(runner_->Execute(missing, &output).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lmserve::engine
