// `lmserve serve`'s configuration: one typed struct, bound from the command line by CLI11
// (BindServeFlags), checked (the flags one at a time as they are read, then FinishServeConfig for
// what flags need together), and summarized for the start-up log (DescribeServeConfig).

#ifndef LMSERVE_SERVER_SERVE_CONFIG_H_
#define LMSERVE_SERVER_SERVE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/engine_core.h"
#include "engine/runner/model_runner.h"
#include "server/command_line.h"

namespace lmserve::server {

// The model and its text side.
struct ModelOptions {
  std::string path;               // --model: a Hugging Face directory or a .gguf file
  std::string tokenizer_path;     // "" : the model's own
  std::string chat_template;      // "" : the model's own; else a built-in name or a file
  std::string served_model_name;  // "" : from the checkpoint
  BackendFlag backend;  // --backend; nullopt: auto (cuda when this build supports the GPU)
};

// Listening, admission, shutdown and security.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int32_t port = 50051;        // 0: any free port (logged)
  int32_t metrics_port = -1;   // -1: no metrics endpoint; 0: any free port (logged)
  int32_t http_port = -1;      // the OpenAI-compatible HTTP API; -1: none; 0: any free port
  int32_t http_threads = 2;    // threads that run every HTTP connection
  double http_idle_timeout_seconds = 60;  // an idle keep-alive connection closes after this
  int64_t max_request_bytes = int64_t{4} << 20;
  // Requests in flight beyond the engine's --max-num-seqs sequence slots wait; a request that
  // would make more than this many wait gets RESOURCE_EXHAUSTED. -1: auto, kQueuedPerSeq *
  // max_num_seqs (FinishServeConfig resolves it).
  int32_t max_queued_requests = -1;
  double grace_period_seconds = 30.0;
  std::string tls_cert_file;       // PEM; with tls_key_file, serve TLS only
  std::string tls_key_file;        // PEM
  std::string tls_client_ca_file;  // PEM; require client certificates signed by it
  std::string auth_token_file;     // read into auth_token by FinishServeConfig
  std::string auth_token;          // "" : no auth. A secret: never logged.
  bool debug_log_text = false;     // log prompts and outputs
  // Chat roles served beside system, user, assistant and tool (--extra-chat-roles).
  std::vector<std::string> extra_chat_roles;
};

// serve's defaults for the runner where they differ from RunnerConfig's.
inline engine::RunnerConfig ServeRunnerDefaults() {
  engine::RunnerConfig runner;
  runner.kv_cache_bytes = 0;  // "auto": 512 MiB on the CPU; on the GPU, what
                              // gpu_memory_utilization leaves
  return runner;
}

// --max-step-slowdown: kAutoStepSlowdown in ServeConfig::engine until the model loader resolves
// it for the backend: kCpuStepSlowdown on the CPU (a prefill step there takes seconds), off on the
// GPU.
inline constexpr double kAutoStepSlowdown = -1.0;
inline constexpr double kCpuStepSlowdown = 2.0;

inline engine::EngineConfig ServeEngineDefaults() {
  engine::EngineConfig engine;
  engine.max_step_slowdown = kAutoStepSlowdown;
  engine.async_scheduling = true;  // where the runner can (the CUDA runner)
  return engine;
}

struct ServeConfig {
  ModelOptions model;
  // dtype, load_format, kv_cache_bytes, num_threads, gpu_memory_utilization, cuda_graphs,
  // fp32_residual, decode_gemm and cuda_kernel_path come from flags. The model loader sets the
  // rest: backend (model.backend resolved), max_num_seqs and max_num_batched_tokens (the engine's),
  // and kv_cache_bytes where it is 0 on the CPU.
  engine::RunnerConfig runner = ServeRunnerDefaults();
  // max_num_seqs, max_num_batched_tokens, max_model_len, enable_prefix_caching, seed and
  // max_step_slowdown come from flags; the model loader sets max_logprobs and max_n from the API's
  // limits, and max_step_slowdown for the backend where it is kAutoStepSlowdown.
  engine::EngineConfig engine = ServeEngineDefaults();
  ServerOptions server;
};

// --max-queued-requests auto: this many waiting requests per sequence slot (256 at the default
// --max-num-seqs 64).
inline constexpr int32_t kQueuedPerSeq = 4;

// The CPU runner's KV cache when --kv-cache-mb is auto.
inline constexpr int64_t kCpuAutoKvCacheBytes = int64_t{512} << 20;

// Declares every flag of `lmserve serve` on `command`, bound to `*config` (which must outlive the
// parse). Each flag's default is the field's value in `*config`; a bad value is a usage error that
// names the flag.
void BindServeFlags(CLI::App* command, ServeConfig* config);

// The runner's flags alone (part of BindServeFlags): adding a RunnerConfig option is one line here.
void BindRunnerFlags(CLI::App* command, engine::RunnerConfig* runner);

// After the parse: the checks that need several flags (--tls-cert with --tls-key, --backend with
// --dtype, one of --auth-token and --auth-token-file, files readable), and reads
// --auth-token-file into server.auth_token. Errors name the flags.
absl::Status FinishServeConfig(ServeConfig* config);

// Parses `args` (the arguments after `lmserve serve`) as the binary does, FinishServeConfig
// included. InvalidArgument with the usage error's message on bad flags; FailedPrecondition when
// the arguments ask for --help.
absl::StatusOr<ServeConfig> ParseServeFlags(const std::vector<std::string>& args);

// One line per setting, secrets redacted, for the start-up log.
std::string DescribeServeConfig(const ServeConfig& config);

// "host:port", with IPv6 hosts in brackets.
std::string ListenAddress(const std::string& host, int port);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_SERVE_CONFIG_H_
