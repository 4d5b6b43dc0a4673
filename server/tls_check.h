// A check of --tls-cert and --tls-key before gRPC sees them: gRPC only fails to start a server
// whose key does not match its certificate, which read as "cannot listen" on the port.

#ifndef LMSERVE_SERVER_TLS_CHECK_H_
#define LMSERVE_SERVER_TLS_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace lmserve::server {

// OK when `cert_pem` starts with a PEM certificate and `key_pem` holds the PEM private key of that
// certificate. InvalidArgument naming --tls-cert or --tls-key otherwise.
absl::Status CheckTlsKeyPair(const std::string& cert_pem, const std::string& key_pem);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_TLS_CHECK_H_
