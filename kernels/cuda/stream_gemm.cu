#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/stream_gemm.h"
#include "kernels/cuda/stream_gemm_schedule.h"
#include "kernels/cuda/tma.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kConsumerWarps = 4;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kThreads = kConsumerThreads + 32;  // and one producer warp
constexpr int kChunkK = kStreamGemmChunk;        // k per stage: one 128-byte swizzled row
constexpr int kBoxRows = kStreamGemmBoxRows;     // W rows per copy

// The shared-memory layout for kTokens tokens (8, 16, 32, 64).
template <int kTokens>
struct Layout {
  static constexpr int kTileRows = StreamGemmTileRows(kTokens);  // W rows per tile
  static constexpr int kWarpRows = kTileRows / kConsumerWarps;    // 16 or 32
  static constexpr int kRowTiles = kWarpRows / 16;                // m16 tiles per warp
  static constexpr int kNTiles = kTokens / 8;                     // n8 tiles
  static constexpr int kWBytes = kTileRows * 128;
  static constexpr int kXBytes = kTokens * 128;
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024: stages stay aligned
  static constexpr int kStages = StreamGemmStages(kTokens);
  static constexpr int kOutStride = kTokens + 1;  // fp32 words per row of the output staging
  static constexpr int kOutBytes = kTileRows * kOutStride * 4;
  static constexpr int kBarrierBytes = 2 * kStages * 8 + 16;
  // 1024 of slack: the ring must start on a 1024-byte boundary (the swizzle's period).
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kOutBytes + kBarrierBytes;
  static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte alignment");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than a block may have");
};

struct KernelArgs {
  void* y;
  int64_t y_stride;
  int m;          // tokens written (x rows)
  int n_out;      // output columns: n, or n / 2 with silu_and_mul
  int up_offset;  // silu_and_mul: W's first up row (n / 2)
  StreamGemmSchedule schedule;
  int* counters;    // [tail tiles]: arrivals of each split tile's units
  float* partials;  // [tail tiles * splits][tile rows][tokens]
};

// Which tile and which chunks of k a work unit covers (see StreamGemmSchedule).
struct Unit {
  int tile;
  int split;  // -1: the whole of k, written directly
  int chunk_begin, chunk_end;
};
__device__ __forceinline__ Unit DecodeUnit(const StreamGemmSchedule& s, int u) {
  if (u < s.full_tiles) return {u, -1, 0, s.num_chunks};
  const int t = u - s.full_tiles;
  const int split = t % s.splits;
  return {s.full_tiles + t / s.splits, split, split * s.num_chunks / s.splits,
          (split + 1) * s.num_chunks / s.splits};
}

// Walks a block's chunks in order: its units blockIdx.x, + gridDim.x, ..., each unit's chunks.
struct Cursor {
  int unit;
  Unit u;
  int chunk;
  __device__ __forceinline__ bool Start(const StreamGemmSchedule& s) {
    unit = blockIdx.x;
    if (unit >= s.num_units) return false;
    u = DecodeUnit(s, unit);
    chunk = u.chunk_begin;
    return true;
  }
  // Returns false past the block's last chunk.
  __device__ __forceinline__ bool Next(const StreamGemmSchedule& s) {
    if (++chunk < u.chunk_end) return true;
    unit += gridDim.x;
    if (unit >= s.num_units) return false;
    u = DecodeUnit(s, unit);
    chunk = u.chunk_begin;
    return true;
  }
};

__device__ __forceinline__ void ConsumerBarrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerThreads) : "memory");
}

template <typename OutT>
__device__ __forceinline__ void StoreOut(OutT* p, float v) {
  if constexpr (std::is_same_v<OutT, float>) {
    *p = v;
  } else {
    *p = FromFloat<OutT>(v);
  }
}

