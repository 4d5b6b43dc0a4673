#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/residual_fold.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;  // 16-byte pieces of each W row in flight per lane

template <typename T>
__device__ __forceinline__ void Store(T* p, float v) {
  *p = FromFloat<T>(v);
}
template <>
__device__ __forceinline__ void Store<float>(float* p, float v) {
  *p = v;
}

// grid: ceil(n / (kWarps * kRowsPerWarp)); warp w of block b takes rows
// (b * kWarps + w) * kRowsPerWarp + [0, kRowsPerWarp). With kSiluAndMul, warp w takes output
// column j = b * kWarps + w: the gate row j and the up row j + n / 2, and writes
// act(gate) * up (kActivation).
// The norm epilogue's partial sums a lane holds (SkinnyGemmParams::norm_partials, one row).
constexpr int kNormPartialsPerLane = kMaxSkinnyNormPartials / 32;

// What the kernel does besides the product (skinny_gemm.h): the L2 prefetch before the wait, and
// the norm epilogue (kNorm).
struct SkinnyExtras {
  int prefetch_offset = 0;  // bytes into each row where the prefetch starts
  int prefetch_bytes = 0;   // per row; 0: none
  // The warps of one wave of resident blocks: a warp of the first wave also asks L2 for the
  // whole rows of warps warp + wave_warps, warp + 2 * wave_warps, ... (blocks that start only
  // once others finish, without overlapping anything). 0: none.
  int wave_warps = 0;
  const float* norm_partials = nullptr;
  int num_norm_partials = 0;
  float inv_norm_width = 0.0f;
  float norm_epsilon = 0.0f;
  // The add + RMSNorm folded in (kAddNorm) and the residual's add settled (residual_fold.cuh).
  ResidualFoldArgs fold;
};

// kSplit (1 or 2): warps a row pair, each taking a contiguous 1 / kSplit of k, their sums added
// through shared memory (SkinnyGemmParams::k_split; every warp of the grid then has rows).
// kAddNorm: the add + RMSNorm before the product (SkinnyGemmParams::add_norm_residual). After
// the wait the block's threads write (residual + x) * weight into shared memory in the input
// type, 8 elements at a time, and sum the squares of residual + x; the warps then read their x
// from there, and the epilogue applies the norm's scale. (Each warp reading the residual, x and
// the weight itself, four times the bytes of x alone, made the product L1-bound: Mamba-2-2.7B
// at batch 1 went from 2.63 ms a step to 2.84 on an H100.)
template <typename T, typename OutT, int M, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu, bool kNorm = false, int kSplit = 1,
          bool kAddNorm = false>
