// The engine over the real CPU runner and the Hugging Face fixture models: each request's output
// (greedy, or seeded sampling for four of them) is the same alone as among 16 concurrent requests
// with chunked prefill, preemption and prefix-cache hits all happening; and alone, greedy decoding
// of the fixture prompts matches the Hugging Face greedy reference. The models include sliding
// windows (mistral-sliding: every layer; gemma2-softcap-sliding: a windowed and a full KV cache
// group), whose blocks the engine frees as the window slides: their windowed groups hold a bounded
// number of blocks however long the context.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/core/engine_core.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/model/kv_cache_groups.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/structured/constraint.h"
#include "engine/structured/matcher.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxTokens = 24;
// Below this top-1 / top-2 logit margin of the float64 reference, a float32 engine may pick either
// token; the reference comparison stops at such a step.
constexpr double kTieMargin = 1e-3;

// Delegates to a runner and records what the steps looked like.
class RecordingRunner final : public ModelRunner {
 public:
  explicit RecordingRunner(std::unique_ptr<ModelRunner> inner, bool samples_on_device = false)
      : inner_(std::move(inner)), samples_on_device_(samples_on_device) {}
  const ModelConfig& model_config() const override { return inner_->model_config(); }
  // The CPU runner implements LogitsMode::kSample; saying so sends the engine down the path the
  // CUDA runner takes (tokens, not logits, come back).
  bool samples_on_device() const override { return samples_on_device_; }
  bool samples_with_token_bitmask() const override { return inner_->samples_with_token_bitmask(); }
  Backend backend() const override { return inner_->backend(); }
  int32_t block_size_tokens() const override { return inner_->block_size_tokens(); }
  int32_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  std::vector<int32_t> kv_group_windows() const override { return inner_->kv_group_windows(); }
  absl::Status Execute(const StepBatch& batch, StepOutput* output) override {
    Record(batch);
    return inner_->Execute(batch, output);
  }
  // The engine's halves go to the runner's own (the CPU runner: the forward pass in Launch, the
  // masked draw in Finish). With an engine set, they note when its masks were computed.
  absl::Status Launch(const StepBatch& batch, StepOutput* output) override {
    Record(batch);
    if (engine_ != nullptr) {
      if (engine_->Stats().num_masks > masks_seen_) ++num_steps_masked_before_launch_;
      masks_seen_ = engine_->Stats().num_masks;
    }
    return inner_->Launch(batch, output);
  }
  absl::Status Finish() override {
    if (engine_ != nullptr) {
      if (engine_->Stats().num_masks > masks_seen_) ++num_steps_masked_after_launch_;
      masks_seen_ = engine_->Stats().num_masks;
    }
    return inner_->Finish();
  }
  void set_engine(const EngineCore* engine) { engine_ = engine; }
  int64_t num_steps_masked_before_launch() const { return num_steps_masked_before_launch_; }
  int64_t num_steps_masked_after_launch() const { return num_steps_masked_after_launch_; }
  int64_t num_partial_prefills() const { return num_partial_prefills_; }
  int64_t num_decodes() const { return num_decodes_; }
  int32_t max_seqs_per_step() const { return max_seqs_per_step_; }
  int64_t num_runner_samples() const { return num_runner_samples_; }

 private:
  void Record(const StepBatch& batch) {
    for (int32_t i = 0; i < batch.num_seqs(); ++i) {
      // A chunk that neither ends its sequence nor asks for logits: a partial prefill.
      if (batch.logits_modes[i] == LogitsMode::kNone) ++num_partial_prefills_;
      if (batch.logits_modes[i] == LogitsMode::kSample) ++num_runner_samples_;
      const int32_t num_new = batch.query_start[i + 1] - batch.query_start[i];
      if (num_new == 1) ++num_decodes_;
    }
    max_seqs_per_step_ = std::max(max_seqs_per_step_, batch.num_seqs());
  }

  std::unique_ptr<ModelRunner> inner_;
  const bool samples_on_device_;
  const EngineCore* engine_ = nullptr;
  int64_t masks_seen_ = 0;
  int64_t num_steps_masked_before_launch_ = 0;
  int64_t num_steps_masked_after_launch_ = 0;
  int64_t num_runner_samples_ = 0;
  int64_t num_partial_prefills_ = 0;
  int64_t num_decodes_ = 0;
  int32_t max_seqs_per_step_ = 0;
};

