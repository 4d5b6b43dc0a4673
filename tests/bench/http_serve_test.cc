// `lmserve-bench serve --backend http` against a fake OpenAI-compatible server written here: a
// socket server that streams /v1/completions as server-sent events, one token per event a few
// milliseconds apart, and answers every fifth request with HTTP 500. Assertions are on counts and
// orderings, never on tight timings (the machines are shared and noisy).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "gtest/gtest.h"
#include "tests/bench/run_bench.h"

namespace lmserve::testing {
namespace {

class FakeSseServer {
 public:
  // `send_usage`: end each stream with a usage chunk (as include_usage asks).
  // `tokens_per_event`: tokens in each event; > 1 sends token_ids so the client can count them.
  FakeSseServer(bool send_usage, int tokens_per_event)
      : send_usage_(send_usage), tokens_per_event_(tokens_per_event) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listener_, 64);
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~FakeSseServer() {
    stop_ = true;
    acceptor_.join();
    for (std::thread& t : handlers_) t.join();
    ::close(listener_);
  }

  int port() const { return port_; }
  int completions() const { return completions_.load(); }

 private:
  void Accept() {
    while (!stop_) {
      pollfd fd{listener_, POLLIN, 0};
      if (::poll(&fd, 1, 50) <= 0) continue;
      const int connection = ::accept(listener_, nullptr, nullptr);
      if (connection < 0) continue;
      handlers_.emplace_back([this, connection] { Handle(connection); });
    }
  }

  static void Send(int connection, const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(connection, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  void Handle(int connection) {
    std::string request;
    char buffer[4096];
    size_t header_end = std::string::npos;
    size_t content_length = 0;
    while (true) {
      if (header_end == std::string::npos) {
        header_end = request.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          const size_t at = request.find("Content-Length:");
          if (at != std::string::npos) content_length = std::stoul(request.substr(at + 15));
        }
      }
      if (header_end != std::string::npos && request.size() >= header_end + 4 + content_length) {
        break;
      }
      const ssize_t n = ::recv(connection, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        ::close(connection);
        return;
      }
      request.append(buffer, static_cast<size_t>(n));
    }
    const int number = ++completions_;
    const nlohmann::json body = nlohmann::json::parse(request.substr(header_end + 4));
    if (request.rfind("POST /v1/completions ", 0) != 0 || number % 5 == 0) {
      Send(connection,
           "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"
           "oops");
      ::close(connection);
      return;
    }
    const int max_tokens = body["max_tokens"].get<int>();
    const int prompt_tokens = static_cast<int>(body["prompt"].size());
    Send(connection,
         "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n");
    for (int sent = 0; sent < max_tokens; sent += tokens_per_event_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(sent == 0 ? 20 : 3));
      nlohmann::json choice = {{"index", 0}, {"text", "tok"}, {"finish_reason", nullptr}};
      if (tokens_per_event_ > 1) {
        choice["token_ids"] = std::vector<int>(
            static_cast<size_t>(std::min(tokens_per_event_, max_tokens - sent)), 7);
      }
      Send(connection, StrCat("data: ", nlohmann::json({{"choices", {choice}}}).dump(), "\n\n"));
    }
    if (send_usage_) {
      Send(connection, StrCat("data: ",
                              nlohmann::json({{"choices", nlohmann::json::array()},
                                              {"usage",
                                               {{"prompt_tokens", prompt_tokens},
                                                {"completion_tokens", max_tokens}}}})
                                  .dump(),
                              "\n\n"));
    }
    Send(connection, "data: [DONE]\n\n");
    ::close(connection);
  }

