// lmserve-model-bench: the CUDA model runner's step times, each next to its floor from the same
// run.
//
//   decode step at batch B, context C: the wall time of ModelRunner::Execute for B sequences of one
//     new token at context C (the serving path: inputs copied in, the graph or eager step, the
//     sampler, the tokens copied back). Floor: (weight bytes read + B * C KV bytes read) over the
//     device-to-device copy bandwidth measured here (bytes read + bytes written per second).
//     Mixtures of experts read only the experts their tokens chose: per sparse layer, the expected
//     number of distinct experts that B tokens choosing top_k of E uniformly touch,
//     E * (1 - (1 - top_k / E)^B) (exactly top_k at B = 1); the router and every dense tensor in
//     full. State-space (Mamba) layers add B sequences' states read and written once (fp32: each
//     layer's last conv_kernel - 1 conv inputs and its SSM state, 2 * StateSlotBytes a sequence).
//   prefill: the wall time of one step of S sequences of N new tokens. Floor: the step's FLOPs
//     (2 * parameters * tokens for the projections, the causal attention's QK^T and PV, the LM
//     head on the S last rows; a state-space layer's scan, on the CUDA cores, is not counted: its
//     time is in the ratio) over the GEMM rate of the runner's dtype measured here (cuBLASLt,
//     8192^3: bf16 on the tensor cores, or true fp32 for --dtype float32), on random data (x
//     uniform in [-1, 1), W within the dummy weights' 1/sqrt(k)) after half a second idle. A
//     tensor-core GEMM's speed depends on its data: the power its bit flips draw sets the clock
//     an H100 holds under its power cap, and the constant data this floor was measured on until
//     2026-11-26 (memset bytes) ran 12-15% faster than random data (bench/results section 18.1);
//     that rate and the ratio against it are printed beside.
// Weight and KV bytes are those of the runner's dtype (--dtype: bfloat16, the default, or float32,
// which holds everything in fp32: twice the bytes). With --quantization fp8 the linear layers'
// weights are E4M3 (one byte a weight, plus a 4-byte scale a row): the runner's weight bytes, and
// so the decode floor, are FP8's; the prefill floor stays at the bf16 GEMM rate. Likewise GGUF
// blocks (--quantization q8_0|q4_0|q4_k|q6_k with --dummy, or a GGUF model's blocks kept with
// --quantization gguf): the weight bytes are the blocks' (quant_gemm.h's device layout), so the
// decode floor is the quantized bytes read.
// With --kv-cache-dtype fp8 the KV cache holds E4M3 keys and values (one byte each): the decode
// floor's KV bytes are FP8's.
//
// With --timeline, one more decode step of each batch (and two more prefill steps, in one
// recording) runs with its kernels recorded (CUPTI), and the step's time is attributed to them by
// the gaps between consecutive kernels' ends: what each kernel adds to the critical path,
// overlaps of programmatic dependent launch included. The prefill line is followed by the host's
// time in Launch (enqueueing the step) and Finish (waiting for it).
//
// Usage: lmserve-model-bench --model PATH [--dummy] [--dtype bfloat16|float32]
//        [--batches 1,8,64,256] [--context 1024] [--prefill-seqs 4 --prefill-tokens 1024]
//        [--iters 30] [--no-graphs] [--decode-gemm auto|blas|skinny] [--no-pdl]
//        [--cuda-kernel-path auto|portable] [--no-fp32-residual] [--no-ssm-norm-fusion]
//        [--l2-prefetch-mib N] [--no-skinny-split-k] [--ssm-decode-late-dependents]
//        [--ssm-prefill-legacy] [--ssm-scan-warps 4|8]
//        [--tensor-parallel-size N] [--quantization auto|none|fp8|gguf|q8_0|q4_0|q4_k|q6_k]
//        [--kv-cache-dtype auto|bf16|fp8]
//        [--json FILE] [--timeline FILE] [--draw greedy|sample|masked]
//        [--tune-prefill-gemms] [--no-fuse-residual-gemm] [--sm90-gated-gemm]
//        [--no-add-norm-fold] [--gemm-table] [--mixed] [--no-split-attention]
//        [--f8-skinny-cuda-cores] [--no-gqa-packing]
//
// --mixed: after the decode and prefill steps, one step of each batch's decodes (at --context)
// together with the prefill's sequences (--prefill-seqs x --prefill-tokens from position 0), as a
// serving step of continuous batching carries them: its time, its time a token, and with
// --timeline its kernels. --no-split-attention: RunnerConfig::split_mixed_attention off (every
// sequence of such a step on the prefill attention kernel).
//
// --draw: how the decode rows pick their token: greedy (the default), sampled at temperature 1,
// or sampled at temperature 1 behind a token bitmask (structured output on the device) that
// keeps every 64th token, as a JSON state drops most of the vocabulary; the masks are written
// before each step (Execute), so the draw's wait for them ends at once.
//
// --tune-prefill-gemms: RunnerConfig::tune_prefill_gemms (cuBLASLt's algorithm for steps of many
// tokens timed on the step's operands, not the heuristic's first). --no-fuse-residual-gemm:
// RunnerConfig::fuse_residual_gemm off (o_proj and down then write bf16 rows that the next norm
// adds to the fp32 residual, as before 2026-11-26). --sm90-gated-gemm:
// RunnerConfig::sm90_gated_gemm on (the gate/up product of 2,048 tokens and more through the
// Hopper GEMM of our own with the activation in its epilogue). --no-add-norm-fold:
// RunnerConfig::fold_add_norm off (steps of one token run the add + RMSNorm before a product as a
// kernel of its own, and FP8 steps of more than 8 tokens quantize each FP8 GEMM's input in a pass
// of their own, as before 2026-11-27). --gemm-table: before the runner starts, the prefill's
// projections at its token count, each through cuBLASLt's heuristic choice and its fastest
// candidate, on random data (PrefillGemmTable).
//
// --f8-skinny-cuda-cores: FP8's products of 2 to 8 tokens on the CUDA-core kernel instead of the
// tensor-core one (fp8.h: SetF8SkinnyTensorCores), as before 2026-11-28. --no-gqa-packing: the
// Hopper prefill attention kernel's work items a query head each instead of a KV head's query
// heads together (prefill_attention_sm90.h: PrefillSm90Options::pack_gqa), as before 2026-11-29.
//
// --cuda-kernel-path portable runs the kernels' portable path (sm_80's: no bulk copies, no
// programmatic dependent launch) on a Hopper GPU; the output's "kernels:" line says which path ran
// and which code the driver loaded (a compute_80-only build runs the portable path by itself).
//
// With --tensor-parallel-size N the model runs on GPUs 0 .. N-1 and every floor is one GPU's
// (its share of the weights, KV cache and FLOPs), as each GPU works on its share at once.

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/cuda/kernel_timeline.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/runner/cuda_runner.h"
#include "engine/runner/memory_plan.h"
#include "engine/runner/model_runner.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/random_fill.h"
#include "nlohmann/json.hpp"

