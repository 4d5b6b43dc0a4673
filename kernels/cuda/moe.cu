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

// Router logits: grid (ceil(E / kWarps), ceil(tokens / kTileRows)); warp w of block (bx, by) takes
// expert bx * kWarps + w and tokens by * kTileRows + [0, kTileRows).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RouterLogitsKernel(const T* __restrict__ x, const T* __restrict__ router,
                       float* __restrict__ logits, int tokens, int experts, int hidden) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int expert = blockIdx.x * kWarps + threadIdx.x / 32;
  if (expert >= experts) return;
  const int t0 = blockIdx.y * kTileRows;
  const int rows = min(kTileRows, tokens - t0);
  const T* xr[kTileRows];
#pragma unroll
  for (int m = 0; m < kTileRows; ++m) xr[m] = x + int64_t{t0 + (m < rows ? m : 0)} * hidden;
  float acc[kTileRows] = {};
  RowDot<T, kTileRows>(router + int64_t{expert} * hidden, xr, hidden, lane, acc);
#pragma unroll
  for (int m = 0; m < kTileRows; ++m) {
    const float sum = WarpSum(acc[m]);
    if (lane == 0 && m < rows) logits[int64_t{t0 + m} * experts + expert] = sum;
  }
}

// Routing: a warp per token. Each lane holds experts lane, lane + 32, ...; top-k by k rounds of a
// warp argmax (ties: the lower index); fp32 softmax over every expert.
__global__ void __launch_bounds__(128)
    RoutingKernel(const float* __restrict__ logits, int32_t* __restrict__ expert_ids,
                  float* __restrict__ weights, int tokens, int experts, int top_k, bool normalize) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int token = blockIdx.x * 4 + threadIdx.x / 32;
  if (token >= tokens) return;
  float v[kMaxExpertsPerLane];
  bool taken[kMaxExpertsPerLane];
  float local_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int e = lane + 32 * i;
    float x = e < experts ? logits[int64_t{token} * experts + e] : -INFINITY;
    if (x != x) x = -INFINITY;  // NaN: never preferred
    v[i] = x;
    taken[i] = e >= experts;
    local_max = fmaxf(local_max, x);
  }
  const float max_logit = WarpMax(local_max);
  float total = 0;
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    if (lane + 32 * i < experts) total += expf(v[i] - max_logit);
  }
  total = WarpSum(total);
  float chosen_value = 0;  // lane k holds the k-th choice's logit
  int chosen_id = 0;
  for (int k = 0; k < top_k; ++k) {
    float best = -INFINITY;
    int best_id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      const int e = lane + 32 * i;
      if (!taken[i] && (v[i] > best || (v[i] == best && e < best_id))) best = v[i], best_id = e;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) best = other, best_id = other_id;
    }
