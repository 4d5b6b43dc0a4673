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

// The inverse of OrderedKey for every key of a number (key 0, NaN's, gives a NaN).
__device__ __forceinline__ float KeyToFloat(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
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
constexpr float kProvisionalNats = 10.0f;  // pass 2 also keeps the tokens with w > e^-10
constexpr float kFusedNats = 10.5f;  // pass 1 keeps the tokens within this of the running maximum
constexpr int kItems = 16;           // contiguous elements per thread in the ordered passes
constexpr int kTileItems = kItems * kThreads;

// The one-pass path (filtered rows, vocabularies up to kWarpPassMaxVocab): each warp reads its own
// part of the row and keeps its candidates in its own region (a key and a 16-bit offset into its
// part, kRegionEntryBytes); the smallest window of kWindows (WindowNats) that holds the kept set
// is then gathered into the final arrays (max_candidates * kFinalEighths / 8 entries: 6,144 on
// the Hopper path, where a row of the kernel bench whose maximum is low needs ~5,000 for top-p
// 0.9; the regions get the rest, 640 entries a warp).
constexpr int kWarpsPerRow = kThreads / 32;
constexpr int kPassSegments = 4;    // float4 loads a lane has in flight (and as many next)
constexpr int kRefreshBatches = 8;  // batches after which the block's maximum is shared
constexpr int kRegionEntryBytes = 4 + 2;
constexpr int kFinalEighths = 3;
constexpr int64_t kWarpPassMaxVocab = int64_t{kWarpsPerRow} * 65536;  // offsets fit 16 bits
constexpr int kWindows = 5;
// Window k keeps the tokens within WindowNats(k) of the maximum: 4, 6, 8, 9, 10 nats.
__device__ __forceinline__ constexpr float WindowNats(int k) {
  return k < 3 ? 4.0f + 2.0f * static_cast<float>(k) : 6.0f + static_cast<float>(k);
}
static_assert(kSamplingCandidatesPortable * kFinalEighths % 32 == 0 &&
                  kSamplingCandidates * kFinalEighths % 32 == 0,
              "the final arrays start 16-byte aligned and hold a multiple of 4");

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

// A warp's region is about to overflow (the one-pass path): raises the warp's floor from `admit`
// a nat at a time until the region's entries and the batch's kept elements (bits of `keep` over
// x) at or above it fill at most half the region, drops the entries below it (in place, in
// order) and returns it; *count gets the entries left. After 64 nats (logits of absurd range or
// precision) it drops every entry and returns +inf: the region lost tokens it should hold.
// Warp-uniform arguments; the whole warp calls it.
template <int kElements>
__device__ __forceinline__ float RaiseWarpFloor(uint32_t* keys, uint16_t* offsets, int* count,
                                                int capacity, float admit,
                                                const float (&x)[kElements], unsigned keep) {
  const unsigned lanes_below = (1u << (threadIdx.x % 32)) - 1u;
  __syncwarp();  // the region's entries, written by any lane, are visible to every lane
  float level = admit;
  for (int step = 1;; ++step) {
    if (step > 64) {
      level = INFINITY;
      break;
    }
    level += 1.0f;
    int kept = 0;
    for (int i0 = 0; i0 < *count; i0 += 32) {
      const int i = i0 + static_cast<int>(threadIdx.x % 32);
      kept += __popc(__ballot_sync(0xffffffffu, i < *count && KeyToFloat(keys[i]) >= level));
    }
    int batch_kept = 0;
#pragma unroll
    for (int e = 0; e < kElements; ++e) batch_kept += ((keep >> e) & 1u) && x[e] >= level;
    kept += __reduce_add_sync(0xffffffffu, batch_kept);
    if (kept <= capacity / 2) break;
  }
  int out = 0;
  for (int i0 = 0; i0 < *count; i0 += 32) {
    const int i = i0 + static_cast<int>(threadIdx.x % 32);
    const uint32_t key = i < *count ? keys[i] : 0u;
    const uint16_t offset = i < *count ? offsets[i] : 0;
    const bool in = i < *count && level < INFINITY && KeyToFloat(key) >= level;
    const unsigned votes = __ballot_sync(0xffffffffu, in);
    __syncwarp();  // the chunk is read before any lane writes (writes land at or below it)
    if (in) {
      const int at = out + __popc(votes & lanes_below);
      keys[at] = key;
      offsets[at] = offset;
    }
    out += __popc(votes);
    __syncwarp();
  }
  *count = out;
  return level;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float s_warp[32];
  __shared__ int s_warp_index[32];
  __shared__ int s_best_bin;
  __shared__ float s_best_above;
  __shared__ int s_token;
  Shared sh{reinterpret_cast<SamplerSmem*>(smem_raw), s_warp, &s_best_bin, &s_best_above};
  SamplerSmem& big = *sh.big;
  __shared__ uint32_t s_refresh[2][kWarpsPerRow];
  __shared__ uint32_t s_region_floor[kWarpsPerRow];
  __shared__ int s_window_count[kWarpsPerRow][kWindows];
  __shared__ float s_window_mass[kWarpsPerRow][kWindows];
  // The candidates' area (max_candidates * kCandidateBytes): the one-pass path's final arrays
  // (final_share of each: keys, weights, indices), then its warps' regions
  // (region_capacity keys each, then region_capacity 16-bit offsets each); the histogram path's
  // arrays (max_candidates of each) over all of it.
  const int max_candidates = a.max_candidates;
  unsigned char* const candidate_area = smem_raw + sizeof(SamplerSmem);
  const int final_share = max_candidates * kFinalEighths / 8;
  uint32_t* cand_key = reinterpret_cast<uint32_t*>(candidate_area);
  float* cand_weight = reinterpret_cast<float*>(cand_key + final_share);
  int32_t* cand_index = reinterpret_cast<int32_t*>(cand_weight + final_share);
  const int region_capacity =
      (max_candidates - final_share) * kCandidateBytes / (kWarpsPerRow * kRegionEntryBytes) / 2 * 2;
  uint32_t* const region_key = reinterpret_cast<uint32_t*>(cand_index + final_share);
  uint16_t* const region_offset =
      reinterpret_cast<uint16_t*>(region_key + kWarpsPerRow * region_capacity);

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
  // SamplingParams::profile: stamp k, by thread 0 (after a barrier where the step ends in one).
  auto stamp = [&](int k) {
    if (a.profile != nullptr && threadIdx.x == 0) {
      a.profile[int64_t{row_index} * kSamplingProfileStamps + k] = clock64();
    }
  };
  stamp(0);

  const bool filtered = use_top_k || use_top_p || use_min_p;
  float max_z, total_weight;
  uint32_t lower = 0;
  int num_candidates = -1;  // the candidates in shared memory; -1: none (read global memory)
  if (filtered && vocab <= kWarpPassMaxVocab) {
    // 1. One pass for the maximum, the normalizer and the candidates, each warp on its own
    //    contiguous part of the row (warp_float4s float4s, a multiple of 32 but the last), with no
    //    block barrier but one after each of the first kRefreshBatches batches. A batch is
    //    kPassSegments segments of 32 float4s a warp (each read coalesced, one float4 a lane; the
    //    next batch's loads are issued before this one is used). A warp keeps the tokens within
    //    kFusedNats of max(its own running maximum, the block's maximum at the last barrier), in
    //    vocabulary order, in its own region of shared memory: key and 16-bit offset into its
    //    part. Both maxima are at most the row's, so every token within kFusedNats of the row's
    //    maximum is kept, and the rule depends on the row alone (not on timing): the candidates
    //    and the warps' floors (RaiseWarpFloor, where a region would overflow) are the same on
    //    every launch.
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    const unsigned lanes_below = (1u << lane) - 1u;
    const int n4 = vocab / 4;
    const int warp_float4s = (n4 + 32 * kWarpsPerRow - 1) / (32 * kWarpsPerRow) * 32;
    const int part_begin = min(warp * warp_float4s, n4);
    const int part_end = min(part_begin + warp_float4s, n4);
    const int batches = (warp_float4s + 32 * kPassSegments - 1) / (32 * kPassSegments);
    uint32_t* const my_keys = region_key + warp * region_capacity;
    uint16_t* const my_offsets = region_offset + warp * region_capacity;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    auto load_batch = [&](int batch, float4 (&dst)[kPassSegments]) {
#pragma unroll
      for (int j = 0; j < kPassSegments; ++j) {
        const int v = part_begin + (batch * kPassSegments + j) * 32 + lane;
        dst[j] = v < part_end ? __ldg(row4 + v) : make_float4(NAN, NAN, NAN, NAN);
      }
    };
    float4 next[kPassSegments];
    load_batch(0, next);
    float m = -INFINITY, s = 0.0f;  // this thread's running maximum and sum of exp(z - m)
    uint32_t warp_key = 0u;         // key of the warp's running maximum (0: none yet)
    uint32_t block_key = 0u;        // key of the block's maximum at the last barrier
    int count = 0;                  // the warp's candidates so far
    // The warp keeps no token below this (raised when its region would overflow): its region
    // holds every token of its part at or above max(warp_floor, the row's maximum - kFusedNats).
    float warp_floor = -INFINITY;
    for (int batch = 0; batch < batches; ++batch) {
      float x[4 * kPassSegments];  // element e of segment j: x[4 * j + e]
#pragma unroll
      for (int j = 0; j < kPassSegments; ++j) {  // z; NaN (and past the end) stays NaN
        x[4 * j] = next[j].x * inv_t, x[4 * j + 1] = next[j].y * inv_t;
        x[4 * j + 2] = next[j].z * inv_t, x[4 * j + 3] = next[j].w * inv_t;
      }
      if (batch + 1 < batches) load_batch(batch + 1, next);
      float batch_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4 * kPassSegments; ++e) {
        batch_max = fmaxf(batch_max, x[e]);  // NaN ignored
      }
      if (batch_max > m) {
        s *= __expf(m - batch_max);  // m = -inf: s is 0
        m = batch_max;
      }
#pragma unroll
      for (int e = 0; e < 4 * kPassSegments; ++e) {
        if (x[e] > -INFINITY) s += __expf(x[e] - m);  // not NaN, not -inf: m is finite
      }
      warp_key = max(warp_key, __reduce_max_sync(0xffffffffu, OrderedKey(batch_max)));
      if (batch < kRefreshBatches) {            // the same in every thread: uniform barrier
        s_refresh[batch & 1][warp] = warp_key;  // two buffers: no warp still reads this one
        __syncthreads();
        block_key = __reduce_max_sync(0xffffffffu, s_refresh[batch & 1][lane]);
      }
      // The batch's tokens to keep (bit 4 * j + e: element e of segment j) and how many.
      const float admit = fmaxf(KeyToFloat(max(warp_key, block_key)) - kFusedNats, warp_floor);
      unsigned keep = 0;
#pragma unroll
      for (int e = 0; e < 4 * kPassSegments; ++e) {
        if (x[e] > -INFINITY && x[e] >= admit) keep |= 1u << e;
      }
      if (count + __reduce_add_sync(0xffffffffu, __popc(keep)) > region_capacity) {
        warp_floor = RaiseWarpFloor(my_keys, my_offsets, &count, region_capacity, admit, x, keep);
#pragma unroll
        for (int e = 0; e < 4 * kPassSegments; ++e) {
          if (!(x[e] >= warp_floor) || warp_floor == INFINITY) keep &= ~(1u << e);
        }
      }
#pragma unroll
      for (int j = 0; j < kPassSegments; ++j) {
        // Vocabulary order within the segment: lane, then element.
        int before = 0, total = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const unsigned votes = __ballot_sync(0xffffffffu, (keep >> (4 * j + e)) & 1u);
          before += __popc(votes & lanes_below);
          total += __popc(votes);
        }
        if (total == 0) continue;  // the same in every lane
        int slot = count + before;
        const int offset = 4 * ((batch * kPassSegments + j) * 32 + lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if ((keep >> (4 * j + e)) & 1u) {
            my_keys[slot] = OrderedKey(x[4 * j + e]);
            my_offsets[slot] = static_cast<uint16_t>(offset + e);
            ++slot;
          }
        }
        count += total;
      }
    }
    max_z = BlockMax(m, s_warp);
    total_weight = BlockSum(m == -INFINITY ? 0.0f : s * __expf(m - max_z), s_warp);
    stamp(1);
    if (!(max_z > -INFINITY)) {  // every logit NaN or -inf
      if (threadIdx.x == 0) a.output[row_index] = 0;
      return;
    }
    // 2. The smallest window (WindowNats, each within kFusedNats - 0.5 of the maximum: the
    //    margin covers rounding) whose tokens hold the kept set (top-k's k tokens, top-p's mass,
    //    min-p's range) and fit the final arrays; its tokens, gathered in vocabulary order,
    //    are the candidates. Counts are exact; each warp's masses are summed in a fixed order,
    //    then the warps' in warp order: every warp computes the same sums.
    //    A window reaching below some warp's floor is incomplete, and not taken.
    if (lane == 0) {  // +inf: the region lost tokens (RaiseWarpFloor), no window is whole
      s_region_floor[warp] = warp_floor == INFINITY ? 0xffffffffu : OrderedKey(warp_floor);
    }
    __syncthreads();
    const uint32_t floor_key = __reduce_max_sync(0xffffffffu, s_region_floor[lane]);
    {
      uint32_t window_lower[kWindows];
#pragma unroll
      for (int k = 0; k < kWindows; ++k) window_lower[k] = OrderedKey(max_z - WindowNats(k));
      int window_count[kWindows] = {};
      float window_mass[kWindows] = {};
      // The windows are nested: k = kWindows - 1 is the widest.
      for (int i = lane; i < count; i += 32) {
        const uint32_t key = my_keys[i];
        if (key < window_lower[kWindows - 1]) continue;
        const float w = __expf(KeyToFloat(key) - max_z);
#pragma unroll
        for (int k = 0; k < kWindows; ++k) {
          if (key >= window_lower[k]) window_count[k] += 1, window_mass[k] += w;
        }
      }
#pragma unroll
      for (int k = 0; k < kWindows; ++k) {
        const int in_window = __reduce_add_sync(0xffffffffu, window_count[k]);
        const float mass = WarpSum(window_mass[k]);
        if (lane == 0) s_window_count[warp][k] = in_window, s_window_mass[warp][k] = mass;
      }
      __syncthreads();
      int selected = -1, selected_count = 0;
#pragma unroll
      for (int k = 0; k < kWindows; ++k) {
        const int in_window = __reduce_add_sync(0xffffffffu, s_window_count[lane][k]);
        const float mass = WarpSum(s_window_mass[lane][k]);  // the same bits in every lane
        bool covered;
        if (use_top_k) {
          covered = in_window >= top_k;
        } else if (use_top_p) {
          covered = mass >= 1.001f * fmaxf(top_p * total_weight, FLT_MIN);
        } else {  // min-p alone: w >= min_p needs d <= -log(min_p)
          covered = -logf(min_p) <= WindowNats(k) - 0.5f;
        }
        if (selected < 0 && covered && in_window <= final_share &&
            window_lower[k] >= floor_key) {
          selected = k, selected_count = in_window;
        }
      }
      if (selected >= 0) {  // the same in every thread
        // Gather: warp w's tokens of the window go after those of warps 0..w-1.
        uint32_t window = 0u;
        int mine = 0;
#pragma unroll
        for (int k = 0; k < kWindows; ++k) {
          if (k == selected) window = window_lower[k], mine = s_window_count[lane][k];
        }
        int slot = __reduce_add_sync(0xffffffffu, lane < warp ? mine : 0);
        const int part_first_index = 4 * part_begin;
        for (int i0 = 0; i0 < count; i0 += 32) {
          const int i = i0 + lane;
          const uint32_t key = i < count ? my_keys[i] : 0u;
          const bool in = key >= window && key != 0u;
          const unsigned votes = __ballot_sync(0xffffffffu, in);
          if (in) {
            const int at = slot + __popc(votes & lanes_below);
            cand_key[at] = key;
            cand_weight[at] = __expf(KeyToFloat(key) - max_z);
            cand_index[at] = part_first_index + my_offsets[i];
          }
          slot += __popc(votes);
        }
        __syncthreads();
        lower = window;
        num_candidates = selected_count;
      }
    }
  } else {
    // 1. Maximum and normalizer (online: a running maximum per thread).
    float m = -INFINITY, s = 0.0f;
    ForEachLogit(row, vocab, [&](int, float x) {
      const float z = x * inv_t;
      if (z > m) {
        s = s * __expf(m - z) + 1.0f;
        m = z;
      } else if (z > -INFINITY) {  // not NaN, and m is finite here
        s += __expf(z - m);
      }
    });
    max_z = BlockMax(m, s_warp);
    total_weight = BlockSum(m == -INFINITY ? 0.0f : s * __expf(m - max_z), s_warp);
    stamp(1);
    if (!(max_z > -INFINITY)) {  // every logit NaN or -inf
      if (threadIdx.x == 0) a.output[row_index] = 0;
      return;
    }
  }
  if (num_candidates < 0) {  // the histogram path's layout: max_candidates of each array
    cand_key = reinterpret_cast<uint32_t*>(candidate_area);
    cand_weight = reinterpret_cast<float*>(cand_key + max_candidates);
    cand_index = reinterpret_cast<int32_t*>(cand_weight + max_candidates);
  }
  auto weight_of = [&](float z) { return z == z ? __expf(z - max_z) : 0.0f; };
  auto global_for_each = [&](auto&& f) {
    ForEachLogit(row, vocab, [&](int, float x) {
      const float z = x * inv_t;
      f(OrderedKey(z), weight_of(z));
    });
  };
  const uint32_t upper = OrderedKey(max_z);  // every key is at most this
  stamp(2);

  // 2'. Otherwise a lower bound on the kept keys from a count histogram of d = max - z over
  //    [0, kRangeNats) (bin kBins - 1 - floor(d * kBins / kRangeNats): the top bin is the highest);
  //    3. the candidates above it, compacted in vocabulary order into shared memory.
  if (filtered && num_candidates < 0) {
    constexpr float kBinsPerNat = kBins / kRangeNats;
    for (int b = threadIdx.x; b < kBins; b += kThreads) big.bin_count[b] = 0;
    __syncthreads();
    // The histogram, and in the same pass a provisional compaction of the tokens with
    // d < kProvisionalNats: when the bound found below is within it, no third pass is needed.
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

  stamp(3);
  // 4. Exact thresholds.
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

  stamp(4);
  // 5. The token: u * (kept weight) located by an ordered prefix sum.
  float kept_total = total_weight;  // nothing filtered: every token
  if (use_top_k || use_top_p || use_min_p) {
    kept_total = 0.0f;
    for_each([&](uint32_t key, float w) { kept_total += kept_weight(key, w); });
    kept_total = BlockSum(kept_total, s_warp);
  }
  stamp(5);
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
  stamp(6);
}

}  // namespace

__global__ void PendingTokensKernel(int32_t* __restrict__ ids, const int32_t* __restrict__ pairs,
                                    const int32_t* __restrict__ sampled, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) ids[pairs[2 * i]] = sampled[pairs[2 * i + 1]];
}

cudaError_t Launch(const PendingTokensParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.count == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  const auto blocks = static_cast<unsigned>((p.count + kBlock - 1) / kBlock);
  PendingTokensKernel<<<blocks, kBlock, 0, stream>>>(p.ids, p.pairs, p.sampled,
                                                     static_cast<int>(p.count));
  return cudaGetLastError();
}

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