__global__ void __launch_bounds__(kThreads, kAddNorm ? 4 : 0)  // kAddNorm: as M 1 without, 64
    SkinnyGemmKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y,
                     int n, int k, int64_t x_stride, int64_t y_stride, bool late_dependents,
                     SkinnyExtras extras) {
  static_assert(!kSiluAndMul || kRowsPerWarp == 2, "a warp holds a gate row and its up row");
  static_assert(!kNorm || (M == 1 && !kSiluAndMul), "the norm epilogue takes one row");
  static_assert(kSplit == 1 || !kSiluAndMul);
  static_assert(!kAddNorm || (M == 1 && !kNorm && kSplit == 1),
                "the folded add + RMSNorm takes one row and the whole of k");
  const int lane = threadIdx.x % 32;
  const int warp_in_block = threadIdx.x / 32;
  const int slice = warp_in_block % kSplit;  // of k
  const int warp_index = blockIdx.x * (kWarps / kSplit) + warp_in_block / kSplit;  // row pair
  const int row0 = kSiluAndMul ? warp_index : warp_index * kRowsPerWarp;
  if (row0 >= (kSiluAndMul ? n / 2 : n)) {
    WaitForPriorKernels();
    // Its share of the folded norm's row, and the barrier.
    if constexpr (kAddNorm) AddNormScale<T, kThreads>(x, extras.fold, k);
    return;
  }
  // What a folded add + RMSNorm left unadded: y's previous rows, into the residual (only this
  // warp writes its rows of y, after its wait); first, before W's pieces are requested
  // (residual_fold.cuh says why).
  if constexpr (!kSiluAndMul && !kAddNorm) {  // Validate(): never both
    if (extras.fold.settle_residual != nullptr && slice == 0) {
      SettleResidualRows<OutT, kRowsPerWarp>(extras.fold.settle_residual, y, row0, n, lane);
    }
  }
  const int row_step = kSiluAndMul ? n / 2 : 1;  // between a warp's rows
  const int chunks = k / 8 / kSplit;  // of this warp's slice
  if constexpr (kSplit > 1) {
    w += static_cast<int64_t>(slice) * chunks * 8;
    x += static_cast<int64_t>(slice) * chunks * 8;
  }
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
  }
  const T* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) w_rows[r] = w + int64_t{row0 + r * row_step} * k;

  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[u][r] = LoadStream16(w_rows[r] + (c + 32 * u) * 8);
    }
  };
  // The weights do not depend on the previous kernel: the first pieces are requested before
  // waiting for it (programmatic dependent launch, common.cuh). A step takes kUnroll pieces a
  // lane, 32 * kUnroll chunks a warp; the steps where every lane has all of its pieces run here,
  // the warp converged, and the pieces left over run in the tail loop below.
  constexpr int kStep = 32 * kUnroll;
  int c = lane;
  if (kStep <= chunks) load_w(c);
  // Lane r asks L2 for the rest of row r (up to extras.prefetch_bytes of it), past the pieces
  // just loaded.
  if (extras.prefetch_bytes > 0 && lane < kRowsPerWarp &&
      (kSiluAndMul || row0 + lane < n)) {
    PrefetchL2(reinterpret_cast<const char*>(w + int64_t{row0 + lane * row_step} * k) +
                   extras.prefetch_offset,
               extras.prefetch_bytes);
  }
  if (extras.wave_warps > 0 && lane == 0) {
    const int warps = kSiluAndMul ? n / 2 : (n + kRowsPerWarp - 1) / kRowsPerWarp;
    for (int later = warp_index + extras.wave_warps; later < warps; later += extras.wave_warps) {
      if constexpr (kSiluAndMul) {
        PrefetchL2(w + int64_t{later} * k, k * static_cast<int>(sizeof(T)));
        PrefetchL2(w + int64_t{later + n / 2} * k, k * static_cast<int>(sizeof(T)));
      } else {
        const int rows = min(kRowsPerWarp, n - later * kRowsPerWarp);
        PrefetchL2(w + int64_t{later} * kRowsPerWarp * k, rows * k * static_cast<int>(sizeof(T)));
      }
    }
  }
  if constexpr (kAddNorm) {
    if (warp_in_block == 0 && lane == 0) PrefetchAddNormWeight<T>(extras.fold, k);
  }
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  // The norm epilogue's partial sums: requested now, summed after the products.
  [[maybe_unused]] float partials[kNorm ? kNormPartialsPerLane : 1];
  if constexpr (kNorm) {
#pragma unroll
    for (int j = 0; j < kNormPartialsPerLane; ++j) {
      const int index = lane + 32 * j;
      partials[j] = index < extras.num_norm_partials ? extras.norm_partials[index] : 0.0f;
    }
  }
  [[maybe_unused]] float add_norm_scale = 1.0f;
  if constexpr (kAddNorm) add_norm_scale = AddNormScale<T, kThreads>(x, extras.fold, k);
  // Row t's 8 inputs of chunk `chunk` (kAddNorm: from shared memory).
  auto load_x = [&](int t, int chunk, float (&xf)[8]) {
    if constexpr (kAddNorm) {
      Unpack8<T>(AddNormRowMemory()[chunk], xf);
    } else {
      Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(x + t * x_stride + chunk * 8)), xf);
    }
  };
  for (; c - lane + kStep <= chunks; c += kStep) {
    if (c != lane) {
      load_w(c);
      // All of the step's loads before any of its products. Without this barrier, CUDA 13.0's
      // ptxas folds the loads into the products as predicated loads and issues the last one only
      // after the products of the first piece, which wait for it to arrive: a step then waits
      // for two round trips to memory instead of one. (An H200, Llama-3-8B's shapes, batch 1:
      // the projections streamed at 3.9-4.4 TB/s without it and 4.0-4.6 with it.)
      __syncwarp();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float xf[8];
        load_x(t, c + 32 * u, xf);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float wf[8];
          Unpack8<T>(wv[u][r], wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
        }
      }
    }
  }
  for (; c < chunks; c += 32) {  // the tail
    uint4 wv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wv[r] = LoadStream16(w_rows[r] + c * 8);
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float xf[8];
      load_x(t, c, xf);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float wf[8];
        Unpack8<T>(wv[r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
      }
    }
  }
  // With late_dependents the next kernel may launch only once every warp has read its share of
  // W, not right after the wait (common.cuh): a next GEMM's blocks, streaming weights too, then
  // do not take the memory from this one's. An H200, Llama-3-8B's shapes at batch 1: 4.15 ms a
  // step against 4.21 with it everywhere, 4.12 with it for the gate/up projection alone.
  if (late_dependents) AllowDependentLaunch();
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]);
  }
  if constexpr (kSplit > 1) {  // the slices' sums into slice 0's warp
    __shared__ float slice_sums[kWarps][kRowsPerWarp][M];
    if (slice != 0 && lane == 0) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int t = 0; t < M; ++t) slice_sums[warp_in_block][r][t] = acc[r][t];
      }
    }
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int s = 1; s < kSplit; ++s) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int t = 0; t < M; ++t) acc[r][t] += slice_sums[warp_in_block + s][r][t];
      }
    }
  }
  if constexpr (kNorm) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormPartialsPerLane; ++j) sum += partials[j];
    const float scale = rsqrtf(WarpSum(sum) * extras.inv_norm_width + extras.norm_epsilon);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[r][0] *= scale;
  }
  if constexpr (kAddNorm) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) acc[r][0] *= add_norm_scale;
  }
  if constexpr (kSiluAndMul) {
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const float gate = ToFloat(FromFloat<T>(acc[0][t])), up = ToFloat(FromFloat<T>(acc[1][t]));
        Store(y + t * y_stride + row0, GateActivationOf<kActivation, true>(gate) * up);
      }
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (row0 + r >= n) continue;
#pragma unroll
      for (int t = 0; t < M; ++t) Store(y + t * y_stride + row0 + r, acc[r][t]);
    }
  }
}

