#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cpu/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // first radix level: the top 11 bits of a key

// Bin weights are summed in fixed point (units of 2^-40) with integer atomics: integer addition
// is associative, so a relaunch on the same row sums to the same bits and picks the same token
// (float atomics summed in arrival order, and a top-p boundary within their rounding went either
// way from one launch to the next).
constexpr float kWeightUnit = 1099511627776.0f;  // 2^40
__device__ __forceinline__ unsigned long long ToFixed(float w) {
  return __float2ull_rn(w * kWeightUnit);
}
__device__ __forceinline__ float FromFixed(unsigned long long w) {
  return __ull2float_rn(w) * (1.0f / kWeightUnit);
}

// The sampler's dynamic shared memory: this, then the candidates (SampleArgs::max_candidates of
// each array: keys, weights, indices), CandidateBytes in all.
struct SamplerSmem {
  uint32_t bin_count[kBins];
  unsigned long long bin_weight[kBins];  // fixed point, ToFixed
  float scan[kThreads];
};
constexpr int kCandidateBytes = 4 + 4 + 4;  // key, weight, index
static_assert(sizeof(SamplerSmem) % 16 == 0, "the candidates start 16-byte aligned");
static_assert(kSamplingCandidates % 4 == 0 && kSamplingCandidatesPortable % 4 == 0,
              "each candidate array starts 16-byte aligned");

// Order-preserving map of floats to unsigned integers; NaN maps to 0, below everything.
__device__ __forceinline__ uint32_t OrderedKey(float z) {
  if (z != z) return 0u;
  const uint32_t bits = __float_as_uint(z);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// 2^x with flush-to-zero (ex2.approx.ftz.f32: one MUFU.EX2; __expf adds a compare and two
// multiplies to keep denormal results, which no sum here needs).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Argmax order: a number beats NaN, a larger value beats a smaller, a lower index breaks ties.
__device__ __forceinline__ bool Better(float v, int i, float best_v, int best_i) {
  const bool nan_v = v != v, nan_best = best_v != best_v;
  if (nan_v != nan_best) return nan_best;
  if (!nan_v && v != best_v) return v > best_v;
  return i < best_i;
}

// The warp's best (value, index) by Better, in every lane.
__device__ __forceinline__ void WarpArgmax(float& best_v, int& best_i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best_v, offset);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (Better(v, i, best_v, best_i)) best_v = v, best_i = i;
  }
}

// Calls f(index, logit) for every element of the row: 16-byte loads, four per thread issued
// before any is used (several loads in flight: a pass runs at the memory's pace).
template <typename F>
__device__ __forceinline__ void ForEachLogit(const float* row, int vocab_size, F&& f) {
  constexpr int kBatch = 4;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  const int n4 = vocab_size / 4;
  for (int base = threadIdx.x; base < n4; base += kBatch * kThreads) {
    float4 x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = base + u * kThreads;
      x[u] = v < n4 ? __ldg(row4 + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int v = base + u * kThreads;
      if (v < n4) {
        f(4 * v, x[u].x);
        f(4 * v + 1, x[u].y);
        f(4 * v + 2, x[u].z);
        f(4 * v + 3, x[u].w);
      }
    }
  }
}

// The row's argmax index; *best_value (when given) gets its value.
__device__ int BlockArgmax(const float* row, int vocab_size, float* s_value, int* s_index,
                           float* best_value = nullptr) {
  float best_v = NAN;
  int best_i = INT_MAX;
  ForEachLogit(row, vocab_size, [&](int i, float x) {
    if (Better(x, i, best_v, best_i)) best_v = x, best_i = i;
  });
  WarpArgmax(best_v, best_i);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) s_value[warp] = best_v, s_index[warp] = best_i;
  __syncthreads();
  best_v = s_value[lane];
  best_i = s_index[lane];
  WarpArgmax(best_v, best_i);
  if (best_value != nullptr) *best_value = best_v;
  return best_i;  // all-NaN rows: index 0
}

// A greedy row split over gridDim.y blocks (sampling.h): block y takes elements
// [y * slice, min((y + 1) * slice, vocab)), slice a multiple of 4; the last block to finish
// picks among the slices' winners (Better is a total order, so the pick does not depend on the
// order they finished in) and sets the row's counter back to zero.
__device__ void SplitArgmax(const float* row, int vocab, int row_index, void* workspace,
                            int32_t* output, float* s_value, int* s_index) {
  const int splits = gridDim.y, slice = ((vocab + splits - 1) / splits + 3) / 4 * 4;
  const int begin = min(static_cast<int>(blockIdx.y) * slice, vocab);
  const int length = min(slice, vocab - begin);
  float value = NAN;
  int index = INT_MAX;
  if (length > 0) {
    index = begin + BlockArgmax(row + begin, length, s_value, s_index, &value);
  }
  auto* counters = static_cast<unsigned*>(workspace);
  auto* winners = reinterpret_cast<float2*>(counters + kSamplingSplitRows) +
                  int64_t{row_index} * kSamplingMaxSplits;
  __shared__ bool s_last;
  if (threadIdx.x == 0) {
    winners[blockIdx.y] = make_float2(value, __int_as_float(index));
    __threadfence();
    s_last = atomicAdd(&counters[row_index], 1u) == static_cast<unsigned>(splits - 1);
  }
  __syncthreads();
  if (!s_last || threadIdx.x >= 32) return;
  __threadfence();
  float best_v = NAN;
  int best_i = INT_MAX;
  if (threadIdx.x < splits) {
    const float2 w = __ldcg(&winners[threadIdx.x]);
    best_v = w.x, best_i = __float_as_int(w.y);
  }
  WarpArgmax(best_v, best_i);
  if (threadIdx.x == 0) {
    output[row_index] = best_i == INT_MAX ? 0 : best_i;
    counters[row_index] = 0;
  }
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* logits, int64_t stride, int vocab_size, int32_t* output) {
  __shared__ float s_value[32];
  __shared__ int s_index[32];
  const int best = BlockArgmax(logits + blockIdx.x * stride, vocab_size, s_value, s_index);
  if (threadIdx.x == 0) output[blockIdx.x] = best;
}

