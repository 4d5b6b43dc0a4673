// bin/lmserve-bench: lmserve's benchmarks, one subcommand each.
//
//   lmserve-bench serve ...   the serving benchmark (a load generator over gRPC or OpenAI HTTP)
//
// A benchmark is added as one row of kCommands: its name, a line of help and its entry point, which
// gets the arguments after the subcommand's name and returns the exit code.

#include <cstdio>
#include <cstring>
#include <string_view>

#include "bench/lmserve_bench/serve.h"

namespace lmserve::bench {
namespace {

struct Command {
  const char* name;
  const char* help;
  int (*run)(int argc, char** argv);
};

constexpr Command kCommands[] = {
    {"serve", "the serving benchmark: TTFT, ITL, TPOT, E2E latency and throughput under load",
     &RunServe},
};

int PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: lmserve-bench <command> [options]   (<command> --help for its options)\n\n");
  for (const Command& command : kCommands)
    std::fprintf(out, "  %-10s %s\n", command.name, command.help);
  return out == stdout ? 0 : 2;
}

}  // namespace
}  // namespace lmserve::bench

int main(int argc, char** argv) {
  using lmserve::bench::kCommands;
  if (argc < 2) return lmserve::bench::PrintUsage(stderr);
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") return lmserve::bench::PrintUsage(stdout);
  for (const auto& command : kCommands) {
    if (name == command.name) {
      return command.run(argc - 2, argv + 2);
    }
  }
  std::fprintf(stderr, "lmserve-bench: unknown command '%s'\n", argv[1]);
  return lmserve::bench::PrintUsage(stderr);
}
