// End-to-end: a state-space model (tests/fixtures/hf-families/mamba2-ssm, Mamba-2) through the
// real `lmserve serve`: streams of the fixture's prompts (token ids) run concurrently with streams
// that are cancelled while they run, on a server of 3 sequence slots, so that admission waits for
// state slots, and cancellation and completion free them. Completed streams give the reference's
// greedy tokens (every reference margin is above 25); once idle, GetServerStatus shows no state
// slot in use. No assertion depends on timing.

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {
namespace {

namespace v1 = ::lmserve::v1;

constexpr int kSlots = 3;

v1::CompleteRequest Request(const std::vector<int32_t>& ids, int32_t max_tokens) {
  v1::CompleteRequest request;
  request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

v1::ServerStatus Status(v1::Lmserve::Stub* stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerStatus status;
  EXPECT_TRUE(stub->GetServerStatus(&context, v1::GetServerStatusRequest(), &status).ok());
  return status;
}

TEST(StateSlotsE2eTest, StreamsAndAbortsReturnEveryStateSlot) {
  const std::string dir = HfFamilyDir("mamba2-ssm");
  const HfTinyReference ref = LoadReference(dir);
  ASSERT_EQ(ref.prompts.size(), 4u);
  auto server = ServerProcess::Start({"--model", dir, "--max-num-seqs", std::to_string(kSlots),
                                      "--max-queued-requests", "64", "--kv-cache-mb", "16"});
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  {
    const v1::ServerStatus idle = Status(stub.get());
    EXPECT_EQ(idle.state_slots_total(), kSlots) << idle.DebugString();
    EXPECT_EQ(idle.state_slots_used(), 0) << idle.DebugString();
  }

  // 8 completed streams (each prompt twice) and 8 cancelled ones, all at once.
  constexpr int kThreads = 16;
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> completed(kThreads);
  std::vector<grpc::StatusCode> codes(kThreads, grpc::StatusCode::UNKNOWN);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<int32_t>& prompt = ref.prompts[static_cast<size_t>(t % 4)];
      const bool cancel = t >= kThreads / 2;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(240));
      auto reader = stub->CompleteStream(&context, Request(prompt, cancel ? 600 : 24));
      v1::CompleteStreamResponse message;
      int messages = 0;
      while (reader->Read(&message)) {
        completed[static_cast<size_t>(t)].insert(completed[static_cast<size_t>(t)].end(),
                                                 message.token_ids().begin(),
                                                 message.token_ids().end());
        if (cancel && ++messages == 3) context.TryCancel();
      }
      codes[static_cast<size_t>(t)] = reader->Finish().error_code();
    });
  }
  // While streams run, the slots in use never exceed the pool.
  for (int i = 0; i < 50; ++i) {
    const v1::ServerStatus status = Status(stub.get());
    EXPECT_LE(status.state_slots_used(), kSlots) << status.DebugString();
    EXPECT_LE(status.num_requests_running(), kSlots) << status.DebugString();
  }
  for (std::thread& thread : threads) thread.join();

  for (int t = 0; t < kThreads; ++t) {
    if (t < kThreads / 2) {
      EXPECT_EQ(codes[static_cast<size_t>(t)], grpc::StatusCode::OK) << "stream " << t;
      EXPECT_EQ(completed[static_cast<size_t>(t)], ref.greedy[static_cast<size_t>(t % 4)])
          << "stream " << t;
    } else {
      EXPECT_EQ(codes[static_cast<size_t>(t)], grpc::StatusCode::CANCELLED) << "stream " << t;
    }
  }
  // The engine's figures are as of its last step: poll until it is idle (up to 30 s).
  v1::ServerStatus last;
  bool idle = false;
  for (int i = 0; i < 600 && !idle; ++i) {
    last = Status(stub.get());
    idle = last.num_requests_running() == 0 && last.num_requests_waiting() == 0 &&
           last.num_requests_in_flight() == 0 && last.state_slots_used() == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(idle) << last.DebugString();
  EXPECT_EQ(last.state_slots_used(), 0) << last.DebugString();
  EXPECT_EQ(last.state_slots_total(), kSlots);
  EXPECT_EQ(last.kv_blocks_free(), last.kv_blocks_total()) << last.DebugString();
  EXPECT_EQ(server->Log().find("CHECK failed"), std::string::npos) << server->Log();
}

}  // namespace
}  // namespace lmserve::testing
