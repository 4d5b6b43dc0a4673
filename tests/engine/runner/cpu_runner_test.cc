// The CPU runner against the Hugging Face reference fixtures (float64 logits, greedy tokens), and
// batched steps against the same sequences run alone.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;

struct Loaded {
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<ModelRunner> runner;
};

Loaded Load(const std::string& model, int32_t block_size = kBlockSize) {
  Loaded out;
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir(model));
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return out;
  out.checkpoint = *std::move(checkpoint);
  RunnerConfig config;
  config.block_size_tokens = block_size;
  config.dtype = RunnerDType::kFloat32;  // the fp32 reference path
  config.kv_cache_bytes = int64_t{64} << 20;
  auto runner = ModelRunner::Create(*out.checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (runner.ok()) out.runner = *std::move(runner);
  return out;
}

std::vector<int32_t> Iota(int32_t first, int32_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  std::iota(v.begin(), v.end(), first);
  return v;
}

int32_t BlocksFor(int64_t tokens, int32_t block_size = kBlockSize) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

int32_t Argmax(const float* row, int64_t vocab) {
  int32_t id = 0;
  kernels::Argmax({.input = row, .output = &id, .num_rows = 1, .row_size = vocab});
  return id;
}

TEST(CpuRunnerTest, TeacherForcedLogitsMatchReference) {
  for (const std::string& model : testing::HfTinyModelNames()) {
    Loaded loaded = Load(model);
    ASSERT_NE(loaded.runner, nullptr) << model;
    const int64_t vocab = loaded.runner->model_config().vocab_size;
    const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      const std::vector<int32_t>& prompt = ref.prompts[j];
      StepBatch batch;
      batch.AddSequence(prompt, 0, Iota(0, BlocksFor(prompt.size())), LogitsMode::kAll);
      StepOutput output;
      ASSERT_TRUE(loaded.runner->Execute(batch, &output).ok());
      const std::vector<float> expected =
          testing::LoadHfTinyReferenceLogits(model, static_cast<int>(j));
      ASSERT_EQ(output.logits.size(), prompt.size() * vocab);
      ASSERT_EQ(expected.size(), output.logits.size());
      ASSERT_EQ(output.logits_row_start, (std::vector<int32_t>{0, int32_t(prompt.size())}));
      double max_error = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        max_error = std::max(max_error, double{std::abs(output.logits[i] - expected[i])});
      }
      std::printf("[ logits   ] %-26s prompt %zu (%3zu tokens): max |error| %.3g\n", model.c_str(),
                  j, prompt.size(), max_error);
      EXPECT_LT(max_error, 1e-4) << model << " prompt " << j;
    }
  }
}

TEST(CpuRunnerTest, GreedyDecodingThroughThePagedCacheMatchesReference) {
  for (const std::string& model : testing::HfTinyModelNames()) {
    Loaded loaded = Load(model);
    ASSERT_NE(loaded.runner, nullptr) << model;
    const int64_t vocab = loaded.runner->model_config().vocab_size;
    const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      std::vector<int32_t> sequence = ref.prompts[j];
      const size_t steps = ref.greedy[j].size();
      // Blocks in descending order: the table is not the identity.
      const int32_t num_blocks = BlocksFor(sequence.size() + steps);
      std::vector<int32_t> blocks = Iota(0, num_blocks);
      std::reverse(blocks.begin(), blocks.end());
      size_t compared = 0;
      StepBatch batch;
      StepOutput output;
      std::vector<int32_t> generated;
      for (size_t step = 0; step < steps; ++step) {
        batch.Clear();
        const size_t computed = step == 0 ? 0 : sequence.size() - 1;
        batch.AddSequence(std::span(sequence).subspan(computed), static_cast<int32_t>(computed),
                          blocks, LogitsMode::kLast);
        ASSERT_TRUE(loaded.runner->Execute(batch, &output).ok());
        ASSERT_EQ(output.logits.size(), static_cast<size_t>(vocab));
        const int32_t token = Argmax(output.logits.data(), vocab);
        generated.push_back(token);
        sequence.push_back(token);
      }
      for (size_t step = 0; step < steps; ++step) {
        if (ref.greedy_margin[j][step] <= 1e-3) break;  // a float32 engine may pick either here
        EXPECT_EQ(generated[step], ref.greedy[j][step])
            << model << " prompt " << j << " step " << step;
        ++compared;
      }
      std::printf("[ greedy   ] %-26s prompt %zu: %zu of %zu tokens compared\n", model.c_str(), j,
                  compared, steps);
    }
  }
}

// A sequence's tokens and the steps that feed it: (first token, count, logits mode) per step; a
// count of 0 means the sequence sits that step out.
struct Plan {
  std::vector<int32_t> tokens;
  int32_t cached_prefix = 0;  // positions [0, cached_prefix) come from another sequence's blocks
  std::vector<int32_t> chunk_sizes;
};