std::unique_ptr<EngineCore> MakeEngine(const Checkpoint& checkpoint, int32_t num_blocks,
                                       const EngineConfig& config, RecordingRunner** recorder,
                                       bool runner_samples = false) {
  RunnerConfig runner_config;
  runner_config.block_size_tokens = kBlockSize;
  runner_config.kv_cache_bytes = CpuKvBlockBytes(checkpoint.config(), kBlockSize) * num_blocks;
  runner_config.num_threads = 1;
  auto runner = ModelRunner::Create(checkpoint, runner_config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  EXPECT_EQ((*runner)->num_kv_blocks(), num_blocks);
  auto recording = std::make_unique<RecordingRunner>(*std::move(runner), runner_samples);
  *recorder = recording.get();
  auto core = EngineCore::Create(std::move(recording), config, nullptr);
  EXPECT_TRUE(core.ok()) << core.status();
  return core.ok() ? *std::move(core) : nullptr;
}

// Request i: greedy, except 6, 9, 12 and 15, which sample with a seed of their own (the same seed
// alone and batched must give the same tokens). Requests 0-3 are the fixture prompts.
Request MakeRequest(std::vector<int32_t> prompt, size_t i) {
  Request request;
  request.prompt_token_ids = std::move(prompt);
  request.sampling.temperature = 0.0;
  if (i >= 4 && i % 3 == 0) {
    request.sampling.temperature = 0.8;
    request.sampling.top_p = 0.9;
    request.sampling.seed = 1000 + i;
  }
  request.sampling.max_tokens = kMaxTokens;
  request.sampling.ignore_eos = true;
  request.sampling.logprobs = 1;  // the top-2 margin, reported when outputs differ
  return request;
}

// The 16 prompts: the four fixture prompts, prefixes and extensions of them (prefix-cache hits),
// and seeded random ones.
std::vector<std::vector<int32_t>> Prompts(const testing::HfTinyReference& ref, int64_t vocab) {
  const std::vector<int32_t>& p1 = ref.prompts[1];  // 7 tokens
  const std::vector<int32_t>& p2 = ref.prompts[2];  // 33
  const std::vector<int32_t>& p3 = ref.prompts[3];  // 130
  std::vector<std::vector<int32_t>> prompts = ref.prompts;
  for (size_t length : {40, 64, 100}) prompts.emplace_back(p3.begin(), p3.begin() + length);
  prompts.push_back(p3);  // the same prompt twice
  std::vector<int32_t> joined = p2;
  joined.insert(joined.end(), p3.begin(), p3.begin() + 20);
  prompts.push_back(joined);
  joined = p1;
  joined.insert(joined.end(), p2.begin(), p2.end());
  prompts.push_back(joined);
  std::mt19937 rng(17);
  while (prompts.size() < 16) {
    std::vector<int32_t> prompt(
        static_cast<size_t>(std::uniform_int_distribution<int>(20, 90)(rng)));
    for (int32_t& token : prompt) {
      token = std::uniform_int_distribution<int32_t>(3, static_cast<int32_t>(vocab) - 1)(rng);
    }
    prompts.push_back(prompt);
  }
  return prompts;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<double> margins;  // top-1 minus top-2 logprob at each step
};

void Collect(OutputStream& stream, Result* result) {
  for (RequestOutput& output : stream.TakeAvailable()) {
    result->tokens.insert(result->tokens.end(), output.token_ids.begin(), output.token_ids.end());
    for (const PositionLogprobs& lp : output.logprobs) {
      result->margins.push_back(lp.top.size() >= 2 ? lp.top[0].logprob - lp.top[1].logprob : 1e9);
    }
  }
}

// A fixture model: hf-tiny/NAME, or hf-families/NAME for the sliding-window ones.
struct EngineCase {
  std::string name;
  bool family = false;
  std::string dir() const { return family ? testing::HfFamilyDir(name) : testing::HfTinyDir(name); }
};

std::vector<EngineCase> EngineCases() {
  std::vector<EngineCase> cases;
  for (const std::string& name : testing::HfTinyModelNames()) cases.push_back({name});
  cases.push_back({"mistral-sliding", true});
  cases.push_back({"gemma2-softcap-sliding", true});
  return cases;
}

// The model's KV cache group windows, as the runner reports them.
std::vector<int32_t> GroupWindows(const Checkpoint& checkpoint) {
  auto model = DescribeModel(checkpoint.config());
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? PlanKvCacheGroups((*model)->kv_windows()).windows : std::vector<int32_t>{0};
}

class CpuEngineTest : public ::testing::TestWithParam<EngineCase> {};

TEST_P(CpuEngineTest, OutputIsTheSameAloneAndAmongSixteenConcurrentRequests) {
  const std::string& model = GetParam().name;
  auto checkpoint = OpenCheckpoint(GetParam().dir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadReference(GetParam().dir());
  // A block holds one group's layers: each group needs its blocks (the pools below are per group).
  const std::vector<int32_t> windows = GroupWindows(**checkpoint);
  const int32_t num_groups = static_cast<int32_t>(windows.size());
  const bool all_windowed = std::find(windows.begin(), windows.end(), 0) == windows.end();
  const std::vector<std::vector<int32_t>> prompts =
      Prompts(ref, (*checkpoint)->config().vocab_size);
  ASSERT_EQ(prompts.size(), 16u);

  // Alone: one request at a time, a roomy pool, no prefix cache.
  EngineConfig alone_config;
  alone_config.enable_prefix_caching = false;
  alone_config.max_num_batched_tokens = 4096;
  RecordingRunner* alone_recorder = nullptr;
  auto alone =
      MakeEngine(**checkpoint, /*num_blocks=*/16 * num_groups, alone_config, &alone_recorder);
  ASSERT_NE(alone, nullptr);
  std::vector<Result> alone_results(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto stream = std::make_shared<OutputStream>(i, 1);
    alone->AddRequest(i, MakeRequest(prompts[i], i), 0.0, stream);
    while (alone->Step()) {
    }
    Collect(*stream, &alone_results[i]);
    ASSERT_EQ(alone_results[i].tokens.size(), static_cast<size_t>(kMaxTokens));
  }
  EXPECT_EQ(alone_recorder->num_partial_prefills(), 0);
  EXPECT_EQ(alone_recorder->max_seqs_per_step(), 1);

  // Alone, the fixture prompts give Hugging Face's greedy tokens (up to a near-tie).
  for (size_t j = 0; j < ref.prompts.size(); ++j) {
    for (size_t step = 0; step < ref.greedy[j].size(); ++step) {
      if (ref.greedy_margin[j][step] <= kTieMargin) break;
      ASSERT_EQ(alone_results[j].tokens[step], ref.greedy[j][step])
          << model << " prompt " << j << " step " << step;
    }
  }

  // Concurrent: all 16 at once; a 64-token budget chunks the long prompts; 24 blocks (384
  // tokens) a group cannot hold them all, so some are preempted; shared prefixes hit the cache.
  // With every layer windowed, a sequence holds at most ceil((15 + 64) / 16) + 1 = 6 blocks, and
  // 2 once decoding: 10 blocks are too few for all 16.
  EngineConfig config;
  config.max_num_batched_tokens = 64;
  config.max_num_seqs = 16;
  RecordingRunner* recorder = nullptr;
  const int32_t num_blocks = all_windowed ? 10 : 24 * num_groups;
  auto concurrent = MakeEngine(**checkpoint, num_blocks, config, &recorder);
  ASSERT_NE(concurrent, nullptr);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    streams.push_back(std::make_shared<OutputStream>(i, 1));
    concurrent->AddRequest(i, MakeRequest(prompts[i], i), 0.0, streams.back());
  }
  std::vector<Result> results(prompts.size());
  int64_t steps = 0;
  std::vector<int32_t> most_used(windows.size(), 0);
  while (concurrent->Step()) {
    ++steps;
    for (size_t i = 0; i < prompts.size(); ++i) Collect(*streams[i], &results[i]);
    const EngineStats step_stats = concurrent->Stats();
    ASSERT_EQ(step_stats.kv_groups.size(), windows.size());
    for (size_t g = 0; g < windows.size(); ++g) {
      most_used[g] = std::max(most_used[g], step_stats.kv_groups[g].num_used_blocks);
      // A windowed group holds at most ceil((W - 1 + 64) / 16) + 1 blocks of each sequence.
      if (windows[g] > 0) {
        const int32_t cap = (windows[g] - 1 + 64 + kBlockSize - 1) / kBlockSize + 1;
        ASSERT_LE(step_stats.kv_groups[g].num_used_blocks, cap * step_stats.num_running_seqs);
      }
    }
  }
  const EngineStats stats = concurrent->Stats();
  EXPECT_GT(recorder->num_partial_prefills(), 0) << "no chunked prefill happened";
  EXPECT_GT(stats.num_preemptions, 0) << "no preemption happened";
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0) << "no prefix-cache hit happened";
  EXPECT_GT(recorder->max_seqs_per_step(), 4);
  EXPECT_EQ(stats.num_free_kv_blocks, num_blocks);

  int64_t compared = 0;
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(streams[i]->finished());
    ASSERT_EQ(results[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << "request " << i;
    for (size_t step = 0; step < static_cast<size_t>(kMaxTokens); ++step, ++total) {
      EXPECT_EQ(results[i].tokens[step], alone_results[i].tokens[step])
          << model << " request " << i << " step " << step << " (alone margin "
          << alone_results[i].margins[step] << ")";
      if (results[i].tokens[step] != alone_results[i].tokens[step]) break;
      ++compared;
    }
  }
  std::printf(
      "[ engine   ] %-26s %ld steps, %ld preemptions, %ld of %ld prompt tokens from the "
      "prefix cache, %ld partial prefills, %ld/%ld tokens equal; most blocks used by group: "
      "%s\n",
      model.c_str(), static_cast<long>(steps), static_cast<long>(stats.num_preemptions),
      static_cast<long>(stats.prefix_cache_hit_tokens),
      static_cast<long>(stats.prefix_cache_queried_tokens),
      static_cast<long>(recorder->num_partial_prefills()), static_cast<long>(compared),
      static_cast<long>(total), StrJoin(most_used, " ").c_str());
}

// The runner-sampling path (LogitsMode::kSample, as the CUDA runner does it), taken here by the CPU
// runner: greedy and seeded requests alike give the engine sampler's tokens (one definition of the
// draw: the same Philox stream and counter, the same selection), and the same tokens alone as
// among 16 concurrent requests with preemption and chunking; requests the runner cannot sample
// exactly (logprobs, penalties, min_tokens) still get logits rows.
TEST(CpuEngineRunnerSamplingTest, MatchesTheEngineSamplerAndStaysBatchInvariant) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadHfTinyReference("llama-gqa");
  const std::vector<std::vector<int32_t>> prompts =
      Prompts(ref, (*checkpoint)->config().vocab_size);
  auto request = [&](size_t i) {
    Request r = MakeRequest(prompts[i], i);
    r.sampling.logprobs.reset();
    if (i == 5) r.sampling.logprobs = 1;            // needs the logits row
    if (i == 7) r.sampling.repetition_penalty = 1.2;  // the engine's sampler only
    if (i == 8) r.sampling.min_tokens = 4;          // engine-sampled until 4 tokens, then runner
    return r;
  };
  // Returns each request's result; *runner_samples_seen counts the kSample sequences the runner
  // got (read before the engine, which owns the recorder, goes away).
  auto run = [&](bool runner_samples, bool together, int64_t* runner_samples_seen) {
    EngineConfig config;
    config.max_num_batched_tokens = together ? 64 : 4096;
    config.max_num_seqs = 16;
    RecordingRunner* recorder = nullptr;
    auto engine = MakeEngine(**checkpoint, together ? 24 : 16, config, &recorder, runner_samples);
    std::vector<Result> results(prompts.size());
    if (engine == nullptr) return results;
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      streams.push_back(std::make_shared<OutputStream>(i, 1));
      engine->AddRequest(i, request(i), 0.0, streams.back());
      if (!together) {
        while (engine->Step()) {
        }
      }
    }
    while (engine->Step()) {
    }
    for (size_t i = 0; i < prompts.size(); ++i) Collect(*streams[i], &results[i]);
    *runner_samples_seen = recorder->num_runner_samples();
    return results;
  };
  int64_t engine_sampled = -1, alone = -1, together = -1;
  const std::vector<Result> reference = run(false, false, &engine_sampled);
  const std::vector<Result> runner_alone = run(true, false, &alone);
  const std::vector<Result> runner_together = run(true, true, &together);
  EXPECT_EQ(engine_sampled, 0);
  EXPECT_GT(alone, 0);
  EXPECT_GT(together, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(runner_alone[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << i;
    EXPECT_EQ(runner_together[i].tokens, runner_alone[i].tokens) << "request " << i;
    // Greedy: the runner's argmax is the engine's. Seeded: the runner draws what the engine's
    // sampler draws (alone, the two see the same logits rows).
    EXPECT_EQ(runner_alone[i].tokens, reference[i].tokens) << "request " << i;
  }
  EXPECT_EQ(runner_alone[5].margins.size(), static_cast<size_t>(kMaxTokens));  // logprobs kept
}

// What a seed guarantees on the CPU runner (lmserve.proto's `seed` states it from this test): a
// seeded sampled request alone, twice, and then among seven other requests (admitted together,
// so its decode steps are batched), twice. Each position's logprobs (from the logits row the
// draw used) and tokens are compared bit for bit.
TEST(CpuEngineSeedTest, ASeededRequestAloneAndInABatch) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadHfTinyReference("llama-gqa");
  const std::vector<std::vector<int32_t>> prompts =
      Prompts(ref, (*checkpoint)->config().vocab_size);
  auto seeded = [&] {
    Request r;
    r.prompt_token_ids = prompts[2];
    r.sampling.temperature = 0.9;
    r.sampling.top_p = 0.95;
    r.sampling.seed = 20261125;
    r.sampling.max_tokens = kMaxTokens;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 2;
    return r;
  };
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;  // each position's chosen token's, then its top 2
  };
  // The seeded request alone (others: 0) or with `others` requests of other lengths and settings.
  auto run = [&](int others) {
    EngineConfig config;
    config.max_num_seqs = 16;
    RecordingRunner* recorder = nullptr;
    auto engine = MakeEngine(**checkpoint, /*num_blocks=*/96, config, &recorder);
    Run result;
    if (engine == nullptr) return result;
    auto stream = std::make_shared<OutputStream>(0, 1);
    engine->AddRequest(0, seeded(), 0.0, stream);
    for (int i = 1; i <= others; ++i) {
      engine->AddRequest(i, MakeRequest(prompts[4 + i], 4 + i), 0.0,
                         std::make_shared<OutputStream>(i, 1));
    }
    while (engine->Step()) {
    }
    for (RequestOutput& output : stream->TakeAvailable()) {
      result.tokens.insert(result.tokens.end(), output.token_ids.begin(), output.token_ids.end());
      for (const PositionLogprobs& lp : output.logprobs) {
        result.logprobs.push_back(lp.logprob);
        for (const TokenLogprob& top : lp.top) result.logprobs.push_back(top.logprob);
      }
    }
    EXPECT_EQ(recorder->max_seqs_per_step(), others + 1);
    return result;
  };
  const Run alone = run(0), alone_again = run(0), batched = run(7), batched_again = run(7);
  ASSERT_EQ(alone.tokens.size(), static_cast<size_t>(kMaxTokens));
  // The same batch composition: the same tokens from the same logits, bit for bit.
  EXPECT_EQ(alone_again.tokens, alone.tokens);
  EXPECT_EQ(alone_again.logprobs, alone.logprobs);
  EXPECT_EQ(batched_again.tokens, batched.tokens);
  EXPECT_EQ(batched_again.logprobs, batched.logprobs);
  // Another batch composition: the CPU runner computes a one-token step with sgemv and a batched
  // one with sgemm (kernels/cpu/linear.cc), so the logits may differ in their last bits; the
  // tokens then stay the same unless a draw falls within that rounding of a boundary. (Here they
  // stay the same; that is this draw's luck, not a guarantee.)
  ASSERT_EQ(batched.logprobs.size(), alone.logprobs.size());
  int64_t differing = 0;
  float worst = 0.0f;
  for (size_t i = 0; i < alone.logprobs.size(); ++i) {
    if (batched.logprobs[i] != alone.logprobs[i]) ++differing;
    worst = std::max(worst, std::abs(batched.logprobs[i] - alone.logprobs[i]));
  }
  std::printf(
      "[ seed     ] alone vs in a batch of 8: %ld of %zu logprobs differ (at most %.3g); "
      "tokens %s\n",
      static_cast<long>(differing), alone.logprobs.size(), static_cast<double>(worst),
      batched.tokens == alone.tokens ? "identical" : "differ");
  EXPECT_LE(worst, 1e-4f) << "more than rounding between batch compositions";
  EXPECT_EQ(batched.tokens, alone.tokens);
}

