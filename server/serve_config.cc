#include "server/serve_config.h"

#include <cmath>
#include <exception>
#include <utility>

#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "server/request_convert.h"

namespace lmserve::server {
namespace {

constexpr char kModelGroup[] = "Model";
constexpr char kRunnerGroup[] = "Runner";
constexpr char kEngineGroup[] = "Engine";
constexpr char kServerGroup[] = "Server";

void BindModelFlags(CLI::App* command, ModelOptions* model) {
  AddStringFlag(command, "--model", &model->path, "a Hugging Face model directory or a .gguf file")
      ->required()
      ->group(kModelGroup);
  AddStringFlag(command, "--tokenizer", &model->tokenizer_path,
                "a tokenizer.json, a model directory or a .gguf file to take the tokenizer from "
                "(default: the model's own; without one, only token-id prompts are served)")
      ->group(kModelGroup);
  AddStringFlag(command, "--chat-template", &model->chat_template,
                "the chat template for Chat calls: a built-in name (chatml, llama2, llama3, "
                "mistral, zephyr) or a .jinja / .json file (default: the model's own)")
      ->group(kModelGroup);
  AddStringFlag(command, "--served-model-name", &model->served_model_name,
                "the model name in responses and metrics (default: the model's)")
      ->group(kModelGroup);
  AddBackendFlag(command, &model->backend,
                 "auto (cuda when this build supports the GPU, else cpu; the start-up log says "
                 "which and why), cpu or cuda")
      ->group(kModelGroup);
}

void BindEngineFlags(CLI::App* command, engine::EngineConfig* engine) {
  AddIntFlag(command, "--max-num-seqs", &engine->max_num_seqs,
             "sequences the engine runs at once at most", 1, 4096)
      ->group(kEngineGroup);
  AddIntFlag(command, "--max-num-batched-tokens", &engine->max_num_batched_tokens,
             "tokens one engine step computes at most", 1, 1 << 20)
      ->group(kEngineGroup);
  AddIntFlag(command, "--max-model-len", &engine->max_model_len,
             "the context length; 0: the model's", 0, 1 << 24)
      ->group(kEngineGroup);
  AddNegatedFlag(command, "--no-prefix-caching", &engine->enable_prefix_caching,
                 "do not reuse the KV cache of shared prompt prefixes")
      ->group(kEngineGroup);
  AddNegatedFlag(command, "--no-async-scheduling", &engine->async_scheduling,
                 "finish each step before scheduling the next (by default the next step is "
                 "launched while the GPU runs this one)")
      ->group(kEngineGroup);
  AddIntFlag(command, "--seed", &engine->seed, "seeds the random seeds of requests that bring none",
             0, std::numeric_limits<int64_t>::max())
      ->group(kEngineGroup);
  command
      ->add_option_function<std::string>(
          "--max-step-slowdown",
          [engine](const std::string& text) {
            if (text == "auto") {
              engine->max_step_slowdown = kAutoStepSlowdown;
              return;
            }
            if (text == "off") {
              engine->max_step_slowdown = 0;
              return;
            }
            double factor = 0;
            size_t used = 0;
            try {
              factor = std::stod(text, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used != text.size() || !std::isfinite(factor) || factor < 1 || factor > 1e6) {
              throw CLI::ValidationError("--max-step-slowdown",
                                         StrCat("'", text, "' is not auto, off or a factor >= 1"));
            }
            engine->max_step_slowdown = factor;
          },
          StrCat("while sequences decode, a step that also prefills takes at most this many times "
                 "a decode-only step (measured; long prompts are prefilled in chunks sized to "
                 "fit), so a long prompt does not stall other streams; auto: ",
                 kCpuStepSlowdown, " on the CPU, off on the GPU; off: the token budget alone"))
      ->type_name("FACTOR|auto|off")
      ->default_str("auto")
      ->group(kEngineGroup);
}

void BindServerFlags(CLI::App* command, ServerOptions* server) {
  AddStringFlag(command, "--host", &server->host,
                "the address to listen on (0.0.0.0 or [::] for every interface)")
      ->check([](const std::string& host) { return host.empty() ? "empty" : ""; })
      ->group(kServerGroup);
  AddIntFlag(command, "--port", &server->port, "the gRPC port; 0: any free port (logged)", 0, 65535)
      ->group(kServerGroup);
  AddIntFlag(command, "--metrics-port", &server->metrics_port,
             "the port of the Prometheus /metrics HTTP endpoint; 0: any free port (logged); -1: "
             "none",
             -1, 65535)
      ->group(kServerGroup);
  AddIntFlag(command, "--http-port", &server->http_port,
             "the port of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
             "/v1/models, /health, /tokenize, /detokenize); 0: any free port (logged); -1: none",
             -1, 65535)
      ->group(kServerGroup);
  AddIntFlag(command, "--http-threads", &server->http_threads,
             "threads that run every HTTP connection (asynchronous: not one per connection)", 1,
             256)
      ->group(kServerGroup);
  AddDoubleFlag(command, "--http-idle-timeout-s", &server->http_idle_timeout_seconds,
                "an HTTP connection closes when no request arrives whole within this (idle "
                "keep-alive connections), or when a response's write makes no progress for as "
                "long (a reader that stopped reading)",
                [](double seconds) {
                  return std::isfinite(seconds) && seconds > 0 && seconds <= 86400
                             ? ""
                             : "is not in (0, 86400]";
                })
      ->group(kServerGroup);
  AddIntFlag(command, "--max-request-bytes", &server->max_request_bytes,
             "the largest request message accepted; larger ones get RESOURCE_EXHAUSTED (HTTP: 413)",
             1024, int64_t{1} << 30)
      ->group(kServerGroup);
  command
      ->add_option_function<std::string>(
          "--max-queued-requests",
          [server](const std::string& text) {
            server->max_queued_requests =
                text == "auto"
                    ? -1
                    : static_cast<int32_t>(ParseIntFlag("--max-queued-requests", text, 0, 1 << 20));
          },
          StrCat("requests that may wait for one of the engine's --max-num-seqs sequence slots "
                 "(requests in flight beyond them); beyond: RESOURCE_EXHAUSTED. auto: ",
                 kQueuedPerSeq, " per sequence slot"))
      ->type_name("N|auto")
      ->default_str(server->max_queued_requests < 0 ? "auto" : StrCat(server->max_queued_requests))
      ->group(kServerGroup);
  AddDoubleFlag(command, "--grace-period-s", &server->grace_period_seconds,
                "on SIGTERM or SIGINT, how long in-flight requests may run before they are "
                "aborted",
                [](double seconds) {
                  return std::isfinite(seconds) && seconds >= 0 && seconds <= 86400
                             ? ""
                             : "is not in [0, 86400]";
                })
      ->group(kServerGroup);
  AddStringFlag(command, "--tls-cert", &server->tls_cert_file,
                "serve TLS with this PEM certificate chain (needs --tls-key)")
      ->group(kServerGroup);
  AddStringFlag(command, "--tls-key", &server->tls_key_file, "the PEM private key of --tls-cert")
      ->group(kServerGroup);
  AddStringFlag(command, "--tls-client-ca", &server->tls_client_ca_file,
                "require client certificates signed by this PEM CA (needs --tls-cert)")
      ->group(kServerGroup);
  CLI::Option* token_file =
      AddStringFlag(command, "--auth-token-file", &server->auth_token_file,
                    "require 'authorization: Bearer <token>' metadata (HTTP: header), the token "
                    "read from this file (the health service and HTTP /health stay open)")
          ->check([](const std::string& path) { return path.empty() ? "empty" : ""; })
          ->group(kServerGroup);
  AddStringFlag(command, "--auth-token", &server->auth_token,
                "as --auth-token-file, the token given inline (visible in ps)")
      ->check([](const std::string& token) { return token.empty() ? "empty" : ""; })
      ->excludes(token_file)
      ->group(kServerGroup);
  command
      ->add_option_function<std::string>(
          "--extra-chat-roles",
          [server](const std::string& text) {
            server->extra_chat_roles.clear();
            for (std::string_view role : StrSplit(text, ',')) {
              server->extra_chat_roles.emplace_back(role);
            }
          },
          "chat message roles served beside system, user, assistant and tool, comma-separated "
          "(ASCII letters, digits, '_' and '-'; e.g. developer,ipython); other roles get "
          "INVALID_ARGUMENT")
      ->type_name("ROLE,...")
      ->group(kServerGroup);
  AddBoolFlag(command, "--debug-log-text", &server->debug_log_text,
              "log request prompts and outputs (off: never logged)")
      ->group(kServerGroup);
}

absl::Status CheckReadable(std::string_view flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(StrCat("--", flag, ": ", contents.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace

void BindRunnerFlags(CLI::App* command, engine::RunnerConfig* runner) {
  AddDtypeFlag(command, &runner->dtype,
               "the element type of weights, activations and KV cache: auto (bfloat16 on cuda, "
               "native on cpu), native (cpu only: weights stay in the checkpoint's types, GGUF "
               "blocks or bfloat16, with int8 activations for quantized ones), bfloat16 (cuda "
               "only) or float32 (every weight converted: on cpu the reference path, on cuda the "
               "CPU reference's numbers at twice bfloat16's memory)")
      ->group(kRunnerGroup);
  AddChoiceFlag<engine::RunnerQuantization>(
      command, "--quantization", &runner->quantization, engine::RunnerQuantizationFromName,
      "auto, none, fp8, gguf, q8_0, q4_0, q4_k, q6_k",
      std::string(engine::RunnerQuantizationName(runner->quantization)),
      "the linear layers' weights: auto (the checkpoint's: an FP8 checkpoint in FP8 on a GPU of "
      "compute capability 8.9+, dequantized elsewhere; GGUF blocks dequantized), none (the "
      "--dtype; FP8 checkpoints and GGUF blocks dequantized), fp8 (cuda in bfloat16 on compute "
      "capability 8.9+ only: E4M3 weights with a scale per output channel, a bfloat16 "
      "checkpoint quantized at load; embeddings, norms, the LM head and experts stay bfloat16), "
      "gguf (cuda in bfloat16: a GGUF checkpoint's Q8_0, Q4_0, Q4_K and Q6_K linear layers kept "
      "in their blocks, a quarter to a half of the memory; faster decode at 1-8 sequences, "
      "slower beyond for now) or q8_0, q4_0, q4_k, q6_k (cuda with --load-format dummy only: "
      "dummy weights in that GGUF block type)")
      ->group(kRunnerGroup);
  AddChoiceFlag<engine::KvCacheDType>(
      command, "--kv-cache-dtype", &runner->kv_cache_dtype, engine::KvCacheDTypeFromName,
      "auto, bf16, fp8", std::string(engine::KvCacheDTypeName(runner->kv_cache_dtype)),
      "the KV cache's element type: auto (the --dtype's), bf16 (cuda in bfloat16: the same as "
      "auto) or fp8 (cuda in bfloat16 on compute capability 8.9+ only: E4M3 keys and values with "
      "a scale per layer, the checkpoint's k_scale / v_scale or 1.0; twice the tokens in the same "
      "memory)")
      ->group(kRunnerGroup);
  AddChoiceFlag<engine::LoadFormat>(
      command, "--load-format", &runner->load_format,
      [](std::string_view name) -> std::optional<engine::LoadFormat> {
        if (name == "auto") return engine::LoadFormat::kCheckpoint;
        if (name == "dummy") return engine::LoadFormat::kDummy;
        return std::nullopt;
      },
      "auto, dummy", runner->load_format == engine::LoadFormat::kDummy ? "dummy" : "auto",
      "auto (the checkpoint's weights) or dummy (random weights of the model's shapes, for "
      "benchmarks; --model may then be a config.json or its directory)")
      ->group(kRunnerGroup);
  command
      ->add_option_function<std::string>(
          "--kv-cache-mb",
          [runner](const std::string& text) {
            runner->kv_cache_bytes =
                text == "auto" ? 0 : ParseIntFlag("--kv-cache-mb", text, 1, int64_t{1} << 22) << 20;
          },
          "the KV cache's memory budget in MiB; auto: 512 on the CPU, on the GPU what "
          "--gpu-memory-utilization leaves")
      ->type_name("MIB|auto")
      ->default_str(runner->kv_cache_bytes == 0 ? "auto" : StrCat(runner->kv_cache_bytes >> 20))
      ->group(kRunnerGroup);
  AddThreadsFlag(command, &runner->num_threads)->group(kRunnerGroup);
  AddIntFlag(command, "--tensor-parallel-size", &runner->tensor_parallel_size,
             "split the model over this many GPUs (--backend cuda: devices 0 .. N-1) with NCCL, "
             "or over this many CPU shards (the CPU twin, for tests); it must divide the model's "
             "attention and KV heads and MLP widths",
             1, 64)
      ->group(kRunnerGroup);
  AddDoubleFlag(command, "--gpu-memory-utilization", &runner->gpu_memory_utilization,
                "CUDA: the share of the GPU's memory lmserve may take (weights, KV cache, "
                "workspaces)",
                [](double share) { return share > 0.0 && share <= 1.0 ? "" : "is not in (0, 1]"; })
      ->group(kRunnerGroup);
  AddNegatedFlag(command, "--no-cuda-graphs", &runner->cuda_graphs,
                 "CUDA: run decode steps eagerly instead of replaying CUDA graphs")
      ->group(kRunnerGroup);
  AddBoolFlag(command, "--structured-output-on-device", &runner->device_token_bitmask,
              "CUDA: sample structured output's masked rows on the GPU (the host's token "
              "bitmasks, computed while the forward pass runs, applied by a kernel before the "
              "sampler); on by default, =false brings their logits to the host to be masked and "
              "sampled there")
      ->group(kRunnerGroup);
  AddNegatedFlag(command, "--no-fp32-residual", &runner->fp32_residual,
                 "CUDA in bfloat16: hold the residual stream in bf16 too instead of fp32 (it is "
                 "then rounded at every residual add)")
      ->group(kRunnerGroup);
  AddChoiceFlag<engine::DecodeGemm>(
      command, "--decode-gemm", &runner->decode_gemm, engine::DecodeGemmFromName,
      "auto, blas, skinny", std::string(engine::DecodeGemmName(runner->decode_gemm)),
      "CUDA: the GEMM of steps of up to 8 tokens: auto (the faster of cuBLASLt and the skinny "
      "kernel, timed at start-up), blas or skinny")
      ->group(kRunnerGroup);
  AddChoiceFlag<engine::CudaKernelPath>(
      command, "--cuda-kernel-path", &runner->cuda_kernel_path, engine::CudaKernelPathFromName,
      "auto, portable", std::string(engine::CudaKernelPathName(runner->cuda_kernel_path)),
      "CUDA: the kernels' code path: auto (Hopper's bulk copies and programmatic dependent "
      "launch on compute capability 9.0 and newer, the portable sm_80 path below it) or "
      "portable (the portable path on every GPU)")
      ->group(kRunnerGroup);
}

void BindServeFlags(CLI::App* command, ServeConfig* config) {
  BindModelFlags(command, &config->model);
  BindRunnerFlags(command, &config->runner);
  BindEngineFlags(command, &config->engine);
  BindServerFlags(command, &config->server);
}

absl::Status FinishServeConfig(ServeConfig* config) {
  LMSERVE_RETURN_IF_ERROR(CheckBackendAndDtype(config->model.backend, config->runner.dtype));
  ServerOptions& server = config->server;
  if (server.max_queued_requests < 0) {
    server.max_queued_requests = kQueuedPerSeq * config->engine.max_num_seqs;
  }
  if (server.tls_cert_file.empty() != server.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!server.tls_client_ca_file.empty() && server.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  for (const std::string& role : server.extra_chat_roles) {
    if (absl::Status status = CheckChatRoleName(role); !status.ok()) {
      return absl::InvalidArgumentError(StrCat("--extra-chat-roles: ", status.message()));
    }
  }
  LMSERVE_RETURN_IF_ERROR(CheckReadable("tls-cert", server.tls_cert_file));
  LMSERVE_RETURN_IF_ERROR(CheckReadable("tls-key", server.tls_key_file));
  LMSERVE_RETURN_IF_ERROR(CheckReadable("tls-client-ca", server.tls_client_ca_file));
  if (!server.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(server.auth_token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(StrCat("--auth-token-file: ", token.status().message()));
    }
    while (!token->empty() &&
           (token->back() == '\n' || token->back() == '\r' || token->back() == ' ')) {
      token->pop_back();
    }
    if (token->empty()) {
      return absl::InvalidArgumentError("--auth-token-file: the file holds no token");
    }
    server.auth_token = *std::move(token);
  }
  return absl::OkStatus();
}

absl::StatusOr<ServeConfig> ParseServeFlags(const std::vector<std::string>& args) {
  ServeConfig config;
  CLI::App command("lmserve serve", "lmserve serve");
  UseCommandLineConventions(&command);
  BindServeFlags(&command, &config);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    command.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return absl::FailedPreconditionError("--help");
  } catch (const CLI::ParseError& error) {
    return absl::InvalidArgumentError(error.what());
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(StrCat("bad command line: ", error.what()));
  }
  LMSERVE_RETURN_IF_ERROR(FinishServeConfig(&config));
  return config;
}

std::string DescribeServeConfig(const ServeConfig& config) {
  auto or_default = [](const std::string& value, std::string_view fallback) {
    return value.empty() ? std::string(fallback) : value;
  };
  const ModelOptions& model = config.model;
  const engine::RunnerConfig& runner = config.runner;
  const engine::EngineConfig& engine = config.engine;
  const ServerOptions& server = config.server;
  return StrCat(
      "configuration:\n", "  model: ", model.path, "\n",
      "  tokenizer: ", or_default(model.tokenizer_path, "(the model's)"), "\n",
      "  chat template: ", or_default(model.chat_template, "(the model's)"), "\n",
      "  served model name: ", or_default(model.served_model_name, "(the model's)"), "\n",
      "  backend: ", BackendFlagName(model.backend),
      ", dtype: ", engine::RunnerDTypeName(runner.dtype),
      ", quantization: ", engine::RunnerQuantizationName(runner.quantization),
      ", KV cache dtype: ", engine::KvCacheDTypeName(runner.kv_cache_dtype),
      ", threads: ", runner.num_threads,
      ", load format: ", runner.load_format == engine::LoadFormat::kDummy ? "dummy" : "auto",
      ", GPU memory utilization: ", runner.gpu_memory_utilization,
      ", CUDA graphs: ", runner.cuda_graphs ? "on" : "off",
      ", fp32 residual: ", runner.fp32_residual ? "on" : "off",
      ", decode GEMM: ", engine::DecodeGemmName(runner.decode_gemm),
      ", CUDA kernel path: ", engine::CudaKernelPathName(runner.cuda_kernel_path),
      ", tensor parallel size: ", runner.tensor_parallel_size, "\n", "  listen: ", server.host, ":",
      server.port, ", metrics port: ",
      server.metrics_port < 0 ? std::string("off") : StrCat(server.metrics_port),
      ", HTTP port: ",
      server.http_port < 0 ? std::string("off")
                           : StrCat(server.http_port, " (", server.http_threads,
                                    " threads, idle timeout ", server.http_idle_timeout_seconds,
                                    " s)"),
      "\n",
      "  max request bytes: ", server.max_request_bytes, "\n",
      "  max num seqs: ", engine.max_num_seqs,
      ", max num batched tokens: ", engine.max_num_batched_tokens, "\n", "  KV cache: ",
      runner.kv_cache_bytes == 0 ? std::string("auto")
                                 : StrCat(runner.kv_cache_bytes >> 20, " MiB"),
      ", max model len: ",
      engine.max_model_len == 0 ? std::string("(the model's)") : StrCat(engine.max_model_len),
      ", prefix caching: ", engine.enable_prefix_caching ? "on" : "off",
      ", async scheduling: ", engine.async_scheduling ? "on" : "off", ", seed: ", engine.seed,
      ", max step slowdown: ",
      engine.max_step_slowdown == kAutoStepSlowdown ? std::string("auto")
      : engine.max_step_slowdown == 0               ? std::string("off")
                                                    : StrCat(engine.max_step_slowdown),
      "\n", "  max queued requests: ", server.max_queued_requests,
      ", grace period: ", server.grace_period_seconds, " s\n", "  TLS: ",
      server.tls_cert_file.empty()
          ? std::string("off")
          : StrCat("cert ", server.tls_cert_file, ", key ", server.tls_key_file),
      server.tls_client_ca_file.empty() ? std::string()
                                        : StrCat(", client CA ", server.tls_client_ca_file),
      "\n", "  auth: ", server.auth_token.empty() ? "off" : "bearer token (redacted)", "\n",
      "  debug log text: ", server.debug_log_text ? "ON (prompts and outputs are logged)" : "off",
      server.extra_chat_roles.empty()
          ? std::string()
          : StrCat("\n  extra chat roles: ", StrJoin(server.extra_chat_roles, ", ")));
}

std::string ListenAddress(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return StrCat("[", host, "]:", port);
  }
  return StrCat(host, ":", port);
}

}  // namespace lmserve::server
