// lmserve-kernels-bench: times the CUDA decoder-step kernels against the device's own ceilings.
//
// Measures, in one run: the device-to-device copy bandwidth (bytes read + written over time, a
// 1 GiB cudaMemcpyAsync) and the cuBLASLt bf16 GEMM rate (8192^3, fp32 accumulation); then each
// kernel at the sizes of the acceptance targets, reporting the bytes it must move (each input read
// once, each output written once) over its median time next to the copy bandwidth, or its FLOPs
// over time next to the GEMM rate. Every timed launch follows an L2 flush (a write of twice the L2
// size), is bracketed by CUDA events, and comes after warm-up launches; inputs are random, never
// zeros.
//
// Usage: lmserve-kernels-bench [--json PATH] [--commit SHA] [--iters N] [--filter SUBSTRING]
//                              [--cuda-kernel-path auto|portable] [--kv-cache-dtype bf16|fp8]
// (--cuda-kernel-path portable: the kernels' portable path on a Hopper GPU too, device.h; decode
// attention is the kernel whose figures it changes, and no kernel chains by programmatic launch.)
// (--kv-cache-dtype fp8: decode and prefill attention read an FP8 E4M3 cache, and the decode
// rows' bytes are its one byte an element; the rows' names say "fp8 KV".)

#include <cuda_runtime.h>

// Results are written as partial aggregates; the rest keep their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/qkv_postprocess.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_sm90.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/qkv_postprocess.h"
#include "kernels/cuda/quant_gemm.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/ssm.h"

