#include "server/model_loader.h"

#include <filesystem>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "server/log.h"

namespace lmserve::server {

// Copies engine statistics into the metrics every 10 ms on a thread of its own, until Stop.
class EngineStatsPoller {
 public:
  EngineStatsPoller(engine::Engine* engine, Metrics* metrics)
      : thread_([this, engine, metrics] {
          while (true) {
            {
              absl::MutexLock lock(&mu_);
              if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(10))) return;
            }
            metrics->UpdateEngineStats(engine->Stats());
          }
        }) {}
  ~EngineStatsPoller() { Stop(); }

  // Idempotent. Returns once the thread has ended.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above
};

ServingModel::ServingModel() = default;

ServingModel::~ServingModel() { Shutdown(); }

void ServingModel::Shutdown() {
  if (poller != nullptr) poller->Stop();
  if (engine != nullptr) engine->Shutdown();
}

namespace {

std::string DefaultModelName(const engine::ModelConfig& config, const std::string& path) {
  if (!config.name.empty()) return config.name;
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name.empty() ? std::string("model") : name;
}

// The runner of `config` on `backend`: the flags' settings, the engine's step limits, and the
// CPU's KV cache size for --kv-cache-mb auto.
engine::RunnerConfig MakeRunnerConfig(const ServeConfig& config, engine::Backend backend) {
  engine::RunnerConfig runner = config.runner;
  runner.backend = backend;
  if (backend == engine::Backend::kCpu && runner.kv_cache_bytes == 0) {
    runner.kv_cache_bytes = kCpuAutoKvCacheBytes;
  }
  runner.max_num_seqs = config.engine.max_num_seqs;
  runner.max_context_len = config.engine.max_model_len;
  runner.max_num_batched_tokens = config.engine.max_num_batched_tokens;
  return runner;
}

void LogRunner(std::string_view backend, const engine::ModelRunner& runner) {
  const engine::RunnerStats stats = runner.stats();
  LogInfo("runner: ", backend, " in ", engine::RunnerDTypeName(stats.dtype),
          stats.quantization == engine::RunnerQuantization::kFp8 ? " (linear layers in FP8)"
          : stats.quantization != engine::RunnerQuantization::kNone
              ? StrCat(" (linear layers in GGUF blocks: ",
                       engine::RunnerQuantizationName(stats.quantization), ")")
              : std::string(),
          " on ", stats.device_name, ", weights ", stats.weight_bytes >> 20, " MiB, KV cache ",
          stats.kv_cache_dtype == engine::KvCacheDType::kFp8 ? "(FP8) " : "",
          stats.kv_cache_bytes >> 20, " MiB (", runner.num_kv_blocks(), " blocks of ",
          runner.block_size_tokens(), " tokens), ",
          stats.workspace_bytes > 0  // the CPU runner's grow with the batch
              ? StrCat("workspaces ", stats.workspace_bytes >> 20, " MiB, ")
              : std::string(),
          stats.num_cuda_graphs, " CUDA graphs",
          stats.cuda_kernels.empty() ? std::string() : StrCat(", ", stats.cuda_kernels),
          "; start-up took ", stats.startup_seconds, " s",
          stats.device_memory_total_bytes > 0
              ? StrCat("; GPU memory in use ", stats.device_memory_used_bytes >> 20, " of ",
                       stats.device_memory_total_bytes >> 20, " MiB")
              : std::string());
}

// One short request through every stage (prefill, sampling, decode), before SERVING.
absl::Status WarmUp(engine::Engine& engine, const engine::ModelConfig& model_config) {
  engine::Request warmup;
  warmup.prompt_token_ids = {model_config.bos_token_id.value_or(0),
                             static_cast<int32_t>(1 % model_config.vocab_size)};
  warmup.sampling.temperature = 0;
  warmup.sampling.max_tokens = 2;
  warmup.sampling.ignore_eos = true;
  absl::StatusOr<engine::RequestHandle> handle = engine.Submit(warmup);
  if (!handle.ok()) {
    return absl::InternalError(StrCat("warm-up request: ", handle.status().message()));
  }
  engine::RequestOutput output;
  while (handle->stream->Next(&output, absl::Minutes(10)) ==
         engine::OutputStream::NextResult::kOutput) {
    if (output.finished && output.finish_reason == engine::FinishReason::kError) {
      return absl::InternalError(StrCat("warm-up request failed: ", output.error));
    }
  }
  if (!handle->stream->finished()) return absl::InternalError("warm-up request: no answer");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServingModel>> Load(const ServeConfig& config,
                                                   const ApiLimits& api_limits) {
  const absl::Time load_start = absl::Now();
  const bool dummy_weights = config.runner.load_format == engine::LoadFormat::kDummy;
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      dummy_weights ? engine::OpenConfigOnlyCheckpoint(config.model.path)
                    : engine::OpenCheckpoint(config.model.path);
  if (!checkpoint.ok()) {
    return absl::InvalidArgumentError(StrCat("--model: ", checkpoint.status().message()));
  }
  const engine::ModelConfig model_config = (*checkpoint)->config();
  std::string reason;
  const engine::Backend backend = ResolveBackend(config.model.backend, &reason);
  const std::string_view backend_name = engine::BackendName(backend);
  if (!config.model.backend.has_value()) {
    LogInfo("--backend auto: serving on ", backend_name, ": ", reason);
  }

  std::string warning;
  LMSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelText> text,
      ModelText::Load(config.model.path, config.model.tokenizer_path, config.model.chat_template,
                      model_config.vocab_size, &warning, model_config.eos_token_ids));
  if (!warning.empty()) LogWarning(warning);

  LMSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::ModelRunner> runner,
      engine::ModelRunner::Create(**checkpoint, MakeRunnerConfig(config, backend)));
  LogRunner(backend_name, *runner);
  const engine::RunnerStats runner_stats = runner->stats();
  checkpoint->reset();  // the runner holds its own copy of the weights
  const int64_t kv_tokens = int64_t{runner->num_kv_blocks()} * runner->block_size_tokens();

