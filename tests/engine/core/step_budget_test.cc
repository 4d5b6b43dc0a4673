// EngineConfig::max_step_slowdown (a step that prefills beside decoding sequences is kept to a
// multiple of a decode-only step, its prefill chunk steered by measured step times) and the chunked
// prompt logprobs (EngineConfig::max_prompt_logits_bytes_per_step). Issue 27: one 800-token prompt
// on the CPU delayed a concurrent request's tokens from 0.25 s to 10 s, and prompt logprobs
// materialized [prompt x vocabulary] logits at once.
//
// The fake runner advances a manual clock by 10 ms a step plus 2 ms a token, so the times and the
// chunks below are exact.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/core/engine_test_util.h"

namespace lmserve::engine::testing {
namespace {

constexpr double kStepSeconds = 0.010;
constexpr double kTokenSeconds = 0.002;

FakeRunnerOptions TimedRunner() {
  FakeRunnerOptions options;
  options.num_kv_blocks = 256;
  options.block_size_tokens = 4;
  options.max_position_embeddings = 512;
  options.seconds_per_step = kStepSeconds;
  options.seconds_per_token = kTokenSeconds;
  return options;
}

EngineConfig SlowdownConfig(double slowdown) {
  EngineConfig config;
  config.max_num_batched_tokens = 512;
  config.max_step_slowdown = slowdown;
  return config;
}

// Step by step: the long prompt B goes in whole while nothing decodes; beside A's decode (12 ms)
// it goes in chunks steered toward 2 x 12 ms: from kMinPrefillChunkTokens (1: 14 ms, so x 24/14)
// up to 6 tokens (10 ms + 7 tokens x 2 ms = 24 ms), where it stays. No step takes more than twice
// A's decode step.
TEST(StepBudgetTest, ALongPromptIsChunkedWhileAnotherSequenceDecodes) {
  CoreHarness h(TimedRunner(), SlowdownConfig(2.0));
  h.AddGreedy("A", 4, 60);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Scheduled(), "A:4");  // nothing decodes yet: no prefill budget
  EXPECT_EQ(h.core().Stats().last_prefill_budget, 0);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Scheduled(), "A:1");
  const double decode_seconds = kStepSeconds + kTokenSeconds;
  EXPECT_DOUBLE_EQ(h.core().Stats().decode_step_seconds, decode_seconds);

  h.AddGreedy("B", 100, 2);
  // The chunks: 1 (14 ms) -> 1.71 -> 2.94 -> 4.41 -> 5.29 -> 5.77 -> 6.30, then 6.30 each step.
  int32_t prefilled = 0;
  for (int32_t chunk : {1, 1, 2, 4, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}) {
    ASSERT_TRUE(h.Step());
    EXPECT_EQ(h.Scheduled(), StrCat("A:1 B:", chunk)) << "after " << prefilled;
    EXPECT_EQ(h.core().Stats().last_prefill_budget, chunk);
    EXPECT_LE(h.core().Stats().last_step_seconds, 2 * decode_seconds + 1e-9);
    prefilled += chunk;
  }
  ASSERT_TRUE(h.Step());  // the last 4 of B's 100 tokens
  EXPECT_EQ(h.Scheduled(), "A:1 B:4");
  EXPECT_NEAR(h.core().Stats().prefill_chunk_tokens, 6.30, 0.01);
  h.RunToCompletion();
  EXPECT_EQ(h.result(1).token_ids.size(), 60u);
  EXPECT_EQ(h.result(2).token_ids.size(), 2u);
}

// Off (the engine's default), the same prompt goes in one step that takes 18 decode steps' time.
TEST(StepBudgetTest, OffTheTokenBudgetAloneDecides) {
  CoreHarness h(TimedRunner(), SlowdownConfig(0.0));
  h.AddGreedy("A", 4, 40);
  ASSERT_TRUE(h.Step());
  ASSERT_TRUE(h.Step());
  h.AddGreedy("B", 100, 2);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Scheduled(), "A:1 B:100");
  EXPECT_EQ(h.core().Stats().last_prefill_budget, 0);
}

// A prefill alone is not held back: nobody waits for a token between its steps.
TEST(StepBudgetTest, APrefillAloneTakesTheWholeBudget) {
  CoreHarness h(TimedRunner(), SlowdownConfig(2.0));
  h.AddGreedy("A", 4, 2);
  h.RunToCompletion();  // measures a decode step and a prefill
  h.AddGreedy("B", 300, 2);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Scheduled(), "B:300");
}

TEST(StepBudgetTest, BadSlowdownsAreRefused) {
  for (double bad : {-1.0, 0.5, std::nan(""), 1e9}) {
    auto core = EngineCore::Create(std::make_unique<FakeRunner>(TimedRunner()), SlowdownConfig(bad),
                                   nullptr);
    EXPECT_FALSE(core.ok()) << bad;
  }
}

double LogSoftmax(const std::vector<float>& logits, int32_t token) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - max - std::log(sum);
}

// Prompt logprobs come in chunks of at most max_prompt_logits_bytes_per_step of logits rows (here
// 8 rows of the fake model's 64 logits), with the same values as the model's.
TEST(StepBudgetTest, PromptLogprobsAreComputedChunkByChunk) {
  EngineConfig config = SlowdownConfig(0.0);
  config.max_prompt_logits_bytes_per_step = 8 * 64 * sizeof(float);
  CoreHarness h(TimedRunner(), config);
  const std::vector<int32_t> prompt = h.Prompt("P", 30);
  Request request;
  request.prompt_token_ids = prompt;
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 2;
  request.sampling.ignore_eos = true;
  request.sampling.prompt_logprobs = 1;
  const RequestId id = h.Add("P", request);
  for (const char* expected : {"P:8", "P:8", "P:8", "P:6", "P:1"}) {
    ASSERT_TRUE(h.Step());
    EXPECT_EQ(h.Scheduled(), expected);
  }
  h.RunToCompletion();
  const SampleResult& r = h.result(id);
  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t p = 1; p < prompt.size(); ++p) {
    const std::vector<float> logits =
        FakeLogits(std::span<const int32_t>(prompt).first(p), h.vocab_size());
    EXPECT_EQ(r.prompt_logprobs[p - 1].token_id, prompt[p]);
    EXPECT_NEAR(r.prompt_logprobs[p - 1].logprob, LogSoftmax(logits, prompt[p]), 1e-5) << p;
  }
  // A request without prompt logprobs is not chunked.
  Request plain = request;
  plain.prompt_token_ids = h.Prompt("Q", 30);
  plain.sampling.prompt_logprobs.reset();
  h.Add("Q", plain);
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Scheduled(), "Q:30");
}

}  // namespace
}  // namespace lmserve::engine::testing
