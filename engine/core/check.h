// CHECK for the engine core: a broken invariant is a bug, so it aborts with a message.
// (Debian's Abseil 20220623 predates absl/log/check.h.)

#ifndef LMSERVE_ENGINE_CORE_CHECK_H_
#define LMSERVE_ENGINE_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/strings.h"

namespace lmserve::engine::core_internal {

[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition,
                                     const std::string& message) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s %s\n", file, line, condition, message.c_str());
  std::abort();
}

}  // namespace lmserve::engine::core_internal

// LMSERVE_CORE_CHECK(condition, message parts...): the parts go through lmserve::StrCat.
#define LMSERVE_CORE_CHECK(condition, ...)                                           \
  do {                                                                               \
    if (!(condition)) {                                                              \
      ::lmserve::engine::core_internal::CheckFailed(__FILE__, __LINE__, #condition,  \
                                                    ::lmserve::StrCat(__VA_ARGS__)); \
    }                                                                                \
  } while (false)

#endif  // LMSERVE_ENGINE_CORE_CHECK_H_
