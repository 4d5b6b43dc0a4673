// lmserve serve --model PATH [--port N] [--metrics-port M] ...: the gRPC server.
//
// SIGTERM and SIGINT drain it (see service.h) and it exits 0; a second signal cuts the grace period
// short. Exit codes: 0 after a drain, 1 when the server could not start or the model not load,
// 2 for bad options.

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "server/cli.h"
#include "server/log.h"
#include "server/model_loader.h"
#include "server/serve_config.h"
#include "server/service.h"

namespace lmserve::server {
namespace {

// Counts SIGTERM and SIGINT. The handler only writes a byte to a pipe (async-signal-safe, and it
// works whichever thread the signal lands on, including threads libraries started before main); a
// thread of ours reads the pipe.
class SignalCounter {
 public:
  SignalCounter() {
    if (pipe(fds_) != 0) {
      LogError("cannot create the signal pipe: signals will end the process at once");
      return;
    }
    write_fd_ = fds_[1];
    struct sigaction action {};
    action.sa_handler = [](int signal_number) {
      const char byte = static_cast<char>(signal_number);
      [[maybe_unused]] ssize_t n = write(write_fd_, &byte, 1);
    };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    std::thread([this] {
      char byte = 0;
      while (read(fds_[0], &byte, 1) == 1) {
        LogInfo("received ", byte == SIGTERM ? "SIGTERM" : "SIGINT");
        absl::MutexLock lock(&mu_);
        ++count_;
      }
    }).detach();  // lives until exit, blocked in read
  }

  int count() {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  void AwaitFirst() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* count) { return *count > 0; }, &count_));
  }

 private:
  static inline int write_fd_ = -1;
  int fds_[2] = {-1, -1};
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

int Run(const ServeConfig& config) {
  SetLogText(config.server.debug_log_text);

  static SignalCounter* const signals = new SignalCounter();  // lives until exit

  LogInfo(DescribeServeConfig(config));
  absl::StatusOr<std::unique_ptr<LmserveServer>> server = LmserveServer::Start(config.server);
  if (!server.ok()) {
    LogError(server.status().message());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<ServingModel>> model =
      LoadServingModel(config, (*server)->api_limits());
  if (!model.ok()) {
    LogError("cannot serve the model: ", model.status().message());
    (*server)->Drain(absl::ZeroDuration());
    return 1;
  }
  (*server)->Serve(*std::move(model));
  signals->AwaitFirst();
  (*server)->Drain(absl::Seconds(config.server.grace_period_seconds),
                   [] { return signals->count() >= 2; });
  return 0;
}

}  // namespace

CommandRunner DeclareServe(CLI::App* command) {
  command->footer(
      "Serves a model over gRPC (lmserve.v1.Lmserve, grpc.health.v1.Health, server reflection), "
      "with Prometheus metrics at http://HOST:METRICS_PORT/metrics. SIGTERM or SIGINT drains: new "
      "requests are refused, in-flight ones get --grace-period-s to finish, then the server exits "
      "0.");
  auto config = std::make_shared<ServeConfig>();
  BindServeFlags(command, config.get());
  return [config] {
    if (absl::Status status = FinishServeConfig(config.get()); !status.ok()) {
      std::fprintf(stderr, "lmserve serve: %s\n", std::string(status.message()).c_str());
      return 2;
    }
    return Run(*config);
  };
}

}  // namespace lmserve::server