// Runs `plans` batched, step by step, and checks each sequence's logits rows against the same
// sequence run alone in one step (all positions' logits).
void CheckBatchConsistency(const std::string& model, int32_t block_size, uint32_t seed) {
  Loaded alone = Load(model, block_size);
  Loaded batched = Load(model, block_size);
  ASSERT_NE(alone.runner, nullptr);
  ASSERT_NE(batched.runner, nullptr);
  const int64_t vocab = alone.runner->model_config().vocab_size;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab) - 1);
  auto random_tokens = [&](int32_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = token(rng);
    return v;
  };

  // A: a 130-token prompt in three chunks, then decodes. B: a 33-token prefill in one step, then
  // decodes. C: prefill of 7 starting at step 1. D: one token, then decodes. E: shares A's first
  // two blocks (a prefix-cache hit) and computes the rest in step 2. F: 17 tokens, one chunk of 16
  // without logits, then 1.
  std::vector<Plan> plans(6);
  plans[0] = {random_tokens(134), 0, {50, 47, 33, 1, 1, 1, 1}};
  plans[1] = {random_tokens(37), 0, {33, 1, 1, 1, 1, 0, 0}};
  plans[2] = {random_tokens(9), 0, {0, 7, 1, 0, 1, 0, 0}};
  plans[3] = {random_tokens(5), 0, {1, 1, 1, 1, 1, 0, 0}};
  plans[4].tokens.assign(plans[0].tokens.begin(), plans[0].tokens.begin() + 2 * block_size);
  const std::vector<int32_t> own = random_tokens(10);
  plans[4].tokens.insert(plans[4].tokens.end(), own.begin(), own.end());
  plans[4].cached_prefix = 2 * block_size;
  plans[4].chunk_sizes = {0, 0, 9, 1, 0, 0, 0};
  plans[5] = {random_tokens(17), 0, {16, 1, 0, 0, 0, 0, 0}};

  // Block tables from a shuffled pool; E's first two blocks are A's.
  std::vector<int32_t> pool = Iota(0, batched.runner->num_kv_blocks());
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  std::vector<std::vector<int32_t>> tables(plans.size());
  for (size_t s = 0; s < plans.size(); ++s) {
    int32_t needed = BlocksFor(plans[s].tokens.size(), block_size);
    if (s == 4) {
      tables[s] = {tables[0][0], tables[0][1]};
      needed -= 2;
    }
    for (int32_t b = 0; b < needed; ++b) tables[s].push_back(pool[next++]);
  }

  // Each sequence alone: one step, every position's logits.
  std::vector<std::vector<float>> expected(plans.size());
  for (size_t s = 0; s < plans.size(); ++s) {
    StepBatch batch;
    const auto& tokens = plans[s].tokens;
    batch.AddSequence(tokens, 0, Iota(0, BlocksFor(tokens.size(), block_size)), LogitsMode::kAll);
    StepOutput output;
    ASSERT_TRUE(alone.runner->Execute(batch, &output).ok());
    expected[s] = output.logits;
  }

  std::vector<int32_t> computed(plans.size());
  for (size_t s = 0; s < plans.size(); ++s) computed[s] = plans[s].cached_prefix;
  const size_t num_steps = plans[0].chunk_sizes.size();
  double max_error = 0;
  double max_scaled_error = 0;  // the error divided by max(1, largest |logit| of the row / 10)
  StepBatch batch;
  StepOutput output;
  for (size_t step = 0; step < num_steps; ++step) {
    batch.Clear();
    std::vector<size_t> in_step;
    for (size_t s = 0; s < plans.size(); ++s) {
      const int32_t n = plans[s].chunk_sizes[step];
      if (n == 0) continue;
      const bool is_f_first_chunk = s == 5 && step == 0;
      batch.AddSequence(std::span(plans[s].tokens).subspan(computed[s], n), computed[s], tables[s],
                        is_f_first_chunk ? LogitsMode::kNone
                        : step % 2 == 0  ? LogitsMode::kAll
                                         : LogitsMode::kLast);
      in_step.push_back(s);
    }
    ASSERT_TRUE(batched.runner->Execute(batch, &output).ok()) << "step " << step;
    ASSERT_EQ(output.logits_row_start.size(), in_step.size() + 1);
    for (size_t k = 0; k < in_step.size(); ++k) {
      const size_t s = in_step[k];
      const int32_t n = plans[s].chunk_sizes[step];
      const int32_t rows = output.logits_row_start[k + 1] - output.logits_row_start[k];
      const LogitsMode mode = batch.logits_modes[k];
      ASSERT_EQ(rows, mode == LogitsMode::kNone ? 0 : mode == LogitsMode::kLast ? 1 : n);
      for (int32_t r = 0; r < rows; ++r) {
        const int64_t position = computed[s] + (mode == LogitsMode::kLast ? n - 1 : r);
        const float* actual = output.logits.data() + (output.logits_row_start[k] + r) * vocab;
        const float* want = expected[s].data() + position * vocab;
        double scale = 1;  // the row's largest |logit|, at least 1
        for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, double{std::abs(want[v])});
        for (int64_t v = 0; v < vocab; ++v) {
          const double error = std::abs(actual[v] - want[v]);
          max_error = std::max(max_error, error);
          max_scaled_error = std::max(max_scaled_error, error / std::max(1.0, scale / 10));
        }
      }
      computed[s] += n;
    }
  }
  for (size_t s = 0; s < plans.size(); ++s) {
    EXPECT_EQ(computed[s], static_cast<int32_t>(plans[s].tokens.size())) << "plan " << s;
  }
  std::printf("[ batch    ] %-26s block size %2d: max |batched - alone| %.3g (scaled %.3g)\n",
              model.c_str(), block_size, max_error, max_scaled_error);
  // 1e-5 absolute for logits up to 10 in magnitude. Beyond, the bound grows with the row's scale:
  // batched and alone steps run GEMMs of other shapes, which OpenBLAS sums in other orders, and
  // fp32 rounding noise is relative (the tied-embedding fixtures have logits up to 218, where one
  // ulp is 1.5e-5).
  EXPECT_LE(max_scaled_error, 1e-5) << model;
}