// Inclusive prefix sum over the block, in thread order; returns it and sets *exclusive to the
// previous thread's inclusive value (exactly: the intervals partition the total). Barriers inside.
__device__ float BlockScan(float x, float* exclusive, float* total, float* s_scan, float* s_warp) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = x;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float t = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += t;
  }
  __syncthreads();
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = s_warp[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const float t = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += t;
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  const float inclusive = (warp > 0 ? s_warp[warp - 1] : 0.0f) + v;
  s_scan[threadIdx.x] = inclusive;
  __syncthreads();
  *exclusive = threadIdx.x > 0 ? s_scan[threadIdx.x - 1] : 0.0f;
  *total = s_scan[kThreads - 1];
  return inclusive;
}

// Exclusive prefix sum of 64-bit integers over the block, in thread order; *total gets the
// block's sum. Exact (integers), so the sampler packs four 16-bit counts into one value (each
// field's block total below 2^16: no carries between fields). Barriers inside; s_warp: [32].
__device__ unsigned long long BlockScanU64(unsigned long long x, unsigned long long* total,
                                          unsigned long long* s_warp) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long v = x;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long t = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += t;
  }
  __syncthreads();  // s_warp may still be read by a previous call
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = s_warp[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const unsigned long long t = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += t;
    }
    s_warp[lane] = w;
  }
  __syncthreads();
  *total = s_warp[kThreads / 32 - 1];
  return (warp > 0 ? s_warp[warp - 1] : 0ull) + v - x;
}

struct Shared {
  SamplerSmem* big;
  float* warp;      // [32]
  int* best_bin;    // [1]
  float* best_above;  // [1]
};

// Over the histogram of `num_bins` bins in shared memory: the lowest non-empty bin b with
// above_total + (weight of the bins above b) < limit, and that weight. -1 if none.
__device__ int SelectBin(const Shared& sh, int num_bins, bool use_weight, float above_total,
                         float limit, float* above_best, float* all_bins = nullptr) {
  const int per_thread = num_bins / kThreads;  // 1 or 2, from the top: thread 0 owns the top bins
  float own[2] = {0.0f, 0.0f};
  int bins[2] = {-1, -1};
  float local = 0.0f;
  for (int j = 0; j < per_thread; ++j) {
    const int b = num_bins - 1 - (threadIdx.x * per_thread + j);
    bins[j] = b;
    own[j] = use_weight ? FromFixed(sh.big->bin_weight[b]) : static_cast<float>(sh.big->bin_count[b]);
    local += own[j];
  }
  if (threadIdx.x == 0) *sh.best_bin = INT_MAX;
  float exclusive, total;
  BlockScan(local, &exclusive, &total, sh.big->scan, sh.warp);  // its barriers publish best_bin
  if (all_bins != nullptr) *all_bins = total;
  float above = exclusive;
  float my_above[2];
  for (int j = 0; j < per_thread; ++j) {
    my_above[j] = above;
    if (sh.big->bin_count[bins[j]] > 0 && above_total + above < limit) {
      atomicMin(sh.best_bin, bins[j]);
    }
    above += own[j];
  }
  __syncthreads();
  const int best = *sh.best_bin;
  for (int j = 0; j < per_thread; ++j) {
    if (bins[j] == best) *sh.best_above = my_above[j];
  }
  __syncthreads();
  *above_best = *sh.best_above;
  __syncthreads();
  return best == INT_MAX ? -1 : best;
}

