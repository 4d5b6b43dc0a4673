// Starts the real `bin/lmserve serve` as a child process on a loopback port, for end-to-end tests,
// and gives gRPC channels to it.
//
// Every wait is bounded; the destructor kills (SIGKILL) and reaps a child still running.

#ifndef LMSERVE_TESTS_E2E_SERVER_PROCESS_H_
#define LMSERVE_TESTS_E2E_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

namespace lmserve::testing {

class ServerProcess {
 public:
  // Runs `lmserve serve --host 127.0.0.1 --port 0 <args>` with its stderr in a log file, and waits
  // (up to 60 s) for its "listening on" line. With `wait_serving`, also waits (up to 120 s) for the
  // health service to say SERVING. Fails the calling test (and returns nullptr) on a timeout or
  // an early exit.
  static std::unique_ptr<ServerProcess> Start(const std::vector<std::string>& args,
                                              bool wait_serving = true);
  ~ServerProcess();

  int port() const { return port_; }
  std::string address() const;
  // The metrics port from the log ("metrics on http://..."), waiting up to 60 s; -1 if none.
  int MetricsPort();

  // A plaintext channel to the server.
  std::shared_ptr<grpc::Channel> Channel() const;

  // Health Check of "" (plaintext, no token): SERVING, NOT_SERVING, or nullopt when the call failed.
  std::optional<bool> Serving() const;
  // Polls Serving() until it equals `serving`, up to `timeout_seconds`.
  bool WaitHealth(bool serving, double timeout_seconds) const;

  void Signal(int signal_number) const;
  // Waits up to `timeout_seconds` for the child to exit; returns its exit code (-1: killed by a
  // signal or still running, in which case it is killed).
  int WaitExit(double timeout_seconds);

  // The server's stderr so far.
  std::string Log() const;
  // Polls the log for `text`, up to `timeout_seconds`.
  bool WaitForLog(const std::string& text, double timeout_seconds) const;

 private:
  ServerProcess() = default;

  pid_t pid_ = -1;
  int port_ = -1;
  int metrics_port_ = -1;
  std::string log_path_;
  bool exited_ = false;
};

// The fixture model the e2e tests serve (no tokenizer: token-id prompts).
std::string E2eFixtureModel();

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_E2E_SERVER_PROCESS_H_