// grid: min(units, multiprocessors) blocks of kThreads; Layout<kTokens>::kSmemBytes dynamic
// shared memory. Warps 0-3 consume, warp 4 produces.
template <typename T, typename OutT, int kTokens, bool kSiluAndMul>
__global__ void __launch_bounds__(kThreads, 1)
    StreamGemmKernel(const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap x_map, KernelArgs a) {
  using L = Layout<kTokens>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* s_out = reinterpret_cast<float*>(ring + L::kStages * L::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + L::kStages * L::kStageBytes + L::kOutBytes);
  uint64_t* empty = full + L::kStages;
  int* s_last = reinterpret_cast<int*>(empty + L::kStages);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const StreamGemmSchedule& sched = a.schedule;
  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      BarrierInit(&full[s], 1);                // the producer's arrival (and the copies' bytes)
      BarrierInit(&empty[s], kConsumerWarps);  // one arrival per consumer warp
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // The producer. Its first kStages chunks' weights are requested before waiting for the
    // previous kernel (they do not depend on it); x, which does, only after.
    if (lane == 0) {
      TmaPrefetchDescriptor(&w_map);
      TmaPrefetchDescriptor(&x_map);
      // Stage s gets the W rows of the cursor's tile at its chunk.
      auto load_w = [&](const Cursor& c, int s) {
        constexpr int kBoxes = L::kTileRows / kBoxRows;
        unsigned char* stage = ring + s * L::kStageBytes;
#pragma unroll
        for (int b = 0; b < kBoxes; ++b) {
          int row;
          if constexpr (kSiluAndMul) {
            // The tile's first half: gate rows j0.., its second half: the matching up rows.
            const int j0 = c.u.tile * (L::kTileRows / 2);
            row = b < kBoxes / 2 ? j0 + b * kBoxRows
                                 : a.up_offset + j0 + (b - kBoxes / 2) * kBoxRows;
          } else {
            row = c.u.tile * L::kTileRows + b * kBoxRows;
          }
          TmaLoad2d(stage + b * kBoxRows * 128, &w_map, c.chunk * kChunkK, row, &full[s]);
        }
      };
      Cursor cursor;
      int issued = 0;
      bool more = cursor.Start(sched);
      for (; more && issued < L::kStages; ++issued) {
        BarrierArriveExpectTx(&full[issued], L::kStageBytes);
        load_w(cursor, issued);
        more = cursor.Next(sched);
      }
      WaitForPriorKernels();
      AllowDependentLaunch();
      {
        Cursor again;
        again.Start(sched);
        for (int q = 0; q < issued; ++q) {
          TmaLoad2d(ring + q * L::kStageBytes + L::kWBytes, &x_map, again.chunk * kChunkK, 0,
                    &full[q]);
          again.Next(sched);
        }
      }
      for (int q = issued; more; ++q) {
        const int s = q % L::kStages;
        const uint32_t phase = (q / L::kStages) & 1;
        BarrierWait(&empty[s], phase ^ 1);
        BarrierArriveExpectTx(&full[s], L::kStageBytes);
        load_w(cursor, s);
        TmaLoad2d(ring + s * L::kStageBytes + L::kWBytes, &x_map, cursor.chunk * kChunkK, 0,
                  &full[s]);
        more = cursor.Next(sched);
      }
    } else {
      WaitForPriorKernels();
      AllowDependentLaunch();
    }
    return;
  }

  // The consumers.
  WaitForPriorKernels();
  AllowDependentLaunch();
  const int tid = threadIdx.x;  // 0 .. kConsumerThreads - 1
  constexpr int kCols = kSiluAndMul ? L::kTileRows / 2 : L::kTileRows;  // output columns a tile
  int q = 0;  // chunks consumed so far: stage q % kStages, phase (q / kStages) & 1
  for (int unit_index = blockIdx.x; unit_index < sched.num_units; unit_index += gridDim.x) {
    const Unit unit = DecodeUnit(sched, unit_index);
    float acc[L::kRowTiles][L::kNTiles][4];
#pragma unroll
    for (int rt = 0; rt < L::kRowTiles; ++rt) {
#pragma unroll
      for (int nt = 0; nt < L::kNTiles; ++nt) {
        acc[rt][nt][0] = acc[rt][nt][1] = acc[rt][nt][2] = acc[rt][nt][3] = 0.0f;
      }
    }
    for (int chunk = unit.chunk_begin; chunk < unit.chunk_end; ++chunk, ++q) {
      const int s = q % L::kStages;
      const uint32_t phase = (q / L::kStages) & 1;
      BarrierWait(&full[s], phase);
      const unsigned char* w_tile = ring + s * L::kStageBytes;
      const unsigned char* x_tile = w_tile + L::kWBytes;
#pragma unroll
      for (int kk = 0; kk < kChunkK / 16; ++kk) {
        uint32_t a_frag[L::kRowTiles][4];
#pragma unroll
        for (int rt = 0; rt < L::kRowTiles; ++rt) {
          // Rows of this m16 tile: lanes 0-15 the first 8 k, lanes 16-31 the next 8.
          const int row = warp * L::kWarpRows + rt * 16 + (lane % 16);
          const int box = row / kBoxRows, box_row = row % kBoxRows;
          LdMatrixX4(a_frag[rt], w_tile + box * kBoxRows * 128 +
                                     Swizzle128(box_row, kk * 2 + lane / 16));
        }
        uint32_t b_frag[L::kNTiles][2];
        if constexpr (L::kNTiles == 1) {
          // Matrices 0, 1: tokens 0-7 at k 0-7, 8-15 (lanes 16-31 repeat 0-15's addresses).
          const int token = lane % 8;
          uint32_t r[4];
          LdMatrixX4(r, x_tile + Swizzle128(token, kk * 2 + (lane / 8) % 2));
          b_frag[0][0] = r[0];
          b_frag[0][1] = r[1];
        } else {
#pragma unroll
          for (int np = 0; np < L::kNTiles / 2; ++np) {
            // Matrices: tokens 16np + 0-7 at k 0-7, at k 8-15, then tokens 16np + 8-15 likewise.
            const int token = np * 16 + (lane % 8) + 8 * (lane / 16);
            uint32_t r[4];
            LdMatrixX4(r, x_tile + Swizzle128(token, kk * 2 + (lane / 8) % 2));
            b_frag[2 * np][0] = r[0];
            b_frag[2 * np][1] = r[1];
            b_frag[2 * np + 1][0] = r[2];
            b_frag[2 * np + 1][1] = r[3];
          }
        }
#pragma unroll
        for (int rt = 0; rt < L::kRowTiles; ++rt) {
#pragma unroll
          for (int nt = 0; nt < L::kNTiles; ++nt) {
            Mma16816<T>(acc[rt][nt], a_frag[rt], b_frag[nt][0], b_frag[nt][1]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) BarrierArrive(&empty[s]);  // this warp is done with the stage
    }

    // The unit's sums: to the staging rows directly, or through the split partials.
    const int g = lane / 4, t2 = 2 * (lane % 4);
    bool write = true;
    if (unit.split < 0) {
#pragma unroll
      for (int rt = 0; rt < L::kRowTiles; ++rt) {
#pragma unroll
        for (int nt = 0; nt < L::kNTiles; ++nt) {
          const int row = warp * L::kWarpRows + rt * 16 + g, token = nt * 8 + t2;
          s_out[row * L::kOutStride + token] = acc[rt][nt][0];
          s_out[row * L::kOutStride + token + 1] = acc[rt][nt][1];
          s_out[(row + 8) * L::kOutStride + token] = acc[rt][nt][2];
          s_out[(row + 8) * L::kOutStride + token + 1] = acc[rt][nt][3];
        }
      }
      ConsumerBarrier();
    } else {
      const int tail_tile = unit.tile - sched.full_tiles;
      constexpr int kPartial = L::kTileRows * kTokens;  // floats per unit
      float* mine = a.partials + (int64_t{tail_tile} * sched.splits + unit.split) * kPartial;
#pragma unroll
      for (int rt = 0; rt < L::kRowTiles; ++rt) {
#pragma unroll
        for (int nt = 0; nt < L::kNTiles; ++nt) {
          const int row = warp * L::kWarpRows + rt * 16 + g, token = nt * 8 + t2;
          *reinterpret_cast<float2*>(mine + row * kTokens + token) =
              make_float2(acc[rt][nt][0], acc[rt][nt][1]);
          *reinterpret_cast<float2*>(mine + (row + 8) * kTokens + token) =
              make_float2(acc[rt][nt][2], acc[rt][nt][3]);
        }
      }
      __threadfence();  // the partial is visible before this unit counts as arrived
      ConsumerBarrier();
      if (tid == 0) {
        const int arrived = atomicAdd(&a.counters[tail_tile], 1) + 1;
        const int last = arrived == sched.splits;
        if (last) a.counters[tail_tile] = 0;  // ready for the next launch
        *s_last = last;
      }
      ConsumerBarrier();
      write = *s_last != 0;
      if (write) {
        __threadfence();
        // The last block sums every split's partial in split order: the same sum whichever
        // block finishes last.
        const float* first = a.partials + int64_t{tail_tile} * sched.splits * kPartial;
        for (int i = tid; i < kPartial; i += kConsumerThreads) {
          float sum = 0.0f;
          for (int s = 0; s < sched.splits; ++s) sum += __ldcg(first + s * kPartial + i);
          s_out[(i / kTokens) * L::kOutStride + i % kTokens] = sum;
        }
      }
      ConsumerBarrier();
    }
    if (write) {
      OutT* y = static_cast<OutT*>(a.y);
      const int col0 = unit.tile * kCols;
      for (int i = tid; i < a.m * kCols; i += kConsumerThreads) {
        const int token = i / kCols, j = i - token * kCols;
        const int col = col0 + j;
        if (col >= a.n_out) continue;
        float v;
        if constexpr (kSiluAndMul) {
          const float gate = ToFloat(FromFloat<T>(s_out[j * L::kOutStride + token]));
          const float up = ToFloat(FromFloat<T>(s_out[(kCols + j) * L::kOutStride + token]));
          v = gate / (1.0f + __expf(-gate)) * up;
        } else {
          v = s_out[j * L::kOutStride + token];
        }
        StoreOut(y + token * a.y_stride + col, v);
      }
    }
    ConsumerBarrier();  // s_out is free for the next unit
  }
}

template <typename T, typename OutT, int kTokens, bool kSiluAndMul>
cudaError_t LaunchTyped(const StreamGemmParams& p, const KernelArgs& args, int grid,
                        cudaStream_t stream) {
  using L = Layout<kTokens>;
  auto kernel = StreamGemmKernel<T, OutT, kTokens, kSiluAndMul>;
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSmemBytes);
  LMSERVE_CUDA_RETURN_IF_ERROR(attribute_status);
  return LaunchKernel(kernel, dim3(grid), dim3(kThreads), L::kSmemBytes, stream, p.w->map,
                      p.x->map, args);
}

template <typename T, typename OutT, bool kSiluAndMul>
cudaError_t LaunchTokens(const StreamGemmParams& p, const KernelArgs& args, int grid,
                         cudaStream_t stream) {
  switch (StreamGemmTokens(p.x->rows)) {
    case 8:
      return LaunchTyped<T, OutT, 8, kSiluAndMul>(p, args, grid, stream);
    case 16:
      return LaunchTyped<T, OutT, 16, kSiluAndMul>(p, args, grid, stream);
    case 32:
      return LaunchTyped<T, OutT, 32, kSiluAndMul>(p, args, grid, stream);
    default:
      return LaunchTyped<T, OutT, 64, kSiluAndMul>(p, args, grid, stream);
  }
}

}  // namespace

