// The lmserve server: two front ends over one loaded model (model_loader.h) and its engine, sharing
// the serving core (serving_core.h: state, admission, the calls in flight, request metrics):
// - gRPC: the lmserve.v1.Lmserve service, the standard grpc.health.v1.Health service and server
//   reflection (this file's service.cc);
// - with --http-port, the OpenAI-compatible HTTP API (openai_routes.h over http_server.h).
// Both translate: requests into engine requests (request_convert.h), engine outputs into
// responses; absl::Status becomes a grpc::Status here (the one place) and an HTTP status in
// openai_api.h. They build nothing.
//
// Life cycle:
//   Start      binds the ports; health NOT_SERVING (HTTP /health 503); calls get UNAVAILABLE (503).
//   Serve      takes the loaded, warmed-up model: reports SERVING and admits requests.
//   Drain      (SIGTERM/SIGINT) stops admitting (UNAVAILABLE / 503, health NOT_SERVING), lets
//              in-flight requests finish within the grace period, aborts the rest (their streams
//              end with finish_reason ABORT and status UNAVAILABLE, or an HTTP error event), then
//              closes the HTTP connections and stops the servers and the model (its statistics
//              poller and engine).
//
// gRPC calls run on gRPC's callback API: no thread waits on a request. The engine thread signals
// new outputs through OutputStream::SetListener; one server thread (the "pump") turns them into
// responses and starts the writes, so each call's state is touched by one thread at a time. HTTP
// connections run on the HTTP server's few threads, each on its own strand.
//
// Thread safety: Start, Serve and Drain are called by one thread (the main thread).

#ifndef LMSERVE_SERVER_SERVICE_H_
#define LMSERVE_SERVER_SERVICE_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/model_loader.h"
#include "server/request_convert.h"
#include "server/serve_config.h"

namespace lmserve::server {

class LmserveServer {
 public:
  // Binds options.host:options.port (TLS when configured) and starts answering. Fails when the
  // port cannot be bound or a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<LmserveServer>> Start(const ServerOptions& options);
  ~LmserveServer();  // Drain(0) when not drained yet

  LmserveServer(const LmserveServer&) = delete;
  LmserveServer& operator=(const LmserveServer&) = delete;

  int port() const;
  // The HTTP API's port; -1 without --http-port.
  int http_port() const;
  // The metrics port; -1 when metrics are not served or the model is not loaded yet.
  int metrics_port() const;

  // The bounds the API puts on requests (LoadServingModel sizes the engine's limits by them).
  const ApiLimits& api_limits() const;

  // Serves `model` (loaded and warmed up): reports SERVING. Call once, before Drain.
  void Serve(std::unique_ptr<ServingModel> model);

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
