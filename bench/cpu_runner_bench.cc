// lmserve-cpu-runner-bench --model PATH [--threads N] [--prompt-tokens 128] [--decode-tokens 64]
//                          [--repeats 3] [--dtype auto|native|float32] [--int8-activations]
//                          [--batch N] [--accuracy IDS_FILE]
//
// Measures the CPU runner on one model:
// - load: wall time of OpenCheckpoint + ModelRunner::Create (file mapping, weights in their types or
//   converted to fp32 with --dtype float32, fusing, KV pool allocation);
// - prefill: one step computing a --prompt-tokens prompt (pseudo-random ids, logits of the last
//   token only), tokens per second, the median of --repeats runs after one warm-up;
// - decode: single-stream greedy decoding of --decode-tokens tokens after that prompt, one token
//   per step through the paged cache, tokens per second (median of --repeats runs);
// - with --batch N (N > 1), also decode steps of N sequences (each after its own prompt, one token
//   each per step): milliseconds per step, the median over --decode-tokens steps of --repeats runs;
// - peak RSS: getrusage's ru_maxrss at the end (weights, KV pages touched, workspaces).
// With --accuracy IDS_FILE it measures instead the native modes' teacher-forced logits against the
// float32 path's on those ids (top-1 agreement, relative L2).
// Floors, measured on the same machine: prefill against the GEMM throughput of OpenBLAS (a square
// 1024^3 sgemm through kernels::Linear), decode against the time to stream the stored weights once
// from memory (memcpy bandwidth of a 256 MiB buffer).

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/quant_linear.h"

namespace {

using Clock = std::chrono::steady_clock;
using lmserve::engine::LogitsMode;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::string model;
  int threads = 0;
  int prompt_tokens = 128;
  int decode_tokens = 64;
  int repeats = 3;
  int batch = 1;
  lmserve::engine::RunnerDType dtype = lmserve::engine::RunnerDType::kAuto;
  bool int8_activations = false;
  std::string accuracy_ids;  // --accuracy: a file of comma-separated token ids
};

bool ParseOptions(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--int8-activations") {
      options->int8_activations = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* value = argv[++i];
    if (arg == "--model") {
      options->model = value;
    } else if (arg == "--threads") {
      options->threads = std::atoi(value);
    } else if (arg == "--prompt-tokens") {
      options->prompt_tokens = std::atoi(value);
    } else if (arg == "--decode-tokens") {
      options->decode_tokens = std::atoi(value);
    } else if (arg == "--repeats") {
      options->repeats = std::atoi(value);
    } else if (arg == "--batch") {
      options->batch = std::atoi(value);
    } else if (arg == "--accuracy") {
      options->accuracy_ids = value;
    } else if (arg == "--dtype") {
      const auto dtype = lmserve::engine::RunnerDTypeFromName(value);
      if (!dtype.has_value()) return false;
      options->dtype = *dtype;
    } else {
      return false;
    }
  }
  return !options->model.empty() && options->prompt_tokens > 0 && options->decode_tokens > 0 &&
         options->repeats > 0 && options->threads >= 0 && options->batch > 0;
}

// GFLOP/s of a square fp32 GEMM through kernels::Linear (median of 5 after a warm-up).
double MeasureGemmGflops() {
  constexpr int64_t kSize = 1024;
  std::vector<float> a(kSize * kSize, 0.5f), b(kSize * kSize, 0.25f), c(kSize * kSize);
  std::vector<double> times;
  for (int run = 0; run < 6; ++run) {
    const auto start = Clock::now();
    lmserve::kernels::Linear({.input = a.data(),
                              .weight = b.data(),
                              .output = c.data(),
                              .num_tokens = kSize,
                              .in_features = kSize,
                              .out_features = kSize});
    if (run > 0) times.push_back(Seconds(start));
  }
  return 2.0 * kSize * kSize * kSize / Median(times) / 1e9;
}

// GB/s of memcpy over 256 MiB (counting the bytes read, as a weight stream reads them).
double MeasureCopyGBps() {
  constexpr size_t kBytes = size_t{256} << 20;
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  std::vector<double> times;
  for (int run = 0; run < 6; ++run) {
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    if (run > 0) times.push_back(Seconds(start));
  }
  return kBytes / Median(times) / 1e9;
}