// Radix selection of the threshold key: the smallest key v among the elements with key >= lower
// such that the weight (count, or w when use_weight) of those with key > v is below limit.
// for_each(f) calls f(key, w) for every element; every key is at most `upper`.
// The digits are those of key - lower, from the highest set bit of upper - lower down, 11 bits a
// level (the last level's 10 or fewer): the candidates' keys span a few exponents, so that the
// raw keys' top 11 bits (sign, exponent, 2 mantissa bits) put most of them in a handful of bins,
// each a chain of conflicting shared-memory atomics.
template <typename ForEach>
__device__ uint32_t RadixThreshold(const Shared& sh, ForEach&& for_each, bool use_weight,
                                   uint32_t lower, uint32_t upper, float limit) {
  if (upper <= lower) return lower;  // one key at most: it is the threshold
  const uint32_t span = upper - lower;
  int remaining = 32 - __clz(static_cast<int>(span));  // significant bits of the offsets
  uint32_t prefix = 0;  // the offsets' digits chosen so far, in place
  float above_total = 0.0f;
  while (remaining > 0) {
    const int bits = min(remaining, 11);
    const int shift = remaining - bits;
    const int num_bins = bits > 10 ? 2048 : 1024;  // SelectBin takes 1 or 2 bins a thread
    const uint32_t digit_mask = (1u << bits) - 1u;
    // The offset bits already chosen (those at and above `remaining`; beyond the span's, zero).
    const uint32_t high_mask = remaining >= 32 ? 0u : ~((1u << remaining) - 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < num_bins; b += kThreads) {
      sh.big->bin_count[b] = 0;
      sh.big->bin_weight[b] = 0ull;
    }
    __syncthreads();
    for_each([&](uint32_t key, float w) {
      const uint32_t offset = key - lower;
      if (key >= lower && (offset & high_mask) == prefix) {
        const int b = static_cast<int>((offset >> shift) & digit_mask);
        atomicAdd(&sh.big->bin_count[b], 1u);
        if (use_weight) atomicAdd(&sh.big->bin_weight[b], ToFixed(w));
      }
    });
    __syncthreads();
    float above_best;
    const int best = SelectBin(sh, num_bins, use_weight, above_total, limit, &above_best);
    if (best < 0) return lower;  // unreachable with limit > 0: keep everything from `lower`
    above_total += above_best;
    prefix |= static_cast<uint32_t>(best) << shift;
    remaining = shift;
  }
  return lower + prefix;
}

struct SampleArgs {
  const float* logits;
  int32_t* output;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const uint64_t* seeds;
  const uint64_t* steps;
  int64_t stride;
  int vocab_size;
  void* workspace;     // SamplingParams::workspace
  int max_candidates;  // kSamplingCandidates (Hopper path) or kSamplingCandidatesPortable
  long long* profile;  // SamplingParams::profile
};

constexpr float kRangeNats = 16.0f;  // the first histogram covers w = exp(z - max) > e^-16
constexpr float kProvisionalNats = 10.0f;  // the histogram pass also keeps those with w > e^-10
constexpr float kFusedNats = 10.5f;  // pass 2 keeps the tokens within this of the maximum
constexpr int kItems = 16;           // elements per thread in a tile
constexpr int kTileItems = kItems * kThreads;
constexpr int kSlices = kItems / 4;  // a tile of the streaming passes: kSlices coalesced float4s
constexpr int kTile4 = kSlices * kThreads;  // float4s a tile
// Pass 1 keeps each warp's maximum of the first kTrackedTiles tiles (2M tokens) in the
// histogram's weights, unused until pass 2 is done.
constexpr int kTrackedTiles = kBins * 2 / (kThreads / 32);
// Pass 2 works warp by warp for rows of at most kLocalTiles tiles (262,144 tokens): two chunks
// (tile, slice, warp) a thread in its block scan; their counts and first slots, 2 bytes each, in
// the histogram's counts and in the scan buffer.
constexpr int kLocalTiles = 2 * kThreads / (kSlices * (kThreads / 32));
static_assert(kLocalTiles * kSlices * (kThreads / 32) * 2 <= kBins * 4 &&
                  kLocalTiles * kSlices * (kThreads / 32) * 2 <= kThreads * 4,
              "the chunk counts fit");

