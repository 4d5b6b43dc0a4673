// bin/lmserve-bench: lmserve's benchmarks, one subcommand each, parsed by CLI11
// (server/command_line.h).
//
//   lmserve-bench serve ...   the serving benchmark (a load generator over gRPC or OpenAI HTTP)
//
// A benchmark is added as one row of `subcommands`: its name, a line of help and the function that
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

int main(int argc, char** argv) {
  // What --result-json records: the command line, as typed after the program's name.
  std::string command_line = "lmserve-bench";
  for (int i = 1; i < argc; ++i) command_line += lmserve::StrCat(" ", argv[i]);
  const std::vector<lmserve::server::Subcommand> subcommands = {
      {"serve", "the serving benchmark: TTFT, ITL, TPOT, E2E latency and throughput under load",
       [&](CLI::App* command) { return lmserve::bench::DeclareServe(command, command_line); }},
  };
  CLI::App app(
      "lmserve-bench: lmserve's benchmarks. `lmserve-bench <command> --help` lists a "
      "command's options.",
      "lmserve-bench");
  return lmserve::server::RunSubcommands(&app, subcommands, argc, argv);
}
