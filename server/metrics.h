// Prometheus metrics, with vLLM's names and meanings under the prefix lmserve_, and a model_name
// label on every series. Served over HTTP at /metrics by prometheus-cpp when a port is given.
//
// Request metrics are recorded by the front ends (serving_core.h) as outputs are delivered, the
// request histograms labelled by front end (front_end="grpc" or "http"); engine metrics (load, KV
// cache, prefix cache, preemptions, steps) come from EngineStats snapshots taken every few
// milliseconds. A snapshot covering several steps adds that many observations to the step
// histograms at their mean (count and sum stay exact).
//
// Thread safety: every method may be called from any thread.

#ifndef LMSERVE_SERVER_METRICS_H_
#define LMSERVE_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/core/engine_core.h"
#include "engine/core/request.h"

namespace lmserve::server {

// The API a request came through: the request histograms carry it as the label front_end.
enum class FrontEnd : int { kGrpc = 0, kHttp = 1 };
inline constexpr int kNumFrontEnds = 2;
// "grpc" or "http".
std::string_view FrontEndName(FrontEnd front_end);

// What the service knows of a request when its last choice ends.
struct FinishedRequestStats {
  int32_t prompt_tokens = 0;
  int32_t generation_tokens = 0;  // over every choice
  bool has_first_token = false;
  engine::RequestTimings timings;  // queue: the earliest choice's; first token: earliest; finish: latest
};

// The /metrics HTTP endpoint's worker threads, and how long a worker waits for a connection's
// request before closing it: a client that connects and sends nothing (or dribbles) holds one
// worker at most that long, and scrapes go on through the others.
inline constexpr int kMetricsHttpWorkers = 8;
inline constexpr int kMetricsRequestTimeoutMs = 2000;

class Metrics {
 public:
  // `metrics_port` < 0: metrics are kept but not served. 0: any free port. Fails when the port
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& host, int metrics_port,
                                                         const std::string& model_name,
                                                         int32_t max_model_len,
                                                         int32_t max_num_batched_tokens);
  ~Metrics();

  // The bound port; -1 when not served.
  int port() const;

  void ObserveTimeToFirstToken(FrontEnd front_end, double seconds);
  void ObserveInterTokenLatency(FrontEnd front_end, double seconds);
  void AddGenerationTokens(int64_t count);
  void AddPromptTokens(int64_t count);
  // One choice ended.
  void CountFinishedChoice(engine::FinishReason reason);
  // The whole request ended (every choice).
  void ObserveFinishedRequest(FrontEnd front_end, const FinishedRequestStats& stats);
  // A gRPC call ended with `code` (grpc::StatusCode's name, e.g. "OK", "INVALID_ARGUMENT").
  void CountRpc(std::string_view method, std::string_view code);
  // An HTTP request was answered with `status_code` on `route` ("/v1/completions", ...; "other"
  // for unknown paths, so that the label's values stay few).
  void CountHttpRequest(std::string_view route, int status_code);

  // The runner's memory and start-up figures (once, after start-up).
  void SetRunnerStats(const engine::RunnerStats& stats);

  // Engine statistics: gauges and the deltas of its cumulative counters since the last update.
  void UpdateEngineStats(const engine::EngineStats& stats);

  struct Impl;

 private:
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The finished_reason label of a finish reason: "stop", "length", "abort" or "error" (vLLM's).
std::string_view FinishedReasonLabel(engine::FinishReason reason);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_METRICS_H_
