// The threaded Engine: submission from many threads, blocking and polling reads, abort, stats and
// shutdown. The engine thread runs a FakeRunner.

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/core/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/core/fake_runner.h"

namespace lmserve::engine::testing {
namespace {

using ::testing::HasSubstr;

// Every test runs twice: outputs pushed by the stepping thread, and by the emitter thread
// (EngineConfig::emit_outputs_on_thread, as the server runs it).
class EngineThreadTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Engine> MakeEngine(FakeRunnerOptions options = {}, EngineConfig config = {}) {
    if (options.num_kv_blocks == 64) options.num_kv_blocks = 128;
    config.emit_outputs_on_thread = GetParam();
    auto engine = Engine::Create(std::make_unique<FakeRunner>(options), config);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return *std::move(engine);
  }
};

INSTANTIATE_TEST_SUITE_P(Emitter, EngineThreadTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnItsThread" : "ByTheEngineThread";
                         });

std::vector<int32_t> PromptFor(int i, int length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int j = 0; j < length; ++j) prompt[static_cast<size_t>(j)] = 1 + (i * 31 + j * 7) % 63;
  return prompt;
}

Request Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request request;
  request.prompt_token_ids = std::move(prompt);
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

// Reads a stream to its end; returns the tokens and the final output.
std::vector<int32_t> ReadAll(OutputStream& stream, RequestOutput* final_output) {
  std::vector<int32_t> tokens;
  RequestOutput output;
  while (stream.Next(&output) == OutputStream::NextResult::kOutput) {
    tokens.insert(tokens.end(), output.token_ids.begin(), output.token_ids.end());
    if (output.finished) *final_output = output;
  }
  return tokens;
}

TEST_P(EngineThreadTest, SubmitAndReadToTheEnd) {
  auto engine = MakeEngine();
  const std::vector<int32_t> prompt = PromptFor(1, 9);
  auto handle = engine->Submit(Greedy(prompt, 12));
  ASSERT_TRUE(handle.ok()) << handle.status();
  RequestOutput final_output;
  EXPECT_EQ(ReadAll(*handle->stream, &final_output), FakeGreedy(prompt, 12, {}, 64));
  EXPECT_TRUE(final_output.finished);
  EXPECT_EQ(final_output.request_id, handle->id);
  EXPECT_EQ(final_output.finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(final_output.usage.prompt_tokens, 9);
  EXPECT_EQ(final_output.usage.completion_tokens, 12);
  RequestOutput after;
  EXPECT_EQ(handle->stream->Next(&after, absl::ZeroDuration()), OutputStream::NextResult::kEnded);
}

TEST_P(EngineThreadTest, InvalidRequestsFailAtSubmissionNamingTheField) {
  auto engine = MakeEngine();
  Request request = Greedy(PromptFor(1, 4), 4);
  request.sampling.top_p = 1.5;
  auto handle = engine->Submit(request);
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(handle.status().message(), HasSubstr("sampling.top_p"));
}

TEST_P(EngineThreadTest, ManyThreadsSubmitConcurrently) {
  FakeRunnerOptions options;
  options.num_kv_blocks = 40;  // tight: preemption happens
  EngineConfig config;
  config.max_num_batched_tokens = 24;
  config.max_num_seqs = 12;
  auto engine = MakeEngine(options, config);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 25;
  std::atomic<int> mismatches{0};
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int index = t * kPerThread + i;
        const std::vector<int32_t> prompt = PromptFor(index % 17, 5 + index % 23);
        const int32_t max_tokens = 1 + index % 19;
        auto handle = engine->Submit(Greedy(prompt, max_tokens));
        if (!handle.ok()) {
          ++mismatches;
          continue;
        }
        RequestOutput final_output;
        if (ReadAll(*handle->stream, &final_output) != FakeGreedy(prompt, max_tokens, {}, 64)) {
          ++mismatches;
        }
        ++completed;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(completed.load(), kThreads * kPerThread);
  // Stats are published after each step; the last step has run once every stream ended.
  EngineStats stats;
  for (int i = 0; i < 1000; ++i) {
    stats = engine->Stats();
    if (stats.num_finished_requests == kThreads * kPerThread) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(stats.num_finished_requests, kThreads * kPerThread);
  EXPECT_EQ(stats.num_running_seqs + stats.num_waiting_seqs, 0);
  EXPECT_EQ(stats.num_free_kv_blocks, 40);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0);
  EXPECT_GT(stats.num_steps, 0);
  EXPECT_GT(stats.total_step_tokens, 0);
}

TEST_P(EngineThreadTest, AbortFromAnotherThreadEndsTheStreamAndFreesBlocks) {
  FakeRunnerOptions options;
  options.on_execute = [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  auto engine = MakeEngine(options);
  auto handle = engine->Submit(Greedy(PromptFor(3, 8), 200));
  ASSERT_TRUE(handle.ok());
  RequestOutput output;
  // Wait for the first token, then abort.
  ASSERT_EQ(handle->stream->Next(&output, absl::Seconds(10)), OutputStream::NextResult::kOutput);
  std::thread aborter([&] { engine->Abort(handle->id); });
  aborter.join();
  RequestOutput final_output;
  const std::vector<int32_t> rest = ReadAll(*handle->stream, &final_output);
  EXPECT_EQ(final_output.finish_reason, FinishReason::kAborted);
  EXPECT_LT(rest.size(), 199u);
  EngineStats stats;
  for (int i = 0; i < 1000; ++i) {
    stats = engine->Stats();
    if (stats.num_free_kv_blocks == 128) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(stats.num_free_kv_blocks, 128);
  EXPECT_EQ(stats.num_unfinished_requests, 0);
}

TEST_P(EngineThreadTest, PollingWithATimeout) {
  std::atomic<bool> release{false};
  FakeRunnerOptions options;
  options.on_execute = [&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
  auto engine = MakeEngine(options);
  auto handle = engine->Submit(Greedy(PromptFor(4, 4), 2));
  ASSERT_TRUE(handle.ok());
  RequestOutput output;
  EXPECT_EQ(handle->stream->Next(&output, absl::Milliseconds(20)),
            OutputStream::NextResult::kTimeout);
  release = true;
  RequestOutput final_output;
  EXPECT_EQ(ReadAll(*handle->stream, &final_output).size(), 2u);
}

TEST_P(EngineThreadTest, ShutdownAbortsWhatIsLeftAndRefusesNewRequests) {
  FakeRunnerOptions options;
  options.on_execute = [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  auto engine = MakeEngine(options);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 5; ++i) {
    auto handle = engine->Submit(Greedy(PromptFor(i, 6), 200));
    ASSERT_TRUE(handle.ok());
    handles.push_back(*handle);
  }
  engine->Shutdown();
  // Every final output is in its stream when Shutdown returns (the emitter thread's too): the
  // server destroys its front ends' executors, which the streams' listeners post to, after it.
  for (RequestHandle& handle : handles) EXPECT_TRUE(handle.stream->finished());
  for (RequestHandle& handle : handles) {
    RequestOutput final_output;
    ReadAll(*handle.stream, &final_output);
    EXPECT_TRUE(handle.stream->finished());
    EXPECT_EQ(final_output.finish_reason, FinishReason::kAborted);
  }
  EXPECT_EQ(engine->Submit(Greedy(PromptFor(1, 4), 4)).status().code(),
            absl::StatusCode::kUnavailable);
  engine->Shutdown();  // idempotent
}

}  // namespace
}  // namespace lmserve::engine::testing
