// Launcher precondition checks shared by the CPU kernels.
//
// Every kernel's Params has a Validate() that explains what is wrong with a shape or a pointer.
// Callers that take shapes from outside (files, requests) call Validate() themselves and return its
// status; a launcher re-checks and aborts on failure, since reaching it with bad params is a bug in
// the caller.

#ifndef LMSERVE_KERNELS_CPU_CHECK_H_
#define LMSERVE_KERNELS_CPU_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace lmserve::kernels {

// Aborts naming `kernel` and the error when `status` is not OK.
inline void CheckValid(const absl::Status& status, const char* kernel) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: invalid params: %s\n", kernel, std::string(status.message()).c_str());
  std::abort();
}

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_CHECK_H_
