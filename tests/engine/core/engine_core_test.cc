// The engine core end to end over the fake runner: stop conditions, text, logprobs, n > 1,
// reproducible seeded sampling, validation and runner errors.

#include "engine/core/engine_core.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/core/engine_test_util.h"
#include "tests/engine/core/fake_runner.h"

namespace lmserve::engine::testing {
namespace {

using ::testing::HasSubstr;

FakeRunnerOptions Runner(int32_t num_blocks = 64) {
  FakeRunnerOptions options;
  options.num_kv_blocks = num_blocks;
  return options;
}

EngineConfig Config(int32_t max_num_batched_tokens = 32) {
  EngineConfig config;
  config.max_num_batched_tokens = max_num_batched_tokens;
  return config;
}

std::unique_ptr<TextDecoder> FakeText() {
  return std::make_unique<FunctionTextDecoder>([](std::span<const int32_t> ids) {
    std::string text;
    for (int32_t id : ids) text += FakeTokenText(id);
    return text;
  });
}

std::string TextOf(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text += FakeTokenText(id);
  return text;
}

Request Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request request;
  request.prompt_token_ids = std::move(prompt);
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

// A prompt whose greedy continuation (60 tokens, EOS ignored) has at least `min_pieces` tokens
// of two or more characters; searched deterministically.
std::vector<int32_t> PromptWithLongPieces(CoreHarness& h, int min_pieces) {
  for (int attempt = 0;; ++attempt) {
    std::vector<int32_t> prompt = h.Prompt(StrCat("text", attempt), 5);
    const std::vector<int32_t> out = FakeGreedy(prompt, 60, {}, h.vocab_size());
    int count = 0;
    for (int32_t id : out) count += FakeTokenText(id).size() >= 2 ? 1 : 0;
    if (count >= min_pieces) return prompt;
  }
}

TEST(EngineCoreTest, StopStringSpanningTokensEndsGenerationAndIsNotEmitted) {
  CoreHarness h(Runner(), Config(), FakeText());
  const std::vector<int32_t> prompt = PromptWithLongPieces(h, 4);
  const std::vector<int32_t> oracle = FakeGreedy(prompt, 60, {}, h.vocab_size());
  const std::string full_text = TextOf(oracle);
  // A stop string from the last character of one token to the first of the next, at the 3rd
  // multi-character token.
  std::string stop;
  size_t offset = 0;
  int seen = 0;
  for (size_t i = 0; i + 1 < oracle.size(); ++i) {
    const std::string piece = FakeTokenText(oracle[i]);
    offset += piece.size();
    if (piece.size() >= 2 && ++seen == 3 && !FakeTokenText(oracle[i + 1]).empty()) {
      stop = full_text.substr(offset - 1, 2);
      break;
    }
  }
  ASSERT_EQ(stop.size(), 2u);
  const size_t cut = full_text.find(stop);
  // The generation stops with the token that completes the first occurrence.
  size_t num_tokens = 0;
  for (size_t length = 0; length < cut + stop.size(); ++num_tokens) {
    length += FakeTokenText(oracle[num_tokens]).size();
  }

  Request request = Greedy(prompt, 60);
  request.sampling.stop = {stop, "never-appears"};
  const RequestId id = h.Add("S", request);
  h.RunToCompletion();
  const SampleResult& r = h.result(id);
  EXPECT_EQ(r.text, full_text.substr(0, cut));
  EXPECT_EQ(r.text.find(stop), std::string::npos);
  EXPECT_EQ(r.final_output->finish_reason, FinishReason::kStopString);
  EXPECT_EQ(r.final_output->stop_string, stop);
  EXPECT_EQ(r.token_ids, std::vector<int32_t>(oracle.begin(), oracle.begin() + num_tokens));
  EXPECT_EQ(r.final_output->usage.completion_tokens, static_cast<int32_t>(num_tokens));
}

TEST(EngineCoreTest, TextDeltasAddUpToTheDecodedOutput) {
  CoreHarness h(Runner(), Config(), FakeText());
  const std::vector<int32_t> prompt = h.Prompt("T", 6);
  const RequestId id = h.Add("T", Greedy(prompt, 20));
  h.RunToCompletion();
  EXPECT_EQ(h.result(id).text, TextOf(FakeGreedy(prompt, 20, {}, h.vocab_size())));
  EXPECT_EQ(h.result(id).final_output->finish_reason, FinishReason::kMaxTokens);
}

// Finds a prompt whose greedy continuation emits EOS (token 0) at index `eos_index`.
std::vector<int32_t> PromptWithEosAt(CoreHarness& h, size_t eos_index) {
  for (int attempt = 0;; ++attempt) {
    std::vector<int32_t> prompt = h.Prompt(StrCat("eos", attempt), 4);
    const std::vector<int32_t> out = FakeGreedy(prompt, 40, {0}, h.vocab_size());
    if (out.size() == eos_index + 1 && out.back() == 0) return prompt;
  }
}

TEST(EngineCoreTest, EosMinTokensAndIgnoreEos) {
  CoreHarness h(Runner(), Config(), FakeText());
  const std::vector<int32_t> prompt = PromptWithEosAt(h, 2);
  Request eos = Greedy(prompt, 30);
  eos.sampling.ignore_eos = false;
  const RequestId stops = h.Add("E", eos);
  Request min_tokens = eos;
  min_tokens.sampling.min_tokens = 6;
  const RequestId suppressed = h.Add("M", min_tokens);
  Request ignore = eos;
  ignore.sampling.ignore_eos = true;
  ignore.sampling.max_tokens = 8;
  const RequestId ignores = h.Add("I", ignore);
  h.RunToCompletion();

  const SampleResult& e = h.result(stops);
  EXPECT_EQ(e.token_ids, FakeGreedy(prompt, 30, {0}, h.vocab_size()));
  EXPECT_EQ(e.final_output->finish_reason, FinishReason::kEos);
  EXPECT_EQ(e.final_output->stop_token_id, 0);
  EXPECT_EQ(e.text, TextOf({e.token_ids[0], e.token_ids[1]}));  // EOS text not decoded

  const SampleResult& m = h.result(suppressed);
  ASSERT_GE(m.token_ids.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NE(m.token_ids[i], 0) << i;
  EXPECT_EQ(m.token_ids[2], [&] {  // the runner-up where EOS led
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), m.token_ids.begin(), m.token_ids.begin() + 2);
    std::vector<float> logits = FakeLogits(context, h.vocab_size());
    logits[0] = -1e30f;
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }());