namespace lmserve {
namespace {

using engine::LogitsMode;
using engine::StepBatch;
using engine::StepOutput;

struct Options {
  std::string model;
  bool dummy = false;
  std::vector<int> batches = {1, 8, 64, 256};
  int context = 1024;
  int prefill_seqs = 4;
  int prefill_tokens = 1024;
  int iters = 30;
  bool graphs = true;
  engine::DecodeGemm decode_gemm = engine::DecodeGemm::kAuto;
  bool programmatic_launch = true;
  engine::CudaKernelPath kernel_path = engine::CudaKernelPath::kAuto;
  bool fp32_residual = true;
  bool fuse_ssm_norm = true;
  int64_t l2_prefetch_bytes = 0;
  bool skinny_split_k = true;
  bool f8_skinny_tensor_cores = true;
  bool pack_gqa = true;
  bool ssm_decode_late_dependents = false;
  bool ssm_prefill_legacy = false;
  int ssm_scan_warps = 0;
  int tensor_parallel_size = 1;
  engine::RunnerDType dtype = engine::RunnerDType::kBFloat16;
  engine::RunnerQuantization quantization = engine::RunnerQuantization::kAuto;
  engine::KvCacheDType kv_cache_dtype = engine::KvCacheDType::kAuto;
  std::string json;
  std::string timeline;
  std::string draw = "greedy";
  bool tune_prefill_gemms = false;
  bool fuse_residual_gemm = true;
  bool sm90_gated_gemm = false;
  bool fold_add_norm = true;
  bool gemm_table = false;
  bool mixed = false;
  bool split_mixed_attention = true;
};

int Usage(const char* message) {
  std::fprintf(stderr,
               "%s\nusage: lmserve-model-bench --model PATH [--dummy] [--dtype bfloat16|float32] "
               "[--batches 1,8,64,256] [--context 1024] [--prefill-seqs 4] "
               "[--prefill-tokens 1024] [--iters 30] [--no-graphs] "
               "[--decode-gemm auto|blas|skinny] [--no-pdl] [--cuda-kernel-path auto|portable] "
               "[--no-fp32-residual] [--no-ssm-norm-fusion] [--l2-prefetch-mib N] "
               "[--no-skinny-split-k] [--f8-skinny-cuda-cores] [--no-gqa-packing] "
               "[--ssm-decode-late-dependents] "
               "[--ssm-prefill-legacy] "
               "[--ssm-scan-warps 4|8] "
               "[--tensor-parallel-size N] [--quantization auto|none|fp8|gguf|q8_0|q4_0|q4_k|q6_k] "
               "[--kv-cache-dtype auto|bf16|fp8] [--json FILE] "
               "[--timeline FILE] [--draw greedy|sample|masked] [--tune-prefill-gemms] "
               "[--no-fuse-residual-gemm] [--sm90-gated-gemm] [--no-add-norm-fold] "
               "[--gemm-table] [--mixed] [--no-split-attention]\n",
               message);
  return 2;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Device-to-device copy bandwidth, bytes read + written per second, over 1 GiB buffers.
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  std::vector<double> rates;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    rates.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return Median(rates);
}

// What a GEMM's operands hold: a tensor-core GEMM's speed depends on its data (the power its bit
// flips draw sets the clock the GPU holds).
enum class GemmData {
  kConstant,  // every byte 0x3b (bf16 and fp32 about 0.003): the floor's data until 2026-11-26
  kRandom,    // x uniform in [-1, 1), W uniform within 1/sqrt(k) (the dummy weights' range)
};

void FillOperand(void* data, int64_t elements, kernels::DType dtype, GemmData kind, float bound,
                 uint64_t seed) {
  const size_t bytes = static_cast<size_t>(elements) * (dtype == kernels::DType::kF32 ? 4 : 2);
  if (kind == GemmData::kConstant) {
    cudaMemset(data, 0x3b, bytes);
    return;
  }
  (void)kernels::cuda::Launch(kernels::cuda::RandomFillParams{.output = data,
                                                              .num_elements = elements,
                                                              .low = -bound,
                                                              .high = bound,
                                                              .seed = seed,
                                                              .dtype = dtype},
                              nullptr);
}

// Runs `run` back to back for `sustain_ms` of device time (at least 3 runs), then returns the
// median of `iters` timed runs, in seconds.
template <typename Run>
double TimeGemm(const Run& run, double sustain_ms, int iters) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto timed_ms = [&] {
    cudaEventRecord(start);
    run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return double{ms};
  };
  double warm_ms = 0;
  for (int i = 0; i < 3 || warm_ms < sustain_ms; ++i) warm_ms += timed_ms();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) times.push_back(timed_ms() * 1e-3);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(times);
}

