// `lmserve serve`'s flags as the binary binds them (BindServeFlags through CLI11, then
// FinishServeConfig): every flag's default and a value of its own landing in the typed
// configuration, errors that name the flag, --dtype with --backend, --backend auto's resolution,
// and the start-up summary.

#include "server/serve_config.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Parses `flags` (after a --model) as `lmserve serve` does.
absl::StatusOr<ServeConfig> Parse(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--model", "model.gguf"});
  return ParseServeFlags(flags);
}

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(ServeConfigTest, EveryFlagsDefault) {
  absl::StatusOr<ServeConfig> parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ServeConfig& config = *parsed;
  EXPECT_EQ(config.model.path, "model.gguf");
  EXPECT_EQ(config.model.tokenizer_path, "");
  EXPECT_EQ(config.model.chat_template, "");
  EXPECT_EQ(config.model.served_model_name, "");
  EXPECT_FALSE(config.model.backend.has_value());  // auto
  EXPECT_EQ(config.runner.dtype, engine::RunnerDType::kAuto);
  EXPECT_EQ(config.runner.load_format, engine::LoadFormat::kCheckpoint);
  EXPECT_EQ(config.runner.kv_cache_bytes, 0);  // auto
  EXPECT_EQ(config.runner.num_threads, 0);
  EXPECT_EQ(config.runner.gpu_memory_utilization, 0.9);
  EXPECT_TRUE(config.runner.cuda_graphs);
  EXPECT_TRUE(config.runner.fp32_residual);
  EXPECT_EQ(config.runner.cuda_kernel_path, engine::CudaKernelPath::kAuto);
  EXPECT_EQ(config.engine.max_num_seqs, 64);
  EXPECT_EQ(config.engine.max_num_batched_tokens, 2048);
  EXPECT_EQ(config.engine.max_model_len, 0);
  EXPECT_TRUE(config.engine.enable_prefix_caching);
  EXPECT_EQ(config.engine.seed, 0u);
  EXPECT_EQ(config.engine.max_step_slowdown, kAutoStepSlowdown);
  EXPECT_EQ(config.server.host, "127.0.0.1");
  EXPECT_EQ(config.server.port, 50051);
  EXPECT_EQ(config.server.metrics_port, -1);
  EXPECT_EQ(config.server.http_port, -1);
  EXPECT_EQ(config.server.http_threads, 2);
  EXPECT_EQ(config.server.http_idle_timeout_seconds, 60.0);
  EXPECT_EQ(config.server.max_request_bytes, int64_t{4} << 20);
  EXPECT_EQ(config.server.max_queued_requests, 256);
  EXPECT_EQ(config.server.grace_period_seconds, 30.0);
  EXPECT_EQ(config.server.tls_cert_file, "");
  EXPECT_EQ(config.server.tls_key_file, "");
  EXPECT_EQ(config.server.tls_client_ca_file, "");
  EXPECT_EQ(config.server.auth_token_file, "");
  EXPECT_EQ(config.server.auth_token, "");
  EXPECT_FALSE(config.server.debug_log_text);
  EXPECT_TRUE(config.server.extra_chat_roles.empty());
}

