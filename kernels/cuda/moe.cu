// Mixture-of-experts kernels (moe.h): router GEMM, routing, sort by expert, expert GEMMs (fused
// and grouped), combine.

#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_workspace.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 8;  // rows of one expert in a grouped tile; tokens of a router tile
constexpr int kUnroll = 4;    // 8-element pieces of a weight row in flight per lane
constexpr int kMaxExpertsPerLane = kMaxCudaMoeExperts / 32;

template <typename T>
__device__ __forceinline__ void StoreOne(T* p, float v) {
  *p = FromFloat<T>(v);
}

// acc[m] += w[piece c] . x_m[piece c] for the M rows of x, over a weight row of k elements: a
// lane takes pieces lane, lane + 32, ... (kUnroll of them in flight). rows: how many of the M are
// real (the others repeat row 0 and are dropped by the caller).
template <typename T, int M>
__device__ __forceinline__ void RowDot(const T* __restrict__ w, const T* const* x, int k, int lane,
                                       float (&acc)[M]) {
  const int pieces = k / 8;
  int c = lane;
  for (; c + 32 * (kUnroll - 1) < pieces; c += 32 * kUnroll) {
    float wf[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) LoadStream8<T>(w + (c + 32 * u) * 8, wf[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        Load8<T>(x[m] + (c + 32 * u) * 8, xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[u][e], xf[e], acc[m]);
      }
    }
  }
  for (; c < pieces; c += 32) {
    float wf[8];
    LoadStream8<T>(w + c * 8, wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      Load8<T>(x[m] + c * 8, xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
    }
  }
}

// 8 consecutive elements of T as loaded: one 16-byte piece (bf16, fp16) or two (fp32). The
// streaming kernels below keep several in flight per lane before converting any.
template <typename T>
struct Piece {
  uint4 v;
};
template <>
struct Piece<float> {
  float4 a, b;
};
// Streaming load (read once, not kept in L1). REQUIRES: 16-byte aligned.
template <typename T>
__device__ __forceinline__ Piece<T> LoadPiece(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    const auto* v = reinterpret_cast<const float4*>(p);
    return {__ldcs(v), __ldcs(v + 1)};
  } else {
    return {LoadStream16(p)};
  }
}
template <typename T>
__device__ __forceinline__ void UnpackPiece(const Piece<T>& piece, float (&out)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    Unpack8(piece.a, piece.b, out);
  } else {
    Unpack8<T>(piece.v, out);
  }
}

// Router logits: grid (ceil(E / kWarps), ceil(tokens / M)); warp w of block (bx, by) takes expert
// bx * kWarps + w and tokens by * M + [0, M) (M = 1 for one token, else kTileRows). The router's
// rows are constant: a lane requests its first kRouterUnroll pieces before waiting for the
// previous kernel (programmatic dependent launch, common.cuh), so that the router's reads overlap
// it and only the input's wait for it. (Without a minimum of blocks per multiprocessor in __launch_bounds__,
// ptxas held the one-token kernel to 64 registers and spilled; with one, fp32's eight tokens.)
template <typename T, int M>
__global__ void __launch_bounds__(kThreads, 2)
    RouterLogitsKernel(const T* __restrict__ x, const T* __restrict__ router,
                       float* __restrict__ logits, int tokens, int experts, int hidden) {
  const int lane = threadIdx.x % 32;
  const int expert = blockIdx.x * kWarps + threadIdx.x / 32;
  if (expert >= experts) {
    BeginDependentKernel();
    return;
  }
  // Pieces in flight per lane (fp32 pieces are two loads).
  constexpr int kRouterUnroll = M == 1 ? 8 : sizeof(T) == 4 ? 2 : 4;
  const T* w = router + int64_t{expert} * hidden;
  const int pieces = hidden / 8;
  constexpr int kStep = 32 * kRouterUnroll;
  Piece<T> wv[kRouterUnroll];
  int c = lane;
  if (kStep <= pieces) {
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) wv[u] = LoadPiece(w + (c + 32 * u) * 8);
  }
  BeginDependentKernel();
  const int t0 = blockIdx.y * M;
  const int rows = min(M, tokens - t0);
  const T* xr[M];
