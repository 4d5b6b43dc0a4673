// gRPC status codes by name: the one table the server's metrics and logs, lmserve-cli's errors and
// lmserve-bench's records share.

#ifndef LMSERVE_SERVER_GRPC_STATUS_H_
#define LMSERVE_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string_view>

namespace lmserve::server {

// "OK", "INVALID_ARGUMENT", ...; "UNKNOWN" for a code outside gRPC's 17.
inline std::string_view GrpcCodeName(grpc::StatusCode code) {
  static constexpr std::string_view kNames[] = {"OK",
                                                "CANCELLED",
                                                "UNKNOWN",
                                                "INVALID_ARGUMENT",
                                                "DEADLINE_EXCEEDED",
                                                "NOT_FOUND",
                                                "ALREADY_EXISTS",
                                                "PERMISSION_DENIED",
                                                "RESOURCE_EXHAUSTED",
                                                "FAILED_PRECONDITION",
                                                "ABORTED",
                                                "OUT_OF_RANGE",
                                                "UNIMPLEMENTED",
                                                "INTERNAL",
                                                "UNAVAILABLE",
                                                "DATA_LOSS",
                                                "UNAUTHENTICATED"};
  const int index = static_cast<int>(code);
  return index >= 0 && index <= 16 ? kNames[index] : "UNKNOWN";
}

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_GRPC_STATUS_H_