// 16 contiguous logits from i0 (a multiple of 16); past the end: NaN, which is never kept.
__device__ __forceinline__ void LoadContiguous(const float* row, int vocab_size, int i0,
                                               float (&x)[kItems]) {
  const float4* p = reinterpret_cast<const float4*>(row + i0);
#pragma unroll
  for (int v = 0; v < kItems / 4; ++v) {
    float4 t = make_float4(NAN, NAN, NAN, NAN);
    if (i0 + 4 * v < vocab_size) t = __ldg(p + v);
    x[4 * v] = t.x, x[4 * v + 1] = t.y, x[4 * v + 2] = t.z, x[4 * v + 3] = t.w;
  }
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float s_warp[32];
  __shared__ unsigned long long s_warp64[32];
  __shared__ int s_warp_index[32];
  __shared__ int s_best_bin;
  __shared__ float s_best_above;
  __shared__ int s_token;
  __shared__ int s_overflow;  // pass 2: a warp's candidates did not fit its region
  Shared sh{reinterpret_cast<SamplerSmem*>(smem_raw), s_warp, &s_best_bin, &s_best_above};
  SamplerSmem& big = *sh.big;
  const int max_candidates = a.max_candidates;
  // The candidate arrays; once the filters run on pass 2's candidates, from their first.
  uint32_t* cand_key = reinterpret_cast<uint32_t*>(smem_raw + sizeof(SamplerSmem));
  float* cand_weight = reinterpret_cast<float*>(cand_key + max_candidates);
  int32_t* cand_index = reinterpret_cast<int32_t*>(cand_weight + max_candidates);

  const int row_index = blockIdx.x;
  const float* row = a.logits + row_index * a.stride;
  const int vocab = a.vocab_size;
  const float temperature = a.temperature[row_index];
  if (!(temperature > 0.0f)) {
    if (gridDim.y > 1) {
      SplitArgmax(row, vocab, row_index, a.workspace, a.output, s_warp, s_warp_index);
      return;
    }
    const int best = BlockArgmax(row, vocab, s_warp, s_warp_index);
    if (threadIdx.x == 0) a.output[row_index] = best;
    return;
  }
  if (blockIdx.y != 0) return;  // a sampled row takes one block
  const float inv_t = 1.0f / temperature;
  const int top_k = a.top_k != nullptr ? a.top_k[row_index] : 0;
  const float top_p = a.top_p != nullptr ? a.top_p[row_index] : 1.0f;
  const float min_p = a.min_p != nullptr ? a.min_p[row_index] : 0.0f;
  const bool use_top_k = top_k > 0 && top_k < vocab;
  const bool use_top_p = top_p < 1.0f;
  const bool use_min_p = min_p > 0.0f;
  const float uniform = UniformFromSeed(a.seeds[row_index], a.steps[row_index]);
  // SamplingParams::profile: stamp k, by thread 0 (after a barrier, where the step ends in one).
  auto stamp = [&](int k) {
    if (a.profile != nullptr && threadIdx.x == 0) {
      a.profile[int64_t{row_index} * kSamplingProfileStamps + k] = clock64();
    }
  };
  stamp(0);
  if (threadIdx.x == 0) s_overflow = 0;  // published by pass 1's barriers

  const bool filtered = use_top_k || use_top_p || use_min_p;
  // A tile is kItems / 4 = kSlices slices of kThreads float4s, each slice read coalesced (thread
  // t takes float4 t of the slice); its elements in vocabulary order: slice, thread, element.
  const float4* row4 = reinterpret_cast<const float4*>(row);
  const int n4 = vocab / 4;
  const int num_tiles = (n4 + kTile4 - 1) / kTile4;
  auto load_tile = [&](int tile, float4 (&dst)[kSlices]) {
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {
      const int v = tile * kTile4 + j * kThreads + static_cast<int>(threadIdx.x);
      dst[j] = v < n4 ? __ldg(row4 + v) : make_float4(NAN, NAN, NAN, NAN);
    }
  };
  auto to_z = [&](const float4 (&src)[kSlices], float (&x)[kItems]) {
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {  // z; NaN (and past the end) stays NaN
      x[4 * j] = src[j].x * inv_t, x[4 * j + 1] = src[j].y * inv_t;
      x[4 * j + 2] = src[j].z * inv_t, x[4 * j + 3] = src[j].w * inv_t;
    }
  };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Each warp's maximum z over its part of each of the first kTrackedTiles tiles (pass 1 writes
  // it, pass 2 skips the parts with nothing to keep); the histogram's storage, unused until then.
  float* const warp_tile_max = reinterpret_cast<float*>(big.bin_weight);

  // 1. Maximum and normalizer: no barrier until the end. A thread's running maximum m of z and
  //    sum s of exp(z - m), rescaled once a tile, each term one FFMA and one ex2 (2^(x * inv_t *
  //    log2 e - m * log2 e); a NaN's argument is clamped to -200: 0); the next tile's loads are
  //    issued before a tile's work, so that the row streams at the memory's pace.
  float max_z, total_weight;
  {
    constexpr float kLog2e = 1.4426950408889634f;
    const float scale = inv_t * kLog2e;
    float m = -INFINITY, s = 0.0f;
    float4 next[kSlices];
    load_tile(0, next);
    for (int tile = 0; tile < num_tiles; ++tile) {
      float x[kItems];  // the logits, not yet scaled
#pragma unroll
      for (int j = 0; j < kSlices; ++j) {
        x[4 * j] = next[j].x, x[4 * j + 1] = next[j].y;
        x[4 * j + 2] = next[j].z, x[4 * j + 3] = next[j].w;
      }
      if (tile + 1 < num_tiles) load_tile(tile + 1, next);
      float x_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < kItems; ++e) x_max = fmaxf(x_max, x[e]);  // NaN ignored
      // The tile's maximum z: scaling by inv_t > 0 is monotone, rounding included.
      const float tile_max = x_max * inv_t;
      if (tile < kTrackedTiles) {
        const float w = WarpMax(tile_max);
        if (lane == 0) warp_tile_max[tile * (kThreads / 32) + warp] = w;
      }
      if (tile_max > m) {
        s *= Exp2Ftz((m - tile_max) * kLog2e);  // m = -inf: s is 0
        m = tile_max;
      }
      const float offset = m * kLog2e;
#pragma unroll
      for (int e = 0; e < kItems; ++e) s += Exp2Ftz(fmaxf(fmaf(x[e], scale, -offset), -200.0f));
    }
    max_z = BlockMax(m, s_warp);  // its barriers publish warp_tile_max
    total_weight =
        BlockSum(m == -INFINITY ? 0.0f : s * Exp2Ftz((m - max_z) * kLog2e), s_warp);
  }
  stamp(1);
  if (!(max_z > -INFINITY)) {  // every logit NaN or -inf
    if (threadIdx.x == 0) a.output[row_index] = 0;
    return;
  }

  // 2. Filtered rows: the candidates, every token with z >= max - kFusedNats, compacted in
  //    vocabulary order into the top of the candidate arrays (z for now, and the index). The
  //    tiles run last to first: the row's end, read last by pass 1, is still in L2. A warp's part
  //    of a tile whose maximum is below the bound is neither read nor scanned element by element.
  int fused = -1;  // the number of candidates at fused_first; -1: more than fit
  int fused_first = 0;
  if (filtered) {
    const float admit = max_z - kFusedNats;
    auto live = [&](int tile) {
      return tile >= kTrackedTiles || warp_tile_max[tile * (kThreads / 32) + warp] >= admit;
    };
    if (num_tiles <= kLocalTiles && max_candidates == kSamplingCandidates) {
      // Warp by warp, with no block barrier in the loop: each warp compacts the candidates of its
      // chunks (its 128 elements of a slice of a tile) into its own region, z and the element's
      // offset in the chunk, and counts each chunk; then one block scan over the chunk counts in
      // vocabulary order (tile, slice, warp) places every chunk, and each warp copies its own.
      constexpr int kWarps = kThreads / 32;
      constexpr int kWarpCap = kSamplingCandidates / kWarps;
      float* const src_z = reinterpret_cast<float*>(cand_key) + warp * kWarpCap;
      uint8_t* const src_offset = reinterpret_cast<uint8_t*>(cand_index) + warp * kWarpCap;
      // [(tile * kSlices + slice) * kWarps + warp]: the chunk's count, then its first slot.
      uint16_t* const chunk_count = reinterpret_cast<uint16_t*>(big.bin_count);
      uint16_t* const chunk_first = reinterpret_cast<uint16_t*>(big.scan);
      int own = 0;  // this warp's candidates so far
      float4 next[kSlices];
      bool next_live = live(num_tiles - 1);
      if (next_live) load_tile(num_tiles - 1, next);
      for (int tile = num_tiles - 1; tile >= 0; --tile) {  // the same in every warp
        float4 cur[kSlices];
        const bool this_live = next_live;  // the same in the warp's lanes
        if (this_live) {
#pragma unroll
          for (int j = 0; j < kSlices; ++j) cur[j] = next[j];
        }
        if (tile > 0) {
          next_live = live(tile - 1);
          if (next_live) load_tile(tile - 1, next);
        }
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
          int chunk_total = 0;
          if (this_live) {
            const float z[4] = {cur[j].x * inv_t, cur[j].y * inv_t, cur[j].z * inv_t,
                                cur[j].w * inv_t};
            uint32_t mask = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) mask |= (z[e] >= admit ? 1u : 0u) << e;  // NaN: no
            const int count = __popc(mask);
            int inclusive = count;
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
              const int t = __shfl_up_sync(0xffffffffu, inclusive, offset);
              if (lane >= offset) inclusive += t;
            }
            chunk_total = __shfl_sync(0xffffffffu, inclusive, 31);
            int slot = own + inclusive - count;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if ((mask & (1u << e)) != 0) {
                if (slot < kWarpCap) {
                  src_z[slot] = z[e];
                  src_offset[slot] = static_cast<uint8_t>(4 * lane + e);
                }
                ++slot;
              }
            }
          }
          if (lane == 0) {
            chunk_count[(tile * kSlices + j) * kWarps + warp] = static_cast<uint16_t>(chunk_total);
          }
          own += chunk_total;
        }
      }
      if (own > kWarpCap && lane == 0) s_overflow = 1;
      __syncthreads();
      if (s_overflow == 0) {  // the same in every thread
        const int entries = num_tiles * kSlices * kWarps;  // at most 2 a thread
        const int e0 = 2 * static_cast<int>(threadIdx.x);
        const int c0 = e0 < entries ? chunk_count[e0] : 0;
        const int c1 = e0 + 1 < entries ? chunk_count[e0 + 1] : 0;
        unsigned long long all;
        const auto first = static_cast<int>(
            BlockScanU64(static_cast<unsigned long long>(c0 + c1), &all, s_warp64));
        if (e0 < entries) chunk_first[e0] = static_cast<uint16_t>(first);
        if (e0 + 1 < entries) chunk_first[e0 + 1] = static_cast<uint16_t>(first + c0);
        const int n = static_cast<int>(all);
        // The candidates go to the top of cand_weight and cand_index, above the offsets (the
        // first kSamplingCandidates bytes of cand_index): more than that leaves no room.
        const int first_slot = (max_candidates - n) & ~3;
        if (first_slot * 4 >= kSamplingCandidates) {  // the same in every thread
          __syncthreads();
          int src = 0;
          for (int tile = num_tiles - 1; tile >= 0; --tile) {
            for (int j = 0; j < kSlices; ++j) {
              const int k = (tile * kSlices + j) * kWarps + warp;
              const int count = chunk_count[k];
              const int dst = max_candidates - n + chunk_first[k];
              const int index = 4 * (tile * kTile4 + j * kThreads + warp * 32);
              for (int i = lane; i < count; i += 32) {
                cand_weight[dst + i] = src_z[src + i];
                cand_index[dst + i] = index + src_offset[src + i];
              }
              src += count;
            }
          }
          fused_first = first_slot;
          fused = max_candidates - first_slot;
          for (int i = first_slot + static_cast<int>(threadIdx.x); i < max_candidates - n;
               i += kThreads) {
            cand_weight[i] = NAN;  // key 0 and weight 0: never kept
            cand_index[i] = 0;
          }
          __syncthreads();
        }
      }
    } else {
      int placed = 0;  // candidates from the tiles after this one
      float4 next[kSlices];
      if (live(num_tiles - 1)) load_tile(num_tiles - 1, next);
      bool next_live = live(num_tiles - 1);
      for (int tile = num_tiles - 1; tile >= 0; --tile) {
        float x[kItems];
        const bool this_live = next_live;
        if (this_live) to_z(next, x);
        if (tile > 0) {
          next_live = live(tile - 1);
          if (next_live) load_tile(tile - 1, next);
        }
        uint32_t keep = 0;  // bit e: x[e] is a candidate
        if (this_live) {
#pragma unroll
          for (int e = 0; e < kItems; ++e) keep |= (x[e] >= admit ? 1u : 0u) << e;  // NaN: no
        }
        // The candidates of each slice, 16 bits each: a slice has 4 * kThreads elements.
        const uint32_t low = __popc(keep & 0xfu) | (__popc(keep & 0xf0u) << 16);
        const uint32_t high = __popc(keep & 0xf00u) | (__popc(keep & 0xf000u) << 16);
        const unsigned long long counts = (static_cast<unsigned long long>(high) << 32) | low;
        unsigned long long totals;
        const unsigned long long before = BlockScanU64(counts, &totals, s_warp64);
        auto field = [](unsigned long long v, int j) {
          return static_cast<int>((v >> (16 * j)) & 0xffffu);
        };
        const int tile_total =
            field(totals, 0) + field(totals, 1) + field(totals, 2) + field(totals, 3);
        if (keep != 0) {
          int slice_start = max_candidates - placed - tile_total;
#pragma unroll
          for (int j = 0; j < kSlices; ++j) {
            const int first = slice_start + field(before, j);
            const int index =
                4 * (tile * kTile4 + j * kThreads + static_cast<int>(threadIdx.x));
#pragma unroll
            for (int e = 4 * j; e < 4 * j + 4; ++e) {
              // Its slot: after this thread's candidates of the slice before it.
              const int slot = first + __popc(keep & ((1u << e) - 1u) & (0xfu << (4 * j)));
              if ((keep & (1u << e)) != 0 && slot >= 0) {
                cand_weight[slot] = x[e];  // z for now: the weight comes after the pass
                cand_index[slot] = index + e % 4;
              }
            }
            slice_start += field(totals, j);
          }
        }
        placed += tile_total;  // the same in every thread: the branch below is uniform
        if (placed > max_candidates) break;
      }
      __syncthreads();
      if (placed <= max_candidates) {
        // The arrays from a multiple of 4 (16-byte reads below), the 0-3 entries before the first
        // candidate padded with NaN: key 0 and weight 0, never kept.
        fused_first = (max_candidates - placed) & ~3;
        fused = max_candidates - fused_first;
        for (int i = fused_first + static_cast<int>(threadIdx.x); i < max_candidates - placed;
             i += kThreads) {
          cand_weight[i] = NAN;
          cand_index[i] = 0;
        }
        __syncthreads();
      }
    }
  }
  stamp(2);
  auto weight_of = [&](float z) { return z == z ? __expf(z - max_z) : 0.0f; };
  auto global_for_each = [&](auto&& f) {
    ForEachLogit(row, vocab, [&](int, float x) {
      const float z = x * inv_t;
      f(OrderedKey(z), weight_of(z));
    });
  };
  const uint32_t upper = OrderedKey(max_z);  // every key is at most this

  uint32_t lower = 0;
  int num_candidates = -1;  // -1: read global memory
  if (fused >= 0) {
    // Whether pass 2's candidates hold the kept set: every token within kFusedNats - 0.5 of the
    // maximum is among them (the margin covers rounding), so the thresholds are exact over them
    // when that set holds top-k's k tokens, top-p's mass, or min-p's range. Their keys and
    // weights from z first.
    uint32_t* const key = cand_key + fused_first;
    float* const weight = cand_weight + fused_first;
    const uint32_t fused_lower = OrderedKey(max_z - (kFusedNats - 0.5f));
    float count = 0.0f, mass = 0.0f;
    for (int i = threadIdx.x; i < fused; i += kThreads) {
      const float z = weight[i];
      key[i] = OrderedKey(z);
      weight[i] = weight_of(z);
      if (key[i] >= fused_lower) count += 1.0f, mass += weight[i];
    }
    count = BlockSum(count, s_warp);
    mass = BlockSum(mass, s_warp);
    bool covered;
    if (use_top_k) {
      covered = count >= static_cast<float>(top_k);
    } else if (use_top_p) {
      covered = mass >= 1.001f * fmaxf(top_p * total_weight, FLT_MIN);
    } else {  // min-p alone: w >= min_p needs d <= -log(min_p)
      covered = -logf(min_p) <= kFusedNats - 1.0f;
    }
    if (covered) {
      lower = fused_lower, num_candidates = fused;
      cand_key = key, cand_weight = weight, cand_index += fused_first;
    }
  }
  stamp(3);

  // 3. Otherwise a lower bound on the kept keys from a count histogram of d = max - z over
  //    [0, kRangeNats) (bin kBins - 1 - floor(d * kBins / kRangeNats): the top bin is the highest);
  //    4. the candidates above it, compacted in vocabulary order into shared memory.
  if (filtered && num_candidates < 0) {
    constexpr float kBinsPerNat = kBins / kRangeNats;
    for (int b = threadIdx.x; b < kBins; b += kThreads) big.bin_count[b] = 0;
    __syncthreads();
    // The histogram, and in the same pass a provisional compaction of the tokens with
    // d < kProvisionalNats: when the bound found below is within it, step 4 needs no pass.
    float provisional = 0.0f;
    for (int tile = 0; tile < vocab; tile += kTileItems) {
      const int i0 = tile + kItems * threadIdx.x;
      float x[kItems];
      LoadContiguous(row, vocab, i0, x);
      float flags = 0.0f;
      uint32_t keep = 0;  // bit e: element e goes to the provisional candidates
#pragma unroll
      for (int e = 0; e < kItems; ++e) {
        x[e] *= inv_t;  // z; NaN (and past the end) stays NaN
        const float d = max_z - x[e];
        if (d < kRangeNats) {
          atomicAdd(&big.bin_count[kBins - 1 - min(static_cast<int>(d * kBinsPerNat), kBins - 1)], 1u);
        }
        if (d < kProvisionalNats) {
          keep |= 1u << e;
          flags += 1.0f;
        }
      }
      float exclusive, tile_total;
      BlockScan(flags, &exclusive, &tile_total, big.scan, s_warp);
      int slot = static_cast<int>(provisional + exclusive);
#pragma unroll
      for (int e = 0; e < kItems; ++e) {
        if (keep & (1u << e)) {
          if (slot < max_candidates) {
            cand_key[slot] = OrderedKey(x[e]);
            cand_weight[slot] = weight_of(x[e]);
            cand_index[slot] = i0 + e;
          }
          ++slot;
        }
      }
      provisional += tile_total;
    }
    __syncthreads();
    // A lower bound on each bin's weight, so that the selected bin is never above the true one.
    for (int h = threadIdx.x; h < kBins; h += kThreads) {
      big.bin_weight[h] = ToFixed(static_cast<float>(big.bin_count[h]) *
                                  __expf(-static_cast<float>(kBins - h) / kBinsPerNat));
    }
    __syncthreads();
    int selected = -1;  // the lowest bin that may hold the threshold; -1: below the range
    float unused, in_range;
    if (use_top_k) {
      const int h = SelectBin(sh, kBins, false, 0.0f, static_cast<float>(top_k), &unused, &in_range);
      selected = in_range >= static_cast<float>(top_k) ? h : -1;
    } else if (use_top_p) {
      const float limit = fmaxf(top_p * total_weight, FLT_MIN);
      const int h = SelectBin(sh, kBins, true, 0.0f, limit, &unused, &in_range);
      selected = in_range >= limit ? h : -1;
    } else {  // min-p alone: w >= min_p needs d <= -log(min_p)
      const float d_max = -logf(min_p);
      selected = d_max < kRangeNats ? kBins - 1 - static_cast<int>(d_max * kBinsPerNat) : -1;
    }
    if (selected > 0) selected -= 1;  // one bin of margin against rounding
    if (selected >= 0) {
      const float bound_nats = static_cast<float>(kBins - selected) / kBinsPerNat;
      lower = OrderedKey(max_z - bound_nats);
      if (bound_nats + 1.0f / kBinsPerNat <= kProvisionalNats &&
          provisional <= static_cast<float>(max_candidates)) {
        num_candidates = static_cast<int>(provisional);  // a superset of the tokens >= lower
      }
      float count = 0.0f;
      for (int h = selected + threadIdx.x; h < kBins; h += kThreads) count += big.bin_count[h];
      count = BlockSum(count, s_warp);
      if (num_candidates < 0 && count <= static_cast<float>(max_candidates)) {
        float base = 0.0f;
        for (int tile = 0; tile < vocab; tile += kTileItems) {
          const int i0 = tile + kItems * threadIdx.x;
          float x[kItems];
          LoadContiguous(row, vocab, i0, x);
          uint32_t key[kItems];
          float flags = 0.0f;
#pragma unroll
          for (int e = 0; e < kItems; ++e) {
            key[e] = OrderedKey(x[e] * inv_t);  // NaN (and past the end): 0
            if (key[e] >= lower && key[e] != 0u) flags += 1.0f;
          }
          float exclusive, tile_total;
          BlockScan(flags, &exclusive, &tile_total, big.scan, s_warp);
          int slot = static_cast<int>(base + exclusive);
#pragma unroll
          for (int e = 0; e < kItems; ++e) {
            if (key[e] >= lower && key[e] != 0u) {
              if (slot < max_candidates) {
                cand_key[slot] = key[e];
                cand_weight[slot] = weight_of(x[e] * inv_t);
                cand_index[slot] = i0 + e;
              }
              ++slot;
            }
          }
          base += tile_total;
        }
        num_candidates = base <= static_cast<float>(max_candidates) ? static_cast<int>(base) : -1;
        __syncthreads();
      }
    }
  }
  auto for_each = [&](auto&& f) {
    if (num_candidates >= 0) {
      for (int i = threadIdx.x; i < num_candidates; i += kThreads) {
        f(cand_key[i], cand_weight[i]);
      }
    } else {
      global_for_each(f);
    }
  };

  stamp(4);
  // 5. Exact thresholds.
  uint32_t threshold = lower;
  if (use_top_k) {
    threshold = RadixThreshold(sh, for_each, false, threshold, upper, static_cast<float>(top_k));
  }
  if (use_top_p) {
    float set_weight = total_weight;  // no top-k: the whole vocabulary
    if (use_top_k) {
      set_weight = 0.0f;
      for_each([&](uint32_t key, float w) {
        if (key >= threshold) set_weight += w;
      });
      set_weight = BlockSum(set_weight, s_warp);
    }
    threshold = RadixThreshold(sh, for_each, true, threshold, upper,
                               fmaxf(top_p * set_weight, FLT_MIN));
  }
  auto kept_weight = [&](uint32_t key, float w) {
    return key >= threshold && (!use_min_p || w >= min_p) ? w : 0.0f;
  };

  stamp(5);
  // 6. The token: u * (kept weight) located by an ordered prefix sum.
  float kept_total = total_weight;  // nothing filtered: every token
  if (use_top_k || use_top_p || use_min_p) {
    kept_total = 0.0f;
    for_each([&](uint32_t key, float w) { kept_total += kept_weight(key, w); });
    kept_total = BlockSum(kept_total, s_warp);
  }
  stamp(6);
  const float target = uniform * kept_total;
  const int n = num_candidates >= 0 ? num_candidates : vocab;
  if (threadIdx.x == 0) s_token = -1;
  float running = 0.0f;
  int last_kept = -1;  // this thread's last kept index: the fallback when rounding misses
  for (int tile = 0; tile < n; tile += kTileItems) {
    const int i0 = tile + kItems * threadIdx.x;
    float w[kItems];
    int index[kItems];
    float local = 0.0f;
    if (num_candidates >= 0) {
      // 16-byte reads (a thread's 16 candidates are contiguous: 4-way bank conflicts, not 16):
      // a 4-aligned group starting below n lies within the arrays (max_candidates is a multiple
      // of 4); its entries past n are masked.
#pragma unroll
      for (int q = 0; q < kItems / 4; ++q) {
        const int i = i0 + 4 * q;
        uint4 k4 = make_uint4(0u, 0u, 0u, 0u);
        float4 w4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int4 x4 = make_int4(0, 0, 0, 0);
        if (i < n) {
          k4 = *reinterpret_cast<const uint4*>(cand_key + i);
          w4 = *reinterpret_cast<const float4*>(cand_weight + i);
          x4 = *reinterpret_cast<const int4*>(cand_index + i);
        }
        const uint32_t keys[4] = {k4.x, k4.y, k4.z, k4.w};
        const float weights[4] = {w4.x, w4.y, w4.z, w4.w};
        const int32_t indices[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = i + e < n;
          w[4 * q + e] = valid ? kept_weight(keys[e], weights[e]) : 0.0f;
          index[4 * q + e] = valid ? indices[e] : 0;
        }
      }
    } else {
      float x[kItems];
      LoadContiguous(row, vocab, i0, x);
#pragma unroll
      for (int e = 0; e < kItems; ++e) {
        const float z = x[e] * inv_t;
        w[e] = kept_weight(OrderedKey(z), weight_of(z));
        index[e] = i0 + e;
      }
    }
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
      local += w[e];
      if (w[e] > 0.0f) last_kept = index[e];
    }
    float exclusive, tile_total;
    const float inclusive = BlockScan(local, &exclusive, &tile_total, big.scan, s_warp);
    if (target < running + tile_total) {  // the same value in every thread: uniform branch
      if (running + exclusive <= target && target < running + inclusive) {
        float cumulative = running + exclusive;
        int chosen = -1;
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
          if (chosen < 0 || !(target < cumulative)) {
            if (w[e] > 0.0f) {
              chosen = index[e];
              cumulative += w[e];
            }
          }
        }
        s_token = chosen;
      }
      break;
    }
    running += tile_total;
  }
  __syncthreads();
  int token = s_token;
  if (token < 0) {  // rounding put the target past the end: the last kept token
    __syncthreads();
    if (threadIdx.x == 0) s_token = -1;
    __syncthreads();
    atomicMax(&s_token, last_kept);
    __syncthreads();
    token = max(s_token, 0);
  }
  if (threadIdx.x == 0) a.output[row_index] = token;
  stamp(7);
}

}  // namespace

