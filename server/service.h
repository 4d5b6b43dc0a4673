// The lmserve gRPC server: the lmserve.v1.Lmserve service over one engine, the standard
// grpc.health.v1.Health service, server reflection, and the Prometheus endpoint.
//
// Life cycle:
//   Start      binds the port; health NOT_SERVING; Lmserve calls get UNAVAILABLE.
//   LoadModel  loads the model and tokenizer, starts the engine, runs a warm-up request, then
//              reports SERVING and admits requests.
//   Drain      (SIGTERM/SIGINT) stops admitting (UNAVAILABLE, health NOT_SERVING), lets in-flight
//              requests finish within the grace period, aborts the rest (their streams end with
//              finish_reason ABORT and status UNAVAILABLE), then stops the server and the engine.
//
// Calls run on gRPC's callback API: no thread waits on a request. The engine thread signals new
// outputs through OutputStream::SetListener; one server thread (the "pump") turns them into
// responses and starts the writes, so each call's state is touched by one thread at a time.
//
// Thread safety: Start, LoadModel and Drain are called by one thread (the main thread).

#ifndef LMSERVE_SERVER_SERVICE_H_
#define LMSERVE_SERVER_SERVICE_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/serve_config.h"

namespace lmserve::server {

class LmserveServer {
 public:
  // Binds config.host:config.port (TLS when configured) and starts answering. Fails when the port
  // cannot be bound or a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<LmserveServer>> Start(const ServeConfig& config);
  ~LmserveServer();  // Drain(0) when not drained yet

  LmserveServer(const LmserveServer&) = delete;
  LmserveServer& operator=(const LmserveServer&) = delete;

  int port() const;
  // The metrics port; -1 when metrics are not served or the model is not loaded yet.
  int metrics_port() const;

  // Loads the model, starts the engine and the metrics endpoint, runs a warm-up request, then
  // reports SERVING. Errors name the option or file at fault.
  absl::Status LoadModel();

  // Drains and stops (see above). `hurry`, when given, is polled during the grace period: when it
  // returns true the remaining requests are aborted at once (a second SIGTERM).
  void Drain(absl::Duration grace, const std::function<bool()>& hurry = nullptr);

  struct Impl;

 private:
  explicit LmserveServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_SERVICE_H_
