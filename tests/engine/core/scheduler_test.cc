// Scheduler tables: after step k, these sequences were scheduled for these many tokens, these run,
// these wait, these blocks are held. A FakeRunner computes each step (and checks that every block
// table reads back what was written); a ManualClock stands still unless a test moves it.

#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/core/engine_test_util.h"
#include "tests/engine/core/fake_runner.h"

namespace lmserve::engine::testing {
namespace {

FakeRunnerOptions Runner(int32_t num_blocks, int32_t block_size = 4) {
  FakeRunnerOptions options;
  options.num_kv_blocks = num_blocks;
  options.block_size_tokens = block_size;
  return options;
}

EngineConfig Config(int32_t max_num_batched_tokens, int32_t max_num_seqs = 8) {
  EngineConfig config;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = max_num_seqs;
  return config;
}

// Every greedy request produced exactly what the fake model gives alone.
void ExpectGreedyOutputs(CoreHarness& h,
                         const std::vector<std::pair<RequestId, std::string>>& requests,
                         const std::vector<std::pair<int32_t, int32_t>>& prompt_and_max_tokens) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [id, name] = requests[i];
    const auto [prompt_len, max_tokens] = prompt_and_max_tokens[i];
    EXPECT_EQ(h.result(id).token_ids,
              FakeGreedy(h.Prompt(name, prompt_len), max_tokens, {}, h.vocab_size()))
        << name;
  }
}

// Budget 8: a 20-token prompt is prefilled 7 + 7 + 6 between A's one-token decodes.
TEST(SchedulerTableTest, LongPromptIsPrefilledInChunksBetweenDecodes) {
  CoreHarness h(Runner(64), Config(/*max_num_batched_tokens=*/8));
  int step = 0;
  const RequestId a = h.AddGreedy("A", /*prompt_len=*/3, /*max_tokens=*/6);
  ExpectSteps(h, &step, {{1, "A:3", "A", "", "A[0]"}});
  const RequestId c = h.AddGreedy("C", 20, 1);
  ExpectSteps(h, &step,
              {
                  // step scheduled   running waiting blocks
                  {2, "A:1 C:7", "A C", "", "A[0] C[1 2]"},
                  {3, "A:1 C:7", "A C", "", "A[0 3] C[1 2 4 5]"},
                  {4, "A:1 C:6", "A", "", "A[0 3]", "", "C:max_tokens"},
                  {5, "A:1", "A", "", "A[0 3]"},
                  {6, "A:1", "", "", "", "", "A:max_tokens"},
              });
  EXPECT_FALSE(h.Step());
  ExpectGreedyOutputs(h, {{a, "A"}, {c, "C"}}, {{3, 6}, {20, 1}});
  EXPECT_EQ(h.runner().max_batch_tokens(), 8);
}

// Budget 4 and max_num_seqs 2: admission goes by priority (lower first), then arrival.
TEST(SchedulerTableTest, AdmissionInPriorityThenArrivalOrderWithinBudgetAndSequenceLimit) {
  CoreHarness h(Runner(64), Config(/*max_num_batched_tokens=*/4, /*max_num_seqs=*/2));
  int step = 0;
  h.AddGreedy("A", 2, 2, /*priority=*/1);
  h.AddGreedy("B", 2, 2, /*priority=*/0);
  h.AddGreedy("C", 2, 2, /*priority=*/0);
  ExpectSteps(h, &step,
              {
                  {1, "B:2 C:2", "B C", "A", "B[0] C[1]"},
                  // Both finish, but they still ran when this step admitted: A waits.
                  {2, "B:1 C:1", "", "A", "", "", "B:max_tokens C:max_tokens"},
              });
  h.AddGreedy("D", 2, 2, /*priority=*/-1);  // arrives last, admitted first
  ExpectSteps(h, &step,
              {
                  {3, "D:2 A:2", "D A", "", "D[1] A[0]"},
                  {4, "D:1 A:1", "", "", "", "", "A:max_tokens D:max_tokens"},
              });
}

