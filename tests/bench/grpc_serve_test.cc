// `lmserve-bench serve` over gRPC against a real `lmserve serve` of a fixture model (token-id
// prompts), with the server's Prometheus TTFT histogram scraped around the run.

#include <nlohmann/json.hpp>
#include <string>

#include "common/strings.h"
#include "gtest/gtest.h"
#include "tests/bench/run_bench.h"
#include "tests/e2e/server_process.h"

namespace lmserve::testing {
namespace {

TEST(GrpcServeTest, MeasuresARealServerAndComparesItsTtft) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(
      {"--model", E2eFixtureModel(), "--kv-cache-mb", "16", "--metrics-port", "0"});
  ASSERT_NE(server, nullptr);
  const int metrics_port = server->MetricsPort();
  ASSERT_GT(metrics_port, 0);
  const BenchRun run = RunBenchServe(
      StrCat("--addr ", server->address(), " --input-len 8 --output-len 6 --num-prompts 6",
             " --concurrency 2 --warmup-requests 2 --goodput e2el:600000",
             " --metrics-url http://127.0.0.1:", metrics_port, "/metrics"));
  ASSERT_EQ(run.exit_code, 0) << run.output << "\n" << server->Log();
  const nlohmann::json& r = run.result;
  ASSERT_TRUE(r.is_object()) << run.output;
  EXPECT_EQ(r["num_issued"], 6);
  EXPECT_EQ(r["completed"], 6);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["token_counting"], "token_ids");
  EXPECT_EQ(r["total_output_tokens"], 6 * 6);  // ignore_eos and max_tokens: exactly as asked
  EXPECT_EQ(r["total_input_tokens"], 6 * 8);
  // One gap per token after each request's first message. The first message holds at least one
  // token, and more when the tiny model outruns the server's writer, so this is only a bound.
  EXPECT_LE(r["itl_ms"]["count"].get<int>(), 6 * 5);
  EXPECT_EQ(r["num_good"], 6);
  const nlohmann::json& ttft = r["server_ttft"];
  ASSERT_TRUE(ttft.contains("server_ttft_mean_ms")) << ttft.dump();
  // Warm-up excluded on both sides: the server observed exactly the measured requests.
  EXPECT_EQ(ttft["server_ttft_count"].get<double>(), 6);
  // The client's TTFT includes the transport, so it is not below the server's (up to rounding).
  EXPECT_GE(ttft["client_ttft_mean_ms"].get<double>() + 1e-3,
            ttft["server_ttft_mean_ms"].get<double>());
}

}  // namespace
}  // namespace lmserve::testing