// The GEMM rate of cuBLASLt at 8192^3 in `dtype` (bf16: the tensor cores; f32: true fp32, as the
// runner's float32 mode runs its projections), FLOP/s: on `data`, after half a second idle (the
// clocks recover from what ran before) and `sustain_ms` of back-to-back runs (0: 3 warm-ups), the
// median of 10 (0) or 20 timed runs.
double GemmRate(kernels::DType dtype, GemmData data, double sustain_ms) {
  namespace kc = kernels::cuda;
  const int64_t n = 8192;
  const size_t bytes = n * n * (dtype == kernels::DType::kF32 ? 4 : 2);
  auto handle = kc::BlasLtHandle::Create();
  if (!handle.ok()) return 0;
  void *x = nullptr, *w = nullptr, *y = nullptr, *ws = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  cudaMalloc(&x, bytes);
  cudaMalloc(&w, bytes);
  cudaMalloc(&y, bytes);
  cudaMalloc(&ws, ws_bytes);
  FillOperand(x, n * n, dtype, data, 1.0f, 1);
  FillOperand(w, n * n, dtype, data, 1.0f / std::sqrt(static_cast<float>(n)), 2);
  auto plan = kc::GemmPlan::Create(
      (*handle)->get(), {.m = n, .n = n, .k = n, .input_dtype = dtype, .output_dtype = dtype}, ws,
      ws_bytes, /*autotune=*/true, nullptr);
  double rate = 0;
  cudaDeviceSynchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (plan.ok()) {
    const double seconds =
        TimeGemm([&] { (*plan)->Run(x, w, y, nullptr); }, sustain_ms, sustain_ms > 0 ? 20 : 10);
    rate = 2.0 * n * n * n / seconds;
  }
  plan = absl::InternalError("released");
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaFree(ws);
  return rate;
}

// The prefill's projections (layer 0's weight of each kind; not the embedding or the LM head) at
// m rows through cuBLASLt, on random data, each after 200 ms of back-to-back runs: the
// heuristic's algorithm (the runner's choice without --tune-prefill-gemms) against the fastest
// candidate (GemmPlan's autotune). Prints a line each and the sums a layer.
void PrefillGemmTable(const engine::ModelConfig& shard, int64_t m) {
  namespace kc = kernels::cuda;
  auto model = engine::DescribeModel(shard);
  auto handle = kc::BlasLtHandle::Create();
  if (!model.ok() || !handle.ok()) return;
  void* ws = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  cudaMalloc(&ws, ws_bytes);
  double heuristic_sum = 0, tuned_sum = 0;
  std::printf("\nprefill GEMMs at %lld rows (random data, 200 ms back to back each): cuBLASLt's "
              "heuristic choice against its fastest candidate\n",
              static_cast<long long>(m));
  for (const engine::WeightSpec& spec : (*model)->weights().specs()) {
    if (spec.layer != 0 || !spec.is_matrix() || spec.tied_to.present()) continue;
    const kc::GemmShape shape{.m = m, .n = spec.rows, .k = spec.cols};
    void *x = nullptr, *w = nullptr, *y = nullptr;
    if (cudaMalloc(&x, m * spec.cols * 2) != cudaSuccess ||
        cudaMalloc(&w, spec.rows * spec.cols * 2) != cudaSuccess ||
        cudaMalloc(&y, m * spec.rows * 2) != cudaSuccess) {
      cudaFree(x);
      cudaFree(w);
      cudaGetLastError();
      std::printf("  %s: no memory\n", spec.kind.c_str());
      continue;
    }
    FillOperand(x, m * spec.cols, kernels::DType::kBF16, GemmData::kRandom, 1.0f, 3);
    FillOperand(w, spec.rows * spec.cols, kernels::DType::kBF16, GemmData::kRandom,
                1.0f / std::sqrt(static_cast<float>(spec.cols)), 4);
    auto heuristic = kc::GemmPlan::Create((*handle)->get(), shape, ws, ws_bytes, false, nullptr);
    auto tuned = kc::GemmPlan::Create((*handle)->get(), shape, ws, ws_bytes, true, nullptr);
    if (heuristic.ok() && tuned.ok()) {
      const double flops = 2.0 * m * spec.rows * spec.cols;
      const double h = TimeGemm([&] { (*heuristic)->Run(x, w, y, nullptr); }, 200, 20);
      const double t = TimeGemm([&] { (*tuned)->Run(x, w, y, nullptr); }, 200, 20);
      heuristic_sum += h;
      tuned_sum += t;
      std::printf("  %-12s %6lld -> %-6lld heuristic %7.3f ms (%4.0f TFLOP/s), tuned %7.3f ms "
                  "(%4.0f TFLOP/s, %d candidates)\n",
                  spec.kind.c_str(), static_cast<long long>(spec.cols),
                  static_cast<long long>(spec.rows), h * 1e3, flops / h / 1e12, t * 1e3,
                  flops / t / 1e12, (*tuned)->candidates_tried());
    }
    heuristic = absl::InternalError("released");
    tuned = absl::InternalError("released");
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
  }
  cudaFree(ws);
  std::printf("  a layer: heuristic %.3f ms, tuned %.3f ms\n", heuristic_sum * 1e3,
              tuned_sum * 1e3);
}