// Teacher-forced logits of `ids` at every position, [ids, vocab]; empty on an error (printed).
std::vector<float> TeacherForcedLogits(const lmserve::engine::Checkpoint& checkpoint,
                                       const lmserve::engine::RunnerConfig& base,
                                       const std::vector<int32_t>& ids, int32_t chunk) {
  lmserve::engine::RunnerConfig config = base;
  config.max_num_batched_tokens = chunk;
  auto runner = lmserve::engine::ModelRunner::Create(checkpoint, config);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", std::string(runner.status().message()).c_str());
    return {};
  }
  lmserve::engine::ModelRunner& model = **runner;
  const int32_t block = model.block_size_tokens();
  std::vector<int32_t> blocks((ids.size() + block - 1) / block);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  std::vector<float> logits;
  for (size_t begin = 0; begin < ids.size(); begin += chunk) {  // chunked prefill
    const size_t end = std::min(ids.size(), begin + chunk);
    lmserve::engine::StepBatch batch;
    batch.AddSequence(std::span<const int32_t>(ids).subspan(begin, end - begin),
                      static_cast<int32_t>(begin), blocks, LogitsMode::kAll);
    lmserve::engine::StepOutput output;
    if (absl::Status s = model.Execute(batch, &output); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return {};
    }
    logits.insert(logits.end(), output.logits.begin(), output.logits.end());
  }
  return logits;
}

