// `lmserve-bench serve`: the serving benchmark (load generator and report). See serve.cc.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_

#include <functional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace lmserve::bench {

// Declares `serve`'s flags on `command` (a CLI11 subcommand; see server/command_line.h) and returns
// what runs it once the command line is parsed: the exit code, 0 success, 1 the run failed (server
// unreachable, every request failed), 2 bad usage. `command_line` is recorded in --result-json.
std::function<int()> DeclareServe(CLI::App* command, std::string command_line);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_SERVE_H_