cudaError_t Launch(const StreamGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  const int tokens = StreamGemmTokens(p.x->rows);
  const int64_t n = p.w->rows;
  KernelArgs args{};
  args.y = p.y;
  args.m = static_cast<int>(p.x->rows);
  args.n_out = static_cast<int>(p.silu_and_mul ? n / 2 : n);
  args.y_stride = p.y_stride != 0 ? p.y_stride : args.n_out;
  args.up_offset = static_cast<int>(n / 2);
  const int64_t tile_cols =
      p.silu_and_mul ? StreamGemmTileRows(tokens) / 2 : StreamGemmTileRows(tokens);
  args.schedule = MakeStreamGemmSchedule(CeilDiv(args.n_out, tile_cols),
                                         CeilDiv(p.w->cols, kChunkK), StreamGemmGridLimit());
  args.counters = static_cast<int*>(p.workspace);
  args.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) +
                                           kStreamGemmCounterBytes);
  const int grid = std::min(args.schedule.num_units, StreamGemmGridLimit());
  return DispatchActivationDType(p.x->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.output_dtype == DType::kF32) return LaunchTokens<T, float, false>(p, args, grid, stream);
    if (p.silu_and_mul) return LaunchTokens<T, T, true>(p, args, grid, stream);
    return LaunchTokens<T, T, false>(p, args, grid, stream);
  });
}

}  // namespace lmserve::kernels::cuda
