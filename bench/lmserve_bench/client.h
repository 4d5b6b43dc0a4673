// The transports the load generator drives: the lmserve gRPC API (grpc_client.cc) and an
// OpenAI-compatible HTTP streaming endpoint (http_client.cc). Both are asynchronous: Start()
// returns at once and the request runs on the transport's own threads.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_CLIENT_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/lmserve_bench/dataset.h"
#include "bench/lmserve_bench/stats.h"

namespace lmserve::bench {

// Seconds on the steady clock; every timestamp of a RequestRecord is on it.
double NowSeconds();

struct ClientOptions {
  std::string target;  // gRPC: HOST:PORT. HTTP: the base URL, e.g. http://127.0.0.1:8000
  std::string endpoint = "/v1/completions";  // HTTP only
  std::string model;  // HTTP: the "model" field; "": the first model GET /v1/models lists
  bool return_token_ids = true;  // HTTP: ask for token ids in the stream (vLLM's extension)
  std::string token;                         // a bearer token, "" for none
  double temperature = 0;    // greedy by default: output lengths and work per token do not vary
  bool ignore_eos = true;    // so that output lengths are what the dataset asks for
  int32_t num_channels = 4;  // gRPC: connections requests are spread over (round-robin)
  double request_timeout_seconds = 0;  // 0: none
};

// The error of a request that CancelAll() ended.
inline constexpr char kCancelledByClient[] = "cancelled by the client";

// How the output tokens of a stream were counted.
enum class TokenCounting {
  kTokenIds,  // the stream carries token ids (lmserve gRPC; HTTP servers that send token_ids)
  kUsage,     // the stream's final usage.completion_tokens (chunks only time the ITL)
  kChunks,    // neither: one token per non-empty text chunk
};
std::string TokenCountingName(TokenCounting counting);

// Start() and CancelAll() are called from one thread (the load generator's); `done` callbacks
// run on the transport's threads.
class Client {
 public:
  virtual ~Client() = default;

  // Waits until the server is ready (gRPC health SERVING; HTTP: GET of the base URL's /health or
  // /v1/models answers 200), up to `timeout_seconds`.
  virtual absl::Status WaitReady(double timeout_seconds) = 0;

  // The model's vocabulary size, for synthetic token-id prompts; Unimplemented where the transport
  // cannot ask (HTTP: /v1/models' vocab_size, an lmserve extension).
  virtual absl::StatusOr<int32_t> VocabSize() = 0;

  // The model the requests name: HTTP: ClientOptions::model, else the first one GET /v1/models
  // lists (asked once); gRPC: "" (the server serves one model).
  virtual absl::StatusOr<std::string> Model() = 0;

  // Sends one streaming request. `done` runs exactly once, on a transport thread, with what the
  // client saw. Records' times are NowSeconds(); send_time is taken here.
  virtual void Start(const Prompt& prompt, std::function<void(RequestRecord)> done) = 0;

  // Cancels every request in flight; their `done` still runs (success false, error
  // kCancelledByClient).
  virtual void CancelAll() = 0;

  // The most precise counting any finished stream used so far.
  virtual TokenCounting token_counting() const = 0;
};

absl::StatusOr<std::unique_ptr<Client>> CreateGrpcClient(const ClientOptions& options);
absl::StatusOr<std::unique_ptr<Client>> CreateHttpClient(const ClientOptions& options);

// GET `url` (libcurl), for scraping /metrics and reading /v1/models; `token`, when given, is sent
// as a bearer token. Fails on transport errors and non-200 statuses.
absl::StatusOr<std::string> HttpGet(const std::string& url, double timeout_seconds,
                                    const std::string& token = "");

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_CLIENT_H_
