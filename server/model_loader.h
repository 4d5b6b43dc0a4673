// The composition root of `lmserve serve`: from a ServeConfig to a model ready to serve. It opens
// the checkpoint, chooses the backend (--backend auto: engine::ChooseAutoBackend, and the log says
// which and why), loads the tokenizer and chat template (ModelText), creates the runner, the engine
// and the metrics (with their HTTP endpoint), runs a warm-up request through every stage, and
// starts the poller that copies engine statistics into the metrics. The gRPC service (service.h)
// only serves what this builds.

#ifndef LMSERVE_SERVER_MODEL_LOADER_H_
#define LMSERVE_SERVER_MODEL_LOADER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/core/engine.h"
#include "lmserve/v1/lmserve.pb.h"
#include "server/metrics.h"
#include "server/model_text.h"
#include "server/request_convert.h"
#include "server/serve_config.h"

namespace lmserve::server {

class EngineStatsPoller;

// A loaded, warmed-up model. The fields are set once by LoadServingModel and read-only afterwards
// (the engine and the metrics are thread-safe themselves).
struct ServingModel {
  ServingModel();
  ~ServingModel();  // Shutdown()
  ServingModel(ServingModel&&) = delete;

  // Stops the statistics poller, then the engine (requests still running end with ABORT).
  // Idempotent.
  void Shutdown();

  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<ModelText> text;
  std::unique_ptr<Metrics> metrics;
  v1::ModelInfo info;                         // GetModelInfo's answer
  int32_t max_num_seqs = 1;                   // the engine's sequence slots (admission counts them)
  std::unique_ptr<EngineStatsPoller> poller;  // engine statistics into the metrics, every 10 ms
};

// Builds the model of `config` (see the file comment). `api_limits` bounds n and logprobs in the
// engine as the API does. Errors name the flag or file at fault. Logs the backend choice, the
// runner's figures, the metrics address and the load time.
absl::StatusOr<std::unique_ptr<ServingModel>> LoadServingModel(const ServeConfig& config,
                                                               const ApiLimits& api_limits);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_MODEL_LOADER_H_
