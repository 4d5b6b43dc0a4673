// lmserve-engine-bench: end-to-end engine throughput at 1, 4 and 16 concurrent greedy requests.
//
// What it measures: the whole engine (scheduler, KV block manager, runner, sampler, output
// streams), driven through the public Engine API as the server drives it. For each concurrency C,
// C requests are submitted at once, each a prompt of --prompt-tokens random token ids (distinct per
// request; prefix caching off, so nothing is reused) and --max-tokens greedy tokens with EOS
// ignored. The time runs from the first Submit to the last final output. Reported per C: the median
// over --repeats runs (after one warm-up run) of
//   gen tok/s    generated tokens / wall time (the headline: aggregate decode throughput)
//   total tok/s  (prompt + generated tokens) / wall time
//   TTFT         mean time to first token; ITL: mean time between a request's tokens
// The floor it is measured against: a decode step reads every weight once, so at C = 1 the runner
// can do at most (memory bandwidth / weight bytes) steps per second; "weight GB/s" prints
// gen tok/s / C x fp32 weight bytes, the bandwidth the decode steps imply, to compare with the
// machine's measured bandwidth (e.g. `mbw` or STREAM). Larger C amortizes the weight reads.
//
// Usage: lmserve-engine-bench --model PATH [--prompt-tokens 128] [--max-tokens 64]
//          [--concurrency 1,4,16] [--repeats 3] [--threads 0] [--kv-cache-mib 1024]
//          [--block-size 16] [--max-batched-tokens 2048]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/core/engine.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"

namespace {

using lmserve::StrCat;
namespace engine = lmserve::engine;

struct Options {
  std::string model;
  int32_t prompt_tokens = 128;
  int32_t max_tokens = 64;
  std::vector<int32_t> concurrency = {1, 4, 16};
  int32_t repeats = 3;
  int32_t threads = 0;
  int64_t kv_cache_mib = 1024;
  int32_t block_size = 16;
  int32_t max_batched_tokens = 2048;
};

[[noreturn]] void Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "lmserve-engine-bench: %s\n", error.c_str());
  std::fprintf(stderr,
               "usage: lmserve-engine-bench --model PATH [--prompt-tokens N] [--max-tokens N]\n"
               "         [--concurrency 1,4,16] [--repeats N] [--threads N] [--kv-cache-mib N]\n"
               "         [--block-size N] [--max-batched-tokens N]\n");
  std::exit(2);
}

int64_t ParseNumber(const std::string& flag, std::string_view text) {
  const std::optional<int64_t> value = lmserve::ParseInt<int64_t>(text);
  if (!value.has_value() || *value < 0) {
    Usage(StrCat("--", flag, ": want a non-negative integer, got '", text, "'"));
  }
  return *value;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage("");
    if (flag.rfind("--", 0) != 0 || i + 1 >= argc) Usage(StrCat("unexpected argument ", flag));
    flag = flag.substr(2);
    const std::string value = argv[++i];
    if (flag == "model") {
      options.model = value;
    } else if (flag == "prompt-tokens") {
      options.prompt_tokens = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "max-tokens") {
      options.max_tokens = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "concurrency") {
      options.concurrency.clear();
      for (std::string_view part : lmserve::StrSplit(value, ',')) {
        options.concurrency.push_back(static_cast<int32_t>(ParseNumber(flag, part)));
      }
    } else if (flag == "repeats") {
      options.repeats = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "threads") {
      options.threads = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "kv-cache-mib") {
      options.kv_cache_mib = ParseNumber(flag, value);
    } else if (flag == "block-size") {
      options.block_size = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "max-batched-tokens") {
      options.max_batched_tokens = static_cast<int32_t>(ParseNumber(flag, value));
    } else {
      Usage(StrCat("unknown option --", flag));
    }
  }
  if (options.model.empty()) Usage("--model is required");
  if (options.prompt_tokens < 1 || options.max_tokens < 1 || options.repeats < 1) {
    Usage("--prompt-tokens, --max-tokens and --repeats must be >= 1");
  }
  for (int32_t c : options.concurrency) {
    if (c < 1) Usage("--concurrency values must be >= 1");
  }
  return options;
}

struct RunResult {
  double wall_seconds = 0.0;
  int64_t generated_tokens = 0;
  int64_t prompt_tokens = 0;
  double mean_ttft_seconds = 0.0;
  double mean_itl_seconds = 0.0;
  int64_t steps = 0;
  int64_t preemptions = 0;
};