TEST(CpuRunnerTest, BatchedStepsGiveEachSequenceItsAloneLogits) {
  for (const std::string& model : testing::HfTinyModelNames()) {
    CheckBatchConsistency(model, kBlockSize, 11);
  }
  CheckBatchConsistency("llama-gqa", 5, 12);
}

TEST(CpuRunnerTest, KvPoolIsSizedFromTheBudget) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok());
  const ModelConfig& c = (*checkpoint)->config();
  const int64_t block_bytes = 2 * c.num_layers * 16 * c.num_kv_heads * c.head_dim * 4;
  RunnerConfig config;
  config.kv_cache_bytes = 10 * block_bytes + block_bytes / 2;
  auto runner = ModelRunner::Create(**checkpoint, config);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->num_kv_blocks(), 10);
  EXPECT_EQ((*runner)->block_size_tokens(), 16);
  EXPECT_EQ((*runner)->backend(), Backend::kCpu);
  EXPECT_EQ((*runner)->model_config().num_layers, c.num_layers);
}

// Structured output's overlap (ModelRunner::Launch, then Finish): the masked rows' bitmask is
// written after Launch has computed the forward pass, and Finish draws with it: the tokens equal
// Execute's with those masks in the batch from the start, though at Launch the rows allowed only
// token 7; the unmasked row is unchanged.
TEST(CpuRunnerTest, TokenBitmasksWrittenAfterLaunchAreTheOnesApplied) {
  Loaded loaded = Load("llama-gqa");
  ASSERT_NE(loaded.runner, nullptr);
  ModelRunner& runner = *loaded.runner;
  const int64_t vocab = runner.model_config().vocab_size;
  const int64_t words = (vocab + 31) / 32;
  const std::vector<int32_t> allowed = {3, 40, static_cast<int32_t>(vocab - 1)};
  const std::vector<int32_t> prompt = {1, 5, 9, 200, 17};
  constexpr int32_t kMaskedRows[] = {0, 2};
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    StepBatch batch;
    for (int s = 0; s < 3; ++s) {
      batch.AddSequence(prompt, 0, Iota(s, 1), LogitsMode::kSample);
      batch.sampling.push_back(
          {.temperature = s == 2 ? 0.0f : 1.0f, .seed = seed, .step = 5, .masked = s != 1});
    }
    batch.token_bitmask.assign(static_cast<size_t>(3 * words), ~0u);
    testing::AllowOnly(&batch, kMaskedRows, allowed);
    StepOutput expected, overlapped;
    ASSERT_TRUE(runner.Execute(batch, &expected).ok());
    testing::AllowOnly(&batch, kMaskedRows, std::vector<int32_t>{7});
    ASSERT_TRUE(runner.Launch(batch, &overlapped).ok());
    // The host's masks, computed while the step ran.
    testing::AllowOnly(&batch, kMaskedRows, allowed);
    ASSERT_TRUE(runner.Finish().ok());
    EXPECT_EQ(overlapped.sampled_tokens, expected.sampled_tokens) << "seed " << seed;
    for (int s : {0, 2}) {
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), overlapped.sampled_tokens[s]),
                allowed.end())
          << "seed " << seed << " row " << s << " drew " << overlapped.sampled_tokens[s];
    }
  }
  // Finish without a Launch is an error, not a crash.
  EXPECT_FALSE(runner.Finish().ok());
}

}  // namespace
}  // namespace lmserve::engine
