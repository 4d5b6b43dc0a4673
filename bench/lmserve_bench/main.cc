// bin/lmserve-bench: lmserve's benchmarks, one subcommand each, parsed by CLI11
// (server/command_line.h).
//
//   lmserve-bench serve ...   the serving benchmark (a load generator over gRPC or OpenAI HTTP)
//
// A benchmark is added as one row of kCommands: its name, a line of help and the function that
// declares its flags and returns its runner (which returns the exit code).

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/lmserve_bench/serve.h"
#include "common/strings.h"
#include "server/command_line.h"

namespace lmserve::bench {
namespace {

struct Command {
  const char* name;
  const char* help;
  std::function<int()> (*declare)(CLI::App* command, std::string command_line);
};

constexpr Command kCommands[] = {
    {"serve", "the serving benchmark: TTFT, ITL, TPOT, E2E latency and throughput under load",
     &DeclareServe},
};

bool IsCommand(std::string_view name) {
  for (const Command& command : kCommands) {
    if (name == command.name) return true;
  }
  return false;
}

}  // namespace
}  // namespace lmserve::bench

int main(int argc, char** argv) {
  using lmserve::bench::kCommands;
  CLI::App app(
      "lmserve-bench: lmserve's benchmarks. `lmserve-bench <command> --help` lists a "
      "command's options.",
      "lmserve-bench");
  lmserve::server::UseCommandLineConventions(&app);
  // What --result-json records: the command line, as typed after the program's name.
  std::string command_line = "lmserve-bench";
  for (int i = 1; i < argc; ++i) command_line += lmserve::StrCat(" ", argv[i]);
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
  for (const auto& entry : kCommands) {
    CLI::App* command = app.add_subcommand(entry.name, entry.help);
    commands.emplace_back(command, entry.declare(command, command_line));
  }
  app.require_subcommand(1);
  const std::string_view first = argc >= 2 ? argv[1] : "";
  if (first.empty() || first == "help") {
    std::fputs(app.help().c_str(), first.empty() ? stderr : stdout);
    return first.empty() ? 2 : 0;
  }
  if (first.front() != '-' && !lmserve::bench::IsCommand(first)) {
    std::fprintf(stderr, "lmserve-bench: unknown command '%s'\n\n%s", argv[1], app.help().c_str());
    return 2;
  }
  if (std::optional<int> exit_code = lmserve::server::ParseCommandLine(&app, argc, argv)) {
    return *exit_code;
  }
  for (auto& [command, run] : commands) {
    if (command->parsed()) return run();
  }
  return 2;  // unreachable: a subcommand is required
}
