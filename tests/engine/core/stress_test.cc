// Randomized stress: 10,000 requests of random lengths, priorities, stop conditions, n and shared
// prefixes, with random aborts, over pools from roomy down to one that barely fits the longest
// request; and 6,000 more over models with sliding-window KV cache groups (alone, mixed with full
// attention, several windows), whose blocks are dropped as their windows slide. Every request must
// finish exactly once per sample, with the reason and the tokens that an engine-free oracle
// computes (aborted ones with a strict prefix of them), and every block must be free at the end.

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/fake_runner.h"

namespace lmserve::engine::testing {
namespace {

constexpr int64_t kVocabSize = 64;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kContextTokens = 64;  // max_model_len: the longest request, 16 blocks
constexpr int32_t kEos = 0;

struct Oracle {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kMaxTokens;
};

// What the request must produce, computed from the fake model alone.
Oracle ComputeOracle(const Request& request, const std::vector<int32_t>& group_windows) {
  const SamplingParams& s = request.sampling;
  const int32_t num_prompt = static_cast<int32_t>(request.prompt_token_ids.size());
  const int32_t max_total = s.max_tokens.has_value() ? num_prompt + *s.max_tokens : kContextTokens;
  Oracle oracle;
  std::vector<int32_t> context = request.prompt_token_ids;
  while (true) {
    const std::vector<float> logits = FakeLogits(context, kVocabSize, group_windows);
    const int32_t token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    oracle.tokens.push_back(token);
    context.push_back(token);
    if (!s.ignore_eos && token == kEos) {
      oracle.reason = FinishReason::kEos;
      return oracle;
    }
    if (std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) !=
        s.stop_token_ids.end()) {
      oracle.reason = FinishReason::kStopToken;
      return oracle;
    }
    if (static_cast<int32_t>(context.size()) >= max_total) {
      oracle.reason =
          s.max_tokens.has_value() ? FinishReason::kMaxTokens : FinishReason::kContextLength;
      return oracle;
    }
  }
}

struct Live {
  Oracle oracle;
  std::shared_ptr<OutputStream> stream;
  std::vector<std::vector<int32_t>> tokens;  // per sample
  std::vector<int32_t> num_finished;         // per sample
  std::vector<FinishReason> reasons;         // per sample
  bool abort_requested = false;
};

struct StressConfig {
  int32_t num_kv_blocks;
  int32_t max_num_batched_tokens;
  int32_t max_num_seqs;
  int32_t long_prefill_token_threshold;
  int32_t num_requests;
  std::vector<int32_t> kv_group_windows = {0};
  bool expect_preemptions = false;
  // EngineConfig::async_scheduling over a FakeRunner that draws kSample rows and launches ahead;
  // some requests ask for logprobs, whose steps the engine samples and finishes before the next.
  bool async_scheduling = false;
};

struct Totals {
  std::map<FinishReason, int64_t> reasons;
  int64_t preemptions = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t requests = 0;
  int64_t steps_launched_ahead = 0;
  int64_t pending_tokens = 0;
};

void RunStress(const StressConfig& sc, uint64_t seed, Totals* totals) {
  SCOPED_TRACE(StrCat("pool ", sc.num_kv_blocks, " blocks, budget ", sc.max_num_batched_tokens,
                      ", windows ", StrJoin(sc.kv_group_windows, " ")));
  FakeRunnerOptions runner_options;
  runner_options.vocab_size = kVocabSize;
  runner_options.block_size_tokens = kBlockSize;
  runner_options.num_kv_blocks = sc.num_kv_blocks;
  runner_options.eos_token_ids = {kEos};
  runner_options.kv_group_windows = sc.kv_group_windows;
  // A step past the context (a sequence scheduled beyond its last token) is refused.
  runner_options.max_position_embeddings = kContextTokens;
  runner_options.samples_on_device = sc.async_scheduling;
  runner_options.launch_ahead = sc.async_scheduling;
  EngineConfig config;
  config.async_scheduling = sc.async_scheduling;
  config.max_model_len = kContextTokens;
  config.max_num_batched_tokens = sc.max_num_batched_tokens;
  config.max_num_seqs = sc.max_num_seqs;
  config.long_prefill_token_threshold = sc.long_prefill_token_threshold;
  auto created = EngineCore::Create(std::make_unique<FakeRunner>(runner_options), config, nullptr);
  ASSERT_TRUE(created.ok()) << created.status();
  EngineCore& core = **created;

  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  std::vector<std::vector<int32_t>> templates;
  for (int t = 0; t < 4; ++t) {
    std::vector<int32_t> tokens(32);
    for (int32_t& token : tokens) token = uniform(1, kVocabSize - 1);
    templates.push_back(tokens);
  }

  std::map<RequestId, Live> live;
  std::vector<RequestId> finished_ids;
  RequestId next_id = 1;
  int32_t submitted = 0;
  int64_t steps = 0;

  auto make_request = [&] {
    Request request;
    const int32_t prompt_len = uniform(1, 40);
    if (chance(0.5)) {
      const auto& t = templates[static_cast<size_t>(uniform(0, 3))];
      const int32_t shared = std::min(prompt_len, uniform(4, 32));
      request.prompt_token_ids.assign(t.begin(), t.begin() + shared);
    }
    while (static_cast<int32_t>(request.prompt_token_ids.size()) < prompt_len) {
      request.prompt_token_ids.push_back(uniform(1, kVocabSize - 1));
    }
    request.sampling.temperature = 0.0;
    if (chance(0.8)) {
      request.sampling.max_tokens = uniform(1, std::min(24, kContextTokens - prompt_len));
    }
    request.sampling.ignore_eos = chance(0.3);
    if (chance(0.2)) request.sampling.stop_token_ids = {uniform(1, kVocabSize - 1)};
    request.priority = uniform(0, 2);
    if (chance(0.1)) request.sampling.n = uniform(2, 3);
    if (sc.async_scheduling && chance(0.05)) request.sampling.logprobs = 1;
    return request;
  };

  auto drain = [&](RequestId id, Live& l) {
    for (RequestOutput& output : l.stream->TakeAvailable()) {
      const size_t sample = static_cast<size_t>(output.sample_index);
      ASSERT_EQ(l.num_finished[sample], 0) << "request " << id << " output after its final one";
      l.tokens[sample].insert(l.tokens[sample].end(), output.token_ids.begin(),
                              output.token_ids.end());
      if (output.finished) {
        ++l.num_finished[sample];
        l.reasons[sample] = output.finish_reason;
        // Every token counted was emitted (none drawn ahead and dropped).
        ASSERT_EQ(output.usage.completion_tokens, static_cast<int32_t>(l.tokens[sample].size()))
            << "request " << id;
      }
    }
  };

  auto verify = [&](RequestId id, const Live& l) {
    for (size_t sample = 0; sample < l.tokens.size(); ++sample) {
      SCOPED_TRACE(StrCat("request ", id, " sample ", sample));
      ASSERT_EQ(l.num_finished[sample], 1);
      const FinishReason reason = l.reasons[sample];
      ++totals->reasons[reason];
      if (reason == FinishReason::kAborted) {
        ASSERT_TRUE(l.abort_requested);
        ASSERT_LT(l.tokens[sample].size(), l.oracle.tokens.size());
        ASSERT_TRUE(
            std::equal(l.tokens[sample].begin(), l.tokens[sample].end(), l.oracle.tokens.begin()));
      } else {
        ASSERT_EQ(reason, l.oracle.reason);
        ASSERT_EQ(l.tokens[sample], l.oracle.tokens);
      }
    }
  };

  while (submitted < sc.num_requests || core.HasWork()) {
    if (submitted < sc.num_requests && live.size() < 48) {
      for (int k = uniform(0, 3); k > 0 && submitted < sc.num_requests; --k) {
        Request request = make_request();
        ASSERT_TRUE(core.Validate(request).ok()) << core.Validate(request);
        const RequestId id = next_id++;
        Live l;
        l.oracle = ComputeOracle(request, sc.kv_group_windows);
        const int32_t n = request.sampling.n;
        l.stream = std::make_shared<OutputStream>(id, n);
        l.tokens.resize(static_cast<size_t>(n));
        l.num_finished.assign(static_cast<size_t>(n), 0);
        l.reasons.assign(static_cast<size_t>(n), FinishReason::kAborted);
        core.AddRequest(id, std::move(request), 0.0, l.stream);
        live.emplace(id, std::move(l));
        ++submitted;
      }
    }
    if (!live.empty() && chance(0.04)) {  // abort a random live request
      auto it = live.begin();
      std::advance(it, uniform(0, static_cast<int>(live.size()) - 1));
      it->second.abort_requested = true;
      core.Abort(it->first);
    }
    if (!finished_ids.empty() && chance(0.01)) {  // aborting a finished request is a no-op
      core.Abort(
          finished_ids[static_cast<size_t>(uniform(0, static_cast<int>(finished_ids.size()) - 1))]);
    }
    core.Step();
    ++steps;
    for (auto it = live.begin(); it != live.end();) {
      drain(it->first, it->second);
      if (it->second.stream->finished()) {
        drain(it->first, it->second);
        verify(it->first, it->second);
        finished_ids.push_back(it->first);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    if (steps % 64 == 0) core.block_manager().CheckInvariants();
    ASSERT_LT(steps, 1000000) << "no progress";
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_TRUE(live.empty());
  core.block_manager().CheckInvariants();
  EXPECT_EQ(core.block_manager().num_free_blocks(), sc.num_kv_blocks);
  EXPECT_EQ(core.block_manager().num_sequences(), 0);
  const EngineStats stats = core.Stats();
  EXPECT_EQ(stats.num_running_seqs + stats.num_waiting_seqs + stats.num_unfinished_requests, 0);
  EXPECT_EQ(stats.num_finished_requests, sc.num_requests);
  totals->preemptions += stats.num_preemptions;
  totals->prefix_hit_tokens += stats.prefix_cache_hit_tokens;
  totals->requests += sc.num_requests;
  totals->steps_launched_ahead += core.num_steps_launched_ahead();
  totals->pending_tokens += dynamic_cast<const FakeRunner&>(core.runner()).num_pending_tokens();
  if (!sc.async_scheduling) {
    EXPECT_EQ(core.num_steps_launched_ahead(), 0);
  }
  if (sc.expect_preemptions) {
    EXPECT_GT(stats.num_preemptions, 0);
  }
}

TEST(EngineStressTest, TenThousandRequestsWithAbortsDownToABarelyFittingPool) {
  Totals totals;
  const std::vector<StressConfig> configs = {
      {/*num_kv_blocks=*/256, /*max_num_batched_tokens=*/48, /*max_num_seqs=*/16, 0, 2500},
      {48, 32, 16, 8, 2500},
      {24, 16, 8, 0, 2500, {0}, true},
      {16, 24, 16, 6, 2500, {0}, true},  // the longest request (64 tokens) needs all 16 blocks
  };
  uint64_t seed = 1;
  for (const StressConfig& sc : configs) {
    RunStress(sc, seed++, &totals);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(totals.requests, 10000);
  for (FinishReason reason :
       {FinishReason::kEos, FinishReason::kStopToken, FinishReason::kMaxTokens,
        FinishReason::kContextLength, FinishReason::kAborted}) {
    EXPECT_GT(totals.reasons[reason], 50) << FinishReasonName(reason);
  }
  EXPECT_EQ(totals.reasons[FinishReason::kError], 0);
  EXPECT_GT(totals.preemptions, 100);
  EXPECT_GT(totals.prefix_hit_tokens, 10000);
  std::printf(
      "reasons: eos %ld stop_token %ld max_tokens %ld context_length %ld aborted %ld; "
      "preemptions %ld, prefix-hit tokens %ld\n",
      static_cast<long>(totals.reasons[FinishReason::kEos]),
      static_cast<long>(totals.reasons[FinishReason::kStopToken]),
      static_cast<long>(totals.reasons[FinishReason::kMaxTokens]),
      static_cast<long>(totals.reasons[FinishReason::kContextLength]),
      static_cast<long>(totals.reasons[FinishReason::kAborted]),
      static_cast<long>(totals.preemptions), static_cast<long>(totals.prefix_hit_tokens));
}

// Windowed KV cache groups: the fake model's tokens depend on what each group's window shows, read
// through that group's tables, so a block dropped too early, a windowed prefix hit that lacks a
// block, or a table of the wrong group changes the tokens (or fails the step).
TEST(EngineStressTest, SixThousandRequestsOverWindowedKvCacheGroups) {
  Totals totals;
  // A windowed group holds at most ceil((W - 1 + chunk) / 4) + 1 blocks of a sequence, a full one
  // 16 (64 tokens): each pool below fits the longest request alone.
  const std::vector<StressConfig> configs = {
      {/*num_kv_blocks=*/256, /*max_num_batched_tokens=*/48, /*max_num_seqs=*/16, 0, 1500, {8}},
      {32, 16, 8, 0, 1500, {8, 0}, true},    // 16 + 7
      {24, 16, 16, 6, 1500, {0, 8}, true},   // 16 + 5: barely
      {20, 24, 16, 0, 1500, {6, 12}, true},  // 9 + 10, whatever the context
  };
  uint64_t seed = 101;
  for (const StressConfig& sc : configs) {
    RunStress(sc, seed++, &totals);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(totals.requests, 6000);
  EXPECT_EQ(totals.reasons[FinishReason::kError], 0);
  EXPECT_GT(totals.reasons[FinishReason::kAborted], 20);
  EXPECT_GT(totals.preemptions, 100);
  EXPECT_GT(totals.prefix_hit_tokens, 5000);
  std::printf("windowed: preemptions %ld, prefix-hit tokens %ld\n",
              static_cast<long>(totals.preemptions), static_cast<long>(totals.prefix_hit_tokens));
}

// Async scheduling: steps launched while the one before is unread, their decodes' tokens taken
// from its draws, sequences that stop on an unread token computing one position more (dropped).
// The same oracle, aborts and pools as above, full attention and windows.
TEST(EngineStressTest, AsyncSchedulingGivesTheOraclesTokens) {
  Totals totals;
  const std::vector<StressConfig> configs = {
      {256, 48, 16, 0, 1500, {0}, false, true},
      {24, 16, 8, 0, 1500, {0}, true, true},
      {16, 24, 16, 6, 1500, {0}, true, true},
      {32, 16, 8, 0, 1500, {8, 0}, true, true},
  };
  uint64_t seed = 201;
  for (const StressConfig& sc : configs) {
    RunStress(sc, seed++, &totals);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(totals.requests, 6000);
  EXPECT_EQ(totals.reasons[FinishReason::kError], 0);
  for (FinishReason reason : {FinishReason::kEos, FinishReason::kStopToken,
                              FinishReason::kMaxTokens, FinishReason::kAborted}) {
    EXPECT_GT(totals.reasons[reason], 50) << FinishReasonName(reason);
  }
  EXPECT_GT(totals.preemptions, 100);
  EXPECT_GT(totals.steps_launched_ahead, 10000);
  EXPECT_GT(totals.pending_tokens, 10000);
  std::printf("async: %ld steps launched ahead, %ld pending tokens, preemptions %ld\n",
              static_cast<long>(totals.steps_launched_ahead),
              static_cast<long>(totals.pending_tokens), static_cast<long>(totals.preemptions));
}

}  // namespace
}  // namespace lmserve::engine::testing
