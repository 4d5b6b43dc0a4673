#include "server/serve_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "common/strings.h"

namespace lmserve::server {
namespace {

absl::StatusOr<int64_t> IntIn(const Args& args, std::string_view name, int64_t low, int64_t high) {
  absl::StatusOr<int64_t> value = args.GetInt(name);
  if (!value.ok()) return value.status();
  if (*value < low || *value > high) {
    return absl::InvalidArgumentError(
        StrCat("--", name, ": ", *value, " is not in [", low, ", ", high, "]"));
  }
  return *value;
}

absl::StatusOr<std::string> ReadSecretFile(std::string_view option, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(StrCat("--", option, ": cannot read ", path));
  std::stringstream contents;
  contents << file.rdbuf();
  std::string text = contents.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) {
    text.pop_back();
  }
  return text;
}

absl::Status CheckReadable(std::string_view option, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(StrCat("--", option, ": cannot read ", path));
  return absl::OkStatus();
}

}  // namespace

void AddServeOptions(Args* args) {
  args->Required("model", "a Hugging Face model directory or a .gguf file")
      .Option("tokenizer",
              "a tokenizer.json, a model directory or a .gguf file to take the tokenizer from "
              "(default: the model's own; without one, only token-id prompts are served)")
      .Option("chat-template",
              "the chat template for Chat calls: a built-in name (chatml, llama2, llama3, mistral, "
              "zephyr) or a .jinja / .json file (default: the model's own)")
      .Option("served-model-name", "the model name in responses and metrics (default: the model's)")
      .Option("backend", "auto (cuda when a GPU is present, else cpu), cpu or cuda", "auto")
      .Option("dtype",
              "the element type of weights, activations and KV cache: auto (bfloat16 on cuda, "
              "float32 on cpu), bfloat16 (cuda only) or float32 (on cuda: the CPU runner's "
              "numbers, at twice bfloat16's memory and well below its speed)",
              "auto")
      .Option("load-format",
              "auto (the checkpoint's weights) or dummy (random weights of the model's shapes, "
              "for benchmarks; --model may then be a config.json or its directory)",
              "auto")
      .Option("gpu-memory-utilization",
              "CUDA: the share of the GPU's memory lmserve may take (weights, KV cache, "
              "workspaces)",
              "0.9")
      .Flag("no-cuda-graphs", "CUDA: run decode steps eagerly instead of replaying CUDA graphs")
      .Option("threads", "CPU threads for matrix products and attention; 0: one per core", "0")
      .Option("host", "the address to listen on (0.0.0.0 or [::] for every interface)", "127.0.0.1")
      .Option("port", "the gRPC port; 0: any free port (logged)", "50051")
      .Option("metrics-port",
              "the port of the Prometheus /metrics HTTP endpoint; 0: any free port (logged); "
              "-1: none",
              "-1")
      .Option("max-request-bytes",
              "the largest request message accepted; larger ones get RESOURCE_EXHAUSTED",
              "4194304")
      .Option("max-num-seqs", "sequences the engine runs at once at most", "64")
      .Option("max-num-batched-tokens", "tokens one engine step computes at most", "2048")
      .Option("kv-cache-mb",
              "the KV cache's memory budget in MiB; auto: 512 on the CPU, on the GPU what "
              "--gpu-memory-utilization leaves",
              "auto")
      .Option("max-model-len", "the context length; 0: the model's", "0")
      .Flag("no-prefix-caching", "do not reuse the KV cache of shared prompt prefixes")
      .Option("seed", "seeds the random seeds of requests that bring none", "0")
      .Option("max-queued-requests",
              "requests waiting for the engine at most; beyond: RESOURCE_EXHAUSTED", "256")
      .Option("grace-period-s",
              "on SIGTERM or SIGINT, how long in-flight requests may run before they are aborted",
              "30")
      .Option("tls-cert", "serve TLS with this PEM certificate chain (needs --tls-key)")
      .Option("tls-key", "the PEM private key of --tls-cert")
      .Option("tls-client-ca", "require client certificates signed by this PEM CA (needs --tls-cert)")
      .Option("auth-token-file",
              "require 'authorization: Bearer <token>' metadata, the token read from this file "
              "(the health service stays open)")
      .Option("auth-token", "as --auth-token-file, the token given inline (visible in ps)")
      .Flag("debug-log-text", "log request prompts and outputs (off: never logged)");
}