#pragma unroll
    for (int i = 0; i < kMaxExpertsPerLane; ++i) {
      if (best_id == lane + 32 * i) taken[i] = true;
    }
    if (lane == k) chosen_value = best, chosen_id = best_id;
  }
  const float p = lane < top_k ? expf(chosen_value - max_logit) : 0.0f;
  const float denominator = normalize ? WarpSum(p) : total;
  if (lane < top_k) {
    expert_ids[int64_t{token} * top_k + lane] = chosen_id;
    weights[int64_t{token} * top_k + lane] = p / denominator;
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

// The rows of work unit `unit`: fused, slot `unit` alone; grouped, tile `unit` of the sorted rows
// (nothing past the last tile). Sets the expert, the first row and the row count.
template <bool kGrouped>
__device__ __forceinline__ bool FindTile(int unit, const int32_t* __restrict__ expert_ids,
                                         const int32_t* __restrict__ offsets,
                                         const int32_t* __restrict__ tile_offsets, int experts,
                                         int* expert, int* first_row, int* rows) {
  if constexpr (!kGrouped) {
    *expert = expert_ids[unit];
    *first_row = unit;
    *rows = 1;
    return true;
  } else {
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
}

// Gate/up with SiLU-and-mul: grid (ceil(I / kWarps), units). Warp w takes column
// j = bx * kWarps + w: the expert's gate row j and up row j, over the unit's rows (M of them at
// most). act[row, j] = silu(gate) * up, each rounded to T first as a separate activation kernel
// would see them. The input row of a row is its slot's token: slot / top_k (fused: row = slot;
// grouped: slot = sorted_slots[row]).
template <typename T, int M, bool kGrouped>
__global__ void __launch_bounds__(kThreads)
    GateUpKernel(const T* __restrict__ x, const T* __restrict__ gate_up, T* __restrict__ act,
                 const int32_t* __restrict__ expert_ids, const int32_t* __restrict__ offsets,
                 const int32_t* __restrict__ tile_offsets, const int32_t* __restrict__ sorted_slots,
                 int experts, int top_k, int hidden, int inter) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * kWarps + threadIdx.x / 32;
  int expert, first_row, rows;
  if (j >= inter || !FindTile<kGrouped>(blockIdx.y, expert_ids, offsets, tile_offsets, experts,
                                        &expert, &first_row, &rows)) {
    return;
  }
  const T* xr[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int row = first_row + (m < rows ? m : 0);
    const int slot = kGrouped ? sorted_slots[row] : row;
    xr[m] = x + int64_t{slot / top_k} * hidden;
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

// Fused down + combine: grid (ceil(hidden / kWarps), tokens). Warp w of block (bx, t) takes output
// feature n = bx * kWarps + w of token t: sum_k weight[t, k] * down_e[n] . act[t * top_k + k].
// The (k, piece) pairs are spread over the lanes, kUnroll in flight.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    FusedDownKernel(const T* __restrict__ act, const T* __restrict__ down, T* __restrict__ out,
                    const int32_t* __restrict__ expert_ids, const float* __restrict__ weights,
                    int top_k, int hidden, int inter) {
  BeginDependentKernel();
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarps + threadIdx.x / 32;
  const int token = blockIdx.y;
  if (n >= hidden) return;
  const int pieces = inter / 8;
  const int items = pieces * top_k;
  float acc = 0;
  int i = lane;
  auto item = [&](int index, float(&wf)[8], float(&af)[8]) {
    const int k = index / pieces, c = index - k * pieces;
    const int slot = token * top_k + k;
    const int expert = expert_ids[slot];
    LoadStream8<T>(down + (int64_t{expert} * hidden + n) * inter + c * 8, wf);
    Load8<T>(act + int64_t{slot} * inter + c * 8, af);
    return weights[slot];
  };
  for (; i + 32 * (kUnroll - 1) < items; i += 32 * kUnroll) {
    float wf[kUnroll][8], af[kUnroll][8], scale[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) scale[u] = item(i + 32 * u, wf[u], af[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float dot = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(wf[u][e], af[u][e], dot);
      acc = fmaf(scale[u], dot, acc);
    }
  }
  for (; i < items; i += 32) {
    float wf[8], af[8];
    const float scale = item(i, wf, af);
    float dot = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot = fmaf(wf[e], af[e], dot);
    acc = fmaf(scale, dot, acc);
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
  if (n >= hidden || !FindTile<true>(blockIdx.y, nullptr, offsets, tile_offsets, experts, &expert,
                                     &first_row, &rows)) {
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
    LMSERVE_CUDA_RETURN_IF_ERROR(
        LaunchKernel(RouterLogitsKernel<T>,
                     dim3(static_cast<unsigned>(CeilDiv(experts, kWarps)),
                          static_cast<unsigned>(CeilDiv(tokens, kTileRows))),
                     kThreads, 0, stream, x, router, logits, tokens, experts, hidden));
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(RoutingKernel,
                                              static_cast<unsigned>(CeilDiv(tokens, 4)), 128, 0,
                                              stream, static_cast<const float*>(logits), ids,
                                              weights, tokens, experts, top_k, p.normalize_top_k));
    const unsigned column_blocks = static_cast<unsigned>(CeilDiv(inter, kWarps));
    const unsigned row_blocks = static_cast<unsigned>(CeilDiv(hidden, kWarps));
    if (!grouped) {
      LMSERVE_CUDA_RETURN_IF_ERROR(
          LaunchKernel(GateUpKernel<T, 1, false>, dim3(column_blocks, static_cast<unsigned>(slots)),
                       kThreads, 0, stream, x, gate_up, act, static_cast<const int32_t*>(ids),
                       static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                       static_cast<const int32_t*>(nullptr), experts, top_k, hidden, inter));
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
          FusedDownKernel<T>, dim3(row_blocks, static_cast<unsigned>(tokens)), kThreads, 0, stream,
          static_cast<const T*>(act), down, out, static_cast<const int32_t*>(ids),
          static_cast<const float*>(weights), top_k, hidden, inter));
      continue;
    }
    LMSERVE_CUDA_RETURN_IF_ERROR(
        LaunchKernel(SortKernel, 1, 1024, 0, stream, static_cast<const int32_t*>(ids), offsets,
                     tile_offsets, sorted_slots, slot_rows, slots, experts));
    // Tiles: at most one partial tile per expert beyond the full ones.
    const unsigned units = static_cast<unsigned>(CeilDiv(slots, kTileRows) + experts);
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(
        GateUpKernel<T, kTileRows, true>, dim3(column_blocks, units), kThreads, 0, stream, x,
        gate_up, act, static_cast<const int32_t*>(ids), static_cast<const int32_t*>(offsets),
        static_cast<const int32_t*>(tile_offsets), static_cast<const int32_t*>(sorted_slots),
        experts, top_k, hidden, inter));
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
