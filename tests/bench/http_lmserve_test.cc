// `lmserve-bench serve --backend http` against a real `lmserve serve --http-port` of a fixture model
// (no tokenizer): token-id prompts, the model name and vocabulary size taken from /v1/models, and
// the output counted exactly from the streams' token_ids (vLLM's return_token_ids).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/strings.h"
#include "gtest/gtest.h"
#include "tests/bench/run_bench.h"
#include "tests/e2e/server_process.h"

namespace lmserve::testing {
namespace {

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

TEST(HttpLmserveTest, CountsTokenIdsOfARealServer) {
  const int http_port = FreePort();
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(
      {"--model", E2eFixtureModel(), "--kv-cache-mb", "16", "--http-port", StrCat(http_port)});
  ASSERT_NE(server, nullptr);
  const BenchRun run = RunBenchServe(
      StrCat("--backend http --url http://127.0.0.1:", http_port,
             " --input-len 8 --output-len 6 --num-prompts 6 --concurrency 2 --warmup-requests 2"));
  ASSERT_EQ(run.exit_code, 0) << run.output << "\n" << server->Log();
  const nlohmann::json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.output;
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["token_counting"], "token_ids");
  EXPECT_EQ(r["total_output_tokens"], 6 * 6);
  EXPECT_EQ(r["total_input_tokens"], 6 * 8);
  EXPECT_EQ(r["config"]["model"], "llama-gqa");  // from /v1/models
}

}  // namespace
}  // namespace lmserve::testing
