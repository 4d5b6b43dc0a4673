#include "tests/e2e/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/strings.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string E2eFixtureModel() { return HfTinyDir("llama-gqa"); }

std::unique_ptr<ServerProcess> ServerProcess::Start(const std::vector<std::string>& args,
                                                    bool wait_serving) {
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
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    const int log = ::open(server->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) ::dup2(log, STDERR_FILENO);
    ::execv(c_argv[0], c_argv.data());
    std::_Exit(127);
  }
  server->pid_ = pid;
  const std::regex listening(R"(listening on 127\.0\.0\.1:(\d+))");
  const double deadline = Now() + 60;
  while (Now() < deadline) {
    std::smatch match;
    const std::string log = server->Log();
    if (std::regex_search(log, match, listening)) {
      server->port_ = std::stoi(match[1]);
      break;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      server->exited_ = true;
      ADD_FAILURE() << "the server exited early:\n" << log;
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (server->port_ < 0) {
    ADD_FAILURE() << "the server did not listen within 60 s:\n" << server->Log();
    return nullptr;
  }
  if (wait_serving && !server->WaitHealth(true, 120)) {
    ADD_FAILURE() << "the server was not SERVING within 120 s:\n" << server->Log();
    return nullptr;
  }
  return server;
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
  const double deadline = Now() + 60;
  while (Now() < deadline) {
    std::smatch match;
    const std::string log = Log();
    if (std::regex_search(log, match, metrics)) return metrics_port_ = std::stoi(match[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
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
  const double deadline = Now() + timeout_seconds;
  while (Now() < deadline) {
    if (Serving() == serving) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void ServerProcess::Signal(int signal_number) const {
  if (pid_ > 0 && !exited_) ::kill(pid_, signal_number);
}

int ServerProcess::WaitExit(double timeout_seconds) {
  if (pid_ <= 0 || exited_) return -1;
  const double deadline = Now() + timeout_seconds;
  int status = 0;
  while (Now() < deadline) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  exited_ = true;
  return -1;
}

std::string ServerProcess::Log() const {
  std::ifstream file(log_path_);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool ServerProcess::WaitForLog(const std::string& text, double timeout_seconds) const {
  const double deadline = Now() + timeout_seconds;
  while (Now() < deadline) {
    if (Log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace lmserve::testing
