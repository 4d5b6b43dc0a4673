// Starts the real `bin/lmserve serve` as a child process on a loopback port, for end-to-end tests,
// and gives gRPC channels to it.
//
// Every wait has a deadline and watches the child too: a wait ends at once, with the child's exit
// status and its log in the error, when the child exits before what it waits for happens. The
// destructor kills (SIGKILL) and reaps a child still running.

#ifndef LMSERVE_TESTS_E2E_SERVER_PROCESS_H_
#define LMSERVE_TESTS_E2E_SERVER_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lmserve::testing {

class ServerProcess {
 public:
  struct StartOptions {
    bool wait_serving = true;              // also wait for the health service's SERVING
    double listen_timeout_seconds = 60;    // for the "listening on" line
    double serving_timeout_seconds = 120;  // for SERVING, after the line
  };

  // Runs `lmserve serve --host 127.0.0.1 --port 0 --threads 1 <args>` with its stderr in a log
  // file and waits for its "listening on" line (and SERVING with `wait_serving`). The error says
  // why it gave up: the server exited (with its exit status), or a deadline passed; either way
  // the message ends with the server's log.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Launch(const std::vector<std::string>& args,
                                                               const StartOptions& options);
  // Launch with the default deadlines; fails the calling test (ADD_FAILURE with Launch's error)
  // and returns nullptr when it gives up.
  static std::unique_ptr<ServerProcess> Start(const std::vector<std::string>& args,
                                              bool wait_serving = true);
  ~ServerProcess();

  int port() const { return port_; }
  std::string address() const;
  // The metrics port from the log ("metrics on http://..."), waiting up to 60 s; -1 if none (the
  // server exited, or the deadline passed: the calling test fails with the reason and the log).
  int MetricsPort();

  // A plaintext channel to the server.
  std::shared_ptr<grpc::Channel> Channel() const;

  // Health Check of "" (plaintext, no token): SERVING, NOT_SERVING, or nullopt when the call
  // failed.
  std::optional<bool> Serving() const;
  // Polls Serving() until it equals `serving`; false after `timeout_seconds`, or at once when the
  // server has exited.
  bool WaitHealth(bool serving, double timeout_seconds) const;

  // Polls `ready` (every 20 ms) until it returns true: OK. DeadlineExceeded when
  // `timeout_seconds` pass first, FailedPrecondition as soon as the server has exited (its exit
  // status in the message); both messages name `what` and end with the server's log.
  absl::Status WaitFor(const std::string& what, const std::function<bool()>& ready,
                       double timeout_seconds) const;

  // "exited with code N" or "was killed by signal N" once the child has exited, else nullopt.
  // Does not reap the child (WaitExit and the destructor do).
  std::optional<std::string> ExitDescription() const;

  void Signal(int signal_number) const;
  // Waits up to `timeout_seconds` for the child to exit; returns its exit code (-1: killed by a
  // signal or still running, in which case it is killed).
  int WaitExit(double timeout_seconds);

  // The server's stderr so far.
  std::string Log() const;
  // Polls the log for `text`; false after `timeout_seconds`, or at once when the server has
  // exited without writing it.
  bool WaitForLog(const std::string& text, double timeout_seconds) const;

 private:
  ServerProcess() = default;

  pid_t pid_ = -1;
  int port_ = -1;
  int metrics_port_ = -1;
  std::string log_path_;
  bool exited_ = false;           // reaped
  std::string exit_description_;  // once reaped: how it exited
};

// The fixture model the e2e tests serve (no tokenizer: token-id prompts).
std::string E2eFixtureModel();

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_E2E_SERVER_PROCESS_H_