// Submits `concurrency` requests at once and waits for all of them.
absl::StatusOr<RunResult> Run(engine::Engine& eng, const Options& options, int32_t concurrency,
                              int32_t max_tokens, uint32_t seed) {
  const int64_t vocab = eng.limits().vocab_size;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  const engine::EngineStats before = eng.Stats();
  const double start = engine::SystemClock::Get()->NowSeconds();
  std::vector<engine::RequestHandle> handles;
  for (int32_t i = 0; i < concurrency; ++i) {
    engine::Request request;
    request.prompt_token_ids.resize(static_cast<size_t>(options.prompt_tokens));
    for (int32_t& id : request.prompt_token_ids) id = token(rng);
    request.sampling.temperature = 0.0;
    request.sampling.max_tokens = max_tokens;
    request.sampling.ignore_eos = true;
    absl::StatusOr<engine::RequestHandle> handle = eng.Submit(std::move(request));
    if (!handle.ok()) return handle.status();
    handles.push_back(*std::move(handle));
  }
  RunResult result;
  double ttft_sum = 0.0, itl_sum = 0.0;
  int64_t itl_count = 0;
  for (engine::RequestHandle& handle : handles) {
    engine::RequestOutput output;
    std::vector<double> times;
    while (handle.stream->Next(&output) == engine::OutputStream::NextResult::kOutput) {
      result.generated_tokens += static_cast<int64_t>(output.token_ids.size());
      times.insert(times.end(), output.token_times_seconds.begin(),
                   output.token_times_seconds.end());
      if (output.finished) {
        if (output.finish_reason == engine::FinishReason::kError) {
          return absl::InternalError(StrCat("request failed: ", output.error));
        }
        result.prompt_tokens += output.usage.prompt_tokens;
        ttft_sum += output.timings.first_token_seconds;
      }
    }
    for (size_t i = 1; i < times.size(); ++i) itl_sum += times[i] - times[i - 1];
    itl_count += times.empty() ? 0 : static_cast<int64_t>(times.size()) - 1;
  }
  result.wall_seconds = engine::SystemClock::Get()->NowSeconds() - start;
  result.mean_ttft_seconds = ttft_sum / concurrency;
  result.mean_itl_seconds = itl_count > 0 ? itl_sum / static_cast<double>(itl_count) : 0.0;
  // Stats are published after each step; the last step may still be publishing.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const engine::EngineStats after = eng.Stats();
  result.steps = after.num_steps - before.num_steps;
  result.preemptions = after.num_preemptions - before.num_preemptions;
  return result;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int Main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  auto checkpoint = engine::OpenCheckpoint(options.model);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "lmserve-engine-bench: %s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  int64_t weight_elements = 0;
  for (const auto& [name, tensor] : (*checkpoint)->tensors()) {
    weight_elements += tensor.NumElements();
  }
  const double weight_bytes_fp32 = 4.0 * static_cast<double>(weight_elements);

  engine::RunnerConfig runner_config;
  runner_config.backend = engine::Backend::kCpu;
  runner_config.block_size_tokens = options.block_size;
  runner_config.kv_cache_bytes = options.kv_cache_mib << 20;
  runner_config.num_threads = options.threads;
  auto runner = engine::ModelRunner::Create(**checkpoint, runner_config);
  if (!runner.ok()) {
    std::fprintf(stderr, "lmserve-engine-bench: %s\n", runner.status().ToString().c_str());
    return 1;
  }
  const int32_t num_kv_blocks = (*runner)->num_kv_blocks();
  const engine::ModelConfig model_config = (*runner)->model_config();
  checkpoint->reset();  // the runner holds its own copy of the weights

  engine::EngineConfig config;
  config.enable_prefix_caching = false;
  config.max_num_batched_tokens = options.max_batched_tokens;
  config.max_num_seqs =
      std::max(64, *std::max_element(options.concurrency.begin(), options.concurrency.end()));
  auto eng = engine::Engine::Create(*std::move(runner), config);
  if (!eng.ok()) {
    std::fprintf(stderr, "lmserve-engine-bench: %s\n", eng.status().ToString().c_str());
    return 1;
  }

  std::printf("lmserve-engine-bench: %s\n", options.model.c_str());
  std::printf("model: %s, %lld layers, hidden %lld, vocab %lld; fp32 weights %.1f MB\n",
              model_config.name.empty() ? model_config.architecture_name.c_str()
                                        : model_config.name.c_str(),
              static_cast<long long>(model_config.num_layers),
              static_cast<long long>(model_config.hidden_size),
              static_cast<long long>(model_config.vocab_size), weight_bytes_fp32 / 1e6);
  std::printf(
      "runner: CPU, %d threads (0: all %u cores), KV pool %d blocks of %d tokens; "
      "budget %d tokens per step\n",
      options.threads, std::thread::hardware_concurrency(), num_kv_blocks, options.block_size,
      options.max_batched_tokens);
  std::printf(
      "workload: C concurrent greedy requests, %d random prompt tokens + %d generated "
      "each, EOS ignored, prefix caching off; median of %d runs after a warm-up\n\n",
      options.prompt_tokens, options.max_tokens, options.repeats);
  std::printf("%11s %11s %11s %12s %9s %9s %7s %11s\n", "concurrency", "gen tok/s", "total tok/s",
              "weight GB/s", "TTFT ms", "ITL ms", "steps", "preemptions");

  uint32_t seed = 1;
  // Warm-up: workspaces grow to their size, caches and the OpenBLAS pool warm.
  if (auto warm = Run(**eng, options, 1, std::min(options.max_tokens, 8), seed++); !warm.ok()) {
    std::fprintf(stderr, "lmserve-engine-bench: %s\n", warm.status().ToString().c_str());
    return 1;
  }
  for (int32_t concurrency : options.concurrency) {
    std::vector<double> gen, total, ttft, itl;
    RunResult last;
    for (int32_t r = 0; r < options.repeats; ++r) {
      absl::StatusOr<RunResult> result =
          Run(**eng, options, concurrency, options.max_tokens, seed++);
      if (!result.ok()) {
        std::fprintf(stderr, "lmserve-engine-bench: %s\n", result.status().ToString().c_str());
        return 1;
      }
      gen.push_back(static_cast<double>(result->generated_tokens) / result->wall_seconds);
      total.push_back(static_cast<double>(result->generated_tokens + result->prompt_tokens) /
                      result->wall_seconds);
      ttft.push_back(result->mean_ttft_seconds);
      itl.push_back(result->mean_itl_seconds);
      last = *result;
    }
    const double gen_median = Median(gen);
    std::printf("%11d %11.1f %11.1f %12.2f %9.1f %9.2f %7lld %11lld\n", concurrency, gen_median,
                Median(total), gen_median / concurrency * weight_bytes_fp32 / 1e9,
                Median(ttft) * 1e3, Median(itl) * 1e3, static_cast<long long>(last.steps),
                static_cast<long long>(last.preemptions));
  }
  (*eng)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
