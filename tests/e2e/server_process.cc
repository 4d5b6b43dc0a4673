#include "tests/e2e/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/status.h"
#include "common/strings.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "exited with code N" or "was killed by signal N (NAME)", from waitid's report of a child.
std::string DescribeExit(const siginfo_t& info) {
  if (info.si_code == CLD_EXITED) return StrCat("exited with code ", info.si_status);
  const char* name = ::strsignal(info.si_status);
  return StrCat("was killed by signal ", info.si_status, " (", name != nullptr ? name : "?", ")");
}

}  // namespace

std::string E2eFixtureModel() { return HfTinyDir("llama-gqa"); }

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Launch(
    const std::vector<std::string>& args, const StartOptions& options) {
  static int counter = 0;
  std::unique_ptr<ServerProcess> server(new ServerProcess());
  server->log_path_ = StrCat(TempDir(), "/server_", ::getpid(), "_", counter++, ".log");
  std::vector<std::string> argv = {StrCat(LMSERVE_BINARY_DIR, "/bin/lmserve"), "serve", "--host",
                                   "127.0.0.1", "--port", "0", "--threads", "1"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(StrCat("fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    const int log = ::open(server->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) ::dup2(log, STDERR_FILENO);
    ::execv(c_argv[0], c_argv.data());
    std::_Exit(127);
  }
  server->pid_ = pid;
  const std::regex listening(R"(listening on 127\.0\.0\.1:(\d+))");
  LMSERVE_RETURN_IF_ERROR(server->WaitFor(
      "its \"listening on\" line",
      [&] {
        std::smatch match;
        const std::string log = server->Log();
        if (!std::regex_search(log, match, listening)) return false;
        server->port_ = std::stoi(match[1]);
        return true;
      },
      options.listen_timeout_seconds));
  if (options.wait_serving) {
    LMSERVE_RETURN_IF_ERROR(server->WaitFor(
        "SERVING", [&] { return server->Serving() == true; }, options.serving_timeout_seconds));
  }
  return server;
}

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& args,
                                                    bool wait_serving) {
  StartOptions options;
  options.wait_serving = wait_serving;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = Launch(args, options);
  if (!server.ok()) {
    ADD_FAILURE() << server.status().message();
    return nullptr;
  }
  return *std::move(server);
}

absl::Status ServerProcess::WaitFor(const std::string& what, const std::function<bool()>& ready,
                                    double timeout_seconds) const {
  const double deadline = Now() + timeout_seconds;
  while (true) {
    if (ready()) return absl::OkStatus();
    if (std::optional<std::string> exit = ExitDescription()) {
      // What it waited for may have come just before the exit.
      if (ready()) return absl::OkStatus();
      return absl::FailedPreconditionError(
          StrCat("the server ", *exit, " before ", what, "; its log:\n", Log()));
    }
    if (Now() >= deadline) {
      return absl::DeadlineExceededError(StrCat("the server is still running, but ", what,
                                                " did not come within ", timeout_seconds,
                                                " s; its log:\n", Log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<std::string> ServerProcess::ExitDescription() const {
  if (exited_) return exit_description_;
  if (pid_ <= 0) return "never started";
  siginfo_t info{};
  // WNOWAIT: look without reaping, so that WaitExit still sees the status.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid == 0) {
    return std::nullopt;
  }
  return DescribeExit(info);
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

std::string ServerProcess::address() const { return StrCat("127.0.0.1:", port_); }

int ServerProcess::MetricsPort() {
  if (metrics_port_ >= 0) return metrics_port_;
  const std::regex metrics(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  const absl::Status found = WaitFor(
      "its \"metrics on\" line",
      [&] {
        std::smatch match;
        const std::string log = Log();
        if (!std::regex_search(log, match, metrics)) return false;
        metrics_port_ = std::stoi(match[1]);
        return true;
      },
      60);
  if (!found.ok()) ADD_FAILURE() << found.message();
  return metrics_port_;
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel() const {
  return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
}

std::optional<bool> ServerProcess::Serving() const {
  auto stub = grpc::health::v1::Health::NewStub(Channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) return std::nullopt;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

bool ServerProcess::WaitHealth(bool serving, double timeout_seconds) const {
  return WaitFor(
             serving ? "SERVING" : "NOT_SERVING", [&] { return Serving() == serving; },
             timeout_seconds)
      .ok();
}

void ServerProcess::Signal(int signal_number) const {
  if (pid_ > 0 && !exited_) ::kill(pid_, signal_number);
}

int ServerProcess::WaitExit(double timeout_seconds) {
  if (pid_ <= 0 || exited_) return -1;
  const double deadline = Now() + timeout_seconds;
  siginfo_t info{};
  while (Now() < deadline) {
    info = {};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG) == 0 &&
        info.si_pid == pid_) {
      exited_ = true;
      exit_description_ = DescribeExit(info);
      return info.si_code == CLD_EXITED ? info.si_status : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  exited_ = true;
  exit_description_ = "was killed by the test (SIGKILL) after it did not exit in time";
  return -1;
}

std::string ServerProcess::Log() const {
  std::ifstream file(log_path_);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool ServerProcess::WaitForLog(const std::string& text, double timeout_seconds) const {
  return WaitFor(
             StrCat("\"", text, "\" in its log"),
             [&] { return Log().find(text) != std::string::npos; }, timeout_seconds)
      .ok();
}

}  // namespace lmserve::testing