// 6 blocks of 4 tokens; A and B need 4 blocks each at the end. B (same priority, later) is
// preempted, waits until its recompute fits, then resumes from its cached prompt blocks.
TEST(SchedulerTableTest, PreemptionOfTheLatestAndResumptionFromThePrefixCache) {
  CoreHarness h(Runner(/*num_blocks=*/6), Config(/*max_num_batched_tokens=*/16));
  int step = 0;
  const RequestId a = h.AddGreedy("A", 8, 8);
  const RequestId b = h.AddGreedy("B", 8, 8);
  ExpectSteps(h, &step,
              {
                  {1, "A:8 B:8", "A B", "", "A[0 1] B[2 3]"},
                  {2, "A:1 B:1", "A B", "", "A[0 1 4] B[2 3 5]"},
                  {3, "A:1 B:1", "A B", "", "A[0 1 4] B[2 3 5]"},
                  {4, "A:1 B:1", "A B", "", "A[0 1 4] B[2 3 5]"},
                  {5, "A:1 B:1", "A B", "", "A[0 1 4] B[2 3 5]"},
                  // A needs a 4th block: B is preempted; its cached blocks go to the free list
                  // tail first (5 3 2), so A takes 5.
                  {6, "A:1", "A", "B", "A[0 1 4 5]", "B"},
              });
  EXPECT_EQ(h.core().Stats().num_preempted_seqs, 1);
  ExpectSteps(h, &step,
              {
                  // B (13 tokens known) would reuse cached 2 3 and take 2 more: 4 > 2 free.
                  {7, "A:1", "A", "B", "A[0 1 4 5]"},
                  {8, "A:1", "", "B", "", "", "A:max_tokens"},
                  // B resumes: 8 tokens from the prefix cache (blocks 2 3), recomputes 5.
                  {9, "B:5", "B", "", "B[2 3 5 4]"},
                  {10, "B:1", "B", "", "B[2 3 5 4]"},
                  {11, "B:1", "", "", "", "", "B:max_tokens"},
              });
  EXPECT_FALSE(h.Step());
  ExpectGreedyOutputs(h, {{a, "A"}, {b, "B"}}, {{8, 8}, {8, 8}});
  const EngineStats stats = h.core().Stats();
  EXPECT_EQ(stats.num_preemptions, 1);
  EXPECT_EQ(stats.num_preempted_seqs, 0);
  EXPECT_EQ(stats.prefix_cache_queried_tokens, 8 + 8 + 13);
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 8);
  EXPECT_EQ(stats.num_free_kv_blocks, 6);
  EXPECT_EQ(h.result(b).final_output->usage.cached_tokens, 0);  // at first admission
}

// A (priority 1) was admitted first; B (priority 0) later. When blocks run out the lowest
// priority goes, even though it arrived first, and even when it is the one asking.
TEST(SchedulerTableTest, PreemptionTakesTheLowestPriorityBeforeTheLatest) {
  CoreHarness h(Runner(6), Config(16));
  int step = 0;
  const RequestId a = h.AddGreedy("A", 8, 8, /*priority=*/1);
  ExpectSteps(h, &step, {{1, "A:8", "A", "", "A[0 1]"}});
  const RequestId b = h.AddGreedy("B", 8, 8, /*priority=*/0);
  ExpectSteps(h, &step,
              {
                  {2, "A:1 B:8", "A B", "", "A[0 1 2] B[3 4]"},
                  {3, "A:1 B:1", "A B", "", "A[0 1 2] B[3 4 5]"},
                  {4, "A:1 B:1", "A B", "", "A[0 1 2] B[3 4 5]"},
                  {5, "A:1 B:1", "A B", "", "A[0 1 2] B[3 4 5]"},
                  // A asks for a 4th block and is itself the victim.
                  {6, "B:1", "B", "A", "B[3 4 5]", "A"},
                  // B takes 2, A's tail; A's blocks 0 1 are still cached but need 2 more.
                  {7, "B:1", "B", "A", "B[3 4 5 2]"},
                  {8, "B:1", "B", "A", "B[3 4 5 2]"},
                  {9, "B:1", "", "A", "", "", "B:max_tokens"},
                  // A resumes on its cached 0 1 and recomputes 5 tokens into 2 and 5.
                  {10, "A:5", "A", "", "A[0 1 2 5]"},
                  {11, "A:1", "A", "", "A[0 1 2 5]"},
                  {12, "A:1", "", "", "", "", "A:max_tokens"},
              });
  ExpectGreedyOutputs(h, {{a, "A"}, {b, "B"}}, {{8, 8}, {8, 8}});
  EXPECT_EQ(h.core().Stats().num_preemptions, 1);
}