  engine::EngineConfig engine_config = config.engine;
  if (engine_config.max_step_slowdown == kAutoStepSlowdown) {
    engine_config.max_step_slowdown = backend == engine::Backend::kCpu ? kCpuStepSlowdown : 0.0;
  }
  engine_config.max_logprobs = api_limits.max_logprobs;
  // The streams' readers are woken off the stepping thread (EngineConfig::emit_outputs_on_thread).
  engine_config.emit_outputs_on_thread = true;
  engine_config.max_n = api_limits.max_n;
  std::unique_ptr<engine::TextDecoder> decoder = text->NewTextDecoder();
  auto model = std::make_unique<ServingModel>();
  LMSERVE_ASSIGN_OR_RETURN(
      model->engine, engine::Engine::Create(std::move(runner), engine_config, std::move(decoder)));
  model->text = std::move(text);
  model->max_num_seqs = config.engine.max_num_seqs;

  const engine::RequestLimits& limits = model->engine->limits();
  v1::ModelInfo& info = model->info;
  info.set_name(config.model.served_model_name.empty()
                    ? DefaultModelName(model_config, config.model.path)
                    : config.model.served_model_name);
  info.set_architecture(model_config.architecture_name);
  info.set_context_length(limits.max_context_tokens);
  info.set_vocab_size(static_cast<int32_t>(limits.vocab_size));
  info.set_dtype(std::string(engine::RunnerDTypeName(runner_stats.dtype)));
  info.set_backend(std::string(backend_name));
  for (int32_t id : model_config.eos_token_ids) info.add_eos_token_ids(id);
  info.set_has_chat_template(model->text->has_chat_template());
  info.set_has_tokenizer(model->text->has_tokenizer());
  info.set_kv_cache_tokens(kv_tokens);

  const ServerOptions& server = config.server;
  LMSERVE_ASSIGN_OR_RETURN(model->metrics, Metrics::Create(server.host, server.metrics_port,
                                                           info.name(), limits.max_context_tokens,
                                                           config.engine.max_num_batched_tokens));
  model->metrics->SetRunnerStats(runner_stats);
  if (model->metrics->port() >= 0) {
    LogInfo("metrics on http://", ListenAddress(server.host, model->metrics->port()), "/metrics");
  }

  LMSERVE_RETURN_IF_ERROR(WarmUp(*model->engine, model_config));
  LogInfo("model ", info.name(), " (", info.architecture(), ", vocabulary ", info.vocab_size(),
          ", context ", info.context_length(), ", KV cache ", kv_tokens,
          " tokens, tokenizer: ", info.has_tokenizer() ? "yes" : "no", ") loaded and warmed up in ",
          absl::ToDoubleSeconds(absl::Now() - load_start), " s");
  model->poller = std::make_unique<EngineStatsPoller>(model->engine.get(), model->metrics.get());
  return model;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServingModel>> LoadServingModel(const ServeConfig& config,
                                                               const ApiLimits& api_limits) {
  // The runners refuse what their memory plan shows will not fit; this is the last resort for an
  // allocation that fails anyway (the plan is a floor), so that the process exits with a message.
  try {
    return Load(config, api_limits);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory while loading the model: a smaller --kv-cache-mb or "
        "--max-num-batched-tokens, or a smaller model, may fit");
  }
}

}  // namespace lmserve::server
