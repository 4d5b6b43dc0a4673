// Status propagation: the two macros every fallible call site uses instead of spelling out
// `if (!s.ok()) return s;`.
//
//   LMSERVE_RETURN_IF_ERROR(expr);          expr is an absl::Status: returned when not OK.
//   LMSERVE_ASSIGN_OR_RETURN(lhs, expr);    expr is an absl::StatusOr<T>: its status returned when
//                                           not OK, else its value moved into lhs, which may be a
//                                           declaration (`auto x`, `const Foo& y` is not allowed:
//                                           the value is a temporary) or an existing lvalue.
//
// Both work in any function that returns absl::Status or absl::StatusOr<U>.

#ifndef LMSERVE_COMMON_STATUS_H_
#define LMSERVE_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LMSERVE_STATUS_CONCAT_INNER_(a, b) a##b
#define LMSERVE_STATUS_CONCAT_(a, b) LMSERVE_STATUS_CONCAT_INNER_(a, b)

#define LMSERVE_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                    \
    if (::absl::Status lmserve_status_ = (expr); !lmserve_status_.ok()) {                 \
      return lmserve_status_;                                                             \
    }                                                                                     \
  } while (0)

#define LMSERVE_ASSIGN_OR_RETURN(lhs, expr) \
  LMSERVE_ASSIGN_OR_RETURN_IMPL_(LMSERVE_STATUS_CONCAT_(lmserve_statusor_, __COUNTER__), lhs, expr)

#define LMSERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = *std::move(statusor)

#endif  // LMSERVE_COMMON_STATUS_H_