#pragma unroll
  for (int m = 0; m < M; ++m) xr[m] = x + int64_t{t0 + (m < rows ? m : 0)} * hidden;
  float acc[M] = {};
  for (; c - lane + kStep <= pieces; c += kStep) {
    if (c != lane) {
#pragma unroll
      for (int u = 0; u < kRouterUnroll; ++u) wv[u] = LoadPiece(w + (c + 32 * u) * 8);
      __syncwarp();  // every load of the step before its products (skinny_gemm.cu says why)
    }
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) {
      float wf[8];
      UnpackPiece(wv[u], wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        Load8<T>(xr[m] + (c + 32 * u) * 8, xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
      }
    }
  }
  for (; c < pieces; c += 32) {  // the tail
    float wf[8];
    UnpackPiece(LoadPiece(w + c * 8), wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      Load8<T>(xr[m] + c * 8, xf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[m] = fmaf(wf[e], xf[e], acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float sum = WarpSum(acc[m]);
    if (lane == 0 && m < rows) logits[int64_t{t0 + m} * experts + expert] = sum;
  }
}

// A float's bits as an int that orders as the float does (-0 below +0; callers pass no NaN and
// no -0), and back.
__device__ __forceinline__ int OrderedKey(float f) {
  const int bits = __float_as_int(f);
  return bits >= 0 ? bits : bits ^ 0x7fffffff;
}
__device__ __forceinline__ float FromOrderedKey(int key) {
  return __int_as_float(key >= 0 ? key : key ^ 0x7fffffff);
}

// The routing of one token by one warp (every lane calls it, converged), the twin of
// kernels::MoeRouting: lane k < top_k gets the k-th choice (by descending logit; ties: the lower
// expert index) in *chosen_id and, with kWeights, its weight (softmax over every expert in fp32,
// renormalized over the top_k when `normalize`); the other lanes get expert 0 and weight 0.
// `logits`: the token's [experts] fp32 logits, read through L2 (__ldcg), so that a kernel may read
// logits written two kernels back before its own wait (FusedDownKernel).
template <bool kWeights>
__device__ __forceinline__ void WarpRoute(const float* __restrict__ logits, int experts, int top_k,
                                          bool normalize, int lane, int* chosen_id,
                                          float* chosen_weight) {
  float v[kMaxExpertsPerLane];
  bool taken[kMaxExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int e = lane + 32 * i;
    float x = e < experts ? __ldcg(logits + e) : -INFINITY;
    if (x != x) x = -INFINITY;  // NaN: never preferred
    if (x == 0.0f) x = 0.0f;    // -0 as +0, as the CPU's comparisons see them
    v[i] = x;
    taken[i] = e >= experts;
  }
  float chosen_value = -INFINITY, max_logit = -INFINITY;
  int id = 0;
  for (int k = 0; k < top_k; ++k) {
    // The lane's best remaining expert (its experts ascend with i: strict > keeps the lower).
    float best = -INFINITY;
    int best_id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      const int e = lane + 32 * i;
      if (!taken[i] && (v[i] > best || (v[i] == best && e < best_id))) best = v[i], best_id = e;
    }
    // The warp's: the largest value, then the lowest index holding it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int best_key = __reduce_max_sync(0xffffffffu, OrderedKey(best));
    best_id = __reduce_min_sync(0xffffffffu, OrderedKey(best) == best_key ? best_id : INT_MAX);
    best = FromOrderedKey(best_key);
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) best = other, best_id = other_id;
    }
#endif
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      if (best_id == lane + 32 * i) taken[i] = true;
    }
    if (k == 0) max_logit = best;  // the first choice is the largest logit
    if (lane == k) chosen_value = best, id = best_id;
  }
  *chosen_id = id;
  if constexpr (kWeights) {
    const float p = lane < top_k ? expf(chosen_value - max_logit) : 0.0f;
    float denominator;
    if (normalize) {
      denominator = WarpSum(p);
    } else {
      float total = 0;
#pragma unroll
      for (int i = 0; i < kMaxExpertsPerLane; ++i) {
        if (lane + 32 * i < experts) total += expf(v[i] - max_logit);
      }
      denominator = WarpSum(total);
    }
    *chosen_weight = lane < top_k ? p / denominator : 0.0f;
  }
}

