// The server harness gives up at once, with the reason and the server's log, when the server
// exits before what a wait waits for: never by running into its deadline. Each wait here is given
// an hour; a harness that waited for it would run into ctest's TIMEOUT for e2e_test (300 s) and
// fail. Nothing here asserts on times: the checks are on the reported reason.

#include "tests/e2e/server_process.h"

#include <signal.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kAnHour = 3600;

ServerProcess::StartOptions PatientOptions() {
  ServerProcess::StartOptions options;
  options.listen_timeout_seconds = kAnHour;
  options.serving_timeout_seconds = kAnHour;
  return options;
}

// The server listens, then fails to load the model and exits 1: the wait for SERVING (or, if the
// exit comes first, the one for the "listening on" line) reports the exit and the log.
TEST(ServerProcessTest, ABadModelPathFailsTheStartWithTheServersLog) {
  const absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Launch({"--model", "/nonexistent/lmserve-model"}, PatientOptions());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  const std::string message(server.status().message());
  EXPECT_THAT(message, HasSubstr("the server exited with code 1 before "));
  EXPECT_THAT(message, HasSubstr("cannot serve the model"));  // the log's own words
  EXPECT_THAT(message, HasSubstr("/nonexistent/lmserve-model"));
  EXPECT_THAT(message, Not(HasSubstr("within")));  // not a deadline
}

// An unknown option: the server exits 2 before it listens.
TEST(ServerProcessTest, AnUnknownOptionFailsTheWaitForTheListeningLine) {
  const absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Launch({"--model", E2eFixtureModel(), "--no-such-option"}, PatientOptions());
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  const std::string message(server.status().message());
  EXPECT_THAT(message, HasSubstr("the server exited with code 2 before its \"listening on\" line"));
  EXPECT_THAT(message, HasSubstr("no-such-option"));
}

// After a good start, the other waits (health, log lines, any WaitFor) notice a dead server too.
TEST(ServerProcessTest, WaitsAfterTheStartEndWhenTheServerDies) {
  auto server = ServerProcess::Start({"--model", E2eFixtureModel(), "--kv-cache-mb", "16"});
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->ExitDescription(), std::nullopt);
  server->Signal(SIGKILL);
  const absl::Status waited = server->WaitFor(
      "a miracle", [] { return false; }, kAnHour);
  EXPECT_EQ(waited.code(), absl::StatusCode::kFailedPrecondition) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("the server was killed by signal 9"));
  EXPECT_THAT(waited.message(), HasSubstr("before a miracle; its log:\n"));
  EXPECT_THAT(waited.message(), HasSubstr("SERVING"));  // the log so far
  EXPECT_FALSE(server->WaitHealth(true, kAnHour));
  EXPECT_FALSE(server->WaitForLog("a line it never wrote", kAnHour));
  EXPECT_EQ(server->WaitExit(kAnHour), -1);  // killed by a signal
  EXPECT_THAT(server->ExitDescription().value_or(""), HasSubstr("killed by signal 9"));
}

}  // namespace
}  // namespace lmserve::testing