absl::StatusOr<ServeConfig> ServeConfigFromArgs(const Args& args) {
  ServeConfig config;
  config.model_path = args.Get("model");
  config.tokenizer_path = args.Get("tokenizer");
  config.chat_template = args.Get("chat-template");
  config.served_model_name = args.Get("served-model-name");
  config.backend = args.Get("backend");
  if (config.backend != "auto" && config.backend != "cpu" && config.backend != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("--backend: '", config.backend, "' is not one of auto, cpu, cuda"));
  }
  const std::optional<engine::RunnerDType> dtype = engine::RunnerDTypeFromName(args.Get("dtype"));
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(
        StrCat("--dtype: '", args.Get("dtype"), "' is not one of auto, bfloat16, float32"));
  }
  config.dtype = *dtype;
  if (config.backend == "cpu" && config.dtype == engine::RunnerDType::kBFloat16) {
    return absl::InvalidArgumentError(
        "--dtype bfloat16: the CPU backend computes in float32 only (use auto or float32, or "
        "--backend cuda)");
  }
  const std::string load_format = args.Get("load-format");
  if (load_format != "auto" && load_format != "dummy") {
    return absl::InvalidArgumentError(
        StrCat("--load-format: '", load_format, "' is not one of auto, dummy"));
  }
  config.dummy_weights = load_format == "dummy";
  absl::StatusOr<double> utilization = args.GetDouble("gpu-memory-utilization");
  if (!utilization.ok()) return utilization.status();
  if (!(*utilization > 0.0 && *utilization <= 1.0)) {
    return absl::InvalidArgumentError(StrCat("--gpu-memory-utilization: ",
                                             args.Get("gpu-memory-utilization"),
                                             " is not in (0, 1]"));
  }
  config.gpu_memory_utilization = *utilization;
  config.cuda_graphs = !args.GetFlag("no-cuda-graphs");
  absl::StatusOr<int64_t> value = IntIn(args, "threads", 0, 1024);
  if (!value.ok()) return value.status();
  config.threads = static_cast<int32_t>(*value);

  config.host = args.Get("host");
  if (config.host.empty()) return absl::InvalidArgumentError("--host: empty");
  if (!(value = IntIn(args, "port", 0, 65535)).ok()) return value.status();
  config.port = static_cast<int32_t>(*value);
  if (!(value = IntIn(args, "metrics-port", -1, 65535)).ok()) return value.status();
  config.metrics_port = static_cast<int32_t>(*value);
  if (!(value = IntIn(args, "max-request-bytes", 1024, int64_t{1} << 30)).ok()) {
    return value.status();
  }
  config.max_request_bytes = *value;

  if (!(value = IntIn(args, "max-num-seqs", 1, 4096)).ok()) return value.status();
  config.max_num_seqs = static_cast<int32_t>(*value);
  if (!(value = IntIn(args, "max-num-batched-tokens", 1, 1 << 20)).ok()) return value.status();
  config.max_num_batched_tokens = static_cast<int32_t>(*value);
  if (args.Get("kv-cache-mb") == "auto") {
    config.kv_cache_bytes = 0;
  } else {
    if (!(value = IntIn(args, "kv-cache-mb", 1, int64_t{1} << 22)).ok()) return value.status();
    config.kv_cache_bytes = *value << 20;
  }
  if (!(value = IntIn(args, "max-model-len", 0, 1 << 24)).ok()) return value.status();
  config.max_model_len = static_cast<int32_t>(*value);
  config.enable_prefix_caching = !args.GetFlag("no-prefix-caching");
  if (!(value = IntIn(args, "seed", 0, std::numeric_limits<int64_t>::max())).ok()) {
    return value.status();
  }
  config.seed = static_cast<uint64_t>(*value);

  if (!(value = IntIn(args, "max-queued-requests", 0, 1 << 20)).ok()) return value.status();
  config.max_queued_requests = static_cast<int32_t>(*value);
  absl::StatusOr<double> grace = args.GetDouble("grace-period-s");
  if (!grace.ok()) return grace.status();
  if (!std::isfinite(*grace) || *grace < 0 || *grace > 86400) {
    return absl::InvalidArgumentError(
        StrCat("--grace-period-s: ", args.Get("grace-period-s"), " is not in [0, 86400]"));
  }
  config.grace_period_seconds = *grace;

  config.tls_cert_file = args.Get("tls-cert");
  config.tls_key_file = args.Get("tls-key");
  config.tls_client_ca_file = args.Get("tls-client-ca");
  if (config.tls_cert_file.empty() != config.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!config.tls_client_ca_file.empty() && config.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  for (const auto& [option, path] :
       {std::pair<std::string_view, const std::string*>{"tls-cert", &config.tls_cert_file},
        {"tls-key", &config.tls_key_file},
        {"tls-client-ca", &config.tls_client_ca_file}}) {
    if (absl::Status status = CheckReadable(option, *path); !status.ok()) return status;
  }
  if (args.Has("auth-token-file") && args.Has("auth-token")) {
    return absl::InvalidArgumentError("give one of --auth-token-file and --auth-token");
  }
  if (args.Has("auth-token-file")) {
    absl::StatusOr<std::string> token =
        ReadSecretFile("auth-token-file", args.Get("auth-token-file"));
    if (!token.ok()) return token.status();
    config.auth_token = *std::move(token);
    if (config.auth_token.empty()) {
      return absl::InvalidArgumentError("--auth-token-file: the file holds no token");
    }
  } else if (args.Has("auth-token")) {
    config.auth_token = args.Get("auth-token");
    if (config.auth_token.empty()) return absl::InvalidArgumentError("--auth-token: empty");
  }
  config.debug_log_text = args.GetFlag("debug-log-text");
  return config;
}

