// The OpenAI-compatible HTTP API: the router that http_server.h calls, over the serving core
// (serving_core.h) that the gRPC service uses too. It only translates: JSON bodies into the API's
// requests (openai_api.h), checked and converted by request_convert.h, submitted as
// GenerationCalls; engine outputs into OpenAI's JSON, whole or as server-sent events.
//
// Routes:
//   POST /v1/completions, /v1/chat/completions   generation, plain or streamed (SSE)
//   GET  /v1/models                              the served model
//   GET  /health                                 200 when serving; 503 while starting or draining
//   POST /tokenize, /detokenize                  vLLM's
// Every route but /health needs the bearer token when --auth-token(-file) is set. Errors are
// OpenAI's error objects (openai_api.h) with their HTTP status.
//
// Streams: one event per engine output batch and choice (outputs that waited are merged), the
// chat's first event of a choice carrying the role; then the usage event when
// stream_options.include_usage asks, an error event when the request failed or a drain aborted it,
// and "data: [DONE]". A stream takes the engine's outputs only while its connection has room
// (HttpResponder::HasRoom): outputs of a slow reader wait in the engine's output stream, compact,
// and are merged into fewer events. A client that goes away aborts its requests (the engine frees
// their KV cache before its next step).
//
// Metrics: lmserve_http_requests_total{route, code} per answer (499: the client went away first);
// the request histograms carry front_end="http".

#ifndef LMSERVE_SERVER_OPENAI_ROUTES_H_
#define LMSERVE_SERVER_OPENAI_ROUTES_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "server/serving_core.h"

namespace lmserve::server {

class OpenAiRoutes {
 public:
  explicit OpenAiRoutes(ServingCore* core);

  // The HttpRouter (http_server.h).
  std::unique_ptr<HttpExchange> Handle(HttpRequest request, HttpResponder* responder);

  // Answers `error` (JSON), counted in the metrics under `route`.
  void RespondError(HttpResponder* responder, std::string_view route, const absl::Status& status);
  // Counts an answer in the metrics.
  void Count(std::string_view route, int http_status);

  ServingCore* core() const { return core_; }

 private:
  std::unique_ptr<HttpExchange> HandleGeneration(OpenAiEndpoint endpoint, std::string_view route,
                                                 const HttpRequest& request,
                                                 HttpResponder* responder);
  void HandleModels(std::string_view route, HttpResponder* responder);
  void HandleTokenize(std::string_view route, const HttpRequest& request, HttpResponder* responder);
  void HandleDetokenize(std::string_view route, const HttpRequest& request,
                        HttpResponder* responder);
  // NotFound naming "model" unless `model` is "" or the served model's name.
  absl::Status CheckModel(const std::string& model);

  ServingCore* const core_;
  const int64_t created_unix_seconds_;
};

// The metrics' route label of a request target: its path when it is one of the routes above,
// else "other" (so that the label's values stay few).
std::string_view HttpRouteLabel(std::string_view target);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_OPENAI_ROUTES_H_