namespace lmserve::kernels::cuda {
namespace {

#define CHECK_CUDA(expr)                                                                    \
  do {                                                                                      \
    const cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                    \
                   cudaGetErrorString(err_));                                               \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

struct Options {
  std::string json_path;
  std::string commit = "unknown";
  std::string command;
  int iters = 30;
  std::string filter;
  bool kv_fp8 = false;  // --kv-cache-dtype fp8
};

// Device memory owned for the whole run.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(bytes) { CHECK_CUDA(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16))); }
  ~Buffer() { cudaFree(ptr_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

std::mt19937 rng(12345);

// Random values (bf16 of N(0, stddev), or fp32), uploaded: up to 4M fresh values, then repeated
// by device copies to fill large buffers quickly.
void FillRepeated(const Buffer& b, const void* host, size_t host_bytes) {
  const size_t first = std::min(host_bytes, b.bytes());
  CHECK_CUDA(cudaMemcpy(b.get(), host, first, cudaMemcpyHostToDevice));
  for (size_t done = first; done < b.bytes();) {
    const size_t n = std::min(done, b.bytes() - done);
    CHECK_CUDA(cudaMemcpy(b.get<char>() + done, b.get(), n, cudaMemcpyDeviceToDevice));
    done += n;
  }
}
void FillBf16(const Buffer& b, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> host(std::min<size_t>(b.bytes() / 2, size_t{1} << 22));
  for (auto& x : host) x = F32ToBf16(dist(rng));
  FillRepeated(b, host.data(), host.size() * 2);
}
void FillF8(const Buffer& b, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint8_t> host(std::min<size_t>(b.bytes(), size_t{1} << 22));
  for (auto& x : host) x = F32ToF8E4M3(dist(rng));
  FillRepeated(b, host.data(), host.size());
}
void FillF32(const Buffer& b, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> host(std::min<size_t>(b.bytes() / 4, size_t{1} << 22));
  for (auto& x : host) x = dist(rng);
  FillRepeated(b, host.data(), host.size() * 4);
}
// ||out - ref|| / ||ref|| of two bf16 arrays on the device of `count` elements, in double; -1
// where ref is all zeros. A check printed beside a timing, not a test.
double RelativeL2Bf16(const void* out, const void* ref, size_t count) {
  std::vector<uint16_t> a(count), b(count);
  CHECK_CUDA(cudaMemcpy(a.data(), out, count * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(b.data(), ref, count * 2, cudaMemcpyDeviceToHost));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    const double d = static_cast<double>(Bf16ToF32(a[i])) - Bf16ToF32(b[i]);
    diff += d * d;
    norm += static_cast<double>(Bf16ToF32(b[i])) * Bf16ToF32(b[i]);
  }
  return norm > 0 ? std::sqrt(diff / norm) : -1.0;
}

template <typename T>
void Upload(const Buffer& b, const std::vector<T>& host) {
  CHECK_CUDA(cudaMemcpy(b.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
}

struct Result {
  std::string name;
  std::string shape;
  double median_us = 0, min_us = 0;
  double bytes = 0, flops = 0;
  double rate = 0;  // GB/s or TFLOP/s
  double ceiling = 0;
  double fraction = 0;
  std::string unit;
  std::string target;  // e.g. ">= 85% copy BW"
  double target_fraction = 0;  // 0: none
  double target_us = 0;        // 0: none
  bool pass = true;
};

class Bench {
 public:
  explicit Bench(const Options& options) : options_(options) {
    CHECK_CUDA(cudaStreamCreate(&stream_));
    CHECK_CUDA(cudaEventCreate(&start_));
    CHECK_CUDA(cudaEventCreate(&stop_));
    const auto devices = ListDevices();
    if (devices.empty()) {
      std::fprintf(stderr, "no CUDA device\n");
      std::exit(2);
    }
    device_ = devices[0];
    flush_ = std::make_unique<Buffer>(std::max<int64_t>(device_.l2_cache_bytes * 2, 64 << 20));
  }

  // Median (and minimum) time of `fn` in microseconds over iters launches, each after an L2 flush.
  std::pair<double, double> Time(const std::function<void()>& fn, int warmup = 3) {
    return TimeInTurn({{std::string(), fn}}, warmup).front();
  }

  bool Selected(const std::string& name) const {
    return options_.filter.empty() || name.find(options_.filter) != std::string::npos;
  }

  void Record(Result r) {
    if (r.bytes > 0) {
      r.unit = "GB/s";
      r.rate = r.bytes / (r.median_us * 1e-6) / 1e9;
      r.ceiling = copy_gbps_;
    } else {
      r.unit = "TFLOP/s";
      r.rate = r.flops / (r.median_us * 1e-6) / 1e12;
      r.ceiling = gemm_tflops_;
    }
    r.fraction = r.ceiling > 0 ? r.rate / r.ceiling : 0;
    if (r.target_fraction > 0) r.pass = r.fraction >= r.target_fraction;
    if (r.target_us > 0) r.pass = r.median_us <= r.target_us;
    std::printf("%-34s %-44s %10.1f us %9.1f %-7s %5.1f%% of %7.1f  %s%s\n", r.name.c_str(),
                r.shape.c_str(), r.median_us, r.rate, r.unit.c_str(), 100 * r.fraction, r.ceiling,
                r.target.c_str(), r.target.empty() ? "" : (r.pass ? " PASS" : " MISS"));
    std::fflush(stdout);
    results_.push_back(r);
  }

  void MeasureCeilings() {
    // Copy bandwidth: 1 GiB device to device.
    const size_t bytes = size_t{1} << 30;
    Buffer src(bytes), dst(bytes);
    CHECK_CUDA(cudaMemset(src.get(), 0x3c, bytes));
    auto [copy_us, copy_min] = Time([&] {
      CHECK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
    });
    copy_gbps_ = 2.0 * bytes / (copy_us * 1e-6) / 1e9;
    // cuBLASLt bf16 GEMM rate, 8192^3, random inputs.
    auto handle = BlasLtHandle::Create();
    if (!handle.ok()) std::exit(3);
    handle_ = std::move(*handle);
    gemm_workspace_ = std::make_unique<Buffer>(32 << 20);
    const int64_t n = 8192;
    Buffer a(n * n * 2), b(n * n * 2), c(n * n * 2);
    FillBf16(a);
    FillBf16(b);
    GemmShape shape;
    shape.m = shape.n = shape.k = n;
    auto plan = GemmPlan::Create(handle_->get(), shape, gemm_workspace_->get(),
                                 gemm_workspace_->bytes(), true, stream_);
    if (!plan.ok()) std::exit(3);
    auto [gemm_us, gemm_min] = Time([&] { (*plan)->Run(a.get(), b.get(), c.get(), stream_); });
    gemm_tflops_ = 2.0 * n * n * n / (gemm_us * 1e-6) / 1e12;
    std::printf("device: %s, %d SMs, L2 %lld MB\n", device_.name.c_str(),
                device_.multiprocessor_count,
                static_cast<long long>(device_.l2_cache_bytes >> 20));
    std::printf("ceilings: copy %.1f GB/s (1 GiB D2D, read+write, median %.1f us); cuBLASLt bf16 "
                "GEMM 8192^3 %.1f TFLOP/s (median %.1f us)\n\n",
                copy_gbps_, copy_us, gemm_tflops_, gemm_us);
    Result copy{"copy (ceiling)", "1 GiB D2D", copy_us, copy_min, 2.0 * bytes};
    Result gemm{"cuBLASLt GEMM (ceiling)", "bf16 8192x8192x8192", gemm_us, gemm_min, 0,
                2.0 * n * n * n};
    Record(copy);
    Record(gemm);
  }

  void Norms() {
    const int64_t tokens = 8192, hidden = 4096;
    Buffer x(tokens * hidden * 2), res(tokens * hidden * 2), w(hidden * 2), out(tokens * hidden * 2);
    FillBf16(x);
    FillBf16(res);
    FillBf16(w);
    if (Selected("add_rmsnorm")) {
      FusedAddRmsNormParams p;
      p.residual = res.get();
      p.input = x.get();
      p.weight = w.get();
      p.output = out.get();
      p.num_tokens = tokens;
      p.hidden_size = hidden;
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"fused add+RMSNorm", "8192 tok x 4096, bf16", us, min_us,
              4.0 * tokens * hidden * 2 + hidden * 2, 0, 0, 0, 0, "", ">=85% copy", 0.85});
    }
    if (Selected("rmsnorm")) {
      RmsNormParams p;
      p.input = x.get();
      p.weight = w.get();
      p.output = out.get();
      p.num_tokens = tokens;
      p.hidden_size = hidden;
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"RMSNorm", "8192 tok x 4096, bf16", us, min_us,
              2.0 * tokens * hidden * 2 + hidden * 2, 0});
    }
  }

  void Qkv() {
    if (!Selected("qkv")) return;
    const int64_t tokens = 8192, heads = 32, kv_heads = 8, head_dim = 128, block = 16;
    const int64_t row = (heads + 2 * kv_heads) * head_dim;
    const int64_t num_blocks = tokens / block + 16;
    Buffer qkv(tokens * row * 2), q(tokens * heads * head_dim * 2),
        k(num_blocks * block * kv_heads * head_dim * 2), v(k.bytes()), pos(tokens * 4),
        slots(tokens * 8), table(tokens * head_dim * 4);
    FillBf16(qkv);
    std::vector<int32_t> positions(tokens);
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<int64_t> slot_ids(num_blocks * block);
    std::iota(slot_ids.begin(), slot_ids.end(), 0);
    std::vector<int32_t> block_order(num_blocks);
    std::iota(block_order.begin(), block_order.end(), 0);
    std::shuffle(block_order.begin(), block_order.end(), rng);
    for (int64_t t = 0; t < tokens; ++t) slot_ids[t] = block_order[t / block] * block + t % block;
    slot_ids.resize(tokens);
    Upload(pos, positions);
    Upload(slots, slot_ids);
    std::vector<double> inv_freq(head_dim / 2);
    for (int64_t i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(500000.0, -2.0 * i / head_dim);
    Upload(table, RotaryCosSinTable(inv_freq.data(), head_dim, tokens));
    QkvPostProcessParams p;
    p.qkv = qkv.get();
    p.positions = pos.get<int32_t>();
    p.cos_sin = table.get<float>();
    p.slot_mapping = slots.get<int64_t>();
    p.query_out = q.get();
    p.key_cache = k.get();
    p.value_cache = v.get();
    p.num_tokens = tokens;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.block_size = block;
    p.num_blocks = num_blocks;
    p.max_position = tokens;
    auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
    // qkv read, q/k/v written, positions, slots and each token's cos/sin row read once.
    const double bytes = 2.0 * tokens * row * 2 + tokens * (4 + 8 + head_dim * 4);
    Record({"QKV post-processing (rotary+KV)", "8192 tok, 32/8 heads, d128, bf16", us, min_us,
            bytes, 0, 0, 0, 0, "", ">=75% copy", 0.75});
    // As an FP8 serving step has it: 8 sequences of 1024 positions, the query written over qkv,
    // an FP8 GEMM's output scales applied, and an FP8 cache.
    std::vector<int32_t> step_positions(tokens);
    for (int64_t t = 0; t < tokens; ++t) step_positions[t] = static_cast<int32_t>(t % 1024);
    Upload(pos, step_positions);
    Buffer row_scales(tokens * 4), col_scales(row * 4);
    FillF32(row_scales, 0.01f);
    FillF32(col_scales, 0.01f);
    p.query_out = qkv.get();
    p.query_out_stride = row;
    for (const bool f8 : {false, true}) {
      // qkv read, queries and the cache written, positions, slots and row scales read.
      const double step_bytes = tokens * row * 2.0 + tokens * heads * head_dim * 2.0 +
                                2.0 * tokens * kv_heads * head_dim * (f8 ? 1 : 2) +
                                tokens * (4 + 8 + 4);
      p.cache_fp8 = f8;
      p.qkv_row_scales = f8 ? row_scales.get<float>() : nullptr;
      p.qkv_col_scales = f8 ? col_scales.get<float>() : nullptr;
      auto [step_us, step_min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"QKV post-processing (rotary+KV)",
              f8 ? "8 x 1024 tok, in place, FP8 scales and cache" : "8 x 1024 tok, in place",
              step_us, step_min_us, step_bytes, 0, 0, 0, 0, "", "", 0});
    }
  }

  void Silu() {
    if (!Selected("silu")) return;
    const int64_t tokens = 8192, inter = 14336;
    Buffer in(tokens * inter * 4), out(tokens * inter * 2);
    FillBf16(in, 3.0f);
    SiluAndMulParams p{in.get(), out.get(), tokens, inter, DType::kBF16};
    auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
    Record({"SiLU-and-mul", "8192 tok x 14336, bf16", us, min_us, 3.0 * tokens * inter * 2, 0, 0,
            0, 0, "", ">=85% copy", 0.85});
  }

  // The gated activation of an FP8 layer: the FP8 GEMM's unscaled gate/up product in, its scales
  // applied as read, the output quantized per token for the down projection (SiluAndMulParams's
  // row_scales, col_scales and f8_output): a serving decode step's 1,024 rows and a big step's.
  void SiluF8() {
    if (!Selected("silu")) return;
    const int64_t inter = 14336;
    for (int64_t tokens : {int64_t{1024}, int64_t{16384}}) {
      Buffer in(tokens * inter * 4), out(tokens * inter), out_scales(tokens * 4),
          row_scales(tokens * 4), col_scales(2 * inter * 4);
      FillBf16(in, 3.0f);
      std::vector<float> rs(tokens), cs(2 * inter);
      std::uniform_real_distribution<float> scale(0.5f, 2.0f);
      for (float& v : rs) v = scale(rng);
      for (float& v : cs) v = scale(rng);
      Upload(row_scales, rs);
      Upload(col_scales, cs);
      SiluAndMulParams p{.gate_up = in.get(),
                         .num_tokens = tokens,
                         .intermediate_size = inter,
                         .row_scales = row_scales.get<float>(),
                         .col_scales = col_scales.get<float>(),
                         .f8_output = out.get(),
                         .f8_output_scales = out_scales.get<float>()};
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"SiLU-and-mul FP8", std::to_string(tokens) + " tok x 14336, scaled, E4M3 out", us,
              min_us, tokens * inter * 5.0 + tokens * 8.0, 0});
    }
  }