// Seconds per Execute of `batch`, median of `iters` after 3 warm-ups.
double TimeSteps(engine::ModelRunner& runner, const StepBatch& batch, int iters) {
  StepOutput out;
  for (int i = 0; i < 3; ++i) {
    if (absl::Status s = runner.Execute(batch, &out); !s.ok()) {
      std::fprintf(stderr, "step failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    // The last step in an NVTX range, for profilers (`ncu --nvtx --nvtx-include "step/"`); a
    // no-op when none is attached.
    if (i == iters - 1) nvtxRangePushA("step");
    const auto start = std::chrono::steady_clock::now();
    (void)runner.Execute(batch, &out);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (i == iters - 1) nvtxRangePop();
  }
  return Median(times);
}

// `steps` more steps of `batch` (one by default) with their kernels recorded: prints the kernels
// by their share of the critical path, and returns the records (times relative to the first
// kernel's start, in us).
// `b`: the decode batch, or 0 for the prefill step (`label` names the step in the printout).
nlohmann::json RecordTimeline(engine::ModelRunner& runner, const StepBatch& batch, int b,
                              const std::string& label, int steps = 1) {
  auto timeline = bench::KernelTimeline::Start();
  if (!timeline.ok()) {
    std::printf("  timeline: %s\n", timeline.status().ToString().c_str());
    return nlohmann::json::object();
  }
  StepOutput out;
  for (int i = 0; i < steps; ++i) (void)runner.Execute(batch, &out);
  cudaDeviceSynchronize();
  const std::vector<bench::KernelRecord> records = (*timeline)->Stop();
  if (records.empty()) return nlohmann::json::object();
  uint64_t first_start = records.front().start_ns;
  for (const auto& r : records) first_start = std::min(first_start, r.start_ns);
  const double span_us = (records.back().end_ns - first_start) * 1e-3;
  std::printf("  %s timeline: %zu kernels over %.1f us; by share of the critical path:\n",
              label.c_str(), records.size(), span_us);
  nlohmann::json shares = nlohmann::json::array();
  for (const bench::KernelShare& s : bench::Summarize(records)) {
    if (s.critical_us >= 0.005 * span_us) {
      std::printf("    %8.1f us %5.1f%%  %4d x %7.2f us busy  %s\n", s.critical_us,
                  100.0 * s.critical_us / span_us, s.count, s.busy_us / s.count, s.name.c_str());
    }
    shares.push_back({{"name", s.name}, {"count", s.count}, {"busy_us", s.busy_us},
                      {"critical_us", s.critical_us}});
  }
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& r : records) {
    kernels.push_back({{"name", r.name}, {"start_us", (r.start_ns - first_start) * 1e-3},
                       {"end_us", (r.end_ns - first_start) * 1e-3}});
  }
  return {{"batch", b}, {"step", label}, {"span_us", span_us}, {"shares", shares},
          {"kernels", kernels}};
}

// The token decode sequence s brings, and a prompt of n tokens: the same in the decode, prefill
// and mixed steps, so that a mixed step is the other two's sequences in one step.
int32_t DecodeToken(int s, int64_t vocab_size) {
  return static_cast<int32_t>((s * 7919 + 13) % vocab_size);
}
std::vector<int32_t> PromptTokens(int n, int64_t vocab_size) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 31 + 7) % vocab_size);
  return tokens;
}

// Adds sequence s of `count` to `batch` with a block table of `per_table` blocks in each of the
// runner's `groups` KV cache groups (engine/model/kv_cache_groups.h: Gemma 2's windowed and full
// layers), every table its own blocks: group g's table of s starts at block (g * count + s) *
// per_table.
void AddBenchSequence(StepBatch& batch, std::span<const int32_t> tokens, int32_t computed, int s,
                      int count, int per_table, int groups) {
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(groups));
  std::vector<std::span<const int32_t>> spans;
  for (int g = 0; g < groups; ++g) {
    tables[g].resize(static_cast<size_t>(per_table));
    std::iota(tables[g].begin(), tables[g].end(), (g * count + s) * per_table);
    spans.emplace_back(tables[g]);
  }
  batch.AddSequence(tokens, computed, spans, LogitsMode::kSample);
}