// Abort frees a request's blocks at once, whether it is mid-prefill or mid-decode.
TEST(SchedulerTableTest, AbortMidPrefillAndMidDecode) {
  CoreHarness h(Runner(16), Config(/*max_num_batched_tokens=*/4));
  int step = 0;
  const RequestId a = h.AddGreedy("A", 10, 4);
  const RequestId b = h.AddGreedy("B", 2, 10);
  ExpectSteps(h, &step,
              {
                  {1, "A:4", "A", "B", "A[0]"},
                  {2, "A:4", "A", "B", "A[0 1]"},
              });
  h.Abort(a);  // mid-prefill: 8 of 10 prompt tokens computed
  EXPECT_EQ(h.Finished(), "A:aborted");
  EXPECT_EQ(h.Running(), "");
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 16);
  EXPECT_TRUE(h.result(a).token_ids.empty());
  ExpectSteps(h, &step, {{3, "B:2", "B", "", "B[2]"}});
  h.AddGreedy("C", 3, 2);
  ExpectSteps(h, &step, {{4, "B:1 C:3", "B C", "", "B[2] C[3]"}});
  h.Abort(b);  // mid-decode: 2 tokens out
  EXPECT_EQ(h.Finished(), "B:aborted");
  EXPECT_EQ(h.Blocks(), "C[3]");
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 15);
  EXPECT_EQ(h.result(b).token_ids.size(), 2u);
  EXPECT_EQ(h.result(b).final_output->usage.completion_tokens, 2);
  ExpectSteps(h, &step, {{5, "C:1", "", "", "", "", "C:max_tokens"}});
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 16);
  h.Abort(b);      // finished: no-op
  h.Abort(12345);  // unknown: no-op
  EXPECT_EQ(h.Finished(), "");
  EXPECT_FALSE(h.Step());
}

// A per-sequence cap (long_prefill_token_threshold) keeps a long prompt from taking the budget.
TEST(SchedulerTableTest, LongPrefillThresholdCapsAChunk) {
  EngineConfig config = Config(16);
  config.long_prefill_token_threshold = 5;
  CoreHarness h(Runner(64), config);
  int step = 0;
  h.AddGreedy("A", 12, 1);
  h.AddGreedy("B", 3, 1);
  ExpectSteps(h, &step,
              {
                  {1, "A:5 B:3", "A", "", "A[0 1]", "", "B:max_tokens"},
                  // B's freed block 2 went to the front of the free list.
                  {2, "A:5", "A", "", "A[0 1 2]"},
                  {3, "A:2", "", "", "", "", "A:max_tokens"},
              });
}

// n = 3 samples share the prompt's full blocks (prefix caching off, so only sharing can do it);
// samples 1 and 2 wait until sample 0 has computed the prompt.
TEST(SchedulerTableTest, SamplesOfOnePromptShareItsBlocks) {
  EngineConfig config = Config(16);
  config.enable_prefix_caching = false;
  CoreHarness h(Runner(64), config);
  Request request;
  request.prompt_token_ids = h.Prompt("N", 10);
  request.sampling.n = 3;
  request.sampling.seed = 5;
  request.sampling.max_tokens = 3;
  request.sampling.ignore_eos = true;
  const RequestId id = h.Add("N", request);
  int step = 0;
  ExpectSteps(h, &step,
              {
                  {1, "N0:10", "N0", "N1 N2", "N0[0 1 2]"},
                  // 10 tokens: blocks 0 1 are full and shared; each recomputes the last 2.
                  {2, "N0:1 N1:2 N2:2", "N0 N1 N2", "", "N0[0 1 2] N1[0 1 3] N2[0 1 4]"},
              });
  EXPECT_EQ(h.core().block_manager().RefCount(0), 3);
  EXPECT_EQ(h.core().block_manager().RefCount(1), 3);
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 64 - 5);
  h.RunToCompletion();
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(h.result(id, i).token_ids.size(), 3u);
    EXPECT_EQ(h.result(id, i).final_output->usage.cached_tokens, i == 0 ? 0 : 8);
  }
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 64);
  EXPECT_EQ(h.core().Stats().prefix_cache_hit_tokens, 16);
}