TEST(ServeConfigTest, MaxStepSlowdown) {
  absl::StatusOr<ServeConfig> parsed = Parse({"--max-step-slowdown", "3.5"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->engine.max_step_slowdown, 3.5);
  EXPECT_THAT(DescribeServeConfig(*parsed), HasSubstr("max step slowdown: 3.5"));
  parsed = Parse({"--max-step-slowdown", "off"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->engine.max_step_slowdown, 0.0);
  parsed = Parse({"--max-step-slowdown", "auto"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->engine.max_step_slowdown, kAutoStepSlowdown);
  for (const char* bad : {"0.5", "-2", "fast", "2x", "nan", "inf"}) {
    const absl::Status status = Parse({"--max-step-slowdown", bad}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr("--max-step-slowdown")) << bad;
  }
}

// Issue 27: a burst as large as --max-num-seqs must not find the default queue full.
TEST(ServeConfigTest, TheDefaultQueueLimitScalesWithMaxNumSeqs) {
  absl::StatusOr<ServeConfig> parsed = Parse({"--max-num-seqs", "512"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->server.max_queued_requests, kQueuedPerSeq * 512);
  parsed = Parse({"--max-num-seqs", "512", "--max-queued-requests", "auto"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->server.max_queued_requests, kQueuedPerSeq * 512);
  parsed = Parse({"--max-num-seqs", "512", "--max-queued-requests", "0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->server.max_queued_requests, 0);
}

TEST(ServeConfigTest, EveryFlagsValueLandsInTheTypedConfig) {
  const std::string cert = WriteTempFile("serve_config_cert.pem", "CERT");
  const std::string key = WriteTempFile("serve_config_key.pem", "KEY");
  const std::string ca = WriteTempFile("serve_config_ca.pem", "CA");
  absl::StatusOr<ServeConfig> parsed = ParseServeFlags({
      "--model",
      "/models/m.gguf",
      "--tokenizer",
      "/models/tokenizer.json",
      "--chat-template=chatml",
      "--served-model-name",
      "demo",
      "--backend",
      "cuda",
      "--dtype",
      "float32",
      "--load-format",
      "dummy",
      "--kv-cache-mb",
      "256",
      "--threads",
      "3",
      "--gpu-memory-utilization",
      "0.5",
      "--no-cuda-graphs",
      "--no-fp32-residual",
      "--cuda-kernel-path",
      "portable",
      "--max-num-seqs",
      "8",
      "--max-num-batched-tokens=512",
      "--max-model-len",
      "1024",
      "--no-prefix-caching",
      "--seed",
      "42",
      "--host",
      "0.0.0.0",
      "--port",
      "0",
      "--metrics-port",
      "9400",
      "--http-port",
      "8000",
      "--http-threads",
      "3",
      "--http-idle-timeout-s",
      "5.5",
      "--max-request-bytes",
      "65536",
      "--max-queued-requests",
      "7",
      "--grace-period-s",
      "2.5",
      "--tls-cert",
      cert,
      "--tls-key",
      key,
      "--tls-client-ca",
      ca,
      "--auth-token",
      "s3cret",
      "--debug-log-text",
      "--extra-chat-roles",
      "developer,ipython",
      "--kv-cache-dtype",
      "fp8",
  });
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ServeConfig& config = *parsed;
  EXPECT_EQ(config.model.path, "/models/m.gguf");
  EXPECT_EQ(config.model.tokenizer_path, "/models/tokenizer.json");
  EXPECT_EQ(config.model.chat_template, "chatml");
  EXPECT_EQ(config.model.served_model_name, "demo");
  EXPECT_EQ(config.model.backend, engine::Backend::kCuda);
  EXPECT_EQ(config.runner.dtype, engine::RunnerDType::kFloat32);
  EXPECT_EQ(config.runner.load_format, engine::LoadFormat::kDummy);
  EXPECT_EQ(config.runner.kv_cache_dtype, engine::KvCacheDType::kFp8);
  EXPECT_EQ(config.runner.kv_cache_bytes, int64_t{256} << 20);
  EXPECT_EQ(config.runner.num_threads, 3);
  EXPECT_EQ(config.runner.gpu_memory_utilization, 0.5);
  EXPECT_FALSE(config.runner.cuda_graphs);
  EXPECT_FALSE(config.runner.fp32_residual);
  EXPECT_EQ(config.runner.cuda_kernel_path, engine::CudaKernelPath::kPortable);
  EXPECT_EQ(config.engine.max_num_seqs, 8);
  EXPECT_EQ(config.engine.max_num_batched_tokens, 512);
  EXPECT_EQ(config.engine.max_model_len, 1024);
  EXPECT_FALSE(config.engine.enable_prefix_caching);
  EXPECT_EQ(config.engine.seed, 42u);
  EXPECT_EQ(config.server.host, "0.0.0.0");
  EXPECT_EQ(config.server.port, 0);
  EXPECT_EQ(config.server.http_port, 8000);
  EXPECT_EQ(config.server.http_threads, 3);
  EXPECT_EQ(config.server.http_idle_timeout_seconds, 5.5);
  EXPECT_EQ(config.server.metrics_port, 9400);
  EXPECT_EQ(config.server.max_request_bytes, 65536);
  EXPECT_EQ(config.server.max_queued_requests, 7);
  EXPECT_EQ(config.server.grace_period_seconds, 2.5);
  EXPECT_EQ(config.server.tls_cert_file, cert);
  EXPECT_EQ(config.server.tls_key_file, key);
  EXPECT_EQ(config.server.tls_client_ca_file, ca);
  EXPECT_EQ(config.server.auth_token, "s3cret");
  EXPECT_TRUE(config.server.debug_log_text);
  EXPECT_EQ(config.server.extra_chat_roles, (std::vector<std::string>{"developer", "ipython"}));

  // The summary shows the settings and never the token.
  const std::string summary = DescribeServeConfig(config);
  EXPECT_THAT(summary, HasSubstr("backend: cuda, dtype: float32, quantization: auto, KV cache "
                                 "dtype: fp8, threads: 3, load format: dummy"));
  EXPECT_THAT(summary, HasSubstr("CUDA graphs: off, fp32 residual: off"));
  EXPECT_THAT(summary, HasSubstr("CUDA kernel path: portable"));
  EXPECT_THAT(summary, HasSubstr("KV cache: 256 MiB, max model len: 1024, prefix caching: off"));
  EXPECT_THAT(summary, HasSubstr("auth: bearer token (redacted)"));
  EXPECT_THAT(summary, Not(HasSubstr("s3cret")));
}

TEST(ServeConfigTest, AuthTokenFileIsReadAndTrimmed) {
  const std::string path = WriteTempFile("serve_config_token", "t0ken\r\n");
  absl::StatusOr<ServeConfig> config = Parse({"--auth-token-file", path});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.auth_token_file, path);
  EXPECT_EQ(config->server.auth_token, "t0ken");
}

TEST(ServeConfigTest, TheLastOfARepeatedFlagWins) {
  absl::StatusOr<ServeConfig> config = Parse({"--port", "1", "--port=2", "--no-cuda-graphs=false"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server.port, 2);
  EXPECT_TRUE(config->runner.cuda_graphs);  // --no-cuda-graphs=false leaves graphs on
}

// Each bad value is refused with an error that names its flag.
TEST(ServeConfigTest, BadValuesNameTheirFlag) {
  const std::string empty_token = WriteTempFile("serve_config_empty_token", "\n");
  const std::string cert = WriteTempFile("serve_config_cert2.pem", "CERT");
  const struct {
    std::vector<std::string> flags;
    std::string flag;  // what the error must name
  } kCases[] = {
      {{"--backend", "gpu"}, "--backend"},
      {{"--dtype", "half"}, "--dtype"},
      {{"--load-format", "safetensors"}, "--load-format"},
      {{"--kv-cache-mb", "0"}, "--kv-cache-mb"},
      {{"--kv-cache-mb", "lots"}, "--kv-cache-mb"},
      {{"--threads", "-1"}, "--threads"},
      {{"--threads", "010x"}, "--threads"},
      {{"--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization"},
      {{"--gpu-memory-utilization", "most"}, "--gpu-memory-utilization"},
      {{"--no-cuda-graphs=maybe"}, "--no-cuda-graphs"},
      {{"--cuda-kernel-path", "hopper"}, "--cuda-kernel-path"},
      {{"--max-num-seqs", "0"}, "--max-num-seqs"},
      {{"--max-num-batched-tokens", "2048.5"}, "--max-num-batched-tokens"},
      {{"--max-model-len", "-1"}, "--max-model-len"},
      {{"--seed", "-1"}, "--seed"},
      {{"--host", ""}, "--host"},
      {{"--port", "65536"}, "--port"},
      {{"--port"}, "--port"},  // no value
      {{"--metrics-port", "-2"}, "--metrics-port"},
      {{"--max-request-bytes", "1023"}, "--max-request-bytes"},
      {{"--max-queued-requests", "x"}, "--max-queued-requests"},
      {{"--max-queued-requests", "-1"}, "--max-queued-requests"},
      {{"--extra-chat-roles", "developer,user<|im_end|>"}, "--extra-chat-roles"},
      {{"--extra-chat-roles", "a,,b"}, "--extra-chat-roles"},
      {{"--grace-period-s", "-1"}, "--grace-period-s"},
      {{"--grace-period-s", "nan"}, "--grace-period-s"},
      {{"--tls-cert", cert}, "--tls-key"},
      {{"--tls-key", cert}, "--tls-cert"},
      {{"--tls-cert", "/no/such/cert.pem", "--tls-key", cert}, "--tls-cert"},
      {{"--tls-client-ca", cert}, "--tls-client-ca"},
      {{"--auth-token-file", "/no/such/token"}, "--auth-token-file"},
      {{"--auth-token-file", empty_token}, "--auth-token-file"},
      {{"--auth-token", ""}, "--auth-token"},
      {{"--auth-token", "a", "--auth-token-file", empty_token}, "--auth-token"},
      {{"--debug-log-text=maybe"}, "--debug-log-text"},
      {{"--no-such-flag", "1"}, "--no-such-flag"},
  };
  for (const auto& [flags, flag] : kCases) {
    absl::StatusOr<ServeConfig> config = Parse(flags);
    ASSERT_FALSE(config.ok()) << flags.front();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << flags.front();
    EXPECT_THAT(config.status().message(), HasSubstr(flag)) << flags.front();
  }
  absl::StatusOr<ServeConfig> no_model = ParseServeFlags({"--port", "1"});
  ASSERT_FALSE(no_model.ok());
  EXPECT_THAT(no_model.status().message(), HasSubstr("--model is required"));
}

TEST(ServeConfigTest, DtypeDefaultsToAuto) {
  absl::StatusOr<ServeConfig> config = Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->runner.dtype, engine::RunnerDType::kAuto);
  EXPECT_EQ(BackendFlagName(config->model.backend), "auto");
  EXPECT_THAT(DescribeServeConfig(*config), HasSubstr("backend: auto, dtype: auto"));
}

TEST(ServeConfigTest, QuantizationTakesAutoNoneAndFp8) {
  absl::StatusOr<ServeConfig> config = Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->runner.quantization, engine::RunnerQuantization::kAuto);
  for (const char* name : {"auto", "none", "fp8"}) {
    config = Parse({"--quantization", name});
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    EXPECT_EQ(engine::RunnerQuantizationName(config->runner.quantization), name);
    EXPECT_THAT(DescribeServeConfig(*config), HasSubstr(std::string("quantization: ") + name));
  }
  config = Parse({"--quantization", "int4"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("--quantization"));
}

TEST(ServeConfigTest, KvCacheDtypeTakesAutoBf16AndFp8) {
  absl::StatusOr<ServeConfig> config = Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->runner.kv_cache_dtype, engine::KvCacheDType::kAuto);
  for (const char* name : {"auto", "bf16", "fp8"}) {
    config = Parse({"--kv-cache-dtype", name});
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    EXPECT_EQ(engine::KvCacheDTypeName(config->runner.kv_cache_dtype), name);
    EXPECT_THAT(DescribeServeConfig(*config), HasSubstr(std::string("KV cache dtype: ") + name));
  }
  config = Parse({"--kv-cache-dtype", "fp8_e4m3"});  // vLLM's name
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->runner.kv_cache_dtype, engine::KvCacheDType::kFp8);
  config = Parse({"--kv-cache-dtype", "int8"});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("--kv-cache-dtype"));
}

TEST(ServeConfigTest, DtypeTakesAutoBfloat16AndFloat32) {
  for (const char* backend : {"auto", "cuda"}) {
    for (const char* dtype : {"auto", "bfloat16", "float32"}) {
      absl::StatusOr<ServeConfig> config = Parse({"--backend", backend, "--dtype", dtype});
      ASSERT_TRUE(config.ok()) << backend << " " << dtype << ": " << config.status();
      EXPECT_EQ(engine::RunnerDTypeName(config->runner.dtype), dtype);
      EXPECT_THAT(DescribeServeConfig(*config), HasSubstr(std::string("dtype: ") + dtype));
    }
  }
  absl::StatusOr<ServeConfig> equals = Parse({"--dtype=float32", "--backend=cpu"});
  ASSERT_TRUE(equals.ok()) << equals.status();
  EXPECT_EQ(equals->runner.dtype, engine::RunnerDType::kFloat32);
  EXPECT_EQ(equals->model.backend, engine::Backend::kCpu);
}

TEST(ServeConfigTest, RejectsUnknownDtypes) {
  for (const char* dtype : {"half", "float16", "fp32", "FLOAT32", ""}) {
    absl::StatusOr<ServeConfig> config = Parse({"--dtype", dtype});
    ASSERT_FALSE(config.ok()) << dtype;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr("--dtype"));
    EXPECT_THAT(config.status().message(), HasSubstr("auto, bfloat16, float32"));
  }
}

// The CPU runner keeps the checkpoint's types or converts to float32: an explicit CPU backend with
// bfloat16 is refused here, before the model loads (with --backend auto the CPU runner refuses it
// itself), and so is native with an explicit CUDA backend.
TEST(ServeConfigTest, RejectsBfloat16OnTheCpuBackend) {
  absl::StatusOr<ServeConfig> config = Parse({"--backend", "cpu", "--dtype", "bfloat16"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("--dtype bfloat16"));
  EXPECT_THAT(config.status().message(), HasSubstr("bfloat16 needs --backend cuda"));
  EXPECT_TRUE(Parse({"--backend", "cpu", "--dtype", "float32"}).ok());
  EXPECT_TRUE(Parse({"--backend", "cpu", "--dtype", "auto"}).ok());
  EXPECT_TRUE(Parse({"--backend", "cpu", "--dtype", "native"}).ok());
  absl::StatusOr<ServeConfig> native_on_cuda = Parse({"--backend", "cuda", "--dtype", "native"});
  ASSERT_FALSE(native_on_cuda.ok());
  EXPECT_THAT(native_on_cuda.status().message(), HasSubstr("--dtype native"));
}

// This build has no CUDA runner (or this machine no supported GPU): auto is the CPU, and says why.
TEST(ServeConfigTest, BackendAutoResolvesToTheCpuHereWithAReason) {
  absl::StatusOr<ServeConfig> config = Parse({"--backend", "auto"});
  ASSERT_TRUE(config.ok()) << config.status();
  if (engine::CheckCudaDevice().ok()) GTEST_SKIP() << "a supported GPU is present";
  std::string reason;
  EXPECT_EQ(ResolveBackend(config->model.backend, &reason), engine::Backend::kCpu);
  EXPECT_FALSE(reason.empty());
  std::string explicit_reason = "untouched";
  EXPECT_EQ(ResolveBackend(engine::Backend::kCpu, &explicit_reason), engine::Backend::kCpu);
  EXPECT_EQ(explicit_reason, "untouched");
}

TEST(ServeConfigTest, HelpListsEveryFlagWithItsDefault) {
  ServeConfig config;
  CLI::App command("serves a model", "lmserve serve");
  UseCommandLineConventions(&command);
  BindServeFlags(&command, &config);
  const std::string help = command.help();
  for (const char* flag : {"--model",
                           "--tokenizer",
                           "--chat-template",
                           "--served-model-name",
                           "--backend",
                           "--dtype",
                           "--load-format",
                           "--kv-cache-mb",
                           "--threads",
                           "--gpu-memory-utilization",
                           "--no-cuda-graphs",
                           "--no-fp32-residual",
                           "--decode-gemm",
                           "--cuda-kernel-path",
                           "--max-num-seqs",
                           "--max-num-batched-tokens",
                           "--max-model-len",
                           "--no-prefix-caching",
                           "--max-step-slowdown",
                           "--seed",
                           "--host",
                           "--port",
                           "--metrics-port",
                           "--max-request-bytes",
                           "--max-queued-requests",
                           "--grace-period-s",
                           "--tls-cert",
                           "--tls-key",
                           "--tls-client-ca",
                           "--auth-token-file",
                           "--auth-token",
                           "--debug-log-text",
                           "--extra-chat-roles"}) {
    EXPECT_THAT(help, HasSubstr(std::string("\n  ") + flag + " ")) << flag;
  }
  for (const char* shown :
       {"=50051", "=127.0.0.1", "=-1", "=4194304", "=0.9", "=auto", "=64", "=2048", "=30"}) {
    EXPECT_THAT(help, HasSubstr(shown)) << shown;
  }
  EXPECT_EQ(ParseServeFlags({"--help"}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace lmserve::server