cudaError_t Launch(const ArgmaxParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_rows == 0) return cudaSuccess;
  ArgmaxKernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(
      p.logits, p.logits_stride != 0 ? p.logits_stride : p.vocab_size,
      static_cast<int>(p.vocab_size), p.output);
  return cudaGetLastError();
}

cudaError_t Launch(const SamplingParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_rows == 0) return cudaSuccess;
  // The candidates' capacity only decides whether step 3 keeps them in shared memory or the later
  // steps read global memory: the tokens drawn are the same either way.
  const int max_candidates =
      UseHopperKernels() ? kSamplingCandidates : kSamplingCandidatesPortable;
  const int smem_bytes =
      static_cast<int>(sizeof(SamplerSmem)) + max_candidates * kCandidateBytes;
  LMSERVE_CUDA_RETURN_IF_ERROR(
      SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(SampleKernel), smem_bytes));
  SampleArgs a{p.logits, p.output, p.temperature, p.top_k, p.top_p, p.min_p, p.seeds, p.steps,
               p.logits_stride != 0 ? p.logits_stride : p.vocab_size,
               static_cast<int>(p.vocab_size), p.workspace, max_candidates, p.profile};
  // Greedy rows split while the launch has fewer blocks than two a multiprocessor, each slice at
  // least 1024 entries.
  int64_t splits = 1;
  if (p.workspace != nullptr && p.num_rows <= kSamplingSplitRows) {
    const int64_t blocks = 2 * int64_t{std::max(1, CurrentMultiprocessorCount())};
    splits = std::clamp<int64_t>(blocks / p.num_rows, 1, kSamplingMaxSplits);
    splits = std::clamp<int64_t>(p.vocab_size / 1024, 1, splits);
  }
  const dim3 grid(static_cast<unsigned>(p.num_rows), static_cast<unsigned>(splits));
  SampleKernel<<<grid, kThreads, smem_bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace lmserve::kernels::cuda