  // spread > 0: the sequences' contexts run through context - spread / 2 .. context + spread / 2
  // - 1 in turn (serving's mix of lengths), not all `context`.
  void Decode(int64_t batch, int64_t context, double target, int forced_splits = 0,
              const std::string& tag = "", int64_t spread = 0) {
    const bool fp8 = options_.kv_fp8;
    const std::string name = "decode attention b" + std::to_string(batch) +
                             (fp8 ? " fp8 KV" : "") + (forced_splits > 0 ? " (fixed splits)" : "") +
                             tag;
    if (!Selected("decode")) return;
    const int64_t heads = 32, kv_heads = 8, head_dim = 128, block = 16;
    const int64_t kv_element_bytes = fp8 ? 1 : 2;
    std::vector<int32_t> context_lens(batch);
    for (int64_t i = 0; i < batch; ++i) {
      context_lens[i] =
          static_cast<int32_t>(spread > 0 ? context - spread / 2 + i % spread : context);
    }
    const int64_t total_keys =
        std::accumulate(context_lens.begin(), context_lens.end(), int64_t{0});
    const int64_t longest = *std::max_element(context_lens.begin(), context_lens.end());
    const int64_t blocks_per_seq = (longest + block - 1) / block;
    const int64_t num_blocks = batch * blocks_per_seq;
    Buffer q(batch * heads * head_dim * 2), out(q.bytes()),
        k(num_blocks * block * kv_heads * head_dim * kv_element_bytes), v(k.bytes()),
        lens(batch * 4), starts((batch + 1) * 4), ids(num_blocks * 4);
    FillBf16(q);
    if (fp8) {
      FillF8(k);
      FillF8(v);
    } else {
      FillBf16(k);
      FillBf16(v);
    }
    std::vector<int32_t> block_ids(num_blocks);
    std::iota(block_ids.begin(), block_ids.end(), 0);
    std::shuffle(block_ids.begin(), block_ids.end(), rng);
    std::vector<int32_t> start(batch + 1);
    for (int64_t i = 0; i <= batch; ++i) start[i] = static_cast<int32_t>(i * blocks_per_seq);
    Upload(lens, context_lens);
    Upload(starts, start);
    Upload(ids, block_ids);
    const int max_splits =
        forced_splits > 0
            ? forced_splits
            : DecodeAttentionParams::ChooseMaxSplits(batch, heads, kv_heads, head_dim, DType::kBF16,
                                                     1.0, fp8);
    Buffer ws(DecodeAttentionParams::WorkspaceBytes(batch, heads, head_dim, max_splits));
    DecodeAttentionParams p;
    p.cache_fp8 = fp8;
    p.query = q.get();
    p.key_cache = k.get();
    p.value_cache = v.get();
    p.context_lens = lens.get<int32_t>();
    p.block_table_start = starts.get<int32_t>();
    p.block_table_ids = ids.get<int32_t>();
    p.output = out.get();
    p.workspace = ws.get();
    p.num_seqs = batch;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.block_size = block;
    p.num_blocks = num_blocks;
    p.max_splits = max_splits;
    p.scale = 1.0f / std::sqrt(128.0f);
    auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
    const double bytes = 2.0 * total_keys * kv_heads * head_dim * kv_element_bytes +
                         2.0 * batch * heads * head_dim * 2 + batch * (4 + blocks_per_seq * 4);
    char shape[96];
    if (spread > 0) {
      std::snprintf(shape, sizeof(shape), "ctx %lld-%lld, 32/8 heads, d128, blk16, splits<=%d",
                    static_cast<long long>(context - spread / 2),
                    static_cast<long long>(context - spread / 2 + spread - 1), max_splits);
    } else {
      std::snprintf(shape, sizeof(shape), "ctx %lld, 32/8 heads, d128, blk16, splits<=%d",
                    static_cast<long long>(context), max_splits);
    }
    char target_text[32];
    std::snprintf(target_text, sizeof(target_text), ">=%.0f%% copy", 100 * target);
    if (forced_splits > 0 || target <= 0) {
      Record({name, shape, us, min_us, bytes, 0});
    } else {
      Record({name, shape, us, min_us, bytes, 0, 0, 0, 0, "", target_text, target});
    }
  }

  // window, softcap: the attention's sliding window and score soft-cap (0: none); the FLOPs
  // count the keys inside each row's window alone.
  // seq_lens: each sequence's new tokens; with `prefix`, each follows a cached prefix of that many
  // tokens (chunked prefill, speculative decoding's draft tokens), its keys read from the cache.
  void Prefill(const std::vector<int32_t>& seq_lens, int64_t head_dim, const std::string& name,
               double target_tflops, int32_t window = 0, float softcap = 0, int32_t prefix = 0) {
    const bool fp8 = options_.kv_fp8;
    if (!Selected(name)) return;
    const int64_t heads = 32, kv_heads = 8, block = 16;
    const int64_t kv_element_bytes = fp8 ? 1 : 2;
    int64_t tokens = 0, num_blocks = 0;
    double flops = 0;
    std::vector<int32_t> query_start{0}, table_start{0}, table_ids, context_lens;
    for (int32_t len : seq_lens) {
      tokens += len;
      query_start.push_back(static_cast<int32_t>(tokens));
      const int32_t context = prefix + len;
      context_lens.push_back(context);
      const int64_t nb = (context + block - 1) / block;
      for (int64_t j = 0; j < nb; ++j) table_ids.push_back(static_cast<int32_t>(num_blocks + j));
      num_blocks += nb;
      table_start.push_back(static_cast<int32_t>(table_ids.size()));
      if (prefix > 0) {  // rows at positions prefix .. context - 1, keys up to their own (no
                         // window: the rows here do not take one)
        const double n = len;
        flops += 4.0 * head_dim * heads * (n * prefix + n * (n + 1) / 2);
        continue;
      }
      const double w = window > 0 ? std::min(window, len) : len;  // keys of the last rows
      flops += 4.0 * head_dim * heads * (w * (w + 1) / 2 + (len - w) * w);
    }
    std::shuffle(table_ids.begin(), table_ids.end(), rng);
    Buffer q(tokens * heads * head_dim * 2), out(q.bytes()),
        k(num_blocks * block * kv_heads * head_dim * kv_element_bytes), v(k.bytes()),
        qs(query_start.size() * 4), lens(context_lens.size() * 4), ts(table_start.size() * 4),
        ids(table_ids.size() * 4), ws(PrefillAttentionParams::WorkspaceBytes(seq_lens.size()));
    FillBf16(q);
    if (fp8) {
      FillF8(k);
      FillF8(v);
    } else {
      FillBf16(k);
      FillBf16(v);
    }
    Upload(qs, query_start);
    Upload(lens, context_lens);
    Upload(ts, table_start);
    Upload(ids, table_ids);
    PrefillAttentionParams p;
    p.query = q.get();
    p.key_cache = k.get();
    p.value_cache = v.get();
    p.query_start = qs.get<int32_t>();
    p.context_lens = lens.get<int32_t>();
    p.block_table_start = ts.get<int32_t>();
    p.block_table_ids = ids.get<int32_t>();
    p.output = out.get();
    p.workspace = ws.get();
    p.num_seqs = static_cast<int64_t>(seq_lens.size());
    p.num_tokens = tokens;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.block_size = block;
    p.num_blocks = num_blocks;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    p.cache_fp8 = fp8;
    p.window = window;
    p.softcap = softcap;
    CHECK_CUDA(LaunchPrefillPlan(p, stream_));
    p.plan_ready = true;
    auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
    char shape[128];
    std::snprintf(shape, sizeof(shape), "%zu seq, %lld tok%s, 32/8 heads, d%lld, causal, %s%s%s",
                  seq_lens.size(), static_cast<long long>(tokens),
                  prefix > 0 ? (" +" + std::to_string(prefix)).c_str() : "",
                  static_cast<long long>(head_dim),
                  ChoosePrefillKernel(p) == PrefillKernelKind::kWgmmaSm90 ? "wgmma" : "mma.sync",
                  fp8 ? ", fp8 KV" : "", window > 0 || softcap > 0 ? ", window/softcap" : "");
    Result r{name, shape, us, min_us, 0, flops};
    if (target_tflops > 0) {
      char target_text[32];
      std::snprintf(target_text, sizeof(target_text), ">=%.0f TFLOP/s", target_tflops);
      r.target = target_text;
      r.target_fraction = target_tflops / std::max(gemm_tflops_, 1.0);
    }
    Record(r);
  }