  const SampleResult& i = h.result(ignores);
  EXPECT_EQ(i.token_ids, FakeGreedy(prompt, 8, {}, h.vocab_size()));
  EXPECT_EQ(i.token_ids[2], 0);
  EXPECT_EQ(i.final_output->finish_reason, FinishReason::kMaxTokens);
}

// Async scheduling over a runner that draws on the device and launches ahead: the same tokens,
// text and finish reasons as the serial engine; no position computed past a length limit (the
// last token is awaited), and exactly one dropped where a sequence stops on a token not yet read
// (EOS). A request whose tokens the engine samples (min_tokens) finishes its steps serially.
TEST(EngineCoreTest, AsyncSchedulingGivesTheSerialResultsAndDropsOnlyAStoppedPosition) {
  struct Run {
    std::vector<SampleResult> results;
    int64_t step_tokens = 0;
    int64_t launched_ahead = 0;
  };
  auto run = [](bool async, bool with_min_tokens) {
    FakeRunnerOptions options = Runner();
    options.samples_on_device = true;
    options.launch_ahead = async;
    EngineConfig config = Config();
    config.async_scheduling = async;
    CoreHarness h(options, config, FakeText());
    const std::vector<int32_t> prompt = PromptWithEosAt(h, 2);
    Request eos = Greedy(prompt, 30);
    eos.sampling.ignore_eos = false;
    Request ignore = eos;
    ignore.sampling.ignore_eos = true;
    ignore.sampling.max_tokens = 8;
    std::vector<RequestId> ids = {h.Add("E", eos), h.Add("I", ignore),
                                  h.Add("L", Greedy(h.Prompt("L", 9), 5))};
    if (with_min_tokens) {
      Request min_tokens = eos;
      min_tokens.sampling.min_tokens = 6;
      ids.push_back(h.Add("M", min_tokens));
    }
    h.RunToCompletion();
    Run r;
    for (RequestId id : ids) r.results.push_back(h.result(id));
    r.step_tokens = h.core().Stats().total_step_tokens;
    r.launched_ahead = h.core().num_steps_launched_ahead();
    return r;
  };
  for (bool with_min_tokens : {false, true}) {
    SCOPED_TRACE(with_min_tokens ? "with min_tokens" : "device draws only");
    const Run serial = run(false, with_min_tokens), async = run(true, with_min_tokens);
    EXPECT_EQ(serial.launched_ahead, 0);
    EXPECT_GT(async.launched_ahead, 0);
    ASSERT_EQ(async.results.size(), serial.results.size());
    for (size_t i = 0; i < serial.results.size(); ++i) {
      SCOPED_TRACE(i);
      const SampleResult& a = async.results[i];
      const SampleResult& b = serial.results[i];
      EXPECT_EQ(a.token_ids, b.token_ids);
      EXPECT_EQ(a.text, b.text);
      EXPECT_EQ(a.num_finished_outputs, 1);
      ASSERT_TRUE(a.final_output.has_value() && b.final_output.has_value());
      EXPECT_EQ(a.final_output->finish_reason, b.final_output->finish_reason);
      EXPECT_EQ(a.final_output->usage.completion_tokens, static_cast<int32_t>(a.token_ids.size()));
    }
    EXPECT_EQ(serial.results[0].final_output->finish_reason, FinishReason::kEos);
    EXPECT_EQ(serial.results[1].token_ids.size(), 8u);
    // E stopped on its third token while the step after was launched: one position dropped.
    if (!with_min_tokens) {
      EXPECT_EQ(async.step_tokens, serial.step_tokens + 1);
    }
  }
}

// With one seat (max_num_seqs 1), a request waiting behind one that only awaits its last token
// (drawn by the step launched ahead) is admitted into the very next step, as the serial engine
// admits it once that token is read: the same steps in the same order.
TEST(EngineCoreTest, AsyncSchedulingAdmitsIntoTheSeatOfASequenceAwaitingItsLastToken) {
  auto schedules = [](bool async) {
    FakeRunnerOptions options = Runner();
    options.samples_on_device = true;
    options.launch_ahead = async;
    EngineConfig config = Config();
    config.max_num_seqs = 1;
    config.async_scheduling = async;
    CoreHarness h(options, config);
    h.AddGreedy("A", 5, 3);
    h.AddGreedy("B", 6, 2);
    std::vector<std::string> steps;
    while (h.core().HasWork()) {
      h.Step();
      steps.push_back(h.Scheduled());
    }
    return steps;
  };
  const std::vector<std::string> serial = schedules(false);
  EXPECT_EQ(serial, (std::vector<std::string>{"A:5", "A:1", "A:1", "B:6", "B:1"}));
  // The async engine reads the last step's tokens in one more Step call, which schedules nothing.
  std::vector<std::string> async = schedules(true);
  ASSERT_FALSE(async.empty());
  EXPECT_EQ(async.back(), async[async.size() - 2]);
  async.pop_back();
  EXPECT_EQ(async, serial);
}

TEST(EngineCoreTest, StopTokenIdsEndGenerationWithTheToken) {
  CoreHarness h(Runner(), Config());
  const std::vector<int32_t> prompt = h.Prompt("K", 5);
  const std::vector<int32_t> oracle = FakeGreedy(prompt, 30, {}, h.vocab_size());
  // The first token that does not occur earlier, from the 3rd on.
  size_t index = 2;
  while (std::find(oracle.begin(), oracle.begin() + index, oracle[index]) !=
         oracle.begin() + index) {
    ++index;
  }
  Request request = Greedy(prompt, 30);
  request.sampling.stop_token_ids = {oracle[index]};
  const RequestId id = h.Add("K", request);
  h.RunToCompletion();
  EXPECT_EQ(h.result(id).token_ids,
            std::vector<int32_t>(oracle.begin(), oracle.begin() + index + 1));
  EXPECT_EQ(h.result(id).final_output->finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(h.result(id).final_output->stop_token_id, oracle[index]);
}

TEST(EngineCoreTest, WithoutMaxTokensGenerationEndsAtTheContextLength) {
  EngineConfig config = Config();
  config.max_model_len = 20;
  CoreHarness h(Runner(), config);
  Request request = Greedy(h.Prompt("L", 15), 1);
  request.sampling.max_tokens.reset();
  const RequestId id = h.Add("L", request);
  h.RunToCompletion();
  EXPECT_EQ(h.result(id).token_ids.size(), 5u);
  EXPECT_EQ(h.result(id).final_output->finish_reason, FinishReason::kContextLength);

  request.sampling.max_tokens = 6;
  const absl::Status status = h.core().Validate(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("sampling.max_tokens"));
  EXPECT_THAT(status.message(), HasSubstr("context length of 20"));
}

TEST(EngineCoreTest, ARequestThatCanNeverFitIsRejectedNamingTheField) {
  CoreHarness h(Runner(/*num_blocks=*/4), Config(), FakeText());  // 16 KV slots
  Request request = Greedy(h.Prompt("X", 10), 7);
  absl::Status status = h.core().Validate(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("sampling.max_tokens"));
  EXPECT_THAT(status.message(), HasSubstr("KV cache"));
  request.sampling.max_tokens = 6;  // exactly the pool: fits
  EXPECT_TRUE(h.core().Validate(request).ok());

  struct Case {
    std::function<void(Request&)> mutate;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](Request& r) { r.prompt_token_ids.clear(); }, "prompt_token_ids"},
      {[](Request& r) { r.prompt_token_ids[0] = 64; }, "prompt_token_ids"},
      {[](Request& r) { r.prompt_token_ids.assign(16, 1); }, "prompt_token_ids"},
      {[](Request& r) { r.sampling.n = 0; }, "sampling.n"},
      {[](Request& r) { r.sampling.temperature = -0.5; }, "sampling.temperature"},
      {[](Request& r) { r.sampling.temperature = NAN; }, "sampling.temperature"},
      {[](Request& r) { r.sampling.top_k = -2; }, "sampling.top_k"},
      {[](Request& r) { r.sampling.top_p = 0.0; }, "sampling.top_p"},
      {[](Request& r) { r.sampling.min_p = 1.5; }, "sampling.min_p"},
      {[](Request& r) { r.sampling.repetition_penalty = 0.0; }, "sampling.repetition_penalty"},
      {[](Request& r) { r.sampling.presence_penalty = 3.0; }, "sampling.presence_penalty"},
      {[](Request& r) { r.sampling.frequency_penalty = -2.5; }, "sampling.frequency_penalty"},
      {[](Request& r) {
         r.sampling.logit_bias = {{99, 1.0f}};
       },
       "sampling.logit_bias"},
      {[](Request& r) { r.sampling.max_tokens = 0; }, "sampling.max_tokens"},
      {[](Request& r) {
         r.sampling.min_tokens = 5;
         r.sampling.max_tokens = 4;
       },
       "sampling.min_tokens"},
      {[](Request& r) { r.sampling.stop = {""}; }, "sampling.stop"},
      {[](Request& r) { r.sampling.stop_token_ids = {-1}; }, "sampling.stop_token_ids"},
      {[](Request& r) { r.sampling.logprobs = 21; }, "sampling.logprobs"},
      {[](Request& r) { r.sampling.prompt_logprobs = -1; }, "sampling.prompt_logprobs"},
  };
  for (const Case& c : cases) {
    Request bad = Greedy(h.Prompt("X", 4), 4);
    c.mutate(bad);
    status = h.core().Validate(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field)) << status;
  }
}