// --accuracy: teacher-forced logits of the ids in the native modes against the float32 path: top-1
// agreement and relative L2 (issue 22). Steps of `chunk` tokens: a chunk below
// cpu_gemm_min_tokens runs the integer path, as decode steps do.
int RunAccuracy(const Options& options) {
  std::ifstream file(options.accuracy_ids);
  std::vector<int32_t> ids;
  for (std::string id; std::getline(file, id, ',');) ids.push_back(std::atoi(id.c_str()));
  auto checkpoint = lmserve::engine::OpenCheckpoint(options.model);
  if (!checkpoint.ok() || ids.empty()) {
    std::fprintf(stderr, "--accuracy: cannot read the model or the ids\n");
    return 1;
  }
  lmserve::engine::RunnerConfig reference;
  reference.num_threads = options.threads;
  reference.dtype = lmserve::engine::RunnerDType::kFloat32;
  reference.kv_cache_bytes = int64_t{256} << 20;
  const std::vector<float> want = TeacherForcedLogits(**checkpoint, reference, ids, 512);
  if (want.empty()) return 1;
  const int64_t vocab = (*checkpoint)->config().vocab_size;
  std::printf("%zu positions; against --dtype float32 (512-token chunks):\n", ids.size());
  std::printf("%-58s %12s %12s\n", "native mode", "top-1 agree", "relative L2");
  struct Mode {
    const char* name;
    bool int8;
    int32_t gemm_min_tokens;
    int32_t chunk;
  };
  const Mode modes[] = {
      {"default (512-token steps: fp32 tiles + sgemm)", false, 8, 512},
      {"integer path, two int8 parts (1-token steps, as decode)", false, 8, 1},
      {"integer path, one int8 part (1-token steps, as decode)", true, 8, 1},
  };
  for (const Mode& mode : modes) {
    lmserve::engine::RunnerConfig config = reference;
    config.dtype = lmserve::engine::RunnerDType::kNative;
    config.cpu_int8_activations = mode.int8;
    config.cpu_gemm_min_tokens = mode.gemm_min_tokens;
    const std::vector<float> got = TeacherForcedLogits(**checkpoint, config, ids, mode.chunk);
    if (got.size() != want.size()) return 1;
    int64_t agree = 0;
    double diff = 0, norm = 0;
    for (size_t row = 0; row < ids.size(); ++row) {
      const float* g = got.data() + row * vocab;
      const float* w = want.data() + row * vocab;
      agree += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
      for (int64_t v = 0; v < vocab; ++v) {
        diff += (double{g[v]} - w[v]) * (double{g[v]} - w[v]);
        norm += double{w[v]} * w[v];
      }
    }
    std::printf("%-58s %11.2f%% %12.3g\n", mode.name, 100.0 * agree / ids.size(),
                std::sqrt(diff / norm));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseOptions(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: lmserve-cpu-runner-bench --model PATH [--threads N] [--prompt-tokens 128]"
                 " [--decode-tokens 64] [--repeats 3] [--dtype auto|native|float32]"
                 " [--int8-activations] [--batch N] [--accuracy IDS_FILE]\n");
    return 2;
  }

  if (!options.accuracy_ids.empty()) return RunAccuracy(options);

  // Load.
  const auto load_start = Clock::now();
  auto checkpoint = lmserve::engine::OpenCheckpoint(options.model);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "%s\n", std::string(checkpoint.status().message()).c_str());
    return 1;
  }
  lmserve::engine::RunnerConfig config;
  config.num_threads = options.threads;
  config.dtype = options.dtype;
  config.cpu_int8_activations = options.int8_activations;
  const int64_t context = options.prompt_tokens + options.decode_tokens;
  auto runner = lmserve::engine::ModelRunner::Create(**checkpoint, config);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", std::string(runner.status().message()).c_str());
    return 1;
  }
  const double load_seconds = Seconds(load_start);
  lmserve::engine::ModelRunner& model = **runner;
  const lmserve::engine::ModelConfig& c = model.model_config();
  const int64_t blocks_per_seq = (context + model.block_size_tokens() - 1) / model.block_size_tokens();
  if (context > c.max_position_embeddings ||
      options.batch * blocks_per_seq > int64_t{model.num_kv_blocks()}) {
    std::fprintf(stderr, "prompt + decode tokens (%lld) exceed the context or the KV cache\n",
                 static_cast<long long>(context));
    return 1;
  }

  std::vector<int32_t> blocks((context + model.block_size_tokens() - 1) /
                              model.block_size_tokens());
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(options.prompt_tokens));
  for (int32_t& id : prompt) id = id_dist(rng);

  lmserve::engine::StepBatch batch;
  lmserve::engine::StepOutput output;
  auto prefill = [&]() -> bool {
    batch.Clear();
    batch.AddSequence(prompt, 0, blocks, LogitsMode::kLast);
    return model.Execute(batch, &output).ok();
  };
  auto argmax = [&]() {
    int32_t id = 0;
    lmserve::kernels::Argmax(
        {.input = output.logits.data(), .output = &id, .num_rows = 1, .row_size = c.vocab_size});
    return id;
  };

  // Prefill.
  std::vector<double> prefill_times;
  for (int run = 0; run <= options.repeats; ++run) {
    const auto start = Clock::now();
    if (!prefill()) return 1;
    if (run > 0) prefill_times.push_back(Seconds(start));
  }
  const double prefill_seconds = Median(prefill_times);

  // Decode.
  std::vector<double> decode_times;
  for (int run = 0; run <= options.repeats; ++run) {
    if (!prefill()) return 1;
    int32_t token = argmax();
    int32_t computed = options.prompt_tokens;
    const auto start = Clock::now();
    for (int step = 0; step < options.decode_tokens; ++step) {
      batch.Clear();
      const int32_t next[1] = {token};
      batch.AddSequence(next, computed, blocks, LogitsMode::kLast);
      if (!model.Execute(batch, &output).ok()) return 1;
      token = argmax();
      ++computed;
    }
    if (run > 0) decode_times.push_back(Seconds(start));
  }
  const double decode_seconds = Median(decode_times);

  // Decode steps of --batch sequences.
  double batch_step_seconds = 0;
  if (options.batch > 1) {
    const int32_t n = options.batch;
    std::vector<std::vector<int32_t>> tables(n);
    for (int32_t i = 0; i < n; ++i) {
      for (int64_t b = 0; b < blocks_per_seq; ++b) {
        tables[i].push_back(static_cast<int32_t>(i * blocks_per_seq + b));
      }
    }
    std::vector<double> step_times;
    for (int run = 0; run <= options.repeats; ++run) {
      std::vector<int32_t> tokens(n);
      for (int32_t i = 0; i < n; ++i) {  // each sequence's prompt (a rotation of the one prompt)
        std::vector<int32_t> own(prompt);
        std::rotate(own.begin(), own.begin() + i % own.size(), own.end());
        batch.Clear();
        batch.AddSequence(own, 0, tables[i], LogitsMode::kLast);
        if (!model.Execute(batch, &output).ok()) return 1;
        tokens[i] = argmax();
      }
      int32_t computed = options.prompt_tokens;
      for (int step = 0; step < options.decode_tokens; ++step) {
        batch.Clear();
        for (int32_t i = 0; i < n; ++i) {
          batch.AddSequence(std::span<const int32_t>(&tokens[i], 1), computed, tables[i],
                            LogitsMode::kLast);
        }
        const auto start = Clock::now();
        if (!model.Execute(batch, &output).ok()) return 1;
        if (run > 0) step_times.push_back(Seconds(start));
        for (int32_t i = 0; i < n; ++i) {
          lmserve::kernels::Argmax({.input = output.logits.data() + int64_t{i} * c.vocab_size,
                                    .output = &tokens[i],
                                    .num_rows = 1,
                                    .row_size = c.vocab_size});
        }
        ++computed;
      }
    }
    batch_step_seconds = Median(step_times);
  }

  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_rss_mib = usage.ru_maxrss / 1024.0;

  // Floors.
  const int64_t h = c.hidden_size, q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  const int64_t layer_params = (q_dim + 2 * kv_dim) * h + h * q_dim + 3 * c.intermediate_size * h;
  const int64_t matmul_params = c.num_layers * layer_params;
  const int64_t lm_head_params = c.vocab_size * h;
  const double gemm_gflops = MeasureGemmGflops();
  const double copy_gbps = MeasureCopyGBps();
  const double p = options.prompt_tokens;
  // Prefill FLOPs: projections for every token, causal attention (QK^T and PV), lm_head for one
  // row.
  const double prefill_flops = 2.0 * matmul_params * p +
                               c.num_layers * 2.0 * 2.0 * q_dim * (p * (p + 1) / 2) +
                               2.0 * lm_head_params;
  // A decode step streams every stored weight (the tied embedding as the LM head), as stored.
  const lmserve::engine::RunnerStats stats = model.stats();
  const double decode_bytes_per_token = static_cast<double>(stats.weight_bytes);

  std::printf(
      "model            %s (%s, %lld layers, hidden %lld, %lld/%lld heads, head_dim %lld)\n",
      options.model.c_str(), c.architecture_name.c_str(), static_cast<long long>(c.num_layers),
      static_cast<long long>(h), static_cast<long long>(c.num_attention_heads),
      static_cast<long long>(c.num_kv_heads), static_cast<long long>(c.head_dim));
  std::printf("blas             %s, %d threads\n", lmserve::kernels::BlasDescription().c_str(),
              lmserve::kernels::GetBlasThreads());
  std::printf("load             %.3f s (open + weights in %s + KV pool of %d blocks)\n",
              load_seconds, std::string(lmserve::engine::RunnerDTypeName(stats.dtype)).c_str(),
              model.num_kv_blocks());
  std::printf("simd             %s; quantized matrices' inputs in %s\n",
              std::string(lmserve::kernels::SimdPathName(lmserve::kernels::BestSimdPath())).c_str(),
              options.int8_activations ? "one int8 part" : "two int8 parts");
  std::printf(
      "prefill          %.1f tokens/s (%d-token prompt, median of %d: %.2f ms; %.2f GFLOP/s = "
      "%.0f%% of the %.2f GFLOP/s sgemm floor)\n",
      p / prefill_seconds, options.prompt_tokens, options.repeats, prefill_seconds * 1e3,
      prefill_flops / prefill_seconds / 1e9,
      100 * prefill_flops / prefill_seconds / 1e9 / gemm_gflops, gemm_gflops);
  const double per_token = decode_seconds / options.decode_tokens;
  std::printf(
      "decode           %.1f tokens/s (greedy, %d tokens after the prompt, median of %d: %.2f "
      "ms/token; weights stream %.1f MB/token: floor %.2f ms/token at %.1f GB/s copy bandwidth, "
      "%.0f%% of it)\n",
      1 / per_token, options.decode_tokens, options.repeats, per_token * 1e3,
      decode_bytes_per_token / 1e6, decode_bytes_per_token / (copy_gbps * 1e9) * 1e3, copy_gbps,
      100 * decode_bytes_per_token / (copy_gbps * 1e9) / per_token);
  if (options.batch > 1) {
    std::printf("decode batch     %d sequences: %.2f ms/step (median of %d steps), %.1f tokens/s\n",
                options.batch, batch_step_seconds * 1e3, options.repeats * options.decode_tokens,
                options.batch / batch_step_seconds);
  }
  std::printf("peak RSS         %.1f MiB (getrusage ru_maxrss; the weights are %.1f MiB as stored)\n",
              peak_rss_mib, stats.weight_bytes / 1048576.0);
  return 0;
}
