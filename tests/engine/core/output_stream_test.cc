#include "engine/core/output_stream.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

RequestOutput Output(int32_t sample_index, int32_t token, bool finished) {
  RequestOutput output;
  output.sample_index = sample_index;
  output.token_ids = {token};
  output.finished = finished;
  return output;
}

TEST(OutputStreamTest, EndsAfterEverySampleFinishedAndEveryOutputWasRead) {
  OutputStream stream(7, /*num_samples=*/2);
  EXPECT_EQ(stream.request_id(), 7u);
  RequestOutput out;
  EXPECT_EQ(stream.Next(&out, absl::ZeroDuration()), OutputStream::NextResult::kTimeout);
  stream.Push(Output(0, 10, false));
  stream.Push(Output(1, 20, true));
  EXPECT_FALSE(stream.finished());
  stream.Push(Output(0, 11, true));
  EXPECT_TRUE(stream.finished());
  ASSERT_EQ(stream.Next(&out, absl::ZeroDuration()), OutputStream::NextResult::kOutput);
  EXPECT_EQ(out.token_ids[0], 10);
  const std::vector<RequestOutput> rest = stream.TakeAvailable();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[1].token_ids[0], 11);
  EXPECT_EQ(stream.Next(&out), OutputStream::NextResult::kEnded);  // does not block
}

TEST(OutputStreamTest, NextBlocksUntilAnotherThreadPushes) {
  OutputStream stream(1, 1);
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stream.Push(Output(0, 5, true));
  });
  RequestOutput out;
  EXPECT_EQ(stream.Next(&out, absl::Seconds(30)), OutputStream::NextResult::kOutput);
  EXPECT_EQ(out.token_ids[0], 5);
  producer.join();
  EXPECT_EQ(stream.Next(&out), OutputStream::NextResult::kEnded);
}

TEST(OutputStreamTest, ListenerRunsAfterEachPushAndAtOnceWhenOutputsWait) {
  OutputStream stream(1, 1);
  stream.Push(Output(0, 1, false));
  std::atomic<int> calls{0};
  stream.SetListener([&] { ++calls; });
  EXPECT_EQ(calls.load(), 1);  // an output was already waiting
  stream.Push(Output(0, 2, false));
  stream.Push(Output(0, 3, true));
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(stream.TakeAvailable().size(), 3u);
  OutputStream empty(2, 1);
  empty.SetListener([&] { ++calls; });
  EXPECT_EQ(calls.load(), 3);  // nothing waiting: not called
}

TEST(OutputEmitterTest, PushesOnItsOwnThreadKeepingEachStreamsOrderAndEverythingAtTheEnd) {
  constexpr int kStreams = 7;
  constexpr int kOutputs = 100;  // a stream's; batches of OutputEmitter::kBatch cut through them
  std::vector<std::shared_ptr<OutputStream>> streams;
  std::atomic<int> pushes_here{0};
  const std::thread::id here = std::this_thread::get_id();
  for (int s = 0; s < kStreams; ++s) {
    streams.push_back(std::make_shared<OutputStream>(s, 1));
    streams.back()->SetListener([&] {
      if (std::this_thread::get_id() == here) ++pushes_here;
    });
  }
  {
    OutputEmitter emitter;
    for (int i = 0; i < kOutputs; ++i) {
      for (int s = 0; s < kStreams; ++s) {
        // Interleaved over the streams, a few of them ahead of the others.
        emitter.Add(streams[static_cast<size_t>(s)], Output(0, i, i == kOutputs - 1));
      }
      if (i == 40) emitter.Flush();
    }
    // Everything still queued on this side is pushed before the emitter is gone.
  }
  EXPECT_EQ(pushes_here.load(), 0);
  for (int s = 0; s < kStreams; ++s) {
    OutputStream& stream = *streams[static_cast<size_t>(s)];
    EXPECT_TRUE(stream.finished());
    const std::vector<RequestOutput> outputs = stream.TakeAvailable();
    ASSERT_EQ(outputs.size(), static_cast<size_t>(kOutputs)) << "stream " << s;
    for (int i = 0; i < kOutputs; ++i) {
      EXPECT_EQ(outputs[static_cast<size_t>(i)].token_ids[0], i) << "stream " << s;
    }
  }
}

TEST(OutputEmitterTest, AFlushedOutputArrivesWhileTheEmitterLives) {
  auto stream = std::make_shared<OutputStream>(1, 1);
  OutputEmitter emitter;
  emitter.Add(stream, Output(0, 3, false));
  emitter.Flush();
  RequestOutput out;
  ASSERT_EQ(stream->Next(&out, absl::Seconds(30)), OutputStream::NextResult::kOutput);
  EXPECT_EQ(out.token_ids[0], 3);
  emitter.Add(stream, Output(0, 4, true));
  emitter.Flush();
  ASSERT_EQ(stream->Next(&out, absl::Seconds(30)), OutputStream::NextResult::kOutput);
  EXPECT_EQ(stream->Next(&out, absl::Seconds(30)), OutputStream::NextResult::kEnded);
}

}  // namespace
}  // namespace lmserve::engine
