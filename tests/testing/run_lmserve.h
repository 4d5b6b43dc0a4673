// Runs the built `bin/lmserve` binary, for tests of its subcommands.

#ifndef LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_
#define LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_

#include <string>

namespace lmserve::testing {

struct RunResult {
  int exit_code = -1;  // -1: did not run or did not exit normally
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs `bin/lmserve <arguments>` through the shell (quote arguments with spaces yourself).
RunResult RunLmserve(const std::string& arguments);

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_RUN_LMSERVE_H_