// Exact timings from the fake clock: each step takes 10 ms + 1 ms per token.
TEST(SchedulerTableTest, TimingsComeFromTheInjectedClock) {
  FakeRunnerOptions options = Runner(64);
  options.seconds_per_step = 0.010;
  options.seconds_per_token = 0.001;
  CoreHarness h(options, Config(4));
  const RequestId a = h.AddGreedy("A", 4, 3);
  const RequestId b = h.AddGreedy("B", 2, 1);
  h.RunToCompletion();
  // Step 1: A:4 (ends 0.014). Step 2: A:1 B:2 (ends 0.027). Step 3: A:1 (ends 0.038).
  const SampleResult& ra = h.result(a);
  ASSERT_EQ(ra.token_times_seconds.size(), 3u);
  EXPECT_NEAR(ra.token_times_seconds[0], 0.014, 1e-9);
  EXPECT_NEAR(ra.token_times_seconds[1], 0.027, 1e-9);
  EXPECT_NEAR(ra.token_times_seconds[2], 0.038, 1e-9);
  EXPECT_NEAR(ra.final_output->timings.queue_seconds, 0.0, 1e-9);
  EXPECT_NEAR(ra.final_output->timings.first_token_seconds, 0.014, 1e-9);
  EXPECT_NEAR(ra.final_output->timings.finish_seconds, 0.038, 1e-9);
  const SampleResult& rb = h.result(b);
  EXPECT_NEAR(rb.final_output->timings.queue_seconds, 0.014, 1e-9);
  EXPECT_NEAR(rb.final_output->timings.first_token_seconds, 0.027, 1e-9);
  EXPECT_EQ(h.core().Stats().num_steps, 3);
  EXPECT_NEAR(h.core().Stats().total_step_seconds, 0.038, 1e-9);
  EXPECT_EQ(h.core().Stats().total_step_tokens, 8);
}

// Sliding-window KV cache groups (block_manager.h, "Windows").

FakeRunnerOptions WindowedRunner(int32_t num_blocks, int32_t block_size,
                                 std::vector<int32_t> group_windows) {
  FakeRunnerOptions options = Runner(num_blocks, block_size);
  options.kv_group_windows = std::move(group_windows);
  return options;
}

// Group 0 has window 4, group 1 full attention; blocks of 2. As A decodes, group 0 drops each
// block its next query no longer reads (cached, to the free list's back); group 1 keeps every
// block.
TEST(SchedulerWindowTest, AWindowedGroupDropsBlocksAsItsWindowSlides) {
  const std::vector<int32_t> windows = {4, 0};
  CoreHarness h(WindowedRunner(16, 2, windows), Config(/*max_num_batched_tokens=*/4));
  int step = 0;
  const RequestId a = h.AddGreedy("A", /*prompt_len=*/6, /*max_tokens=*/4);
  ExpectSteps(h, &step,
              {
                  {1, "A:4", "A", "", "A[0 1 | 2 3]"},
                  {2, "A:2", "A", "", "A[0 1 4 | 2 3 5]"},
                  // The query at 6 reads from 3: block 0 (positions 0-1) is dropped.
                  {3, "A:1", "A", "", "A[- 1 4 6 | 2 3 5 7]"},
                  {4, "A:1", "A", "", "A[- - 4 6 | 2 3 5 7]"},  // the query at 7 reads from 4
                  {5, "A:1", "", "", "", "", "A:max_tokens"},
              });
  EXPECT_EQ(h.result(a).token_ids, FakeGreedy(h.Prompt("A", 6), 4, {}, h.vocab_size(), windows));
  EXPECT_EQ(h.core().Stats().num_free_kv_blocks, 16);
}