  // Where a sampling launch's time goes: one more launch (after an L2 flush) with
  // SamplingParams::profile set; the mean over rows of each step's SM cycles, and in us at the
  // clock that the slowest row's cycles over the timed median imply (a lower bound on the clock:
  // the median includes the launch).
  void SamplingSteps(SamplingParams p, const Buffer& profile, double median_us) {
    p.profile = profile.get<long long>();
    CHECK_CUDA(cudaMemsetAsync(profile.get(), 0, profile.bytes(), stream_));
    CHECK_CUDA(cudaMemsetAsync(flush_->get(), 1, flush_->bytes(), stream_));
    CHECK_CUDA(Launch(p, stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    std::vector<long long> stamps(static_cast<size_t>(p.num_rows) * kSamplingProfileStamps);
    CHECK_CUDA(cudaMemcpy(stamps.data(), profile.get(), stamps.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<double> mean(kSamplingProfileStamps, 0.0);
    double slowest = 0;
    for (int64_t r = 0; r < p.num_rows; ++r) {
      const long long* row = stamps.data() + r * kSamplingProfileStamps;
      for (int k = 1; k < kSamplingProfileStamps; ++k) {
        mean[k] += static_cast<double>(row[k] - row[k - 1]) / static_cast<double>(p.num_rows);
      }
      slowest = std::max(slowest, static_cast<double>(row[kSamplingProfileStamps - 1] - row[0]));
    }
    const double per_us = slowest / median_us;
    static const char* const kSteps[kSamplingProfileStamps] = {
        "", "pass 1", "coverage", "histogram", "thresholds", "kept weight", "token"};
    std::printf("  steps (mean cycles | us at %.0f cycles/us):", per_us);
    for (int k = 1; k < kSamplingProfileStamps; ++k) {
      std::printf(" %s %.0f | %.1f;", kSteps[k], mean[k], mean[k] / per_us);
    }
    std::printf(" slowest row %.0f cycles\n", slowest);
    std::fflush(stdout);
  }

  void Sampling() {
    const int64_t rows = 128, vocab = 128256;
    Buffer logits(rows * vocab * 4), out(rows * 4), temp(rows * 4), top_k(rows * 4),
        top_p(rows * 4), min_p(rows * 4), seeds(rows * 8), steps(rows * 8),
        profile(rows * kSamplingProfileStamps * 8);
    FillF32(logits, 3.0f);
    std::vector<uint64_t> seed_values(rows), step_values(rows, 7);
    for (int64_t i = 0; i < rows; ++i) seed_values[i] = 1000 + i;
    Upload(seeds, seed_values);
    Upload(steps, step_values);
    struct Variant {
      const char* name;
      int32_t k;
      float p, min_p;
      bool target;
      float temperature = 0.8f;
    };
    // The last row: temperature 0.3 makes the rows peaked (about 50 tokens within 10.5 nats of
    // the maximum, where 0.8 puts about 7,000 there).
    for (const Variant& var : {Variant{"sampling top-p 0.9", 0, 0.9f, 0.0f, true},
                               Variant{"sampling top-k 50 + top-p 0.9", 50, 0.9f, 0.0f, true},
                               Variant{"sampling temperature only", 0, 1.0f, 0.0f, false},
                               Variant{"sampling min-p 0.05", 0, 1.0f, 0.05f, false},
                               Variant{"sampling top-p 0.9, T 0.3", 0, 0.9f, 0.0f, false, 0.3f}}) {
      if (!Selected("sampling")) continue;
      Upload(temp, std::vector<float>(rows, var.temperature));
      Upload(top_k, std::vector<int32_t>(rows, var.k));
      Upload(top_p, std::vector<float>(rows, var.p));
      Upload(min_p, std::vector<float>(rows, var.min_p));
      SamplingParams p;
      p.logits = logits.get<float>();
      p.output = out.get<int32_t>();
      p.temperature = temp.get<float>();
      p.top_k = top_k.get<int32_t>();
      p.top_p = top_p.get<float>();
      p.min_p = min_p.get<float>();
      p.seeds = seeds.get<uint64_t>();
      p.steps = steps.get<uint64_t>();
      p.num_rows = rows;
      p.vocab_size = vocab;
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Result r{var.name, "128 rows x 128256 fp32 logits", us, min_us, 4.0 * rows * vocab, 0};
      if (var.target) {
        r.target = "<100 us";
        r.target_us = 100;
      }
      Record(r);
      SamplingSteps(p, profile, us);
    }
    if (Selected("argmax")) {
      ArgmaxParams p{logits.get<float>(), out.get<int32_t>(), rows, vocab, 0};
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"argmax", "128 rows x 128256 fp32 logits", us, min_us, 4.0 * rows * vocab, 0});
    }
  }

  // Mamba-2-2.7B's decode update of one layer (kernels/cuda/ssm.h): 80 heads of 64, state 128,
  // one group, conv kernel 4, each sequence in its own slot; both block shapes at each batch.
  // Bytes: each sequence's SSM state read and written (2.6 MB each way) and its conv ring's
  // older taps; the rest (in_proj's columns, the output) is small beside them.
  void SsmDecode() {
    if (!Selected("ssm")) return;
    const int64_t heads = 80, head_dim = 64, state = 128, kernel = 4;
    const int64_t inner = heads * head_dim, conv_dim = inner + 2 * state;
    const int64_t in_proj = inner + conv_dim + heads;
    for (int64_t batch : {1, 64}) {
      Buffer in(batch * in_proj * 2), conv_w(conv_dim * kernel * 2), conv_b(conv_dim * 2),
          per_head(heads * 2), conv_states(batch * kernel * conv_dim * 4),
          ssm_states(batch * heads * head_dim * state * 4), out(batch * inner * 2),
          query_start((batch + 1) * 4), context(batch * 4), slots(batch * 4);
      FillBf16(in);
      FillBf16(conv_w, 0.5f);
      FillBf16(conv_b, 0.1f);
      FillBf16(per_head, 0.5f);
      CHECK_CUDA(cudaMemset(conv_states.get(), 0, conv_states.bytes()));
      CHECK_CUDA(cudaMemset(ssm_states.get(), 0, ssm_states.bytes()));
      std::vector<int32_t> starts(batch + 1), lens(batch, 1025), slot_ids(batch);
      for (int64_t i = 0; i <= batch; ++i) starts[i] = static_cast<int32_t>(i);
      for (int64_t i = 0; i < batch; ++i) slot_ids[i] = static_cast<int32_t>(i);
      Upload(query_start, starts);
      Upload(context, lens);
      Upload(slots, slot_ids);
      const SsmDeviceSequences seqs{.query_start = query_start.get<int32_t>(),
                                    .context_lens = context.get<int32_t>(),
                                    .state_slots = slots.get<int32_t>(),
                                    .num_seqs = batch,
                                    .num_slots = batch};
      const auto* in_bytes = in.get<unsigned char>();
      SsmDecodeParams p{
          .conv = {.seqs = seqs,
                   .input = in_bytes + inner * 2,
                   .input_stride = in_proj,
                   .weight = conv_w.get(),
                   .bias = conv_b.get(),
                   .output = out.get(),
                   .conv_states = conv_states.get<float>(),
                   .channels = conv_dim,
                   .kernel = kernel},
          .scan = {.seqs = seqs,
                   .xbc = in.get(),
                   .xbc_stride = conv_dim,
                   .dt = in_bytes + (inner + conv_dim) * 2,
                   .dt_stride = in_proj,
                   .dt_bias = per_head.get(),
                   .a_log = per_head.get(),
                   .d = per_head.get(),
                   .output = out.get(),
                   .ssm_states = ssm_states.get<float>(),
                   .num_heads = heads,
                   .head_dim = head_dim,
                   .state_size = state,
                   .n_groups = 1}};
      const double bytes = batch * (2.0 * heads * head_dim * state * 4 + 3.0 * conv_dim * 4);
      for (SsmDecodeBlocks blocks : {SsmDecodeBlocks::kSmall, SsmDecodeBlocks::kLarge}) {
        p.blocks = blocks;
        auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
        char shape[96];
        std::snprintf(shape, sizeof(shape), "Mamba-2-2.7B layer, batch %lld, %s blocks",
                      static_cast<long long>(batch),
                      blocks == SsmDecodeBlocks::kSmall ? "small" : "large");
        Record({"SSM decode update", shape, us, min_us, bytes, 0});
      }
    }
  }

  void Misc() {
    if (Selected("embedding")) {
      const int64_t vocab = 128256, hidden = 4096, tokens = 8192;
      Buffer table(vocab * hidden * 2), ids(tokens * 4), out(tokens * hidden * 2);
      FillBf16(table);
      std::vector<int32_t> id_values(tokens);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (auto& id : id_values) id = pick(rng);
      Upload(ids, id_values);
      EmbeddingParams p{table.get(), ids.get<int32_t>(), out.get(), tokens, vocab, hidden,
                        DType::kBF16};
      auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
      Record({"embedding gather", "8192 tok x 4096, bf16", us, min_us, 2.0 * tokens * hidden * 2, 0});
    }
    if (Selected("dequant")) {
      const int64_t n = int64_t{4096} * 14336;
      for (DType dtype : {DType::kQ4_K, DType::kQ8_0, DType::kQ6_K}) {
        const BlockLayout layout = GetBlockLayout(dtype);
        const int64_t src_bytes = n / layout.elements_per_block * layout.bytes_per_block;
        Buffer src(src_bytes), dst(n * 2);
        std::vector<uint8_t> host(src_bytes);
        std::uniform_int_distribution<int> byte(0, 255);
        for (auto& b : host) b = static_cast<uint8_t>(byte(rng));
        Upload(src, host);
        DequantizeParams p{src.get(), dst.get(), n, dtype};
        auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
        Record({std::string("dequantize ") + std::string(DTypeName(dtype)) + " -> bf16",
                "4096 x 14336", us, min_us, static_cast<double>(src_bytes) + n * 2, 0});
      }
    }
    if (Selected("skinny")) {
      // The decode projections of Llama-3-8B (QKV, O, gate/up, down, LM head in fp32) and of
      // Mamba-2-2.7B (in_proj, out_proj): the skinny kernel and cuBLASLt's autotuned plan at the
      // batch sizes that decide between them.
      struct Projection {
        const char* name;
        int64_t n, k;
        bool f32_out;
      };
      for (const Projection& proj : {Projection{"qkv", 6144, 4096, false}, {"o", 4096, 4096, false},
                                     {"gate_up", 28672, 4096, false}, {"down", 4096, 14336, false},
                                     {"lm_head", 128256, 4096, true},
                                     {"mamba2 in_proj", 10576, 2560, false},
                                     {"mamba2 out_proj", 2560, 5120, false}}) {
        Buffer w(proj.n * proj.k * 2), x(64 * proj.k * 2), y(64 * proj.n * 4);
        FillBf16(w, 0.05f);
        FillBf16(x);
        for (int64_t m : {1, 8, 64}) {
          char shape_text[64];
          std::snprintf(shape_text, sizeof(shape_text), "%s m %lld n %lld k %lld", proj.name,
                        static_cast<long long>(m), static_cast<long long>(proj.n),
                        static_cast<long long>(proj.k));
          const double bytes = 2.0 * (proj.n * proj.k + m * proj.k) + m * proj.n * (proj.f32_out ? 4 : 2);
          if (m <= kMaxSkinnyGemmRows) {
            SkinnyGemmParams p{.x = x.get(), .w = w.get(), .y = y.get(), .m = m, .n = proj.n,
                               .k = proj.k,
                               .output_dtype = proj.f32_out ? DType::kF32 : DType::kBF16};
            auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
            Record({"skinny GEMM", shape_text, us, min_us, bytes, 0});
            if (std::string_view(proj.name) == "gate_up") {
              p.silu_and_mul = true;
              auto [fused_us, fused_min] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
              Record({"skinny GEMM + SiLU", shape_text, fused_us, fused_min,
                      bytes - m * proj.n, 0});
            }
          }
          GemmShape shape;
          shape.m = m;
          shape.n = proj.n;
          shape.k = proj.k;
          if (proj.f32_out) shape.output_dtype = DType::kF32;
          auto plan = GemmPlan::Create(handle_->get(), shape, gemm_workspace_->get(),
                                       gemm_workspace_->bytes(), true, stream_);
          if (!plan.ok()) continue;
          auto [us, min_us] = Time([&] { (*plan)->Run(x.get(), w.get(), y.get(), stream_); });
          Record({"cuBLASLt GEMM", shape_text, us, min_us, bytes, 0});
        }
      }
    }
    if (Selected("quantized")) {
      // GGUF blocks on the GPU (quant_gemm.h): the quantized skinny kernel over Llama-3-8B's
      // decode projections, its bytes the blocks' (quantized W, bf16 x and y); and the
      // dequantization to bf16 that larger steps run before cuBLASLt (bytes: blocks + bf16 out).
      struct Projection {
        const char* name;
        int64_t n, k;
      };
      for (DType dtype : {DType::kQ4_K, DType::kQ8_0, DType::kQ4_0, DType::kQ6_K}) {
        for (const Projection& proj : {Projection{"qkv", 6144, 4096},
                                       {"o", 4096, 4096},
                                       {"gate_up", 28672, 4096},
                                       {"down", 4096, 14336}}) {
          const int64_t w_bytes = QuantMatrixBytes(dtype, proj.n, proj.k);
          Buffer w(w_bytes), x(8 * proj.k * 2), y(8 * proj.n * 2), wd(proj.n * proj.k * 2);
          const QuantDummyFillParams fill{.dst = w.get(),
                                          .dtype = dtype,
                                          .matrix_rows = proj.n,
                                          .cols = proj.k,
                                          .first_row = 0,
                                          .rows = proj.n,
                                          .high = 0.05f,
                                          .seed = 7};
          CHECK_CUDA(Launch(fill, stream_));
          FillBf16(x);
          for (int64_t m : {1, 2, 4, 8}) {
            char shape_text[80];
            std::snprintf(shape_text, sizeof(shape_text), "%s %s m %lld n %lld k %lld",
                          std::string(DTypeName(dtype)).c_str(), proj.name,
                          static_cast<long long>(m), static_cast<long long>(proj.n),
                          static_cast<long long>(proj.k));
            const double bytes = static_cast<double>(w_bytes) + 2.0 * m * (proj.k + proj.n);
            QuantSkinnyGemmParams p{.x = x.get(),
                                    .w = w.get(),
                                    .w_dtype = dtype,
                                    .y = y.get(),
                                    .m = m,
                                    .n = proj.n,
                                    .k = proj.k};
            auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
            Record({"quant skinny GEMM", shape_text, us, min_us, bytes, 0});
            if (std::string_view(proj.name) == "gate_up") {
              p.silu_and_mul = true;
              auto [fused_us, fused_min] = Time([&] { CHECK_CUDA(Launch(p, stream_)); });
              Record({"quant skinny GEMM + SiLU", shape_text, fused_us, fused_min,
                      bytes - m * proj.n, 0});
            }
          }
          const QuantDequantizeParams dq{
              .w = w.get(), .dst = wd.get(), .dtype = dtype, .rows = proj.n, .cols = proj.k};
          auto [us, min_us] = Time([&] { CHECK_CUDA(Launch(dq, stream_)); });
          // A check, not a test (tests/kernels_gpu/quant_gemm_test.cc is): the skinny kernel at
          // m 8 against cuBLASLt's bf16 GEMM over the dequantized weight, relative L2.
          {
            GemmShape shape;
            shape.m = 8;
            shape.n = proj.n;
            shape.k = proj.k;
            auto plan = GemmPlan::Create(handle_->get(), shape, gemm_workspace_->get(),
                                         gemm_workspace_->bytes(), false, stream_);
            Buffer y_ref(8 * proj.n * 2);
            const QuantSkinnyGemmParams p{.x = x.get(),
                                          .w = w.get(),
                                          .w_dtype = dtype,
                                          .y = y.get(),
                                          .m = 8,
                                          .n = proj.n,
                                          .k = proj.k};
            CHECK_CUDA(Launch(p, stream_));
            if (plan.ok()) (*plan)->Run(x.get(), wd.get(), y_ref.get(), stream_);
            CHECK_CUDA(cudaStreamSynchronize(stream_));
            std::printf("check %s %s: skinny m 8 vs dequantize + cuBLASLt: relative L2 %.3g%s\n",
                        std::string(DTypeName(dtype)).c_str(), proj.name,
                        RelativeL2Bf16(y.get(), y_ref.get(), 8 * proj.n),
                        plan.ok() ? "" : " (no plan)");
          }
          char shape_text[80];
          std::snprintf(shape_text, sizeof(shape_text), "%s %s n %lld k %lld",
                        std::string(DTypeName(dtype)).c_str(), proj.name,
                        static_cast<long long>(proj.n), static_cast<long long>(proj.k));
          Record({"quant dequantize -> bf16", shape_text, us, min_us,
                  static_cast<double>(w_bytes) + 2.0 * proj.n * proj.k, 0});
        }
      }
    }
    if (Selected("gemm")) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 6144, 4096},
                             {8192, 6144, 4096}, {8192, 4096, 14336}}) {
        Buffer x(m * k * 2), w(n * k * 2), y(m * n * 2);
        FillBf16(x);
        FillBf16(w, 0.05f);
        GemmShape shape;
        shape.m = m;
        shape.n = n;
        shape.k = k;
        auto plan = GemmPlan::Create(handle_->get(), shape, gemm_workspace_->get(),
                                     gemm_workspace_->bytes(), true, stream_);
        if (!plan.ok()) continue;
        auto [us, min_us] = Time([&] { (*plan)->Run(x.get(), w.get(), y.get(), stream_); });
        char shape_text[64];
        std::snprintf(shape_text, sizeof(shape_text), "m %lld n %lld k %lld", static_cast<long long>(m),
                      static_cast<long long>(n), static_cast<long long>(k));
        if (m <= 64) {
          Record({"GEMM (weights-bound)", shape_text, us, min_us, 2.0 * (n * k + m * k + m * n), 0});
        } else {
          Record({"GEMM", shape_text, us, min_us, 0, 2.0 * m * n * k});
        }
      }
    }
  }

  // The Hopper GEMM of our own (gemm_sm90.h) against cuBLASLt at the 8B model's prefill
  // projections (4,096 tokens), and its SiLU-and-mul epilogue against cuBLASLt followed by the
  // gated activation's kernel. The kernels of a shape run in turn, iteration by iteration (each
  // after an L2 flush), so that the GPU's warming (its clock under the power cap) falls on all
  // of them alike; medians.
  void Sm90Gemms() {
    if (!Selected("sm90 gemm") || !Sm90GemmAvailable()) return;
    struct Case {
      const char* name;
      int64_t m, n, k;
    };
    for (const Case& c : {Case{"qkv", 4096, 6144, 4096}, Case{"o", 4096, 4096, 4096},
                          Case{"gate_up", 4096, 28672, 4096}, Case{"gate_up", 2048, 28672, 4096},
                          Case{"down", 4096, 4096, 14336},
                          Case{"square", 8192, 8192, 8192}}) {
      const bool gated = std::string(c.name) == "gate_up";
      Buffer x(c.m * c.k * 2), w(c.n * c.k * 2), y(c.m * c.n * 2), y2(c.m * c.n * 2),
          act(c.m * c.n);
      FillBf16(x);
      FillBf16(w, 1.0f / std::sqrt(static_cast<float>(c.k)));
      GemmShape shape;
      shape.m = c.m;
      shape.n = c.n;
      shape.k = c.k;
      auto plan = GemmPlan::Create(handle_->get(), shape, gemm_workspace_->get(),
                                   gemm_workspace_->bytes(), false, stream_);
      if (!plan.ok()) continue;
      std::vector<std::pair<std::string, std::function<void()>>> kernels;
      kernels.emplace_back("cuBLASLt", [&] { (*plan)->Run(x.get(), w.get(), y.get(), stream_); });
      for (int cluster : {1, 2}) {
        Sm90GemmParams p{.x = x.get(), .w = w.get(), .y = y2.get(), .m = c.m, .n = c.n, .k = c.k};
        p.cluster = cluster;
        kernels.emplace_back(cluster == 1 ? "ours" : "ours, clusters of 2",
                             [&, p] { CHECK_CUDA(LaunchSm90Gemm(p, stream_)); });
      }
      if (gated) {
        SiluAndMulParams silu{.gate_up = y.get(), .output = act.get(), .num_tokens = c.m,
                              .intermediate_size = c.n / 2};
        kernels.emplace_back("cuBLASLt + SiluAndMul", [&, silu] {
          (*plan)->Run(x.get(), w.get(), y.get(), stream_);
          CHECK_CUDA(Launch(silu, stream_));
        });
        for (int cluster : {1, 2}) {
          Sm90GemmParams p{.x = x.get(), .w = w.get(), .y = act.get(), .m = c.m, .n = c.n,
                           .k = c.k, .epilogue = Sm90GemmEpilogue::kSiluAndMul};
          p.cluster = cluster;
          kernels.emplace_back(cluster == 1 ? "ours, SiLU epilogue"
                                            : "ours, SiLU epilogue, clusters of 2",
                               [&, p] { CHECK_CUDA(LaunchSm90Gemm(p, stream_)); });
        }
      }
      const std::vector<std::pair<double, double>> times = TimeInTurn(kernels);
      char shape_text[80];
      std::snprintf(shape_text, sizeof(shape_text), "%s m %lld n %lld k %lld", c.name,
                    static_cast<long long>(c.m), static_cast<long long>(c.n),
                    static_cast<long long>(c.k));
      for (size_t i = 0; i < kernels.size(); ++i) {
        Record({"sm90 gemm: " + kernels[i].first, shape_text, times[i].first, times[i].second, 0,
                2.0 * c.m * c.n * c.k});
      }
      // A check, not a test (tests/kernels_gpu/gemm_sm90_test.cc is): ours against cuBLASLt.
      kernels[0].second();
      kernels[1].second();
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      std::printf("  relative L2 against cuBLASLt: %.2e\n",
                  RelativeL2Bf16(y2.get(), y.get(), c.m * c.n));
    }
  }

  // Median and minimum time in microseconds of each kernel, run in turn iters times (the first
  // of the turn rotating), each after an L2 flush, after `warmup` turns.
  std::vector<std::pair<double, double>> TimeInTurn(
      const std::vector<std::pair<std::string, std::function<void()>>>& kernels, int warmup = 3) {
    const size_t count = kernels.size();
    for (int i = 0; i < warmup; ++i) {
      for (const auto& k : kernels) k.second();
    }
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    CHECK_CUDA(cudaGetLastError());
    std::vector<std::vector<double>> times(count);
    for (int i = 0; i < options_.iters; ++i) {
      for (size_t j = 0; j < count; ++j) {
        const size_t which = (i + j) % count;
        CHECK_CUDA(cudaMemsetAsync(flush_->get(), i & 0xff, flush_->bytes(), stream_));
        CHECK_CUDA(cudaEventRecord(start_, stream_));
        kernels[which].second();
        CHECK_CUDA(cudaEventRecord(stop_, stream_));
        CHECK_CUDA(cudaEventSynchronize(stop_));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
        times[which].push_back(ms * 1e3);
      }
    }
    CHECK_CUDA(cudaGetLastError());
    std::vector<std::pair<double, double>> out;
    for (auto& t : times) {
      std::sort(t.begin(), t.end());
      out.emplace_back(t[t.size() / 2], t.front());
    }
    return out;
  }

  void WriteJson() const {
    if (options_.json_path.empty()) return;
    FILE* f = std::fopen(options_.json_path.c_str(), "w");
    if (f == nullptr) return;
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    std::fprintf(f,
                 "{\n  \"device\": \"%s\",\n  \"multiprocessors\": %d,\n  \"l2_bytes\": %lld,\n"
                 "  \"cuda_runtime\": %d,\n  \"cuda_driver\": %d,\n  \"commit\": \"%s\",\n"
                 "  \"command\": \"%s\",\n  \"iters\": %d,\n  \"copy_gbps\": %.1f,\n"
                 "  \"gemm_bf16_tflops\": %.1f,\n  \"results\": [\n",
                 device_.name.c_str(), device_.multiprocessor_count,
                 static_cast<long long>(device_.l2_cache_bytes), runtime, driver,
                 options_.commit.c_str(), options_.command.c_str(), options_.iters, copy_gbps_,
                 gemm_tflops_);
    for (size_t i = 0; i < results_.size(); ++i) {
      const Result& r = results_[i];
      std::fprintf(f,
                   "    {\"name\": \"%s\", \"shape\": \"%s\", \"median_us\": %.2f, \"min_us\": "
                   "%.2f, \"bytes\": %.0f, \"flops\": %.0f, \"rate\": %.2f, \"unit\": \"%s\", "
                   "\"fraction_of_ceiling\": %.4f, \"target\": \"%s\", \"pass\": %s}%s\n",
                   r.name.c_str(), r.shape.c_str(), r.median_us, r.min_us, r.bytes, r.flops, r.rate,
                   r.unit.c_str(), r.fraction, r.target.c_str(), r.pass ? "true" : "false",
                   i + 1 < results_.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }

  double gemm_tflops() const { return gemm_tflops_; }

 private:
  Options options_;
  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
  DeviceInfo device_;
  std::unique_ptr<Buffer> flush_, gemm_workspace_;
  std::unique_ptr<BlasLtHandle> handle_;
  double copy_gbps_ = 0, gemm_tflops_ = 0;
  std::vector<Result> results_;
};

int Main(int argc, char** argv) {
  Options options;
  for (int i = 0; i < argc; ++i) {
    options.command += (i > 0 ? " " : "") + std::string(argv[i]);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--json") {
      options.json_path = next();
    } else if (arg == "--commit") {
      options.commit = next();
    } else if (arg == "--iters") {
      options.iters = std::max(1, std::stoi(next()));
    } else if (arg == "--filter") {
      options.filter = next();
    } else if (arg == "--cuda-kernel-path") {
      const std::string path = next();
      if (path != "auto" && path != "portable") {
        std::fprintf(stderr, "--cuda-kernel-path: '%s' is not auto or portable\n", path.c_str());
        return 2;
      }
      SetKernelPath(path == "portable" ? KernelPath::kPortable : KernelPath::kAuto);
    } else if (arg == "--kv-cache-dtype") {
      const std::string kv_dtype = next();
      if (kv_dtype != "auto" && kv_dtype != "bf16" && kv_dtype != "fp8") {
        std::fprintf(stderr, "--kv-cache-dtype: '%s' is not auto, bf16 or fp8\n", kv_dtype.c_str());
        return 2;
      }
      options.kv_fp8 = kv_dtype == "fp8";
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--commit SHA] [--iters N] [--filter SUBSTRING] "
                   "[--cuda-kernel-path auto|portable] [--kv-cache-dtype bf16|fp8]\n",
                   argv[0]);
      return 2;
    }
  }
  Bench bench(options);
  std::printf("kernels: %s path\n", UseHopperKernels() ? "Hopper" : "portable");
  std::printf("%-34s %-44s %13s %17s\n", "kernel", "shape", "median", "rate");
  bench.MeasureCeilings();
  bench.Norms();
  bench.Qkv();
  bench.Silu();
  bench.SiluF8();
  bench.Sm90Gemms();
  bench.Decode(64, 4096, 0.80);
  bench.Decode(1, 32768, 0.60);
  bench.Decode(64, 4096, 0, 5);     // run 2's split cap, for comparison
  bench.Decode(1, 32768, 0, 128);
  // Serving's decode steps: many sequences, short contexts (128 in / 128 out at 1,024 streams).
  bench.Decode(1024, 193, 0);
  SetDecodeWarps(4);
  bench.Decode(1024, 193, 0, 0, " [4 warps]");
  bench.Decode(512, 193, 0, 0, " [4 warps]");
  SetDecodeWarps(0);
  bench.Decode(512, 193, 0);
  // Serving's contexts are not all one length: prompts of 128 and 1-128 tokens out.
  for (int warps : {2, 1}) {
    SetDecodeWarps(warps);
    const std::string tag = warps == 1 ? " [1 warp]" : " [2 warps]";
    bench.Decode(1024, 193, 0, 0, tag);
    bench.Decode(1024, 193, 0, 0, tag, 128);
    bench.Decode(512, 193, 0, 0, tag, 128);
    bench.Decode(256, 193, 0, 0, tag, 128);
  }
  SetDecodeWarps(0);
  bench.Decode(1024, 193, 0, 0, "", 128);
  if (options.kv_fp8) {
    // An FP8 cache's tiles by one bulk copy a row, as bf16's (decode_attention.h), for
    // comparison with the default cp.async loads.
    SetDecodeF8BulkCopies(true);
    bench.Decode(1024, 193, 0, 0, " [bulk]");
    bench.Decode(64, 4096, 0, 0, " [bulk]");
    bench.Decode(1, 32768, 0, 0, " [bulk]");
    for (int splits : {1, 3}) bench.Decode(64, 4096, 0, splits, " [bulk]");
    SetDecodeF8BulkCopies(false);
    // The E4M3 bytes widened by integer operations instead of the device's conversion
    // instructions, or the values only (decode_attention.h).
    SetDecodeF8Widening(DecodeF8Widening::kInteger);
    bench.Decode(1024, 193, 0, 0, " [integer widening]");
    bench.Decode(64, 4096, 0, 0, " [integer widening]");
    bench.Decode(1, 32768, 0, 0, " [integer widening]");
    SetDecodeF8Widening(DecodeF8Widening::kConvertKeys);
    bench.Decode(64, 4096, 0, 0, " [integer values]");
    SetDecodeF8Widening(DecodeF8Widening::kConvert);
    // Other split caps at batch 64 (the default's is in the shape column).
    for (int splits : {1, 2, 3, 4, 6}) bench.Decode(64, 4096, 0, splits);
  }
  // Issue 25's targets against torch SDPA's cuDNN backend on the same shapes
  // (bench/sdpa_reference.py; 601 / 420 TFLOP/s on an H100 in the lease): 0.95x at
  // 1 x 8192 d128, 0.9x at 4 x 2048 and at 1 x 8192 d64. 4 x 1024: the 8B-shaped prefill step's.
  bench.Prefill({8192}, 128, "prefill attention", 571.0);
  bench.Prefill({2048, 2048, 2048, 2048}, 128, "prefill attention (4 seqs)", 0);
  bench.Prefill({8192}, 64, "prefill attention d64", 378.0);
  bench.Prefill({1024, 1024, 1024, 1024}, 128, "prefill attention (4 x 1024)", 0);
  // Head dim 256 (Gemma 2 and 3; key tiles of 64 on Hopper). Mistral's sliding window (4096)
  // over a longer prompt, and Gemma 2's soft-cap (50).
  bench.Prefill({8192}, 256, "prefill attention d256", 0);
  bench.Prefill({8192}, 128, "prefill attention window 4096", 0, 4096);
  bench.Prefill({8192}, 128, "prefill attention softcap 50", 0, 0, 50.0f);
  // The Hopper kernel's other consumer loops (prefill_attention_sm90.h; the rows above run the
  // default, ping-pong), for comparison: serial (no QK^T/softmax over PV overlap) and pipelined
  // (that overlap, without the groups taking turns). --filter selects rows by name.
  SetPrefillSm90Loop(PrefillSm90Loop::kSerial);
  bench.Prefill({8192}, 128, "prefill attention [serial]", 0);
  bench.Prefill({8192}, 64, "prefill attention d64 [serial]", 0);
  SetPrefillSm90Loop(PrefillSm90Loop::kPipelined);
  bench.Prefill({8192}, 128, "prefill attention [pipelined]", 0);
  bench.Prefill({2048, 2048, 2048, 2048}, 128, "prefill attention (4 seqs) [pipelined]", 0);
  bench.Prefill({8192}, 64, "prefill attention d64 [pipelined]", 0);
  bench.Prefill({1024, 1024, 1024, 1024}, 128, "prefill attention (4 x 1024) [pipelined]", 0);
  SetPrefillSm90Loop(PrefillSm90Loop::kPingpong);
  // The default's options changed (prefill_attention_sm90.h: PrefillSm90Options): persistent
  // blocks instead of a block per work item; a TMA box per 64-element column at head dim 128
  // instead of one for both; and that with the tiles-first order too (as main's kernel was); a
  // work item a query head instead of the 4 of a KV head (GQA packing).
  struct PrefillVariant {
    PrefillSm90Options options;
    const char* tag;
  };
  for (const PrefillVariant& v :
       {PrefillVariant{{.persistent = true}, "[persistent]"},
        PrefillVariant{{.paired = false}, "[box per column]"},
        PrefillVariant{{.heads_first = false, .paired = false}, "[tiles first, box per column]"},
        PrefillVariant{{.pack_gqa = false}, "[no GQA packing]"}}) {
    SetPrefillSm90Options(v.options);
    bench.Prefill({8192}, 128, std::string("prefill attention ") + v.tag, 0);
    bench.Prefill({2048, 2048, 2048, 2048}, 128, std::string("prefill attention (4 seqs) ") + v.tag,
                  0);
    bench.Prefill({8192}, 64, std::string("prefill attention d64 ") + v.tag, 0);
    bench.Prefill({1024, 1024, 1024, 1024}, 128,
                  std::string("prefill attention (4 x 1024) ") + v.tag, 0);
  }
  SetPrefillSm90Options({});
  // Short prompts, as serving's steps have them (items of a few key tiles): the default
  // (persistent blocks where the prompts average at most kPrefillSm90ShortRows tokens:
  // PrefillSm90Options::persistent_short), a block an item, and persistent blocks whatever the
  // lengths.
  {
    std::vector<int32_t> mixed(113, 128);
    mixed[0] = 2048;
    struct Batch {
      std::vector<int32_t> lens;
      const char* tag;
    };
    for (const Batch& batch :
         {Batch{std::vector<int32_t>(120, 128), "(120 x 128)"},
          Batch{std::vector<int32_t>(64, 256), "(64 x 256)"},
          Batch{std::vector<int32_t>(32, 512), "(32 x 512)"}, Batch{mixed, "(2048 + 112 x 128)"}}) {
      const std::string name = std::string("prefill attention ") + batch.tag;
      bench.Prefill(batch.lens, 128, name, 0);
      SetPrefillSm90Options({.persistent_short = false});
      bench.Prefill(batch.lens, 128, name + " [a block an item]", 0);
      SetPrefillSm90Options({.persistent = true});
      bench.Prefill(batch.lens, 128, name + " [persistent]", 0);
      SetPrefillSm90Options({.pack_gqa = false});
      bench.Prefill(batch.lens, 128, name + " [no GQA packing]", 0);
      SetPrefillSm90Options({});
    }
  }
  // Few new tokens a sequence after a cached prefix (speculative decoding's drafts, chunked
  // prefill's short pieces): a query tile of 128 rows a head holds a few tokens, where GQA
  // packing (PrefillSm90Options::pack_gqa) fills it with 4 heads' rows.
  for (auto [seqs, len] : {std::pair{256, 4}, {128, 8}, {64, 16}, {32, 64}}) {
    const std::string name = "prefill attention (" + std::to_string(seqs) + " x " +
                             std::to_string(len) + " after 1024)";
    bench.Prefill(std::vector<int32_t>(seqs, len), 128, name, 0, 0, 0, 1024);
    SetPrefillSm90Options({.pack_gqa = false});
    bench.Prefill(std::vector<int32_t>(seqs, len), 128, name + " [no GQA packing]", 0, 0, 0, 1024);
    SetPrefillSm90Options({});
  }
  bench.Sampling();
  bench.SsmDecode();
  bench.Misc();
  bench.WriteJson();
  return 0;
}

}  // namespace
}  // namespace lmserve::kernels::cuda

int main(int argc, char** argv) { return lmserve::kernels::cuda::Main(argc, argv); }