TEST(EngineCoreTest, StopStringsNeedATextDecoder) {
  CoreHarness h(Runner(), Config());
  Request request = Greedy(h.Prompt("X", 4), 4);
  request.sampling.stop = {"a"};
  EXPECT_THAT(h.core().Validate(request).message(), HasSubstr("sampling.stop"));
}

double LogSoftmaxAt(const std::vector<float>& logits, int32_t token) {
  double sum = 0.0;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  for (float logit : logits) sum += std::exp(static_cast<double>(logit) - max_logit);
  return logits[token] - max_logit - std::log(sum);
}

TEST(EngineCoreTest, LogprobsAndChunkedPromptLogprobsMatchTheModel) {
  CoreHarness h(Runner(), Config(/*max_num_batched_tokens=*/5));
  const std::vector<int32_t> prompt = h.Prompt("P", 13);
  // The same prompt first, so that its blocks are cached: prompt logprobs must not use them.
  const RequestId warm = h.Add("W", Greedy(prompt, 2));
  h.RunToCompletion();
  const int64_t hits_before = h.core().Stats().prefix_cache_hit_tokens;
  Request request = Greedy(prompt, 4);
  request.sampling.logprobs = 3;
  request.sampling.prompt_logprobs = 2;
  const RequestId id = h.Add("P", request);
  h.RunToCompletion();
  EXPECT_EQ(h.core().Stats().prefix_cache_hit_tokens, hits_before);
  const SampleResult& r = h.result(id);
  EXPECT_EQ(h.result(warm).token_ids.size(), 2u);
  EXPECT_EQ(r.token_ids, FakeGreedy(prompt, 4, {}, h.vocab_size()));

  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t p = 1; p < prompt.size(); ++p) {
    const std::vector<float> logits =
        FakeLogits(std::span<const int32_t>(prompt).first(p), h.vocab_size());
    const PositionLogprobs& lp = r.prompt_logprobs[p - 1];
    EXPECT_EQ(lp.token_id, prompt[p]);
    EXPECT_NEAR(lp.logprob, LogSoftmaxAt(logits, prompt[p]), 1e-5) << p;
    ASSERT_EQ(lp.top.size(), 2u);
    EXPECT_EQ(lp.top[0].token_id, std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  ASSERT_EQ(r.logprobs.size(), 4u);
  std::vector<int32_t> context = prompt;
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<float> logits = FakeLogits(context, h.vocab_size());
    EXPECT_EQ(r.logprobs[i].token_id, r.token_ids[i]);
    EXPECT_EQ(r.logprobs[i].rank, 1);  // greedy
    EXPECT_NEAR(r.logprobs[i].logprob, LogSoftmaxAt(logits, r.token_ids[i]), 1e-5);
    ASSERT_EQ(r.logprobs[i].top.size(), 3u);
    EXPECT_EQ(r.logprobs[i].top[0].token_id, r.token_ids[i]);
    context.push_back(r.token_ids[i]);
  }
}