// Routing: a warp per token (WarpRoute), writing the choices for the grouped path (and
// MoeRoutingParams).
__global__ void __launch_bounds__(128)
    RoutingKernel(const float* __restrict__ logits, int32_t* __restrict__ expert_ids,
                  float* __restrict__ weights, int tokens, int experts, int top_k, bool normalize) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int token = blockIdx.x * 4 + threadIdx.x / 32;
  if (token >= tokens) return;
  int id;
  float weight;
  WarpRoute<true>(logits + int64_t{token} * experts, experts, top_k, normalize, lane, &id,
                  &weight);
  if (lane < top_k) {
    expert_ids[int64_t{token} * top_k + lane] = id;
    weights[int64_t{token} * top_k + lane] = weight;
  }
}

// Sorts the slots by expert: one block. Writes offsets, tile offsets (tiles of kTileRows rows),
// the slot of each sorted row and the sorted row of each slot. Rows of one expert come in any
// order (atomics); each row's result does not depend on its place.
__global__ void __launch_bounds__(1024)
    SortKernel(const int32_t* __restrict__ expert_ids, int32_t* __restrict__ offsets,
               int32_t* __restrict__ tile_offsets, int32_t* __restrict__ sorted_slots,
               int32_t* __restrict__ slot_rows, int slots, int experts) {
  __shared__ int32_t count[kMaxCudaMoeExperts];
  __shared__ int32_t cursor[kMaxCudaMoeExperts];
  BeginDependentKernel();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&count[expert_ids[s]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t row = 0, tile = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = row;
      tile_offsets[e] = tile;
      cursor[e] = row;
      row += count[e];
      tile += (count[e] + kTileRows - 1) / kTileRows;
    }
    offsets[experts] = row;
    tile_offsets[experts] = tile;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t row = atomicAdd(&cursor[expert_ids[s]], 1);
    sorted_slots[row] = s;
    slot_rows[s] = row;
  }
}

// The rows of grouped tile `unit` of the sorted rows (false past the last tile): sets the expert,
// the first row and the row count.
__device__ __forceinline__ bool FindTile(int unit, const int32_t* __restrict__ offsets,
                                         const int32_t* __restrict__ tile_offsets, int experts,
                                         int* expert, int* first_row, int* rows) {
  if (unit >= tile_offsets[experts]) return false;
  int lo = 0, hi = experts - 1;  // the last expert whose first tile is <= unit
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= unit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *expert = lo;
  *first_row = offsets[lo] + (unit - tile_offsets[lo]) * kTileRows;
  *rows = min(kTileRows, offsets[lo + 1] - *first_row);
  return true;
}

// Grouped gate/up with SiLU-and-mul: grid (ceil(I / kWarps), units). Warp w takes column
// j = bx * kWarps + w: the expert's gate row j and up row j, over the tile's rows (kTileRows at
// most). act[row, j] = silu(gate) * up, each rounded to T first as a separate activation kernel
// would see them. The input row of a sorted row is its slot's token: sorted_slots[row] / top_k.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GroupedGateUpKernel(const T* __restrict__ x, const T* __restrict__ gate_up,
                        T* __restrict__ act, const int32_t* __restrict__ offsets,
                        const int32_t* __restrict__ tile_offsets,
                        const int32_t* __restrict__ sorted_slots, int experts, int top_k,
                        int hidden, int inter) {
  constexpr int M = kTileRows;
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * kWarps + threadIdx.x / 32;
  int expert, first_row, rows;
  if (j >= inter ||
      !FindTile(blockIdx.y, offsets, tile_offsets, experts, &expert, &first_row, &rows)) {
    return;
  }
  const T* xr[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int row = first_row + (m < rows ? m : 0);
    xr[m] = x + int64_t{sorted_slots[row] / top_k} * hidden;
  }
  const T* gate = gate_up + (int64_t{expert} * 2 * inter + j) * hidden;
  const T* up = gate + int64_t{inter} * hidden;
  float g[M] = {}, u[M] = {};
  RowDot<T, M>(gate, xr, hidden, lane, g);
  RowDot<T, M>(up, xr, hidden, lane, u);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float gs = ToFloat(FromFloat<T>(WarpSum(g[m])));
    const float us = ToFloat(FromFloat<T>(WarpSum(u[m])));
    if (lane == 0 && m < rows) {
      float silu;
      if constexpr (std::is_same_v<T, float>) {
        silu = gs / (1.0f + expf(-gs));
      } else {
        silu = gs / (1.0f + __expf(-gs));
      }
      StoreOne(act + int64_t{first_row + m} * inter + j, silu * us);
    }
  }
}