// A 400-token generation after the 130-token fixture prompt on mistral-sliding (window 16) over a
// pool of 8 blocks (128 token slots): the sequence never holds more than its window's blocks and a
// step's chunk (ceil((15 + 32) / 16) + 1 = 4), the statistics say so at every step, and its tokens
// are the runner's own greedy tokens computed with whole block tables, nothing dropped.
TEST(CpuEngineWindowTest, ALongGenerationHoldsAWindowOfBlocks) {
  const std::string dir = testing::HfFamilyDir("mistral-sliding");
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::vector<int32_t> prompt = testing::LoadReference(dir).prompts[3];
  constexpr int32_t kGenerated = 400;

  EngineConfig config;
  config.max_num_batched_tokens = 32;
  RecordingRunner* recorder = nullptr;
  auto engine = MakeEngine(**checkpoint, /*num_blocks=*/8, config, &recorder);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->limits().kv_cache_tokens, std::numeric_limits<int64_t>::max());
  Request request = MakeRequest(prompt, 0);
  request.sampling.max_tokens = kGenerated;
  auto stream = std::make_shared<OutputStream>(0, 1);
  engine->AddRequest(0, std::move(request), 0.0, stream);
  int32_t most_used = 0;
  while (engine->Step()) {
    const EngineStats stats = engine->Stats();
    ASSERT_EQ(stats.kv_groups.size(), 1u);
    EXPECT_EQ(stats.kv_groups[0].window, 16);
    most_used = std::max(most_used, stats.kv_groups[0].num_used_blocks);
    ASSERT_LE(stats.kv_groups[0].num_used_blocks, 4);
  }
  Result result;
  Collect(*stream, &result);
  ASSERT_EQ(result.tokens.size(), static_cast<size_t>(kGenerated));
  EXPECT_EQ(engine->Stats().num_preemptions, 0);

  // The same greedy decoding with whole tables (every block kept) on a roomy runner.
  RunnerConfig runner_config;
  runner_config.block_size_tokens = kBlockSize;
  runner_config.kv_cache_bytes = int64_t{8} << 20;
  runner_config.num_threads = 1;
  auto runner = ModelRunner::Create(**checkpoint, runner_config);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> sequence = prompt;
  std::vector<int32_t> table((prompt.size() + kGenerated + kBlockSize - 1) / kBlockSize);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> whole;
  for (int32_t step = 0; step < kGenerated; ++step) {
    const size_t computed = step == 0 ? 0 : sequence.size() - 1;
    StepBatch batch;
    batch.AddSequence(std::span(sequence).subspan(computed), static_cast<int32_t>(computed), table,
                      LogitsMode::kLast);
    StepOutput output;
    ASSERT_TRUE((*runner)->Execute(batch, &output).ok());
    const int32_t token = static_cast<int32_t>(
        std::max_element(output.logits.begin(), output.logits.end()) - output.logits.begin());
    whole.push_back(token);
    sequence.push_back(token);
  }
  size_t equal = 0;
  while (equal < whole.size() && whole[equal] == result.tokens[equal]) ++equal;
  std::printf(
      "[ window   ] mistral-sliding, %d tokens after %zu: at most %d of 8 blocks held; "
      "%zu of them equal to whole tables' tokens\n",
      kGenerated, prompt.size(), most_used, equal);
  // Chunked prefill rounds differently from one chunk: allow a near-tie to part them.
  for (size_t i = 0; i < whole.size(); ++i) {
    if (result.margins[i] <= kTieMargin) break;
    ASSERT_EQ(result.tokens[i], whole[i]) << "token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuEngineTest, ::testing::ValuesIn(EngineCases()),
                         [](const ::testing::TestParamInfo<EngineCase>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace lmserve::engine

namespace lmserve::engine {
namespace {

// The made-up byte vocabulary of the structured tests: token i spells a letter, a digit or a pair.
std::unique_ptr<structured::TokenTrie> LetterTrie(const ModelConfig& model) {
  std::vector<std::string> bytes(static_cast<size_t>(model.vocab_size));
  std::vector<uint8_t> excluded(bytes.size(), 0);
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i < 26) {
      bytes[i] = std::string(1, static_cast<char>('a' + i));
    } else if (i < 36) {
      bytes[i] = std::string(1, static_cast<char>('0' + i - 26));
    } else {
      bytes[i] = {static_cast<char>('a' + i % 7), static_cast<char>('-' + i % 3)};
    }
  }
  for (int32_t eos : model.eos_token_ids) excluded[static_cast<size_t>(eos)] = 1;
  return structured::TokenTrie::FromBytes(bytes, excluded, model.vocab_size, model.eos_token_ids);
}

constexpr const char* kStructuredPattern = "[a-e]{2,5}(-[0-9]{1,2}|/[a-c])?";

// What one sample of the structured workload produced.
struct StructuredSample {
  std::vector<int32_t> tokens;
  std::string text;
  int finished = 0;
  FinishReason reason = FinishReason::kError;
  std::string error;
};

// What the runner saw of the workload (RecordingRunner's counts, read before the engine goes).
struct StructuredSteps {
  int64_t runner_samples = 0;
  int64_t masked_before_launch = 0;  // steps whose masks were computed before Launch
  int64_t masked_after_launch = 0;   // ... between Launch and Finish
};

// Four requests of the fixture prompts, n = 2, temperature 1, constrained by kStructuredPattern,
// run to the end on `config`. Samples by request, then sample index.
std::vector<StructuredSample> RunStructured(const Checkpoint& checkpoint,
                                            const structured::TokenTrie& trie,
                                            const EngineConfig& config, bool runner_samples,
                                            StructuredSteps* steps) {
  absl::StatusOr<structured::Grammar> grammar = structured::CompileGrammar(
      {structured::ConstraintKind::kRegex, kStructuredPattern}, structured::GrammarLimits{});
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  if (!grammar.ok()) return {};
  auto compiled =
      std::make_shared<structured::CompiledGrammar>(*std::move(grammar), &trie, "regex");
  RecordingRunner* recorder = nullptr;
  auto engine = MakeEngine(checkpoint, /*num_blocks=*/64, config, &recorder, runner_samples);
  if (engine == nullptr) return {};
  recorder->set_engine(engine.get());
  const testing::HfTinyReference ref = testing::LoadHfTinyReference("llama-gqa");
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 4; ++i) {
    Request request;
    request.prompt_token_ids = ref.prompts[static_cast<size_t>(i)];
    request.sampling.temperature = 1.0;
    request.sampling.seed = 77 + i;
    request.sampling.n = 2;
    request.sampling.max_tokens = 24;
    request.sampling.constraint = compiled;
    EXPECT_TRUE(engine->Validate(request).ok());
    streams.push_back(std::make_shared<OutputStream>(i, 2));
    engine->AddRequest(i, std::move(request), 0.0, streams.back());
  }
  while (engine->Step()) {
  }
  recorder->set_engine(nullptr);
  steps->runner_samples = recorder->num_runner_samples();
  steps->masked_before_launch = recorder->num_steps_masked_before_launch();
  steps->masked_after_launch = recorder->num_steps_masked_after_launch();
  std::vector<StructuredSample> samples(2 * streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    RequestOutput output;
    while (streams[i]->Next(&output, absl::ZeroDuration()) == OutputStream::NextResult::kOutput) {
      StructuredSample& sample = samples[2 * i + static_cast<size_t>(output.sample_index)];
      for (int32_t id : output.token_ids) {
        sample.tokens.push_back(id);
        sample.text += trie.TokenBytes(id);
      }
      if (output.finished) {
        ++sample.finished;
        sample.reason = output.finish_reason;
        sample.error = output.error;
      }
    }
  }
  return samples;
}

// Structured output through the engine: a regular expression over the letter vocabulary of the
// fixture model, sampled at temperature 1 with n = 2: every sample's bytes match, and it ends by
// the constraint (complete) or by EOS where the match may end, never by length. Masked by the
// engine's sampler (the runner returns logits), and by the runner (kSample with the engine's
// bitmasks, the CUDA runner's path).
class CpuEngineStructuredTest : public ::testing::TestWithParam<bool> {};

TEST_P(CpuEngineStructuredTest, SampledOutputsMatchTheirConstraint) {
  const bool runner_samples = GetParam();
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto trie = LetterTrie((*checkpoint)->config());
  EngineConfig config;
  config.max_num_seqs = 8;
  StructuredSteps steps;
  const std::vector<StructuredSample> samples =
      RunStructured(**checkpoint, *trie, config, runner_samples, &steps);
  ASSERT_EQ(samples.size(), 8u);
  // The CPU runner masks rows as the CUDA runner does: with it, the runner draws every token.
  if (runner_samples) {
    EXPECT_GT(steps.runner_samples, 0);
  } else {
    EXPECT_EQ(steps.runner_samples, 0);
  }
  const std::regex expected(kStructuredPattern);
  for (const StructuredSample& sample : samples) {
    EXPECT_EQ(sample.finished, 1);
    EXPECT_TRUE(sample.reason == FinishReason::kConstraintEnd ||
                sample.reason == FinishReason::kEos)
        << FinishReasonName(sample.reason) << " " << sample.error;
    EXPECT_TRUE(std::regex_match(sample.text, expected)) << "'" << sample.text << "'";
  }
}

// The step's masks overlap the forward pass (EngineConfig::overlap_structured_masks): computed
// between the runner's Launch (the CPU runner has computed the forward pass by then) and its
// Finish, on several threads; the serial path computes them on one thread before the launch.
// For the same seeds, both give the same tokens, masked by the engine's sampler or the runner's.
TEST_P(CpuEngineStructuredTest, MasksAfterTheLaunchGiveTheSerialPathsTokens) {
  const bool runner_samples = GetParam();
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto trie = LetterTrie((*checkpoint)->config());
  EngineConfig serial;
  serial.max_num_seqs = 8;
  serial.overlap_structured_masks = false;
  serial.structured_mask_threads = 1;
  EngineConfig overlapped = serial;
  overlapped.overlap_structured_masks = true;
  overlapped.structured_mask_threads = 3;
  StructuredSteps serial_steps, overlapped_steps;
  const std::vector<StructuredSample> expected =
      RunStructured(**checkpoint, *trie, serial, runner_samples, &serial_steps);
  const std::vector<StructuredSample> actual =
      RunStructured(**checkpoint, *trie, overlapped, runner_samples, &overlapped_steps);
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(actual.size(), 8u);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_FALSE(expected[i].tokens.empty());
    EXPECT_EQ(actual[i].tokens, expected[i].tokens) << "sample " << i;
    EXPECT_EQ(actual[i].reason, expected[i].reason) << "sample " << i;
  }
  EXPECT_GT(serial_steps.masked_before_launch, 0);
  EXPECT_EQ(serial_steps.masked_after_launch, 0);
  EXPECT_EQ(overlapped_steps.masked_before_launch, 0);
  EXPECT_GT(overlapped_steps.masked_after_launch, 0);
}

INSTANTIATE_TEST_SUITE_P(MaskedBy, CpuEngineStructuredTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Runner" : "Engine";
                         });

}  // namespace
}  // namespace lmserve::engine