// Seeded sampling gives the same tokens alone and in a crowded batch with chunking, preemption and
// prefix hits; a different seed gives different tokens.
TEST(EngineCoreTest, SeededSamplingIsReproducibleAcrossBatchCompositions) {
  auto seeded = [](CoreHarness& h, uint64_t seed) {
    Request request;
    request.prompt_token_ids = h.Prompt("R", 11);
    request.sampling.temperature = 0.9;
    request.sampling.top_p = 0.95;
    request.sampling.top_k = 40;
    request.sampling.presence_penalty = 0.3;
    request.sampling.seed = seed;
    request.sampling.max_tokens = 24;
    request.sampling.ignore_eos = true;
    request.sampling.n = 2;
    return request;
  };
  CoreHarness alone(Runner(), Config(64));
  const RequestId alone_id = alone.Add("R", seeded(alone, 77));
  alone.RunToCompletion();

  CoreHarness crowded(Runner(/*num_blocks=*/20), Config(/*max_num_batched_tokens=*/7));
  std::vector<RequestId> others;
  for (int i = 0; i < 6; ++i) {
    Request other;
    other.prompt_token_ids = crowded.Prompt(i % 2 == 0 ? "R" : StrCat("o", i), 9 + i);
    other.sampling.temperature = 1.0;
    other.sampling.max_tokens = 20;
    other.sampling.ignore_eos = true;
    others.push_back(crowded.Add(StrCat("O", i), other));
  }
  const RequestId crowded_id = crowded.Add("R", seeded(crowded, 77));
  const RequestId other_seed_id = crowded.Add("Q", seeded(crowded, 78));
  crowded.RunToCompletion();
  const EngineStats stats = crowded.core().Stats();
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0);

  for (int32_t sample = 0; sample < 2; ++sample) {
    EXPECT_EQ(crowded.result(crowded_id, sample).token_ids,
              alone.result(alone_id, sample).token_ids);
    EXPECT_EQ(alone.result(alone_id, sample).token_ids.size(), 24u);
  }
  EXPECT_NE(alone.result(alone_id, 0).token_ids, alone.result(alone_id, 1).token_ids);
  EXPECT_NE(crowded.result(other_seed_id, 0).token_ids, alone.result(alone_id, 0).token_ids);
}