// The fused path (small decode batches). Its kernels find their experts themselves: each warp
// routes its token from the router's logits (WarpRoute, identical in every warp), so no routing
// kernel runs between the router and the expert GEMMs. They stream the experts' rows as the
// skinny GEMM streams W (skinny_gemm.cu): 16-byte pieces, several in flight per lane, every load
// of a step issued before its products.
constexpr int kGateUpUnroll = 4;  // pieces of each of a warp's two rows in flight per lane
constexpr int kDownUnroll = 8;    // pieces in flight per lane
constexpr int kGateUpMinBlocks = 6;

// Gate/up with SiLU-and-mul: grid (ceil(I / kWarps), slots). Warp w of block (bx, s) takes
// column j = bx * kWarps + w of slot s = token * top_k + k: the gate row j and the up row j of
// the token's k-th expert, and writes act[s, j] = silu(gate) * up, each rounded to T first as a
// separate activation kernel would see them.
//
// 16-bit types: at least kGateUpMinBlocks blocks a multiprocessor (registers capped at 40 a
// thread, a few bytes spilled): at batch 1 Qwen3-30B-A3B's 8 slots x 96 column blocks then run as
// one wave on an H100's 132 multiprocessors, where 47 registers left room for 5 blocks and a
// second wave of 108 (batch-1 decode step 3.37 -> 3.18 ms, bench/results section 7). fp32 pieces
// take twice the registers: no cap.
template <typename T>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 2 ? kGateUpMinBlocks : 1)
    FusedGateUpKernel(const T* __restrict__ x, const T* __restrict__ gate_up,
                      const float* __restrict__ logits, T* __restrict__ act, int experts,
                      int top_k, int hidden, int inter) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * kWarps + threadIdx.x / 32;
  if (j >= inter) return;
  const int slot = blockIdx.y;
  const int token = slot / top_k, k = slot - token * top_k;
  int id;
  float unused;
  WarpRoute<false>(logits + int64_t{token} * experts, experts, top_k, false, lane, &id, &unused);
  const int expert = __shfl_sync(0xffffffffu, id, k);
  const T* rows[2];
  rows[0] = gate_up + (int64_t{expert} * 2 * inter + j) * hidden;  // gate
  rows[1] = rows[0] + int64_t{inter} * hidden;                     // up
  const T* xr = x + int64_t{token} * hidden;
  const int pieces = hidden / 8;
  constexpr int kStep = 32 * kGateUpUnroll;
  float acc[2] = {};
  int c = lane;
  for (; c - lane + kStep <= pieces; c += kStep) {
    Piece<T> wv[kGateUpUnroll][2];
#pragma unroll
    for (int u = 0; u < kGateUpUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < 2; ++r) wv[u][r] = LoadPiece(rows[r] + (c + 32 * u) * 8);
    }
    __syncwarp();  // every load of the step before its products (skinny_gemm.cu says why)
