// `lmserve serve`'s configuration: its flags, their checks, and the start-up summary.

#ifndef LMSERVE_SERVER_SERVE_CONFIG_H_
#define LMSERVE_SERVER_SERVE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"
#include "server/args.h"

namespace lmserve::server {

struct ServeConfig {
  // The model.
  std::string model_path;         // a Hugging Face directory or a .gguf file
  std::string tokenizer_path;     // "" : the model's own
  std::string chat_template;      // "" : the model's own; else a built-in name or a file
  std::string served_model_name;  // "" : from the checkpoint
  std::string backend = "auto";   // "auto" (cuda when a GPU is present), "cpu" or "cuda"
  // Weights, activations, KV cache: kAuto (bfloat16 on cuda, float32 on the CPU), kBFloat16
  // (cuda only) or kFloat32.
  engine::RunnerDType dtype = engine::RunnerDType::kAuto;
  bool dummy_weights = false;     // --load-format dummy: random weights of the model's shapes
  double gpu_memory_utilization = 0.9;  // CUDA: the share of the GPU's memory lmserve may hold
  bool cuda_graphs = true;
  int32_t threads = 0;            // CPU threads; 0: one per core

  // Listening.
  std::string host = "127.0.0.1";
  int32_t port = 50051;        // 0: any free port (logged)
  int32_t metrics_port = -1;   // -1: no metrics endpoint; 0: any free port (logged)
  int64_t max_request_bytes = int64_t{4} << 20;

  // The engine.
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int64_t kv_cache_bytes = 0;  // 0 ("auto"): 512 MiB on the CPU; on the GPU, what
                               // gpu_memory_utilization leaves
  int32_t max_model_len = 0;  // 0: the model's context length
  bool enable_prefix_caching = true;
  uint64_t seed = 0;

  // Admission and shutdown.
  int32_t max_queued_requests = 256;  // waiting requests beyond this get RESOURCE_EXHAUSTED
  double grace_period_seconds = 30.0;

  // Security.
  std::string tls_cert_file;       // PEM; with tls_key_file, serve TLS only
  std::string tls_key_file;        // PEM
  std::string tls_client_ca_file;  // PEM; require client certificates signed by it
  std::string auth_token;          // "" : no auth. A secret: never logged.

  bool debug_log_text = false;  // log prompts and outputs
};

// Declares serve's options on `args`.
void AddServeOptions(Args* args);

// Reads and checks the parsed options. Errors name the option. Reads --auth-token-file.
absl::StatusOr<ServeConfig> ServeConfigFromArgs(const Args& args);

// One line per setting, secrets redacted, for the start-up log.
std::string DescribeServeConfig(const ServeConfig& config);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_SERVE_CONFIG_H_
