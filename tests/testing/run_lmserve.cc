#include "tests/testing/run_lmserve.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/strings.h"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {

RunResult RunLmserve(const std::string& arguments, int timeout_seconds) {
  static int counter = 0;
  const std::string err_path = StrCat(TempDir(), "/lmserve_stderr_", counter++, ".txt");
  const std::string command =
      StrCat("timeout --kill-after=10 ", timeout_seconds, " ", LMSERVE_BINARY_DIR, "/bin/lmserve ",
             arguments, " 2>", err_path);
  RunResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream text;
  text << err.rdbuf();
  result.err = text.str();
  if (result.exit_code == 124) {
    result.timed_out = true;
    result.err += StrCat("\n[RunLmserve: killed after its deadline of ", timeout_seconds, " s]\n");
  }
  return result;
}

}  // namespace lmserve::testing