#pragma unroll
    for (int u = 0; u < kGateUpUnroll; ++u) {
      float xf[8];
      Load8<T>(xr + (c + 32 * u) * 8, xf);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float wf[8];
        UnpackPiece(wv[u][r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
      }
    }
  }
  for (; c < pieces; c += 32) {  // the tail
    Piece<T> wv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) wv[r] = LoadPiece(rows[r] + c * 8);
    float xf[8];
    Load8<T>(xr + c * 8, xf);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float wf[8];
      UnpackPiece(wv[r], wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r] = fmaf(wf[e], xf[e], acc[r]);
    }
  }
  const float gs = ToFloat(FromFloat<T>(WarpSum(acc[0])));
  const float us = ToFloat(FromFloat<T>(WarpSum(acc[1])));
  if (lane == 0) {
    StoreOne(act + int64_t{slot} * inter + j,
             GateActivationOf<GateActivation::kSilu, !std::is_same_v<T, float>>(gs) * us);
  }
}

// Fused down + combine: grid (ceil(hidden / kWarps), tokens). Warp w of block (bx, t) takes output
// feature n = bx * kWarps + w of token t: sum_k weight[t, k] * down_e[n] . act[t * top_k + k],
// e = expert[t, k]. The top_k rows of inter elements are one list of items (k, piece), a lane
// taking items lane, lane + 32, ... (kDownUnroll in flight).
//
// Before waiting for the gate/up kernel, a warp routes its token and requests its first pieces
// of the experts' rows: the logits it reads were written by the router, two kernels back, which
// has completed by then (the gate/up kernel lets this one launch only after its own wait, which
// returns once the router has completed; WarpRoute reads them through L2). Only the activations
// wait for the gate/up kernel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FusedDownKernel(const T* __restrict__ act, const T* __restrict__ down,
                    const float* __restrict__ logits, T* __restrict__ out, int experts, int top_k,
                    bool normalize, int hidden, int inter) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  const int token = blockIdx.y;
  if (n >= hidden) {
    BeginDependentKernel();
    return;
  }
  int id;
  float weight;
  WarpRoute<true>(logits + int64_t{token} * experts, experts, top_k, normalize, lane, &id,
                  &weight);
  const int pieces = inter / 8;
  const int items = pieces * top_k;
  const T* row_n = down + int64_t{n} * inter;  // expert e's row n: row_n + e * hidden * inter
  const int64_t expert_stride = int64_t{hidden} * inter;
  const T* act_token = act + int64_t{token} * top_k * inter;
  // The lane's next item (k, c): advanced by 32 items at a time.
  int k = lane / pieces, c = lane - (lane / pieces) * pieces;
  auto advance = [&]() {
    c += 32;
    while (c >= pieces) c -= pieces, ++k;
  };
  constexpr int kStep = 32 * kDownUnroll;
  Piece<T> wv[kDownUnroll];
  int ks[kDownUnroll], cs[kDownUnroll];
  // The step's items and their weights' pieces; every lane has all of its items (converged).
  auto load_step = [&]() {
#pragma unroll
    for (int u = 0; u < kDownUnroll; ++u) {
      ks[u] = k, cs[u] = c;
      advance();
      const int expert = __shfl_sync(0xffffffffu, id, ks[u]);
      wv[u] = LoadPiece(row_n + expert * expert_stride + cs[u] * 8);
    }
  };
  int base = 0;  // the first item of the step
  if (kStep <= items) load_step();
  BeginDependentKernel();
  float acc = 0;
  for (; base + kStep <= items; base += kStep) {
    if (base != 0) {
      load_step();
      __syncwarp();
    }
#pragma unroll
    for (int u = 0; u < kDownUnroll; ++u) {
      const float scale = __shfl_sync(0xffffffffu, weight, ks[u]);
      float wf[8], af[8];
      UnpackPiece(wv[u], wf);
      Load8<T>(act_token + int64_t{ks[u]} * inter + cs[u] * 8, af);
      float dot = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(wf[e], af[e], dot);
      acc = fmaf(scale, dot, acc);
    }
  }
  for (; base < items; base += 32) {  // the tail: uniform trip count, lanes past the end idle
    const bool valid = base + lane < items;
    const int kk = valid ? k : 0;
    const int expert = __shfl_sync(0xffffffffu, id, kk);
    const float scale = __shfl_sync(0xffffffffu, weight, kk);
    if (valid) {
      float wf[8], af[8];
      UnpackPiece(LoadPiece(row_n + expert * expert_stride + c * 8), wf);
      Load8<T>(act_token + int64_t{k} * inter + c * 8, af);
      float dot = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(wf[e], af[e], dot);
      acc = fmaf(scale, dot, acc);
      advance();
    }
  }
  acc = WarpSum(acc);
  if (lane == 0) StoreOne(out + int64_t{token} * hidden + n, acc);
}

