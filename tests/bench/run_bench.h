// Runs the built `bin/lmserve-bench serve` for the tests and reads its JSON result.

#ifndef LMSERVE_TESTS_BENCH_RUN_BENCH_H_
#define LMSERVE_TESTS_BENCH_RUN_BENCH_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/strings.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {

struct BenchRun {
  int exit_code = -1;
  std::string output;     // stdout and stderr
  nlohmann::json result;  // the --result-json file; null when none was written
};

// Runs `lmserve-bench serve <arguments> --result-json <temp file>` through the shell, under
// coreutils' `timeout`: killed (SIGTERM, then SIGKILL 10 s later) after `timeout_seconds`, when
// exit_code is 124 and the output says so.
inline BenchRun RunBenchServe(const std::string& arguments, int timeout_seconds = 240) {
  static int counter = 0;
  const std::string base = StrCat(TempDir(), "/bench_", ::getpid(), "_", counter++);
  const std::string json_path = StrCat(base, ".json");
  const std::string log_path = StrCat(base, ".log");
  std::remove(json_path.c_str());
  const std::string command = StrCat("timeout --kill-after=10 ", timeout_seconds, " ",
                                     LMSERVE_BINARY_DIR, "/bin/lmserve-bench serve ", arguments,
                                     " --result-json ", json_path, " >", log_path, " 2>&1");
  BenchRun run;
  const int status = std::system(command.c_str());
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream log(log_path);
  std::stringstream text;
  text << log.rdbuf();
  run.output = text.str();
  if (run.exit_code == 124) {
    run.output +=
        StrCat("\n[RunBenchServe: killed after its deadline of ", timeout_seconds, " s]\n");
  }
  std::ifstream json(json_path);
  if (json) run.result = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  return run;
}

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_BENCH_RUN_BENCH_H_
