// End-to-end: the real `lmserve serve` on a loopback port, driven by real gRPC clients. The model is
// a tiny fixture (no tokenizer: token-id prompts). A long request is n=16 choices of 500 tokens on a
// server that runs one sequence at a time: thousands of steps, so that cancellation, deadlines,
// queueing and draining happen while it runs. No assertion depends on timing.

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/strings.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {
namespace {

namespace v1 = ::lmserve::v1;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// The server flags of a "long request" server: one sequence at a time.
const std::vector<std::string> kOneAtATime = {"--max-num-seqs", "1"};

std::vector<std::string> Args(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", E2eFixtureModel(), "--kv-cache-mb", "16"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

v1::CompleteRequest IdsRequest(std::vector<int32_t> ids, int32_t max_tokens, int32_t n = 1) {
  v1::CompleteRequest request;
  request.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_n(n);
  return request;
}

// A request that runs for thousands of steps on a --max-num-seqs 1 server.
v1::CompleteRequest LongRequest() { return IdsRequest({5, 6, 7}, 500, 16); }

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

struct StreamResult {
  grpc::Status status;
  std::vector<std::vector<int32_t>> tokens;  // per choice
  std::vector<v1::FinishReason> finish;      // per choice
  std::string text;
  int messages = 0;
  v1::Usage usage;
};

StreamResult ReadStream(v1::Lmserve::Stub* stub, const v1::CompleteRequest& request,
                        double deadline_seconds = 120) {
  grpc::ClientContext context;
  SetDeadline(&context, deadline_seconds);
  auto reader = stub->CompleteStream(&context, request);
  StreamResult result;
  const int n = request.sampling().has_n() ? request.sampling().n() : 1;
  result.tokens.resize(n);
  result.finish.resize(n, v1::FINISH_REASON_UNSPECIFIED);
  v1::CompleteStreamResponse message;
  while (reader->Read(&message)) {
    ++result.messages;
    result.tokens[message.index()].insert(result.tokens[message.index()].end(),
                                          message.token_ids().begin(), message.token_ids().end());
    result.text += message.text();
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish[message.index()] = message.finish_reason();
    }
    if (message.has_usage()) result.usage = message.usage();
  }
  result.status = reader->Finish();
  return result;
}

v1::ServerStatus Status(v1::Lmserve::Stub* stub) {
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::ServerStatus status;
  EXPECT_TRUE(stub->GetServerStatus(&context, v1::GetServerStatusRequest(), &status).ok());
  return status;
}

// Polls GetServerStatus until nothing runs and no KV block is in use (up to 30 s).
bool WaitIdle(v1::Lmserve::Stub* stub, v1::ServerStatus* last) {
  for (int i = 0; i < 600; ++i) {
    *last = Status(stub);
    if (last->num_requests_running() == 0 && last->num_requests_waiting() == 0 &&
        last->kv_cache_usage() == 0 && last->kv_blocks_free() == last->kv_blocks_total() &&
        last->num_requests_in_flight() == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Starts a long stream and returns once its first message arrived (the request runs).
struct RunningStream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::CompleteStreamResponse>> reader;
  v1::CompleteStreamResponse first;
  bool Start(v1::Lmserve::Stub* stub, const v1::CompleteRequest& request) {
    SetDeadline(&context, 120);
    reader = stub->CompleteStream(&context, request);
    return reader->Read(&first);
  }
};

// A TCP connection to 127.0.0.1:`port` whose reads give up after `timeout_seconds`; -1 on failure.
int ConnectLoopback(int port, double timeout_seconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{};
  timeout.tv_sec = static_cast<time_t>(timeout_seconds);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:`port``path`: the whole response, or what came before the read timeout.
std::string HttpGet(int port, const std::string& path, double timeout_seconds) {
  const int fd = ConnectLoopback(port, timeout_seconds);
  if (fd < 0) return "(cannot connect)";
  const std::string request =
      StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "(cannot send)";
  }
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  ::close(fd);
  return response;
}

// The lmserve_grpc_server_handled_total lines of a /metrics response.
std::string RpcCountLines(const std::string& metrics) {
  std::string lines;
  std::istringstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("lmserve_grpc_server_handled_total{", 0) == 0) lines += line + "\n";
  }
  return lines;
}

TEST(ServerE2eTest, StreamedChunksConcatenateToTheUnaryResult) {
  auto server = ServerProcess::Start(Args({}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  const HfTinyReference reference = LoadHfTinyReference("llama-gqa");
  for (const std::vector<int32_t>& prompt : reference.prompts) {
    v1::CompleteRequest request = IdsRequest(prompt, 24);
    grpc::ClientContext context;
    SetDeadline(&context, 60);
    v1::CompleteResponse unary;
    ASSERT_TRUE(stub->Complete(&context, request, &unary).ok());
    ASSERT_EQ(unary.choices_size(), 1);
    const v1::Choice& choice = unary.choices(0);
    EXPECT_EQ(choice.token_ids_size(), 24);
    EXPECT_EQ(choice.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(unary.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    EXPECT_EQ(unary.usage().completion_tokens(), 24);
    EXPECT_EQ(unary.model(), "llama-gqa");
    EXPECT_THAT(unary.request_id(), HasSubstr("lmserve-"));
    EXPECT_GT(unary.timings().total_seconds(), 0);

    const StreamResult stream = ReadStream(stub.get(), request);
    ASSERT_TRUE(stream.status.ok()) << stream.status.error_message();
    EXPECT_EQ(stream.tokens[0], std::vector<int32_t>(choice.token_ids().begin(),
                                                     choice.token_ids().end()));
    EXPECT_EQ(stream.text, choice.text());
    EXPECT_EQ(stream.finish[0], v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(stream.usage.completion_tokens(), 24);
  }
  // The client's request id comes back; n choices and logprobs are delivered.
  v1::CompleteRequest request = IdsRequest({1, 2, 3}, 4, 3);
  request.set_request_id("client-42");
  request.mutable_sampling()->set_logprobs(2);
  request.mutable_sampling()->set_prompt_logprobs(1);
  grpc::ClientContext context;
  SetDeadline(&context, 60);
  v1::CompleteResponse response;
  ASSERT_TRUE(stub->Complete(&context, request, &response).ok());
  EXPECT_EQ(response.request_id(), "client-42");
  ASSERT_EQ(response.choices_size(), 3);
  for (const v1::Choice& choice : response.choices()) {
    ASSERT_EQ(choice.logprobs_size(), 4);
    EXPECT_EQ(choice.logprobs(0).top_size(), 2);
    EXPECT_EQ(choice.logprobs(0).chosen().token_id(), choice.token_ids(0));
  }
  EXPECT_EQ(response.prompt_logprobs_size(), 2);
  EXPECT_EQ(response.usage().completion_tokens(), 12);
}

TEST(ServerE2eTest, SixtyFourConcurrentStreams) {
  auto server = ServerProcess::Start(Args({"--max-num-seqs", "64"}));
  ASSERT_NE(server, nullptr);
  auto channel = server->Channel();
  constexpr int kStreams = 64;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Lmserve::NewStub(channel);
      results[i] = ReadStream(stub.get(), IdsRequest({1 + i % 7, 100 + i, 7}, 32));
    });
  }
  for (std::thread& thread : threads) thread.join();
  auto stub = v1::Lmserve::NewStub(channel);
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens[0].size(), 32u) << i;
    EXPECT_EQ(results[i].finish[0], v1::FINISH_REASON_LENGTH) << i;
  }
  // Batched greedy decoding gives what the request gives alone.
  for (int i : {0, 17, 63}) {
    const StreamResult alone = ReadStream(stub.get(), IdsRequest({1 + i % 7, 100 + i, 7}, 32));
    EXPECT_EQ(alone.tokens[0], results[i].tokens[0]) << i;
  }
  v1::ServerStatus status;
  EXPECT_TRUE(WaitIdle(stub.get(), &status)) << status.DebugString();
}

// Unary calls whose request ends at once (one token, an idle engine): their outputs may reach
// the pump before the handler thread has returned. Each must still be answered whole, and the
// server must live through them (it once filled the response's choices after the outputs could
// already arrive, and crashed now and then on the first choice).
TEST(ServerE2eTest, UnaryCallsThatEndAtOnceAreAnsweredWhole) {
  auto server = ServerProcess::Start(Args({}));
  ASSERT_NE(server, nullptr);
  auto channel = server->Channel();
  constexpr int kThreads = 2, kCallsEach = 1000;
  std::vector<int> answered(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::Lmserve::NewStub(channel);
      for (int i = 0; i < kCallsEach; ++i) {
        const int n = 1 + (t + i) % 2;
        grpc::ClientContext context;
        v1::CompleteResponse response;
        const grpc::Status status =
            stub->Complete(&context, IdsRequest({1 + t, 2 + i % 5}, 1, n), &response);
        if (!status.ok() || response.choices_size() != n) continue;
        bool whole = true;
        for (int c = 0; c < n; ++c) {
          whole = whole && response.choices(c).index() == c &&
                  response.choices(c).token_ids_size() == 1;
        }
        answered[t] += whole;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(answered[t], kCallsEach) << "thread " << t;
  EXPECT_EQ(server->Serving(), true) << server->Log();
}

TEST(ServerE2eTest, CancellingAStreamFreesItsKvCache) {
  auto server = ServerProcess::Start(Args(kOneAtATime));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  RunningStream stream;
  ASSERT_TRUE(stream.Start(stub.get(), LongRequest()));
  // The status is the engine's as of its last step: poll until it shows the request's blocks.
  v1::ServerStatus running;
  for (int i = 0; i < 500 && running.kv_cache_usage() == 0; ++i) running = Status(stub.get());
  EXPECT_GT(running.kv_cache_usage(), 0);
  // The fixture model is one group of full-attention layers: it holds every used block.
  ASSERT_EQ(running.kv_groups_size(), 1) << running.DebugString();
  EXPECT_EQ(running.kv_groups(0).window(), 0);
  EXPECT_EQ(running.kv_groups(0).used_blocks(),
            running.kv_blocks_total() - running.kv_blocks_free());
  stream.context.TryCancel();
  v1::CompleteStreamResponse message;
  int extra = 0;
  while (stream.reader->Read(&message) && extra < 100000) ++extra;
  EXPECT_EQ(stream.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  v1::ServerStatus status;
  EXPECT_TRUE(WaitIdle(stub.get(), &status)) << status.DebugString();
  // The server goes on serving.
  EXPECT_TRUE(ReadStream(stub.get(), IdsRequest({1, 2}, 4)).status.ok());
  EXPECT_THAT(server->Log(), Not(HasSubstr("CHECK failed")));
}

TEST(ServerE2eTest, AnExpiredDeadlineAbortsTheRequest) {
  auto server = ServerProcess::Start(Args({"--max-num-seqs", "1", "--metrics-port", "0"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  {
    grpc::ClientContext context;
    SetDeadline(&context, 0.3);
    v1::CompleteResponse response;
    EXPECT_EQ(stub->Complete(&context, LongRequest(), &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  const StreamResult stream = ReadStream(stub.get(), LongRequest(), 0.3);
  EXPECT_EQ(stream.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  v1::ServerStatus status;
  EXPECT_TRUE(WaitIdle(stub.get(), &status)) << status.DebugString();
  // Issue 27: the metrics count both calls as DEADLINE_EXCEEDED (they said CANCELLED).
  const std::string metrics = RpcCountLines(HttpGet(server->MetricsPort(), "/metrics", 20));
  for (const char* method : {"Complete", "CompleteStream"}) {
    EXPECT_THAT(metrics, HasSubstr(StrCat("lmserve_grpc_server_handled_total{grpc_code=\"",
                                          "DEADLINE_EXCEEDED\",grpc_method=\"", method, "\"")));
  }
  EXPECT_THAT(metrics, Not(HasSubstr("CANCELLED")));
}

TEST(ServerE2eTest, ABoundedWaitingQueue) {
  auto server = ServerProcess::Start(Args({"--max-num-seqs", "1", "--max-queued-requests", "1"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  RunningStream running;
  ASSERT_TRUE(running.Start(stub.get(), IdsRequest({5, 6, 7}, 500, 16)));
  // The engine runs one sequence and has reported so: the next request waits, the one after that
  // finds the queue full.
  for (int i = 0; i < 200 && Status(stub.get()).num_requests_running() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  grpc::ClientContext waiting_context;
  SetDeadline(&waiting_context, 120);
  auto waiting = stub->CompleteStream(&waiting_context, IdsRequest({1, 2, 3}, 4));
  // Wait until the server holds both.
  for (int i = 0; i < 200 && Status(stub.get()).num_requests_in_flight() != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const StreamResult overflow = ReadStream(stub.get(), IdsRequest({1, 2, 3}, 4));
  EXPECT_EQ(overflow.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << overflow.status.error_message();
  EXPECT_THAT(overflow.status.error_message(), HasSubstr("queue"));
  running.context.TryCancel();
  v1::CompleteStreamResponse message;
  while (running.reader->Read(&message)) {
  }
  running.reader->Finish();
  // The waiting request then runs to completion.
  int tokens = 0;
  while (waiting->Read(&message)) tokens += message.token_ids_size();
  EXPECT_TRUE(waiting->Finish().ok());
  EXPECT_EQ(tokens, 4);
}

// Issue 27: a burst no larger than --max-num-seqs finds free sequence slots, whatever the engine's
// last step reported: with no waiting queue at all, every request of the burst is admitted.
// (Before, requests not yet seen running by the engine counted as waiting, and most of a burst was
// refused.)
TEST(ServerE2eTest, ABurstWithinTheSequenceSlotsIsAdmitted) {
  constexpr int kBurst = 16;
  auto server =
      ServerProcess::Start(Args({"--max-num-seqs", StrCat(kBurst), "--max-queued-requests", "0"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  std::vector<StreamResult> results(kBurst);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kBurst; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kBurst) std::this_thread::yield();  // all start together
      results[i] = ReadStream(stub.get(), IdsRequest({1, 2, 3}, 32));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kBurst; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens[0].size(), 32u) << i;
  }
}

// Issue 27: a client that opens TCP connections to /metrics and sends nothing held civetweb's one
// worker for its 30 s request timeout, renewable forever. Now several workers serve scrapes while
// some are held, and each idle connection is closed after a short request timeout. The reads here
// give up after 20 s, less than the old timeout; nothing depends on how fast the server is.
TEST(ServerE2eTest, IdleConnectionsDoNotBlindMetrics) {
  auto server = ServerProcess::Start(Args({"--metrics-port", "0"}));
  ASSERT_NE(server, nullptr);
  const int port = server->MetricsPort();
  ASSERT_GT(port, 0);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = ConnectLoopback(port, 20);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const std::string response = HttpGet(port, "/metrics", 20);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("lmserve_num_requests_running"));
  // The server closes the idle connections (recv returns 0), rather than the read timing out (-1).
  for (int fd : idle) {
    char byte;
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);
    ::close(fd);
  }
  EXPECT_THAT(HttpGet(port, "/metrics", 20), HasSubstr("200 OK"));
}

// A unary call of `method` whose request message is `body`, bytes as they are.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                          const std::string& body) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, 30);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

// Issue 27: a body that does not parse got UNIMPLEMENTED with no message, and neither it nor an
// over-size message was counted in lmserve_grpc_server_handled_total. A message over
// --max-request-bytes is now refused and counted by the server; only one over twice the limit is
// still refused by gRPC's core before any of the server's code sees the call (not counted).
TEST(ServerE2eTest, BodiesThatDoNotParseOrAreTooLargeAreAnsweredAndCounted) {
  auto server = ServerProcess::Start(Args({"--metrics-port", "0", "--max-request-bytes", "65536"}));
  ASSERT_NE(server, nullptr);
  for (const char* method : {"Complete", "Tokenize"}) {
    const grpc::Status status =
        RawUnaryCall(server->Channel(), StrCat("/lmserve.v1.Lmserve/", method), "\xff\xff\xff\xff");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("not a valid protobuf message")) << method;
  }
  auto stub = v1::Lmserve::NewStub(server->Channel());
  v1::CompleteRequest large = IdsRequest({1, 2, 3}, 4);
  large.set_request_id(std::string(100000, 'x'));
  grpc::ClientContext context;
  SetDeadline(&context, 30);
  v1::CompleteResponse response;
  const grpc::Status too_large = stub->Complete(&context, large, &response);
  EXPECT_EQ(too_large.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << too_large.error_message();
  EXPECT_THAT(too_large.error_message(), HasSubstr("more than --max-request-bytes (65536)"));
  const grpc::Status far_too_large =
      RawUnaryCall(server->Channel(), "/lmserve.v1.Lmserve/Complete", std::string(200000, '\x08'));
  EXPECT_EQ(far_too_large.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << far_too_large.error_message();
  const std::string metrics = RpcCountLines(HttpGet(server->MetricsPort(), "/metrics", 20));
  EXPECT_THAT(metrics, HasSubstr("{grpc_code=\"INVALID_ARGUMENT\",grpc_method=\"Complete\""));
  EXPECT_THAT(metrics, HasSubstr("{grpc_code=\"INVALID_ARGUMENT\",grpc_method=\"Tokenize\""));
  // One: the refusal of the message within twice the limit.
  EXPECT_THAT(metrics, ContainsRegex("grpc_code=\"RESOURCE_EXHAUSTED\",grpc_method=\"Complete\""
                                     "[^}]*\\} 1\n"));
  // The server goes on serving.
  EXPECT_TRUE(ReadStream(stub.get(), IdsRequest({1, 2, 3}, 4)).status.ok());
}

struct BadRequest {
  std::string name;
  std::function<void(v1::CompleteRequest*)> mutate;
  grpc::StatusCode code;
  std::string message;  // a substring of the error, usually the field
};

TEST(ServerE2eTest, BadRequestsGetTheirCodes) {
  auto server = ServerProcess::Start(Args({"--max-request-bytes", "65536"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  using C = grpc::StatusCode;
  auto sampling = [](v1::CompleteRequest* r) { return r->mutable_sampling(); };
  const std::vector<BadRequest> cases = {
      {"no prompt", [](auto* r) { r->clear_prompt(); }, C::INVALID_ARGUMENT, "prompt"},
      {"empty text", [](auto* r) { r->set_text(""); }, C::INVALID_ARGUMENT, "prompt.text"},
      {"empty ids", [](auto* r) { r->mutable_token_ids()->clear_ids(); }, C::INVALID_ARGUMENT,
       "prompt.token_ids"},
      {"invalid UTF-8 text", [](auto* r) { r->set_text("ab\xC3\x28"); }, C::INVALID_ARGUMENT,
       "prompt.text: not valid UTF-8"},
      {"overlong UTF-8", [](auto* r) { r->set_text("\xC0\xAF"); }, C::INVALID_ARGUMENT,
       "prompt.text"},
      {"text without a tokenizer", [](auto* r) { r->set_text("hello"); }, C::FAILED_PRECONDITION,
       "prompt.text"},
      {"negative token id", [](auto* r) { r->mutable_token_ids()->add_ids(-1); },
       C::INVALID_ARGUMENT, "prompt.token_ids"},
      {"token id beyond the vocabulary", [](auto* r) { r->mutable_token_ids()->add_ids(1024); },
       C::INVALID_ARGUMENT, "prompt.token_ids"},
      {"prompt too long",
       [](auto* r) {
         for (int i = 0; i < 600; ++i) r->mutable_token_ids()->add_ids(i % 1000);
       },
       C::INVALID_ARGUMENT, "too long"},
      {"max_tokens 0", [&](auto* r) { sampling(r)->set_max_tokens(0); }, C::INVALID_ARGUMENT,
       "sampling.max_tokens"},
      {"max_tokens negative", [&](auto* r) { sampling(r)->set_max_tokens(-3); },
       C::INVALID_ARGUMENT, "sampling.max_tokens"},
      {"max_tokens beyond the context", [&](auto* r) { sampling(r)->set_max_tokens(100000); },
       C::INVALID_ARGUMENT, "sampling.max_tokens"},
      {"prompt + max_tokens beyond the context",
       [&](auto* r) {
         for (int i = 0; i < 300; ++i) r->mutable_token_ids()->add_ids(i);
         sampling(r)->set_max_tokens(300);
       },
       C::INVALID_ARGUMENT, "sampling.max_tokens"},
      {"negative temperature", [&](auto* r) { sampling(r)->set_temperature(-0.5f); },
       C::INVALID_ARGUMENT, "sampling.temperature"},
      {"NaN temperature", [&](auto* r) { sampling(r)->set_temperature(std::nanf("")); },
       C::INVALID_ARGUMENT, "sampling.temperature"},
      {"top_p 0", [&](auto* r) { sampling(r)->set_top_p(0); }, C::INVALID_ARGUMENT,
       "sampling.top_p"},
      {"top_p above 1", [&](auto* r) { sampling(r)->set_top_p(1.5f); }, C::INVALID_ARGUMENT,
       "sampling.top_p"},
      {"negative top_k", [&](auto* r) { sampling(r)->set_top_k(-2); }, C::INVALID_ARGUMENT,
       "sampling.top_k"},
      {"negative min_p", [&](auto* r) { sampling(r)->set_min_p(-0.1f); }, C::INVALID_ARGUMENT,
       "sampling.min_p"},
      {"min_p above 1", [&](auto* r) { sampling(r)->set_min_p(1.1f); }, C::INVALID_ARGUMENT,
       "sampling.min_p"},
      {"repetition_penalty 0", [&](auto* r) { sampling(r)->set_repetition_penalty(0); },
       C::INVALID_ARGUMENT, "sampling.repetition_penalty"},
      {"repetition_penalty 3", [&](auto* r) { sampling(r)->set_repetition_penalty(3); },
       C::INVALID_ARGUMENT, "sampling.repetition_penalty"},
      {"presence_penalty 2.5", [&](auto* r) { sampling(r)->set_presence_penalty(2.5f); },
       C::INVALID_ARGUMENT, "sampling.presence_penalty"},
      {"frequency_penalty -3", [&](auto* r) { sampling(r)->set_frequency_penalty(-3); },
       C::INVALID_ARGUMENT, "sampling.frequency_penalty"},
      {"logit_bias beyond the vocabulary",
       [&](auto* r) { (*sampling(r)->mutable_logit_bias())[5000] = 1; }, C::INVALID_ARGUMENT,
       "sampling.logit_bias"},
      {"logit_bias 200", [&](auto* r) { (*sampling(r)->mutable_logit_bias())[5] = 200; },
       C::INVALID_ARGUMENT, "sampling.logit_bias"},
      {"n 0", [&](auto* r) { sampling(r)->set_n(0); }, C::INVALID_ARGUMENT, "sampling.n"},
      {"n too large", [&](auto* r) { sampling(r)->set_n(17); }, C::INVALID_ARGUMENT,
       "sampling.n"},
      {"too many stop strings",
       [&](auto* r) {
         for (int i = 0; i < 17; ++i) sampling(r)->add_stop(StrCat("stop", i));
       },
       C::INVALID_ARGUMENT, "sampling.stop"},
      {"empty stop string", [&](auto* r) { sampling(r)->add_stop(""); }, C::INVALID_ARGUMENT,
       "sampling.stop"},
      {"invalid UTF-8 stop string", [&](auto* r) { sampling(r)->add_stop("\xFF"); },
       C::INVALID_ARGUMENT, "sampling.stop"},
      {"stop strings without a tokenizer", [&](auto* r) { sampling(r)->add_stop("."); },
       C::FAILED_PRECONDITION, "sampling.stop"},
      {"stop token id beyond the vocabulary", [&](auto* r) { sampling(r)->add_stop_token_ids(9999); },
       C::INVALID_ARGUMENT, "sampling.stop_token_ids"},
      {"logprobs 21", [&](auto* r) { sampling(r)->set_logprobs(21); }, C::INVALID_ARGUMENT,
       "sampling.logprobs"},
      {"negative prompt_logprobs", [&](auto* r) { sampling(r)->set_prompt_logprobs(-1); },
       C::INVALID_ARGUMENT, "sampling.prompt_logprobs"},
      {"negative min_tokens", [&](auto* r) { sampling(r)->set_min_tokens(-1); },
       C::INVALID_ARGUMENT, "sampling.min_tokens"},
      {"min_tokens above max_tokens", [&](auto* r) { sampling(r)->set_min_tokens(100); },
       C::INVALID_ARGUMENT, "sampling.min_tokens"},
      {"request_id too long", [](auto* r) { r->set_request_id(std::string(200, 'x')); },
       C::INVALID_ARGUMENT, "request_id"},
      {"message over --max-request-bytes",
       [](auto* r) {
         for (int i = 0; i < 40000; ++i) r->mutable_token_ids()->add_ids(1000);
       },
       C::RESOURCE_EXHAUSTED, ""},
  };
  ASSERT_GE(cases.size(), 25u);
  for (const BadRequest& bad : cases) {
    v1::CompleteRequest request = IdsRequest({1, 2, 3}, 8);
    bad.mutate(&request);
    for (bool streaming : {false, true}) {
      grpc::ClientContext context;
      SetDeadline(&context, 30);
      grpc::Status status;
      if (streaming) {
        status = ReadStream(stub.get(), request).status;
      } else {
        v1::CompleteResponse response;
        status = stub->Complete(&context, request, &response);
      }
      EXPECT_EQ(status.error_code(), bad.code)
          << bad.name << (streaming ? " (stream)" : "") << ": " << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(bad.message)) << bad.name;
    }
  }
  // The other methods' bad input.
  {
    grpc::ClientContext context;
    v1::ChatRequest request;
    v1::CompleteResponse response;
    EXPECT_EQ(stub->Chat(&context, request, &response).error_code(), C::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext context;
    v1::ChatRequest request;
    request.add_messages()->set_content("hi");
    v1::CompleteResponse response;
    const grpc::Status status = stub->Chat(&context, request, &response);
    EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("messages[0].role"));
  }
  {
    grpc::ClientContext context;
    v1::ChatRequest request;
    v1::ChatMessage* message = request.add_messages();
    message->set_role("user");
    message->set_content("\xE2\x82");
    v1::CompleteResponse response;
    const grpc::Status status = stub->Chat(&context, request, &response);
    EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("messages[0].content"));
  }
  {
    grpc::ClientContext context;
    v1::ChatRequest request;
    v1::ChatMessage* message = request.add_messages();
    message->set_role("user");
    message->set_content("hello");
    v1::CompleteResponse response;
    EXPECT_EQ(stub->Chat(&context, request, &response).error_code(), C::FAILED_PRECONDITION);
  }
  {
    // A reserved template variable is the request's error, found before the (missing) template.
    grpc::ClientContext context;
    v1::ChatRequest request;
    v1::ChatMessage* message = request.add_messages();
    message->set_role("user");
    message->set_content("hello");
    (*request.mutable_chat_template_kwargs()->mutable_fields())["messages"].set_bool_value(true);
    v1::CompleteResponse response;
    const grpc::Status status = stub->Chat(&context, request, &response);
    EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("chat_template_kwargs.messages"));
  }
  {
    grpc::ClientContext context;
    v1::TokenizeRequest request;
    request.set_text("\xFF");
    v1::TokenizeResponse response;
    EXPECT_EQ(stub->Tokenize(&context, request, &response).error_code(), C::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext context;
    v1::DetokenizeRequest request;
    request.add_token_ids(1024);
    v1::DetokenizeResponse response;
    const grpc::Status status = stub->Detokenize(&context, request, &response);
    EXPECT_EQ(status.error_code(), C::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("token_ids"));
  }
  // None of it disturbed the server.
  EXPECT_TRUE(ReadStream(stub.get(), IdsRequest({1, 2, 3}, 4)).status.ok());
  EXPECT_EQ(server->Serving(), true);
}

// The model directory's config.json is a FIFO: loading blocks until the test writes it, so the
// server's state before the model is loaded can be observed without racing.
TEST(ServerE2eTest, HealthTransitionsFromLoadToDrain) {
  const std::string dir = StrCat(TempDir(), "/fifo-model");
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(StrCat(E2eFixtureModel(), "/model.safetensors"),
                                  StrCat(dir, "/model.safetensors"));
  ASSERT_EQ(::mkfifo(StrCat(dir, "/config.json").c_str(), 0644), 0);
  auto server = ServerProcess::Start(
      {"--model", dir, "--kv-cache-mb", "16", "--max-num-seqs", "1", "--grace-period-s", "60"},
      /*wait_serving=*/false);
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  EXPECT_EQ(server->Serving(), false);
  {
    grpc::ClientContext context;
    v1::CompleteResponse response;
    const grpc::Status status = stub->Complete(&context, IdsRequest({1, 2}, 2), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(status.error_message(), HasSubstr("loading"));
  }
  EXPECT_FALSE(Status(stub.get()).ready());
  // Watch sees the change to SERVING.
  grpc::ClientContext watch_context;
  SetDeadline(&watch_context, 120);
  auto health_stub = grpc::health::v1::Health::NewStub(server->Channel());
  auto watch = health_stub->Watch(&watch_context, grpc::health::v1::HealthCheckRequest());
  grpc::health::v1::HealthCheckResponse watched;
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  {
    std::ifstream config(StrCat(E2eFixtureModel(), "/config.json"));
    std::stringstream text;
    text << config.rdbuf();
    std::ofstream fifo(StrCat(dir, "/config.json"));
    fifo << text.str();
  }
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(server->Serving(), true);
  EXPECT_TRUE(Status(stub.get()).ready());
  // Unknown services are NOT_FOUND, as the health protocol says.
  {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("no.such.Service");
    grpc::health::v1::HealthCheckResponse response;
    EXPECT_EQ(health_stub->Check(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Draining: NOT_SERVING while a request is still in flight.
  RunningStream running;
  ASSERT_TRUE(running.Start(stub.get(), LongRequest()));
  server->Signal(SIGTERM);
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(Status(stub.get()).draining());
  running.context.TryCancel();
  v1::CompleteStreamResponse message;
  while (running.reader->Read(&message)) {
  }
  running.reader->Finish();
  EXPECT_EQ(server->WaitExit(60), 0) << server->Log();
}

TEST(ServerE2eTest, SigtermDrainsInFlightStreamsAndRefusesNewCalls) {
  auto server = ServerProcess::Start(Args({"--max-num-seqs", "32", "--grace-period-s", "300"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  // Two long requests (16 choices of 500 tokens, with logprobs), side by side: the drain lasts
  // seconds; the checks below take milliseconds.
  constexpr int kStreams = 2;
  std::vector<std::unique_ptr<RunningStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    v1::CompleteRequest request = IdsRequest({5, 6, 7 + i}, 500, 16);
    request.mutable_sampling()->set_logprobs(20);
    streams.push_back(std::make_unique<RunningStream>());
    ASSERT_TRUE(streams.back()->Start(stub.get(), request));
  }
  server->Signal(SIGTERM);
  // Once the signal is handled (health says NOT_SERVING), new calls are refused while both
  // streams are still in flight.
  ASSERT_TRUE(server->WaitHealth(false, 30));
  {
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::CompleteResponse response;
    const grpc::Status refused = stub->Complete(&context, IdsRequest({1, 2}, 2), &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(refused.error_message(), HasSubstr("shutting down")) << server->Log();
  }
  const v1::ServerStatus draining = Status(stub.get());
  EXPECT_TRUE(draining.draining());
  EXPECT_EQ(draining.num_requests_in_flight(), kStreams);
  // The in-flight streams run to the end.
  for (int i = 0; i < kStreams; ++i) {
    int tokens = streams[i]->first.token_ids_size();
    int logprobs = streams[i]->first.logprobs_size();
    v1::CompleteStreamResponse message;
    while (streams[i]->reader->Read(&message)) {
      tokens += message.token_ids_size();
      logprobs += message.logprobs_size();
    }
    const grpc::Status status = streams[i]->reader->Finish();
    EXPECT_TRUE(status.ok()) << i << ": " << status.error_message();
    EXPECT_EQ(tokens, 8000) << i;
    EXPECT_EQ(logprobs, 8000) << i;
  }
  EXPECT_EQ(server->WaitExit(60), 0) << server->Log();
}

TEST(ServerE2eTest, TheGracePeriodEndsWithAbortedRequests) {
  auto server = ServerProcess::Start(Args({"--max-num-seqs", "1", "--grace-period-s", "0.2"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  RunningStream running;
  ASSERT_TRUE(running.Start(stub.get(), LongRequest()));
  server->Signal(SIGTERM);
  v1::CompleteStreamResponse message;
  int aborted_choices = 0;
  while (running.reader->Read(&message)) {
    if (message.finish_reason() == v1::FINISH_REASON_ABORT) ++aborted_choices;
  }
  const grpc::Status status = running.reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("grace period"));
  EXPECT_GT(aborted_choices, 0);
  EXPECT_EQ(server->WaitExit(60), 0) << server->Log();
}

TEST(ServerE2eTest, BearerTokenAuth) {
  const std::string token_file = StrCat(TempDir(), "/token");
  std::ofstream(token_file) << "s3cret-token\n";
  auto server = ServerProcess::Start(Args({"--auth-token-file", token_file}));
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Log(), Not(HasSubstr("s3cret-token")));
  auto stub = v1::Lmserve::NewStub(server->Channel());
  for (const std::string& header : {std::string(), std::string("Bearer wrong"),
                                    std::string("s3cret-token"), std::string("Bearer s3cret")}) {
    grpc::ClientContext context;
    if (!header.empty()) context.AddMetadata("authorization", header);
    v1::CompleteResponse response;
    EXPECT_EQ(stub->Complete(&context, IdsRequest({1, 2}, 2), &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << header;
  }
  {
    grpc::ClientContext context;
    v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // Issue 27: two authorization entries are refused, whichever comes first.
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret-token");
    context.AddMetadata("authorization", "Bearer wrong");
    v1::CompleteResponse response;
    const grpc::Status status = stub->Complete(&context, IdsRequest({1, 2}, 2), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("more than one"));
  }
  // The scheme is case-insensitive (issue 27: "bearer" was refused).
  for (const std::string& header :
       {std::string("Bearer s3cret-token"), std::string("bearer s3cret-token"),
        std::string("BEARER  s3cret-token")}) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", header);
    v1::CompleteResponse response;
    const grpc::Status status = stub->Complete(&context, IdsRequest({1, 2}, 2), &response);
    EXPECT_TRUE(status.ok()) << header << ": " << status.error_message();
  }
  EXPECT_EQ(server->Serving(), true);  // health stays open
}

// GetModelInfo and the start-up log report the element type the runner really holds.
TEST(ServerE2eTest, ModelInfoReportsTheServedDtype) {
  auto server = ServerProcess::Start(Args({"--backend", "cpu", "--dtype", "float32"}));
  ASSERT_NE(server, nullptr);
  auto stub = v1::Lmserve::NewStub(server->Channel());
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.dtype(), "float32");
  EXPECT_EQ(info.backend(), "cpu");
  EXPECT_THAT(server->Log(), HasSubstr("dtype: float32"));
  EXPECT_THAT(server->Log(), HasSubstr("runner: cpu in float32"));
}

// Runs a shell command; returns its exit code and stdout.
std::pair<int, std::string> Shell(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, out};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A loopback port that was free a moment ago.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

TEST(ServerE2eTest, TlsWithAndWithoutClientCertificates) {
  const std::string dir = StrCat(TempDir(), "/tls");
  std::filesystem::create_directories(dir);
  // A throwaway CA, a server certificate for 127.0.0.1 and a client certificate.
  const std::string script = StrCat(
      "set -e; cd ", dir, "; ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key "
      "-out ca.pem 2>/dev/null; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr "
      "2>/dev/null; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile server.ext -out server.pem 2>/dev/null; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out client.csr "
      "2>/dev/null; ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "-out client.pem 2>/dev/null");
  ASSERT_EQ(Shell(script).first, 0);
  auto read = [&](const std::string& name) {
    std::ifstream file(StrCat(dir, "/", name));
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  };
  auto call = [](std::shared_ptr<grpc::Channel> channel) {
    auto stub = v1::Lmserve::NewStub(channel);
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::ModelInfo info;
    return stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  };
  grpc::SslCredentialsOptions trusting;
  trusting.pem_root_certs = read("ca.pem");
  grpc::SslCredentialsOptions with_client_cert = trusting;
  with_client_cert.pem_cert_chain = read("client.pem");
  with_client_cert.pem_private_key = read("client.key");
  // The HTTP API serves TLS from the same flags (curl: the HTTP status, or 000 when refused).
  auto http_status = [&](int port, const std::string& curl_flags) {
    return Shell(StrCat("curl -sS -o /dev/null -w '%{http_code}' --max-time 20 ", curl_flags,
                        " https://127.0.0.1:", port, "/health 2>/dev/null"))
        .second;
  };
  {
    const int http_port = FreePort();
    auto server = ServerProcess::Start(Args({"--tls-cert", StrCat(dir, "/server.pem"),
                                             "--tls-key", StrCat(dir, "/server.key"),
                                             "--http-port", StrCat(http_port)}),
                                       /*wait_serving=*/false);
    ASSERT_NE(server, nullptr);
    auto channel = grpc::CreateChannel(server->address(), grpc::SslCredentials(trusting));
    grpc::Status status;  // the last call's
    const absl::Status served = server->WaitFor(
        "an answer over TLS", [&] { return (status = call(channel)).ok(); }, 120);
    EXPECT_TRUE(served.ok()) << status.error_message() << "\n" << served.message();
    EXPECT_FALSE(call(server->Channel()).ok());  // plaintext is refused
    EXPECT_EQ(http_status(http_port, StrCat("--cacert ", dir, "/ca.pem")), "200");
    EXPECT_EQ(http_status(http_port, ""), "000");  // the CA is unknown to curl
    // Plaintext gets no answer: the server expects a TLS handshake.
    EXPECT_EQ(Shell(StrCat("curl -sS --max-time 20 http://127.0.0.1:", http_port,
                           "/health 2>/dev/null"))
                  .second,
              "");
  }
  {
    const int http_port = FreePort();
    auto server = ServerProcess::Start(
        Args({"--tls-cert", StrCat(dir, "/server.pem"), "--tls-key", StrCat(dir, "/server.key"),
              "--tls-client-ca", StrCat(dir, "/ca.pem"), "--http-port", StrCat(http_port)}),
        /*wait_serving=*/false);
    ASSERT_NE(server, nullptr);
    auto channel = grpc::CreateChannel(server->address(), grpc::SslCredentials(with_client_cert));
    grpc::Status status;
    const absl::Status served = server->WaitFor(
        "an answer over TLS with a client certificate",
        [&] { return (status = call(channel)).ok(); }, 120);
    EXPECT_TRUE(served.ok()) << status.error_message() << "\n" << served.message();
    EXPECT_FALSE(
        call(grpc::CreateChannel(server->address(), grpc::SslCredentials(trusting))).ok());
    EXPECT_EQ(http_status(http_port, StrCat("--cacert ", dir, "/ca.pem --cert ", dir,
                                            "/client.pem --key ", dir, "/client.key")),
              "200");
    EXPECT_EQ(http_status(http_port, StrCat("--cacert ", dir, "/ca.pem")), "000");
    // lmserve-cli speaks TLS with a client certificate too.
    const auto [code, out] = Shell(StrCat(
        LMSERVE_BINARY_DIR, "/bin/lmserve-cli complete --addr ", server->address(),
        " --tls-ca ", dir, "/ca.pem --tls-cert ", dir, "/client.pem --tls-key ", dir,
        "/client.key --ids 1,2,3 --max-tokens 3 --temperature 0 --json"));
    EXPECT_EQ(code, 0) << out;
    EXPECT_THAT(out, HasSubstr("FINISH_REASON_LENGTH"));
  }
  // Issue 27: a key that is not the certificate's was reported as "--port: cannot listen".
  const std::vector<std::tuple<std::string, std::string, std::string>> mistakes = {
      {"server.pem", "client.key", "--tls-key: the private key does not match"},
      {"server.key", "server.key", "--tls-cert: no PEM certificate"},
      {"server.pem", "server.pem", "--tls-key: no unencrypted PEM private key"}};
  for (const auto& [cert, key, error] : mistakes) {
    const auto [code, out] = Shell(StrCat(LMSERVE_BINARY_DIR, "/bin/lmserve serve --model ",
                                          E2eFixtureModel(), " --port 0 --tls-cert ", dir, "/",
                                          cert, " --tls-key ", dir, "/", key, " 2>&1"));
    EXPECT_EQ(code, 1) << out;
    EXPECT_THAT(out, HasSubstr(error));
    EXPECT_THAT(out, Not(HasSubstr("cannot listen")));
  }
}

TEST(ServerE2eTest, CliStreamsAndReportsErrors) {
  auto server = ServerProcess::Start(Args({}));
  ASSERT_NE(server, nullptr);
  const std::string cli = StrCat(LMSERVE_BINARY_DIR, "/bin/lmserve-cli");
  const auto [code, out] = Shell(StrCat(cli, " complete --addr ", server->address(),
                                        " --ids 1,2,3 --max-tokens 5 --temperature 0 --json"));
  EXPECT_EQ(code, 0);
  int tokens = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    for (size_t at = line.find("\"token_ids\":["); at != std::string::npos;) {
      const size_t end = line.find(']', at);
      const std::string ids = line.substr(at + 13, end - at - 13);
      tokens += ids.empty() ? 0 : 1 + static_cast<int>(std::count(ids.begin(), ids.end(), ','));
      at = line.find("\"token_ids\":[", end);
    }
  }
  EXPECT_EQ(tokens, 5) << out;
  EXPECT_EQ(Shell(StrCat(cli, " health --addr ", server->address())).first, 0);
  const auto [bad_code, bad_out] =
      Shell(StrCat(cli, " complete --addr ", server->address(), " --ids 1,2 --max-tokens 0 2>&1"));
  EXPECT_EQ(bad_code, 1);
  EXPECT_THAT(bad_out, HasSubstr("INVALID_ARGUMENT: sampling.max_tokens"));
  // chat_template_kwargs: a JSON object, checked by the server (this model has no chat template,
  // but a reserved name is refused first).
  const auto [kwargs_code, kwargs_out] =
      Shell(StrCat(cli, " chat --addr ", server->address(),
                   " --chat-template-kwargs '{\"bos_token\": \"x\"}' hi 2>&1"));
  EXPECT_EQ(kwargs_code, 1);
  EXPECT_THAT(kwargs_out, HasSubstr("INVALID_ARGUMENT: chat_template_kwargs.bos_token"));
  const auto [usage_code, usage_out] = Shell(
      StrCat(cli, " chat --addr ", server->address(), " --chat-template-kwargs '[1]' hi 2>&1"));
  EXPECT_EQ(usage_code, 2);
  EXPECT_THAT(usage_out, HasSubstr("--chat-template-kwargs: not a JSON object"));
}

}  // namespace
}  // namespace lmserve::testing