// Grouped down: grid (ceil(hidden / kWarps), units). Warp w takes output feature
// n = bx * kWarps + w of the tile's rows: expert_out[row, n] = down_e[n] . act[row].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GroupedDownKernel(const T* __restrict__ act, const T* __restrict__ down,
                      T* __restrict__ expert_out, const int32_t* __restrict__ offsets,
                      const int32_t* __restrict__ tile_offsets, int experts, int hidden,
                      int inter) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  int expert, first_row, rows;
  if (n >= hidden ||
      !FindTile(blockIdx.y, offsets, tile_offsets, experts, &expert, &first_row, &rows)) {
    return;
  }
  const T* ar[kTileRows];
#pragma unroll
  for (int m = 0; m < kTileRows; ++m) ar[m] = act + int64_t{first_row + (m < rows ? m : 0)} * inter;
  float acc[kTileRows] = {};
  RowDot<T, kTileRows>(down + (int64_t{expert} * hidden + n) * inter, ar, inter, lane, acc);
#pragma unroll
  for (int m = 0; m < kTileRows; ++m) {
    const float sum = WarpSum(acc[m]);
    if (lane == 0 && m < rows) StoreOne(expert_out + int64_t{first_row + m} * hidden + n, sum);
  }
}

// Combine: a block per token; out[t] = sum_k weight[t, k] * expert_out[slot_rows[t * top_k + k]].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    CombineKernel(const T* __restrict__ expert_out, const int32_t* __restrict__ slot_rows,
                  const float* __restrict__ weights, T* __restrict__ out, int top_k, int hidden) {
  BeginDependentKernel();
  const int token = blockIdx.x;
  for (int c = threadIdx.x * 8; c < hidden; c += kThreads * 8) {
    float sum[8] = {};
    for (int k = 0; k < top_k; ++k) {
      const int slot = token * top_k + k;
      const float w = weights[slot];
      float y[8];
      Load8<T>(expert_out + int64_t{slot_rows[slot]} * hidden + c, y);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] = fmaf(w, y[e], sum[e]);
    }
    Store8<T>(out + int64_t{token} * hidden + c, sum);
  }
}

