// Runs the built `bin/lmserve` binary, for tests of its subcommands.

#ifndef LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_
#define LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_

#include <string>

namespace lmserve::testing {

struct RunResult {
  int exit_code = -1;      // -1: did not run or did not exit normally
  std::string out;         // stdout
  std::string err;         // stderr
  bool timed_out = false;  // killed at the deadline (then exit_code is 124, and err says so)
};

// Runs `bin/lmserve <arguments>` through the shell (quote arguments with spaces yourself), under
// coreutils' `timeout`: killed (SIGTERM, then SIGKILL 10 s later) after `timeout_seconds`.
RunResult RunLmserve(const std::string& arguments, int timeout_seconds = 300);

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_