template <typename T, typename OutT, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu>
cudaError_t LaunchTyped(const SkinnyGemmParams& p, cudaStream_t stream) {
  SkinnyExtras extras;
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  const int64_t y_stride = p.y_stride != 0 ? p.y_stride : (kSiluAndMul ? p.n / 2 : p.n);
  const unsigned blocks =
      static_cast<unsigned>(CeilDiv(p.n, int64_t{kWarps} * kRowsPerWarp));  // both mappings
  // Two warps a row pair (one row, no activation) where the blocks would not make 2 a
  // multiprocessor, each half of k a full step of the loop or more, and the rows fill every
  // block: twice the loads in flight for a short, wide product (Mamba-2-2.7B's out_proj: 160
  // blocks of 16 rows).
  constexpr int kSplitRows = kWarps / 2 * kRowsPerWarp;
  [[maybe_unused]] const bool split =
      !kSiluAndMul && p.m == 1 && p.n % kSplitRows == 0 && p.k % 16 == 0 &&
      p.k / 16 >= 32 * kUnroll &&
      (p.k_split == 2 ||
       (p.k_split == 0 && blocks < 2 * static_cast<unsigned>(CurrentMultiprocessorCount())));
  [[maybe_unused]] const unsigned split_blocks = static_cast<unsigned>(p.n / kSplitRows);
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  OutT* y = static_cast<OutT*>(p.y);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  // The L2 prefetch's budget (SkinnyExtras): first the rows of blocks past the first wave of
  // resident ones (they start only as others finish: the kernel's tail), where they fit; then
  // what is left, spread over every row past the pieces of the kernel's first step (loaded into
  // registers before the wait).
  size_t smem = 0;  // dynamic shared memory: kAddNorm's row
  auto launch = [&](auto kernel, auto&&... args) {
    int64_t budget = p.l2_prefetch_bytes;
    const int64_t row_bytes = p.k * static_cast<int64_t>(sizeof(T));
    int per_sm = 0;
    if (budget > 0 &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) ==
            cudaSuccess &&
        per_sm > 0) {
      const int64_t wave = int64_t{per_sm} * CurrentMultiprocessorCount();
      const int64_t later_bytes =
          std::max<int64_t>(0, p.n - wave * kWarps * kRowsPerWarp) * row_bytes;
      if (wave < blocks && later_bytes <= budget) {
        extras.wave_warps = static_cast<int>(wave * kWarps);
        budget -= later_bytes;
      }
    }
    if (budget > 0) {
      const int64_t first = p.k / 8 >= 32 * kUnroll ? int64_t{32 * kUnroll * 16} : 0;
      const int64_t per_row = std::min(row_bytes - first, budget / p.n) / 16 * 16;
      if (per_row > 0) {
        extras.prefetch_offset = static_cast<int>(first);
        extras.prefetch_bytes = static_cast<int>(per_row);
      }
    }
    return LaunchKernel(kernel, blocks, kThreads, smem, stream, args..., extras);
  };
  [[maybe_unused]] auto launch_split = [&](auto kernel, auto&&... args) {  // no prefetch
    return LaunchKernel(kernel, split_blocks, kThreads, 0, stream, args..., extras);
  };
  extras.fold = ResidualFoldArgsOf(p);
  if constexpr (std::is_same_v<OutT, T>) {
    if (p.add_norm_residual != nullptr) {  // Validate(): one row
      smem = static_cast<size_t>(p.k) * sizeof(T);
      return launch(SkinnyGemmKernel<T, OutT, 1, kSiluAndMul, kActivation, false, 1, true>, x, w,
                    y, n, k, x_stride, y_stride, p.late_dependents);
    }
  }
  if constexpr (!kSiluAndMul) {
    if (p.norm_partials != nullptr) {  // Validate(): one row
      extras.norm_partials = p.norm_partials;
      extras.num_norm_partials = static_cast<int>(p.num_norm_partials);
      extras.inv_norm_width = 1.0f / static_cast<float>(p.norm_width);
      extras.norm_epsilon = p.norm_epsilon;
      if (split) {
        return launch_split(SkinnyGemmKernel<T, OutT, 1, false, kActivation, true, 2>, x, w, y, n,
                            k, x_stride, y_stride, p.late_dependents);
      }
      return launch(SkinnyGemmKernel<T, OutT, 1, false, kActivation, true>, x, w, y, n, k,
                    x_stride, y_stride, p.late_dependents);
    }
  }
  if constexpr (!kSiluAndMul) {
    if (split) {
      return launch_split(SkinnyGemmKernel<T, OutT, 1, false, kActivation, false, 2>, x, w, y, n,
                          k, x_stride, y_stride, p.late_dependents);
    }
  }
  switch (p.m) {
#define LMSERVE_SKINNY_CASE(M)                                                          \
  case M:                                                                               \
    return launch(SkinnyGemmKernel<T, OutT, M, kSiluAndMul, kActivation>, x, w, y, n, k,   \
                  x_stride, y_stride, p.late_dependents);
    LMSERVE_SKINNY_CASE(1)
    LMSERVE_SKINNY_CASE(2)
    LMSERVE_SKINNY_CASE(3)
    LMSERVE_SKINNY_CASE(4)
    LMSERVE_SKINNY_CASE(5)
    LMSERVE_SKINNY_CASE(6)
    LMSERVE_SKINNY_CASE(7)
    LMSERVE_SKINNY_CASE(8)
#undef LMSERVE_SKINNY_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t Launch(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchActivationDType(p.input_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Validate() allows the activation with the input type out only.
    if (p.output_dtype == DType::kF32) return LaunchTyped<T, float, false>(p, stream);
    if (p.silu_and_mul && p.activation == GateActivation::kGeluTanh) {
      return LaunchTyped<T, T, true, GateActivation::kGeluTanh>(p, stream);
    }
    if (p.silu_and_mul) return LaunchTyped<T, T, true>(p, stream);
    return LaunchTyped<T, T, false>(p, stream);
  });
}

}  // namespace lmserve::kernels::cuda