TEST(EngineCoreTest, ARunnerErrorFailsTheStepsRequestsAndTheEngineGoesOn) {
  CoreHarness h(Runner(), Config());
  const RequestId a = h.Add("A", Greedy(h.Prompt("A", 6), 5));
  const RequestId b = h.Add("B", Greedy(h.Prompt("B", 6), 5));
  ASSERT_TRUE(h.Step());
  h.runner().FailNextStep(absl::InternalError("device lost"));
  ASSERT_TRUE(h.Step());
  EXPECT_EQ(h.Finished(), "A:error B:error");
  EXPECT_THAT(h.result(a).final_output->error, HasSubstr("device lost"));
  EXPECT_EQ(h.result(b).token_ids.size(), 1u);
  EXPECT_EQ(h.core().block_manager().num_free_blocks(), 64);
  const RequestId c = h.Add("C", Greedy(h.Prompt("C", 6), 3));
  h.RunToCompletion();
  EXPECT_EQ(h.result(c).token_ids, FakeGreedy(h.Prompt("C", 6), 3, {}, h.vocab_size()));
}

TEST(EngineCoreTest, AbortAllFinishesEverySample) {
  CoreHarness h(Runner(), Config(8));
  Request request = Greedy(h.Prompt("N", 9), 5);
  request.sampling.n = 3;
  const RequestId a = h.Add("N", request);
  const RequestId b = h.Add("B", Greedy(h.Prompt("B", 9), 5));
  ASSERT_TRUE(h.Step());
  h.core().AbortAll();
  h.Step();  // nothing left: collects the outputs
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(h.result(a, i).final_output->finish_reason, FinishReason::kAborted);
  }
  EXPECT_EQ(h.result(b).final_output->finish_reason, FinishReason::kAborted);
  EXPECT_TRUE(h.stream(a).finished());
  EXPECT_FALSE(h.core().HasWork());
  EXPECT_EQ(h.core().Stats().num_unfinished_requests, 0);
}

TEST(EngineCoreTest, CreateRejectsUnusableConfigurations) {
  EngineConfig config;
  config.max_num_batched_tokens = 0;
  auto core = EngineCore::Create(std::make_unique<FakeRunner>(Runner()), config, nullptr);
  EXPECT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(core.status().message(), HasSubstr("max_num_batched_tokens"));
  EXPECT_FALSE(EngineCore::Create(nullptr, EngineConfig(), nullptr).ok());
}

}  // namespace
}  // namespace lmserve::engine::testing