int Run(const Options& o) {
  const std::vector<kernels::cuda::DeviceInfo> devices = kernels::cuda::ListDevices();
  if (devices.empty()) {
    std::fprintf(stderr, "lmserve-model-bench: no CUDA GPU on this machine\n");
    return 1;
  }
  auto checkpoint = o.dummy ? engine::OpenConfigOnlyCheckpoint(o.model)
                            : engine::OpenCheckpoint(o.model);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "%s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  const engine::ModelConfig& c = (*checkpoint)->config();
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());

  const bool f32 = o.dtype == engine::RunnerDType::kFloat32;
  const std::string dtype_name(engine::RunnerDTypeName(o.dtype));
  const double bandwidth = CopyBandwidth();
  const kernels::DType gemm_dtype = f32 ? kernels::DType::kF32 : kernels::DType::kBF16;
  // The prefill floor's rate: random data (the dummy weights' kind). The constant data of the
  // floor until 2026-11-26 runs faster than any real weights can (bench/results section 18.1).
  const double gemm_rate = GemmRate(gemm_dtype, GemmData::kRandom, 0);
  const double gemm_rate_constant = GemmRate(gemm_dtype, GemmData::kConstant, 0);
  const double gemm_rate_sustained =
      o.gemm_table ? GemmRate(gemm_dtype, GemmData::kRandom, 500) : 0;
  std::printf("device: %s; copy bandwidth %.0f GB/s (read + write); %s GEMM %.0f TFLOP/s "
              "(random data; constant data %.0f",
              devices[0].name.c_str(), bandwidth / 1e9, dtype_name.c_str(), gemm_rate / 1e12,
              gemm_rate_constant / 1e12);
  if (o.gemm_table) {
    std::printf("; random, after 500 ms back to back %.0f", gemm_rate_sustained / 1e12);
  }
  std::printf(")\n");
  if (o.gemm_table && !f32) {
    auto shard = engine::ShardModelConfig(c, o.tensor_parallel_size, 0);
    if (shard.ok()) PrefillGemmTable(*shard, int64_t{o.prefill_seqs} * o.prefill_tokens);
  }

  engine::RunnerConfig config;
  config.backend = engine::Backend::kCuda;
  config.dtype = o.dtype;
  config.quantization = o.quantization;
  config.kv_cache_dtype = o.kv_cache_dtype;
  config.load_format = o.dummy ? engine::LoadFormat::kDummy : engine::LoadFormat::kCheckpoint;
  // The prefill's sequences need state slots too (state-space layers: one a sequence).
  config.max_num_seqs = o.mixed ? max_batch + o.prefill_seqs : std::max(max_batch, o.prefill_seqs);
  config.max_num_batched_tokens =
      std::max(o.prefill_seqs * o.prefill_tokens + (o.mixed ? max_batch : 0), 256);
  config.kv_cache_bytes = 0;
  config.cuda_graphs = o.graphs;
  config.decode_gemm = o.decode_gemm;
  config.programmatic_launch = o.programmatic_launch;
  config.cuda_kernel_path = o.kernel_path;
  config.fp32_residual = o.fp32_residual;
  config.fuse_ssm_norm = o.fuse_ssm_norm;
  config.skinny_l2_prefetch_bytes = o.l2_prefetch_bytes;
  config.skinny_split_k = o.skinny_split_k;
  config.ssm_decode_late_dependents = o.ssm_decode_late_dependents;
  config.ssm_prefill_legacy = o.ssm_prefill_legacy;
  config.ssm_scan_warps = o.ssm_scan_warps;
  config.tensor_parallel_size = o.tensor_parallel_size;
  config.tune_prefill_gemms = o.tune_prefill_gemms;
  config.fuse_residual_gemm = o.fuse_residual_gemm;
  config.sm90_gated_gemm = o.sm90_gated_gemm;
  config.fold_add_norm = o.fold_add_norm;
  config.split_mixed_attention = o.split_mixed_attention;
  kernels::cuda::SetF8SkinnyTensorCores(o.f8_skinny_tensor_cores);
  kernels::cuda::SetPrefillSm90Options({.pack_gqa = o.pack_gqa});
  auto runner = engine::ModelRunner::Create(**checkpoint, config);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }
  const engine::RunnerStats stats = (*runner)->stats();
  std::printf(
      "model: %s (%s): %lld layers, hidden %lld, heads %lld/%lld, vocab %lld; weights "
      "%.2f GiB %s%s, KV pool %.1f GiB%s (%d blocks); start-up %.1f s with %d CUDA graphs\n",
      o.model.c_str(), o.dummy ? "dummy weights" : "checkpoint",
      static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_kv_heads),
      static_cast<long long>(c.vocab_size), stats.weight_bytes / 1073741824.0,
      std::string(engine::RunnerDTypeName(stats.dtype)).c_str(),
      stats.quantization == engine::RunnerQuantization::kFp8    ? " (linear layers FP8)"
      : stats.quantization == engine::RunnerQuantization::kNone ? ""
                                                                : " (linear layers in GGUF blocks)",
      stats.kv_cache_bytes / 1073741824.0,
      stats.kv_cache_dtype == engine::KvCacheDType::kFp8 ? " FP8" : "", (*runner)->num_kv_blocks(),
      stats.startup_seconds, stats.num_cuda_graphs);
  // The runner has set the process-wide path (the current GPU's code decides; ranks' GPUs alike).
  const bool hopper_kernels = kernels::cuda::UseHopperKernels();
  const int code_capability = kernels::cuda::KernelCodeCapability(0);
  std::printf(
      "kernels: %s path (--cuda-kernel-path %s; code for compute %d.%d loaded on "
      "compute capability %d.%d), programmatic dependent launch %s\n",
      hopper_kernels ? "Hopper" : "portable",
      std::string(engine::CudaKernelPathName(o.kernel_path)).c_str(), code_capability / 10,
      code_capability % 10, devices[0].compute_capability_major,
      devices[0].compute_capability_minor, o.programmatic_launch && hopper_kernels ? "on" : "off");

  const int32_t block = (*runner)->block_size_tokens();
  const int groups = static_cast<int>((*runner)->kv_group_windows().size());
  // With tensor parallelism the floors are one GPU's: its share of the weights and the KV cache
  // (every rank reads its share at once; the all-reduces are not in the floor).
  const int tp = o.tensor_parallel_size;
  const auto sharded = engine::ShardModelConfig(c, tp, 0);
  if (!sharded.ok()) {
    std::fprintf(stderr, "%s\n", sharded.status().ToString().c_str());
    return 1;
  }
  const engine::ModelConfig& shard = *sharded;
  // Weights a decode step reads: all but the embedding table (a few rows), unless it is also
  // the LM head.
  const int64_t element_bytes = engine::RunnerDTypeBytes(stats.dtype);
  const int64_t embed_bytes = engine::VocabShardRows(shard) * c.hidden_size * element_bytes;
  const int64_t weight_read = stats.weight_bytes / tp - (c.tie_word_embeddings ? 0 : embed_bytes);
  // The experts' bytes of each sparse layer (mixtures of experts), of which a step reads a part.
  std::vector<double> expert_layer_bytes;
  if (c.num_experts > 0) {
    auto model = engine::DescribeModel(shard);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      return 1;
    }
    const engine::WeightPlan& plan = (*model)->weights();
    std::vector<engine::Weight> experts = plan.OfKind("moe_gate_up");
    const std::vector<engine::Weight> down = plan.OfKind("moe_down");
    experts.insert(experts.end(), down.begin(), down.end());
    expert_layer_bytes.assign(static_cast<size_t>(c.num_layers), 0.0);
    for (engine::Weight w : experts) {
      expert_layer_bytes[plan[w].layer] += static_cast<double>(plan[w].num_elements()) *
                                           static_cast<double>(element_bytes);
    }
    std::printf("mixture of experts: %lld experts, top %lld; a step reads the experts its tokens "
                "choose (expected distinct under uniform routing)\n",
                static_cast<long long>(c.num_experts),
                static_cast<long long>(c.num_experts_per_tok));
  }
  // The weight bytes a decode step of `b` sequences reads.
  auto weights_read = [&](int b) {
    double bytes = static_cast<double>(weight_read);
    for (double layer_bytes : expert_layer_bytes) {
      const double e = static_cast<double>(c.num_experts);
      const double k = static_cast<double>(c.num_experts_per_tok);
      const double active = e * (1.0 - std::pow(1.0 - k / e, b));
      bytes -= layer_bytes * (1.0 - active / e);
    }
    return bytes;
  };
  const int64_t kv_token_bytes =
      engine::CudaKvBlockBytes(shard, 1, stats.dtype, stats.kv_cache_dtype);
  // A sequence's recurrent state, read and written once a decode step (state-space layers).
  const double state_step_bytes = 2.0 * static_cast<double>(engine::StateSlotBytes(shard));
  int64_t params = stats.weight_bytes / element_bytes / tp;  // one GPU's
  if (stats.quantization != engine::RunnerQuantization::kNone) {  // bytes are not elements
    auto model = engine::DescribeModel(shard);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
      return 1;
    }
    params = engine::WeightPlanBytes((*model)->weights(), 1);
  }
  nlohmann::json results = {
      {"device", devices[0].name},
      {"model", o.model},
      {"dummy_weights", o.dummy},
      {"cuda_graphs", o.graphs},
      {"dtype", dtype_name},
      {"quantization", engine::RunnerQuantizationName(stats.quantization)},
      {"kv_cache_dtype", engine::KvCacheDTypeName(stats.kv_cache_dtype)},
      {"fp32_residual", o.fp32_residual},
      {"fuse_ssm_norm", o.fuse_ssm_norm},
      {"skinny_l2_prefetch_bytes", o.l2_prefetch_bytes},
      {"skinny_split_k", o.skinny_split_k},
      {"f8_skinny_tensor_cores", o.f8_skinny_tensor_cores},
      {"pack_gqa", o.pack_gqa},
      {"ssm_decode_late_dependents", o.ssm_decode_late_dependents},
      {"ssm_prefill_legacy", o.ssm_prefill_legacy},
      {"ssm_scan_warps", o.ssm_scan_warps},
      {"cuda_kernel_path", engine::CudaKernelPathName(o.kernel_path)},
      {"kernels", hopper_kernels ? "hopper" : "portable"},
      {"kernel_code_capability", code_capability},
      {"programmatic_launch", o.programmatic_launch && hopper_kernels},
      {"tensor_parallel_size", tp},
      {"copy_bandwidth_bytes_per_s", bandwidth},
      {"gemm_flops_per_s", gemm_rate},
      {"gemm_flops_per_s_constant_data", gemm_rate_constant},
      {"gemm_flops_per_s_random_sustained", gemm_rate_sustained},
      {"tune_prefill_gemms", o.tune_prefill_gemms},
      {"fuse_residual_gemm", o.fuse_residual_gemm},
      {"sm90_gated_gemm", o.sm90_gated_gemm},
      {"fold_add_norm", o.fold_add_norm},
      {"weight_bytes", stats.weight_bytes},
      {"startup_seconds", stats.startup_seconds},
      {"decode", nlohmann::json::array()}};

  std::printf("\n%-8s %-8s %12s %12s %8s %14s\n", "batch", "context", "step (ms)", "floor (ms)",
              "ratio", "tokens/s");
  const int blocks_per_seq = (o.context + 1 + block - 1) / block;
  nlohmann::json timelines = nlohmann::json::array();
  for (int b : o.batches) {
    if (int64_t{b} * blocks_per_seq * groups > (*runner)->num_kv_blocks()) {
      std::printf("%-8d %-8d skipped: the KV pool holds %d blocks, this needs %lld\n", b,
                  o.context, (*runner)->num_kv_blocks(),
                  static_cast<long long>(int64_t{b} * blocks_per_seq * groups));
      continue;
    }
    StepBatch batch;
    for (int s = 0; s < b; ++s) {
      const int32_t token = DecodeToken(s, c.vocab_size);
      AddBenchSequence(batch, std::span(&token, 1), o.context, s, b, blocks_per_seq, groups);
      batch.sampling.push_back({});
      if (o.draw != "greedy") {
        batch.sampling.back().temperature = 1.0f;
        batch.sampling.back().seed = static_cast<uint64_t>(s);
        batch.sampling.back().masked = o.draw == "masked";
      }
    }
    if (o.draw == "masked") {
      // Every 64th token kept (bit 0 of every other word).
      batch.token_bitmask.assign(static_cast<size_t>(b) * ((c.vocab_size + 31) / 32), 0u);
      for (size_t w = 0; w < batch.token_bitmask.size(); w += 2) batch.token_bitmask[w] = 1u;
    }
    const double seconds = TimeSteps(**runner, batch, o.iters);
    const double step_weight_bytes = weights_read(b);
    const double floor = (step_weight_bytes + double{1.0} * b * (o.context + 1) * kv_token_bytes +
                          b * state_step_bytes) /
                         bandwidth;
    std::printf("%-8d %-8d %12.3f %12.3f %8.2f %14.0f\n", b, o.context + 1, seconds * 1e3,
                floor * 1e3, seconds / floor, b / seconds);
    results["decode"].push_back({{"batch", b},
                                 {"context", o.context + 1},
                                 {"step_seconds", seconds},
                                 {"floor_seconds", floor},
                                 {"weight_bytes_read", step_weight_bytes},
                                 {"state_bytes", b * state_step_bytes},
                                 {"ratio", seconds / floor}});
    if (!o.timeline.empty()) {
      timelines.push_back(RecordTimeline(**runner, batch, b, "batch " + std::to_string(b)));
    }
  }

  // Prefill: S sequences of N new tokens from position 0.
  if (o.prefill_seqs > 0 && o.prefill_tokens > 0) {
    const int n = o.prefill_tokens;
    const int nb = (n + block - 1) / block;
    StepBatch batch;
    const std::vector<int32_t> tokens = PromptTokens(n, c.vocab_size);
    for (int s = 0; s < o.prefill_seqs; ++s) {
      AddBenchSequence(batch, tokens, 0, s, o.prefill_seqs, nb, groups);
      batch.sampling.push_back({});
    }
    const double seconds = TimeSteps(**runner, batch, std::max(5, o.iters / 3));
    const double total_tokens = double{1.0} * o.prefill_seqs * n;
    const double head_params = double{1.0} * engine::VocabShardRows(shard) * c.hidden_size;
    // Each token runs top_k of the E experts of a sparse layer.
    double inactive_expert_params = 0;
    for (double layer_bytes : expert_layer_bytes) {
      inactive_expert_params += layer_bytes / static_cast<double>(element_bytes) *
                                (1.0 - static_cast<double>(c.num_experts_per_tok) /
                                           static_cast<double>(c.num_experts));
    }
    const double body_params = static_cast<double>(params) - head_params -
                               (c.tie_word_embeddings ? 0.0 : head_params) -
                               inactive_expert_params;
    const double attention_flops = 2.0 * 2.0 * o.prefill_seqs * (double{1.0} * n * (n + 1) / 2) *
                                   shard.num_attention_heads * c.head_dim * c.num_layers;
    const double flops = 2.0 * body_params * total_tokens + attention_flops +
                         2.0 * head_params * o.prefill_seqs;
    const double floor = flops / gemm_rate;
    const double constant_floor = flops / gemm_rate_constant;
    std::printf("\nprefill %d x %d tokens: %.2f ms (%.0f tokens/s, %.0f TFLOP/s); floor %.2f ms; "
                "ratio %.2f (constant-data floor %.2f ms: ratio %.2f)\n",
                o.prefill_seqs, n, seconds * 1e3, total_tokens / seconds, flops / seconds / 1e12,
                floor * 1e3, seconds / floor, constant_floor * 1e3, seconds / constant_floor);
    // Where the host's time goes: enqueueing the step (Launch) and waiting for it (Finish).
    {
      std::vector<double> launch_ms, finish_ms;
      StepOutput out;
      for (int i = 0; i < 5; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)(*runner)->Launch(batch, &out);
        const auto t1 = std::chrono::steady_clock::now();
        (void)(*runner)->Finish();
        const auto t2 = std::chrono::steady_clock::now();
        launch_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        finish_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
      std::printf("  host: Launch %.2f ms, Finish %.2f ms (medians of 5)\n", Median(launch_ms),
                  Median(finish_ms));
      results["prefill_launch_ms"] = Median(launch_ms);
      results["prefill_finish_ms"] = Median(finish_ms);
    }
    results["prefill"] = {{"seqs", o.prefill_seqs}, {"tokens_per_seq", n},
                          {"step_seconds", seconds}, {"flops", flops},
                          {"floor_seconds", floor}, {"ratio", seconds / floor},
                          {"constant_data_floor_seconds", constant_floor},
                          {"tokens_per_second", total_tokens / seconds}};
    if (!o.timeline.empty()) {
      // Two steps in one recording: a gap in the first that the second lacks is the recording's
      // own (CUPTI starting up), not the step's.
      timelines.push_back(RecordTimeline(
          **runner, batch, 0,
          "prefill " + std::to_string(o.prefill_seqs) + " x " + std::to_string(n) + ", 2 steps",
          2));
    }
  }
  // Mixed: each batch's decodes and the prefill's sequences in one step.
  if (o.mixed && o.prefill_seqs > 0 && o.prefill_tokens > 0) {
    const int n = o.prefill_tokens;
    const int per_table = std::max(blocks_per_seq, (n + block - 1) / block);
    const std::vector<int32_t> tokens = PromptTokens(n, c.vocab_size);
    results["mixed"] = nlohmann::json::array();
    std::printf("\n%-8s %-8s %-12s %12s %16s\n", "decodes", "context", "prefill", "step (ms)",
                "us a token");
    for (int b : o.batches) {
      const int count = b + o.prefill_seqs;
      if (int64_t{count} * per_table * groups > (*runner)->num_kv_blocks()) {
        std::printf("%-8d skipped: the KV pool holds %d blocks\n", b, (*runner)->num_kv_blocks());
        continue;
      }
      StepBatch batch;
      for (int s = 0; s < b; ++s) {
        const int32_t token = DecodeToken(s, c.vocab_size);
        AddBenchSequence(batch, std::span(&token, 1), o.context, s, count, per_table, groups);
        batch.sampling.push_back({});
      }
      for (int s = 0; s < o.prefill_seqs; ++s) {
        AddBenchSequence(batch, tokens, 0, b + s, count, per_table, groups);
        batch.sampling.push_back({});
      }
      const double seconds = TimeSteps(**runner, batch, std::max(5, o.iters / 3));
      const int64_t step_tokens = int64_t{b} + int64_t{o.prefill_seqs} * n;
      const std::string prefill = std::to_string(o.prefill_seqs) + " x " + std::to_string(n);
      std::printf("%-8d %-8d %-12s %12.3f %16.2f\n", b, o.context + 1, prefill.c_str(),
                  seconds * 1e3, seconds * 1e6 / static_cast<double>(step_tokens));
      results["mixed"].push_back({{"decodes", b},
                                  {"context", o.context + 1},
                                  {"prefill_seqs", o.prefill_seqs},
                                  {"prefill_tokens_per_seq", n},
                                  {"step_seconds", seconds}});
      if (!o.timeline.empty()) {
        timelines.push_back(RecordTimeline(**runner, batch, b,
                                           "mixed " + std::to_string(b) + " + " + prefill));
      }
    }
  }
  if (!o.timeline.empty()) std::ofstream(o.timeline) << timelines.dump(1) << "\n";
  if (!o.json.empty()) {
    std::ofstream(o.json) << results.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace lmserve

int main(int argc, char** argv) {
  lmserve::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model") {
      o.model = value();
    } else if (arg == "--dummy") {
      o.dummy = true;
    } else if (arg == "--dtype") {
      const std::string name = value();
      const auto dtype = lmserve::engine::RunnerDTypeFromName(name);
      if (!dtype.has_value() || *dtype == lmserve::engine::RunnerDType::kAuto) {
        return lmserve::Usage(("--dtype: '" + name + "' is not bfloat16 or float32").c_str());
      }
      o.dtype = *dtype;
    } else if (arg == "--quantization") {
      const std::string name = value();
      const auto quantization = lmserve::engine::RunnerQuantizationFromName(name);
      if (!quantization.has_value()) {
        return lmserve::Usage(("--quantization: '" + name +
                               "' is not auto, none, fp8, gguf, q8_0, q4_0, q4_k or q6_k")
                                  .c_str());
      }
      o.quantization = *quantization;
    } else if (arg == "--kv-cache-dtype") {
      const std::string name = value();
      const auto kv_dtype = lmserve::engine::KvCacheDTypeFromName(name);
      if (!kv_dtype.has_value()) {
        return lmserve::Usage(
            ("--kv-cache-dtype: '" + name + "' is not auto, bf16 or fp8").c_str());
      }
      o.kv_cache_dtype = *kv_dtype;
    } else if (arg == "--no-graphs") {
      o.graphs = false;
    } else if (arg == "--decode-gemm") {
      const std::string name = value();
      const auto choice = lmserve::engine::DecodeGemmFromName(name);
      if (!choice.has_value()) {
        return lmserve::Usage(
            ("--decode-gemm: '" + name + "' is not auto, blas or skinny").c_str());
      }
      o.decode_gemm = *choice;
    } else if (arg == "--no-pdl") {
      o.programmatic_launch = false;
    } else if (arg == "--cuda-kernel-path") {
      const std::string name = value();
      const auto path = lmserve::engine::CudaKernelPathFromName(name);
      if (!path.has_value()) {
        return lmserve::Usage(
            ("--cuda-kernel-path: '" + name + "' is not auto or portable").c_str());
      }
      o.kernel_path = *path;
    } else if (arg == "--no-fp32-residual") {
      o.fp32_residual = false;
    } else if (arg == "--no-ssm-norm-fusion") {
      o.fuse_ssm_norm = false;
    } else if (arg == "--no-skinny-split-k") {
      o.skinny_split_k = false;
    } else if (arg == "--f8-skinny-cuda-cores") {
      o.f8_skinny_tensor_cores = false;
    } else if (arg == "--no-gqa-packing") {
      o.pack_gqa = false;
    } else if (arg == "--ssm-decode-late-dependents") {
      o.ssm_decode_late_dependents = true;
    } else if (arg == "--ssm-prefill-legacy") {
      o.ssm_prefill_legacy = true;
    } else if (arg == "--ssm-scan-warps") {
      o.ssm_scan_warps = std::atoi(value().c_str());
      if (o.ssm_scan_warps != 4 && o.ssm_scan_warps != 8) {
        return lmserve::Usage("--ssm-scan-warps: 4 or 8");
      }
    } else if (arg == "--l2-prefetch-mib") {
      const double mib = std::atof(value().c_str());
      if (!(mib >= 0)) return lmserve::Usage("--l2-prefetch-mib: a size of at least 0");
      o.l2_prefetch_bytes = static_cast<int64_t>(mib * 1048576.0);
    } else if (arg == "--tensor-parallel-size") {
      o.tensor_parallel_size = std::atoi(value().c_str());
    } else if (arg == "--batches") {
      o.batches.clear();
      const std::string list = value();
      for (std::string_view part : lmserve::StrSplit(list, ',')) {
        o.batches.push_back(std::atoi(std::string(part).c_str()));
      }
    } else if (arg == "--context") {
      o.context = std::atoi(value().c_str());
    } else if (arg == "--prefill-seqs") {
      o.prefill_seqs = std::atoi(value().c_str());
    } else if (arg == "--prefill-tokens") {
      o.prefill_tokens = std::atoi(value().c_str());
    } else if (arg == "--iters") {
      o.iters = std::atoi(value().c_str());
    } else if (arg == "--json") {
      o.json = value();
    } else if (arg == "--timeline") {
      o.timeline = value();
    } else if (arg == "--tune-prefill-gemms") {
      o.tune_prefill_gemms = true;
    } else if (arg == "--no-fuse-residual-gemm") {
      o.fuse_residual_gemm = false;
    } else if (arg == "--sm90-gated-gemm") {
      o.sm90_gated_gemm = true;
    } else if (arg == "--no-add-norm-fold") {
      o.fold_add_norm = false;
    } else if (arg == "--gemm-table") {
      o.gemm_table = true;
    } else if (arg == "--mixed") {
      o.mixed = true;
    } else if (arg == "--no-split-attention") {
      o.split_mixed_attention = false;
    } else if (arg == "--draw") {
      o.draw = value();
      if (o.draw != "greedy" && o.draw != "sample" && o.draw != "masked") {
        return lmserve::Usage("--draw: greedy, sample or masked");
      }
    } else {
      return lmserve::Usage(("unknown argument " + arg).c_str());
    }
  }
  if (o.model.empty()) return lmserve::Usage("--model is required");
  if (o.batches.empty() || o.context < 0 || o.iters < 1) return lmserve::Usage("bad options");
  for (int b : o.batches) {
    if (b < 1) return lmserve::Usage("--batches: sizes must be positive");
  }
  return lmserve::Run(o);
}
