// The HTTP transport (server/http_server.h) with routers written here, over real loopback sockets:
// a reader that stops reading gets backpressure (the producer is held at the bound, not buffered
// without end), a client that goes away is noticed while its response is in progress, keep-alive
// serves several requests on one connection, and the server answers 503 from /health before a
// model is served (LmserveServer::Start without Serve). Waits have deadlines; nothing is timed.

#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
}

// Reads until `marker` has arrived (or the peer closes); returns what arrived.
std::string ReadUntil(int fd, const std::string& marker) {
  std::string received;
  char buffer[4096];
  while (received.find(marker) == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    received.append(buffer, static_cast<size_t>(n));
  }
  return received;
}

template <typename Predicate>
bool WaitFor(Predicate predicate) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// Streams events for as long as the connection has room, up to a total.
struct Producer {
  std::atomic<int64_t> produced_bytes{0};
  std::atomic<bool> blocked{false};
  std::atomic<bool> gone{false};
  std::atomic<bool> destroyed{false};
  int64_t total_bytes = int64_t{1} << 30;
};

class ProducingExchange final : public HttpExchange {
 public:
  ProducingExchange(Producer* producer, HttpResponder* responder)
      : producer_(producer), responder_(responder) {
    responder_->StartEvents();
    OnRoom();
  }
  ~ProducingExchange() override { producer_->destroyed.store(true); }
  void OnRoom() override {
    const std::string event = "data: " + std::string(8000, 'x') + "\n\n";
    while (responder_->HasRoom() && producer_->produced_bytes.load() < producer_->total_bytes) {
      responder_->SendEvents(event);
      producer_->produced_bytes += static_cast<int64_t>(event.size());
    }
    if (producer_->produced_bytes.load() >= producer_->total_bytes) {
      responder_->EndEvents();
      return;
    }
    producer_->blocked.store(true);
  }
  void OnClientGone() override { producer_->gone.store(true); }

 private:
  Producer* const producer_;
  HttpResponder* const responder_;
};

TEST(HttpServerTest, SlowReaderGetsBackpressureAndADisconnectIsNoticed) {
  Producer producer;
  HttpServerOptions options;
  options.max_buffered_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(options, [&](HttpRequest request, HttpResponder* responder) {
        return std::make_unique<ProducingExchange>(&producer, responder);
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  const int small_buffer = 16 << 10;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small_buffer, sizeof(small_buffer));
  SendAll(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  // The client reads nothing: the producer must come to a stop with the kernel's socket buffers
  // and the connection's bound filled, far below the 1 GiB it would otherwise write.
  ASSERT_TRUE(WaitFor([&] { return producer.blocked.load(); }));
  int64_t before = -1;
  ASSERT_TRUE(WaitFor([&] {
    const int64_t now = producer.produced_bytes.load();
    const bool settled = now == before;
    before = now;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return settled && now == producer.produced_bytes.load();
  }));
  EXPECT_LT(producer.produced_bytes.load(), int64_t{32} << 20);
  EXPECT_FALSE(producer.gone.load());
  // Reading resumes the producer.
  const int64_t stalled_at = producer.produced_bytes.load();
  char buffer[65536];
  for (int i = 0; i < 64; ++i) {
    if (::recv(fd, buffer, sizeof(buffer), 0) <= 0) break;
  }
  ASSERT_TRUE(WaitFor([&] { return producer.produced_bytes.load() > stalled_at; }));
  // The client goes away mid-response: the exchange hears of it and is destroyed.
  ::close(fd);
  ASSERT_TRUE(WaitFor([&] { return producer.gone.load() && producer.destroyed.load(); }));
  ASSERT_TRUE(WaitFor([&] { return (*server)->num_connections() == 0; }));
  (*server)->Stop();
}

TEST(HttpServerTest, KeepAliveAndTransportErrors) {
  std::atomic<int> requests{0};
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(HttpServerOptions(), [&](HttpRequest request, HttpResponder* responder) {
        if (request.transport_error_status != 0) {
          responder->Respond(request.transport_error_status, "text/plain",
                             request.transport_error_message);
          return std::unique_ptr<HttpExchange>();
        }
        ++requests;
        responder->Respond(200, "text/plain",
                           request.method + " " + request.target + " " + request.body);
        return std::unique_ptr<HttpExchange>();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  for (int i = 0; i < 3; ++i) {
    SendAll(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
    const std::string answer = ReadUntil(fd, "POST /echo hi");
    EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200 OK"));
  }
  // Two pipelined requests are answered in order.
  SendAll(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string both = ReadUntil(fd, "GET /b");
  EXPECT_LT(both.find("GET /a"), both.find("GET /b"));
  EXPECT_EQ(requests.load(), 5);
  // Garbage gets 400 and the connection closes.
  SendAll(fd, "NOT HTTP AT ALL\r\n\r\n");
  const std::string bad = ReadUntil(fd, "\r\n\r\n__never__");
  EXPECT_THAT(bad, HasSubstr("HTTP/1.1 400"));
  EXPECT_THAT(bad, HasSubstr("Connection: close"));
  ::close(fd);
  (*server)->Stop();
}

TEST(HttpServerTest, ALateAnswerArrivesAfterConnectionClose) {
  // The exchange answers later, from another thread through the connection's poster, to a
  // request that said "Connection: close" (so no read is pending meanwhile).
  std::vector<std::thread> threads;
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(HttpServerOptions(), [&](HttpRequest request, HttpResponder* responder) {
        std::function<void(std::function<void()>)> post = responder->Poster();
        threads.emplace_back([post, responder] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          post([responder] { responder->Respond(200, "text/plain", "late answer"); });
        });
        return std::make_unique<HttpExchange>();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->port());
  SendAll(fd, "GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answer = ReadUntil(fd, "late answer");
  ::close(fd);
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(answer, HasSubstr("late answer"));
  for (std::thread& thread : threads) thread.join();
  (*server)->Stop();
}

TEST(HttpServerTest, HealthIs503BeforeTheModelIsServed) {
  ServerOptions options;
  options.port = 0;
  options.http_port = 0;
  absl::StatusOr<std::unique_ptr<LmserveServer>> server = LmserveServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = Connect((*server)->http_port());
  SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string health = ReadUntil(fd, "\r\n\r\n__never__");
  ::close(fd);
  EXPECT_THAT(health, HasSubstr("HTTP/1.1 503"));
  EXPECT_THAT(health, HasSubstr("the server is starting"));
  const int fd2 = Connect((*server)->http_port());
  SendAll(fd2,
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
          "17\r\n\r\n{\"prompt\": [1,2]}");
  const std::string completion = ReadUntil(fd2, "\r\n\r\n__never__");
  ::close(fd2);
  EXPECT_THAT(completion, HasSubstr("HTTP/1.1 503"));
  EXPECT_THAT(completion, HasSubstr("\"code\":\"service_unavailable\""));
  (*server)->Drain(absl::ZeroDuration());
}

}  // namespace
}  // namespace lmserve::server