std::string DescribeServeConfig(const ServeConfig& config) {
  auto or_default = [](const std::string& value, std::string_view fallback) {
    return value.empty() ? std::string(fallback) : value;
  };
  return StrCat(
      "configuration:\n", "  model: ", config.model_path, "\n",
      "  tokenizer: ", or_default(config.tokenizer_path, "(the model's)"), "\n",
      "  chat template: ", or_default(config.chat_template, "(the model's)"), "\n",
      "  served model name: ", or_default(config.served_model_name, "(the model's)"), "\n",
      "  backend: ", config.backend, ", dtype: ", engine::RunnerDTypeName(config.dtype),
      ", threads: ", config.threads,
      ", load format: ", config.dummy_weights ? "dummy" : "auto",
      ", GPU memory utilization: ", config.gpu_memory_utilization,
      ", CUDA graphs: ", config.cuda_graphs ? "on" : "off", "\n",
      "  listen: ", config.host, ":", config.port, ", metrics port: ",
      config.metrics_port < 0 ? std::string("off") : StrCat(config.metrics_port), "\n",
      "  max request bytes: ", config.max_request_bytes, "\n",
      "  max num seqs: ", config.max_num_seqs,
      ", max num batched tokens: ", config.max_num_batched_tokens, "\n",
      "  KV cache: ",
      config.kv_cache_bytes == 0 ? std::string("auto") : StrCat(config.kv_cache_bytes >> 20, " MiB"),
      ", max model len: ",
      config.max_model_len == 0 ? std::string("(the model's)") : StrCat(config.max_model_len),
      ", prefix caching: ", config.enable_prefix_caching ? "on" : "off", ", seed: ", config.seed,
      "\n", "  max queued requests: ", config.max_queued_requests,
      ", grace period: ", config.grace_period_seconds, " s\n",
      "  TLS: ", config.tls_cert_file.empty() ? std::string("off") : StrCat("cert ", config.tls_cert_file, ", key ", config.tls_key_file),
      config.tls_client_ca_file.empty() ? std::string()
                                        : StrCat(", client CA ", config.tls_client_ca_file),
      "\n", "  auth: ", config.auth_token.empty() ? "off" : "bearer token (redacted)", "\n",
      "  debug log text: ", config.debug_log_text ? "ON (prompts and outputs are logged)" : "off");
}

}  // namespace lmserve::server