// A 400-token generation over a pool of 6 blocks of 4 (24 slots): the window of 8 holds at most
// ceil((8 - 1 + 8) / 4) + 1 = 5 blocks whatever the context, and the engine's statistics show it.
TEST(SchedulerWindowTest, ALongWindowedSequenceHoldsABoundedNumberOfBlocks) {
  const std::vector<int32_t> windows = {8};
  FakeRunnerOptions options = WindowedRunner(6, 4, windows);
  options.max_position_embeddings = 1024;
  CoreHarness h(options, Config(/*max_num_batched_tokens=*/8));
  EXPECT_EQ(h.core().limits().kv_cache_tokens, std::numeric_limits<int64_t>::max());
  const RequestId a = h.AddGreedy("A", /*prompt_len=*/30, /*max_tokens=*/400);
  int32_t most_used = 0;
  while (h.core().HasWork()) {
    h.Step();
    const EngineStats stats = h.core().Stats();
    ASSERT_EQ(stats.kv_groups.size(), 1u);
    EXPECT_EQ(stats.kv_groups[0].window, 8);
    EXPECT_EQ(stats.kv_groups[0].num_used_blocks, stats.num_kv_blocks - stats.num_free_kv_blocks);
    most_used = std::max(most_used, stats.kv_groups[0].num_used_blocks);
    ASSERT_LE(most_used, 5);
  }
  EXPECT_GE(most_used, 3);
  EXPECT_EQ(h.result(a).token_ids.size(), 400u);
  EXPECT_EQ(h.result(a).token_ids, FakeGreedy(h.Prompt("A", 30), 400, {}, h.vocab_size(), windows));
}

// A second request with the same prompt hits the first one's cached blocks: only the blocks that
// its first new query reads (the last window's) need to be there, and the rest may be evicted.
TEST(SchedulerWindowTest, APrefixHitOnAWindowedModelNeedsOnlyTheLastWindow) {
  const std::vector<int32_t> windows = {4};
  CoreHarness h(WindowedRunner(10, 2, windows), Config(/*max_num_batched_tokens=*/16));
  int step = 0;
  const RequestId a = h.AddGreedy("A", /*prompt_len=*/12, /*max_tokens=*/1);
  ExpectSteps(h, &step, {{1, "A:12", "", "", "", "", "A:max_tokens"}});
  // A's blocks 0-5 are cached and free. C's 6 blocks take the 4 never used, then evict 0 and 1.
  h.AddGreedy("C", 12, 1);
  ExpectSteps(h, &step, {{2, "C:12", "", "", "", "", "C:max_tokens"}});
  Request request;
  request.prompt_token_ids = h.Prompt("A", 12);
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = 2;
  request.sampling.ignore_eos = true;
  const RequestId b = h.Add("B", std::move(request));
  // 5 blocks computed: the query at 10 reads positions 7-10, blocks 3 and 4, both still cached;
  // its new block evicts A's block 2.
  ExpectSteps(h, &step, {{3, "B:2", "B", "", "B[- - - 3 4 2]"}});
  h.RunToCompletion();
  EXPECT_EQ(h.result(b).final_output->usage.cached_tokens, 10);
  EXPECT_EQ(h.result(b).token_ids, FakeGreedy(h.Prompt("A", 12), 2, {}, h.vocab_size(), windows));
  EXPECT_EQ(h.result(a).token_ids, FakeGreedy(h.Prompt("A", 12), 1, {}, h.vocab_size(), windows));
}

// n = 3 samples start from sample 0's computed prompt in every group, the windowed group's only
// from the last window on. Sample 0 decodes in the same step and drops block 2 before the samples
// are admitted, so they find the prompt in the prefix cache rather than in its table.
TEST(SchedulerWindowTest, SamplesShareThePromptBlocksOfEveryGroup) {
  const std::vector<int32_t> windows = {4, 0};
  CoreHarness h(WindowedRunner(32, 2, windows), Config(/*max_num_batched_tokens=*/16));
  Request request;
  request.prompt_token_ids = h.Prompt("A", 9);
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = 3;
  request.sampling.ignore_eos = true;
  request.sampling.n = 3;
  const RequestId a = h.Add("A", std::move(request));
  int step = 0;
  ExpectSteps(h, &step,
              {
                  {1, "A0:9", "A0", "A1 A2", "A0[0 1 2 3 4 | 5 6 7 8 9]"},
                  // 4 prompt blocks shared: the query at 8 reads from 5, blocks 2 and 3.
                  {2, "A0:1 A1:1 A2:1", "A0 A1 A2", "",
                   "A0[- - - 3 4 | 5 6 7 8 9] A1[- - 2 3 10 | 5 6 7 8 11] "
                   "A2[- - 2 3 12 | 5 6 7 8 13]"},
              });
  h.RunToCompletion();
  for (int32_t sample = 0; sample < 3; ++sample) {
    EXPECT_EQ(h.result(a, sample).token_ids,
              FakeGreedy(h.Prompt("A", 9), 3, {}, h.vocab_size(), windows));
  }
}

}  // namespace
}  // namespace lmserve::engine::testing