template <typename T>
cudaError_t LaunchTyped(const MoeParams& p, cudaStream_t stream) {
  const int64_t chunk = std::min<int64_t>(p.num_tokens, kMoeChunkTokens);
  const MoeWorkspaceLayout l =
      MoeWorkspaceLayout::For(chunk, p.num_experts, p.top_k, p.hidden, p.intermediate, sizeof(T));
  auto* ws = static_cast<unsigned char*>(p.workspace);
  float* logits = reinterpret_cast<float*>(ws + l.logits);
  int32_t* ids = reinterpret_cast<int32_t*>(ws + l.expert_ids);
  float* weights = reinterpret_cast<float*>(ws + l.weights);
  int32_t* offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  int32_t* tile_offsets = reinterpret_cast<int32_t*>(ws + l.tile_offsets);
  int32_t* sorted_slots = reinterpret_cast<int32_t*>(ws + l.sorted_slots);
  int32_t* slot_rows = reinterpret_cast<int32_t*>(ws + l.slot_rows);
  T* act = reinterpret_cast<T*>(ws + l.act);
  T* expert_out = reinterpret_cast<T*>(ws + l.expert_out);
  const T* router = static_cast<const T*>(p.router);
  const T* gate_up = static_cast<const T*>(p.gate_up);
  const T* down = static_cast<const T*>(p.down);
  const int experts = static_cast<int>(p.num_experts), top_k = static_cast<int>(p.top_k);
  const int hidden = static_cast<int>(p.hidden), inter = static_cast<int>(p.intermediate);
  const bool grouped = p.Resolved() == MoePath::kGrouped;
  for (int64_t start = 0; start < p.num_tokens; start += chunk) {
    const int tokens = static_cast<int>(std::min(chunk, p.num_tokens - start));
    const int slots = tokens * top_k;
    const T* x = static_cast<const T*>(p.input) + start * p.hidden;
    T* out = static_cast<T*>(p.output) + start * p.hidden;
    const unsigned expert_blocks = static_cast<unsigned>(CeilDiv(experts, kWarps));
    if (tokens == 1) {
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(RouterLogitsKernel<T, 1>, dim3(expert_blocks, 1),
                                                kThreads, 0, stream, x, router, logits, tokens,
                                                experts, hidden));
    } else {
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
          RouterLogitsKernel<T, kTileRows>,
          dim3(expert_blocks, static_cast<unsigned>(CeilDiv(tokens, kTileRows))), kThreads, 0,
          stream, x, router, logits, tokens, experts, hidden));
    }
    const unsigned column_blocks = static_cast<unsigned>(CeilDiv(inter, kWarps));
    const unsigned row_blocks = static_cast<unsigned>(CeilDiv(hidden, kWarps));
    if (!grouped) {
      // Each expert GEMM routes its tokens itself (no routing kernel).
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
          FusedGateUpKernel<T>, dim3(column_blocks, static_cast<unsigned>(slots)), kThreads, 0,
          stream, x, gate_up, static_cast<const float*>(logits), act, experts, top_k, hidden,
          inter));
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
          FusedDownKernel<T>, dim3(row_blocks, static_cast<unsigned>(tokens)), kThreads, 0, stream,
          static_cast<const T*>(act), down, static_cast<const float*>(logits), out, experts, top_k,
          p.normalize_top_k, hidden, inter));
      continue;
    }
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(RoutingKernel,
                                              static_cast<unsigned>(CeilDiv(tokens, 4)), 128, 0,
                                              stream, static_cast<const float*>(logits), ids,
                                              weights, tokens, experts, top_k, p.normalize_top_k));
    LMSERVE_CUDA_RETURN_IF_ERROR(
        LaunchKernel(SortKernel, 1, 1024, 0, stream, static_cast<const int32_t*>(ids), offsets,
                     tile_offsets, sorted_slots, slot_rows, slots, experts));
    // Tiles: at most one partial tile per expert beyond the full ones.
    const unsigned units = static_cast<unsigned>(CeilDiv(slots, kTileRows) + experts);
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
        GroupedGateUpKernel<T>, dim3(column_blocks, units), kThreads, 0, stream, x, gate_up, act,
        static_cast<const int32_t*>(offsets), static_cast<const int32_t*>(tile_offsets),
        static_cast<const int32_t*>(sorted_slots), experts, top_k, hidden, inter));
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
        GroupedDownKernel<T>, dim3(row_blocks, units), kThreads, 0, stream,
        static_cast<const T*>(act), down, expert_out, static_cast<const int32_t*>(offsets),
        static_cast<const int32_t*>(tile_offsets), experts, hidden, inter));
    LMSERVE_CUDA_RETURN_IF_ERROR(
        LaunchKernel(CombineKernel<T>, static_cast<unsigned>(tokens), kThreads, 0, stream,
                     static_cast<const T*>(expert_out), static_cast<const int32_t*>(slot_rows),
                     static_cast<const float*>(weights), out, top_k, hidden));
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t Launch(const MoeParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchTyped<T>(p, stream);
  });
}

cudaError_t Launch(const MoeRoutingParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return LaunchKernel(RoutingKernel, static_cast<unsigned>(CeilDiv(p.num_tokens, 4)), 128, 0,
                      stream, p.logits, p.expert_ids, p.weights, static_cast<int>(p.num_tokens),
                      static_cast<int>(p.num_experts), static_cast<int>(p.top_k),
                      p.normalize_top_k);
}

}  // namespace lmserve::kernels::cuda