  const bool send_usage_;
  const int tokens_per_event_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> completions_{0};
  std::thread acceptor_;
  std::vector<std::thread> handlers_;  // only the acceptor adds, only the destructor joins
};

std::string Args(int port, int num_prompts, int output_len) {
  return StrCat("--backend http --url http://127.0.0.1:", port,
                " --model fake --vocab-size 1000 --input-len 16 --output-len ", output_len,
                " --num-prompts ", num_prompts, " --concurrency 4 --warmup-requests 0");
}

void ExpectOrdered(const nlohmann::json& d) {
  EXPECT_LE(d["min"].get<double>(), d["p50"].get<double>());
  EXPECT_LE(d["p50"].get<double>(), d["p90"].get<double>());
  EXPECT_LE(d["p90"].get<double>(), d["p99"].get<double>());
  EXPECT_LE(d["p99"].get<double>(), d["max"].get<double>());
}

TEST(HttpServeTest, CountsTokensFromUsageAndFailuresHonestly) {
  FakeSseServer server(/*send_usage=*/true, /*tokens_per_event=*/1);
  const BenchRun run = RunBenchServe(Args(server.port(), 20, 12));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.output;
  EXPECT_EQ(server.completions(), 20);
  EXPECT_EQ(r["num_issued"], 20);
  EXPECT_EQ(r["completed"], 16);  // every fifth request got HTTP 500
  EXPECT_EQ(r["failed"], 4);
  EXPECT_EQ(r["errors"]["HTTP 500: oops"], 4);
  EXPECT_EQ(r["token_counting"], "usage");
  EXPECT_EQ(r["total_output_tokens"], 16 * 12);
  EXPECT_EQ(r["total_input_tokens"], 16 * 16);
  EXPECT_EQ(r["ttft_ms"]["count"], 16);
  EXPECT_EQ(r["itl_ms"]["count"], 16 * 11);
  EXPECT_EQ(r["tpot_ms"]["count"], 16);
  for (const char* metric : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) ExpectOrdered(r[metric]);
  // The fake waits 20 ms before the first token and 3 ms between tokens: TTFT and E2E are at least
  // that (lower bounds only: a loaded machine only makes them longer).
  EXPECT_GE(r["ttft_ms"]["min"].get<double>(), 19);
  EXPECT_GE(r["e2el_ms"]["min"].get<double>(), r["ttft_ms"]["min"].get<double>());
  EXPECT_GE(r["e2el_ms"]["min"].get<double>(), 19 + 11 * 2.5);
  EXPECT_GT(r["output_throughput"].get<double>(), 0);
  EXPECT_NE(run.output.find("Serving Benchmark Result"), std::string::npos);
}

TEST(HttpServeTest, WithoutUsageCountsChunks) {
  FakeSseServer server(/*send_usage=*/false, /*tokens_per_event=*/1);
  const BenchRun run = RunBenchServe(Args(server.port(), 4, 6));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.result["token_counting"], "chunks");
  EXPECT_EQ(run.result["completed"], 4);
  EXPECT_EQ(run.result["total_output_tokens"], 4 * 6);
}

TEST(HttpServeTest, CountsTokenIdsOfMultiTokenChunks) {
  FakeSseServer server(/*send_usage=*/false, /*tokens_per_event=*/3);
  const BenchRun run = RunBenchServe(Args(server.port(), 4, 10));  // events of 3, 3, 3, 1 tokens
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.result["token_counting"], "token_ids");
  EXPECT_EQ(run.result["total_output_tokens"], 4 * 10);
  // The first event's 3 tokens have no gaps; the other 7 tokens each have one.
  EXPECT_EQ(run.result["itl_ms"]["count"], 4 * 7);
}

TEST(HttpServeTest, DurationBoundCountsRequestsInFlight) {
  // 200 tokens at >= 3 ms each: every request outlasts a 0.1 s bound with no grace.
  FakeSseServer server(/*send_usage=*/true, /*tokens_per_event=*/1);
  const BenchRun run =
      RunBenchServe(StrCat("--backend http --url http://127.0.0.1:", server.port(),
                           " --model fake --vocab-size 1000 --input-len 4 --output-len 200"
                           " --concurrency 3"
                           " --warmup-requests 0 --duration-s 0.1 --grace-s 0"));
  const nlohmann::json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.output;
  EXPECT_EQ(run.exit_code, 1) << run.output;  // nothing completed
  EXPECT_EQ(r["num_issued"], 3);
  EXPECT_EQ(r["completed"], 0);
  EXPECT_EQ(r["failed"], 3);
  EXPECT_EQ(r["cancelled_at_bound"], 3);
  EXPECT_EQ(r["errors"]["in flight at the end (duration bound + grace): cancelled"], 3);
}

}  // namespace
}  // namespace lmserve::testing
