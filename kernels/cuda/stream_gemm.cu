#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/stream_gemm.h"
#include "kernels/cuda/stream_gemm_schedule.h"
#include "kernels/cuda/tma.cuh"

namespace lmserve::kernels::cuda {
namespace {

using T = __nv_bfloat16;
constexpr int kPieceK = kStreamGemmPieceK;
constexpr int kPieceBytes = kPieceK * 2;  // a 128-byte swizzled row
constexpr int kMTileBytes = 16 * kPieceBytes;  // 16 rows of one piece

// A configuration's shared-memory layout and warp roles. A stage holds, for each piece of 64 k,
// the tile's m16 tiles (16 rows x 128 bytes each; with the SiLU epilogue 8 gate rows then their
// 8 up rows), then each piece's x rows. Consumer warp w takes the m16 tiles {w % kWarpsM + j *
// kWarpsM} and the pieces {w / kWarpsM + j * kWarpsK}; warps that share m16 tiles (kWarpsK > 1)
// sum their accumulators through shared memory at the end of a unit.
template <int kTokens_, int kTileRows_, int kStageK_, int kWarps_, int kStages_, bool kWgmma_>
struct Shape {
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kTokens = kTokens_;
  static constexpr int kTileRows = kTileRows_;
  static constexpr int kStageK = kStageK_;
  static constexpr int kConsumerWarps = kWarps_;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumerThreads = kConsumerWarps * 32;
  static constexpr int kThreads = kConsumerThreads + 32;  // and one producer warp
  static constexpr int kPieces = kStageK / kPieceK;
  static constexpr int kMTiles = kTileRows / 16;
  static constexpr int kNTiles = kTokens / 8;
  static constexpr int kWarpsM = kConsumerWarps < kMTiles ? kConsumerWarps : kMTiles;
  static constexpr int kWarpsK = kConsumerWarps / kWarpsM;
  static constexpr int kWarpMTiles = kMTiles / kWarpsM;  // m16 tiles per warp
  static constexpr int kWarpPieces = kPieces / kWarpsK;  // pieces per warp per stage
  static constexpr int kWBytes = kPieces * kMTiles * kMTileBytes;
  static constexpr int kXSlotBytes = kTokens * kPieceBytes;  // one piece's x rows
  static constexpr int kStageBytes = kWBytes + kPieces * kXSlotBytes;
  static constexpr int kOutStride = kTokens + 1;  // fp32 words per row of the reduction rows
  static constexpr int kRedBytes = kWarpsK * kTileRows * kOutStride * 4;
  static constexpr int kBarrierBytes = 2 * kStages * 8 + 16;
  // 1024 of slack: the ring must start on a 1024-byte boundary (the swizzle's period).
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kRedBytes + kBarrierBytes;
  static_assert(kConsumerWarps % kWarpsM == 0 && kMTiles % kWarpsM == 0, "warps along M");
  static_assert(kPieces % kWarpsK == 0, "warps along K");
  static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte alignment");
  static_assert(kSmemBytes <= 232448, "more shared memory than a block may have");
  static_assert(!kWgmma || (kTileRows == 128 && kConsumerWarps == 8 && kPieces == 1),
                "wgmma: two warpgroups of 64 rows, one piece a stage");
};

template <int kTokens, int kVariant>
using ShapeFor = Shape<StreamGemmConfigFor(kTokens, kVariant).tokens,
                       StreamGemmConfigFor(kTokens, kVariant).tile_rows,
                       StreamGemmConfigFor(kTokens, kVariant).stage_k,
                       StreamGemmConfigFor(kTokens, kVariant).warps,
                       StreamGemmConfigFor(kTokens, kVariant).stages,
                       StreamGemmConfigFor(kTokens, kVariant).wgmma>;

struct KernelArgs {
  void* y;
  int64_t y_stride;
  int m;          // tokens computed and written (x rows)
  int k;
  int n_out;      // output columns: n, or n / 2 with silu_and_mul
  int up_offset;  // silu_and_mul: W's first up row (n / 2)
  StreamGemmSchedule schedule;
  int* counters;    // [tail tiles]: arrivals of each split tile's units
  float* partials;  // [tail tiles * splits][tile rows][tokens]
};

// Which tile and which stages of k a work unit covers (see StreamGemmSchedule).
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

// Walks a block's stages in order: its units blockIdx.x, + gridDim.x, ..., each unit's chunks.
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
  // Returns false past the block's last stage.
  __device__ __forceinline__ bool Next(const StreamGemmSchedule& s) {
    if (++chunk < u.chunk_end) return true;
    unit += gridDim.x;
    if (unit >= s.num_units) return false;
    u = DecodeUnit(s, unit);
    chunk = u.chunk_begin;
    return true;
  }
};

template <int kThreadsBarrier>
__device__ __forceinline__ void ConsumerBarrier() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreadsBarrier) : "memory");
}

// Warpgroup MMAs (sm_90a): D[64 x N] (+)= A[64 x 16] B[16 x N], A and B K-major bf16 tiles in
// shared memory, each row 128 bytes with the 128-byte swizzle, described by a matrix descriptor.
// The accumulators of warp w of the warpgroup are rows 16w + lane / 4 (+ 8), columns as mma.sync
// m16n8's for each n8 tile: d[4j + e].
__device__ __forceinline__ uint64_t MatrixDescriptor(const void* tile) {
  const uint32_t address = SmemAddress(tile);
  return uint64_t{(address & 0x3FFFF) >> 4}  // start address
         | uint64_t{1} << 16                 // leading byte offset (unused: swizzled K-major)
         | uint64_t{1024 >> 4} << 32         // stride byte offset: 8 rows of 128 bytes
         | uint64_t{1} << 62;                // 128-byte swizzle
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
template <int kN>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kN / 2]) {
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <int kN>
__device__ __forceinline__ void Wgmma(float (&d)[kN / 2], uint64_t a, uint64_t b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <>
__device__ __forceinline__ void Wgmma<64>(float (&d)[32], uint64_t a, uint64_t b,
                                          int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void Wgmma<32>(float (&d)[16], uint64_t a, uint64_t b,
                                          int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}
#else
// Compiled for sm_90a only (the build's stream GEMM target); never reached elsewhere.
template <>
__device__ __forceinline__ void Wgmma<64>(float (&)[32], uint64_t, uint64_t, int) { __trap(); }
template <>
__device__ __forceinline__ void Wgmma<32>(float (&)[16], uint64_t, uint64_t, int) { __trap(); }
#endif

template <typename OutT>
__device__ __forceinline__ void StoreOut(OutT* p, float v) {
  if constexpr (std::is_same_v<OutT, float>) {
    *p = v;
  } else {
    *p = FromFloat<OutT>(v);
  }
}

// grid: min(units, multiprocessors) blocks of S::kThreads; S::kSmemBytes of dynamic shared
// memory. Warps [0, S::kConsumerWarps) consume, the last warp produces.
template <typename OutT, typename S, bool kSiluAndMul>
__global__ void __launch_bounds__(S::kThreads, 1)
    StreamGemmKernel(const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap x_map, KernelArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  float* s_red = reinterpret_cast<float*>(ring + S::kStages * S::kStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + S::kStages * S::kStageBytes + S::kRedBytes);
  uint64_t* empty = full + S::kStages;
  int* s_last = reinterpret_cast<int*>(empty + S::kStages);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const StreamGemmSchedule& sched = a.schedule;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      BarrierInit(&full[s], 1);                   // the producer's arrival (and the copies' bytes)
      BarrierInit(&empty[s], S::kConsumerWarps);  // one arrival per consumer warp
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warp == S::kConsumerWarps) {
    // The producer. Its first kStages stages' weights are requested before waiting for the
    // previous kernel (they do not depend on it); x, which does, only after.
    if (lane == 0) {
      TmaPrefetchDescriptor(&w_map);
      TmaPrefetchDescriptor(&x_map);
      const uint32_t stage_tx = S::kWBytes + S::kPieces * a.m * kPieceBytes;
      // Stage s gets the W rows of the cursor's tile at its stage of k: per m16 tile, its
      // pieces in k order (a row's consecutive bytes are asked for together).
      auto load_w = [&](const Cursor& c, int s) {
        unsigned char* stage = ring + s * S::kStageBytes;
        const int k0 = c.chunk * S::kStageK;
        if constexpr (S::kWgmma) {
          // Two boxes of 64 rows (w_map is the wide descriptor): the warpgroups' A tiles; with
          // the SiLU epilogue the 64 gate rows, then their 64 up rows.
          const int first = kSiluAndMul ? c.u.tile * 64 : c.u.tile * S::kTileRows;
          const int second = kSiluAndMul ? a.up_offset + first : first + 64;
          TmaLoad2d(stage, &w_map, k0, first, &full[s]);
          TmaLoad2d(stage + 64 * kPieceBytes, &w_map, k0, second, &full[s]);
        } else {
#pragma unroll
          for (int i = 0; i < S::kMTiles; ++i) {
#pragma unroll
            for (int p = 0; p < S::kPieces; ++p) {
              unsigned char* dst = stage + (p * S::kMTiles + i) * kMTileBytes;
              if constexpr (kSiluAndMul) {
                const int j0 = c.u.tile * (S::kTileRows / 2) + i * 8;  // output columns
                TmaLoad2d(dst, &w_map, k0 + p * kPieceK, j0, &full[s]);
                TmaLoad2d(dst + 8 * kPieceBytes, &w_map, k0 + p * kPieceK, a.up_offset + j0,
                          &full[s]);
              } else {
                TmaLoad2d(dst, &w_map, k0 + p * kPieceK, c.u.tile * S::kTileRows + i * 16,
                          &full[s]);
              }
            }
          }
        }
      };
      auto load_x = [&](const Cursor& c, int s) {
        unsigned char* slots = ring + s * S::kStageBytes + S::kWBytes;
#pragma unroll
        for (int p = 0; p < S::kPieces; ++p) {
          TmaLoad2d(slots + p * S::kXSlotBytes, &x_map, c.chunk * S::kStageK + p * kPieceK, 0,
                    &full[s]);
        }
      };
      Cursor cursor;
      int issued = 0;
      bool more = cursor.Start(sched);
      for (; more && issued < S::kStages; ++issued) {
        BarrierArriveExpectTx(&full[issued], stage_tx);
        load_w(cursor, issued);
        more = cursor.Next(sched);
      }
      WaitForPriorKernels();
      AllowDependentLaunch();
      {
        Cursor again;
        again.Start(sched);
        for (int q = 0; q < issued; ++q) {
          load_x(again, q);
          again.Next(sched);
        }
      }
      for (int q = issued; more; ++q) {
        const int s = q % S::kStages;
        const uint32_t phase = (q / S::kStages) & 1;
        BarrierWait(&empty[s], phase ^ 1);
        BarrierArriveExpectTx(&full[s], stage_tx);
        load_w(cursor, s);
        load_x(cursor, s);
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
  constexpr int kConsumerThreads = S::kConsumerThreads;
  const int tid = threadIdx.x;
  const int warp_m = warp % S::kWarpsM, warp_k = warp / S::kWarpsM;
  constexpr int kCols = kSiluAndMul ? S::kTileRows / 2 : S::kTileRows;  // output columns a tile
  int q = 0;  // stages consumed so far: stage q % kStages, phase (q / kStages) & 1
  for (int unit_index = blockIdx.x; unit_index < sched.num_units; unit_index += gridDim.x) {
    const Unit unit = DecodeUnit(sched, unit_index);
    float acc[S::kWarpMTiles][S::kNTiles][4];
#pragma unroll
    for (int i = 0; i < S::kWarpMTiles; ++i) {
#pragma unroll
      for (int nt = 0; nt < S::kNTiles; ++nt) {
        acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.0f;
      }
    }
    if constexpr (S::kWgmma) {
      // Warpgroup g multiplies the stage's W rows [64 g, 64 g + 64) with all the tokens.
      float d[S::kTokens / 2];
      const int warpgroup = warp / 4;
      for (int chunk = unit.chunk_begin; chunk < unit.chunk_end; ++chunk, ++q) {
        const int s = q % S::kStages;
        const uint32_t phase = (q / S::kStages) & 1;
        BarrierWait(&full[s], phase);
        const unsigned char* stage = ring + s * S::kStageBytes;
        const uint64_t a_desc = MatrixDescriptor(stage + warpgroup * 64 * kPieceBytes);
        const uint64_t b_desc = MatrixDescriptor(stage + S::kWBytes);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kPieceK / 16; ++kk) {
          // 16 k further: 32 bytes into each swizzled row (2 in the descriptor's units).
          Wgmma<S::kTokens>(d, a_desc + 2 * kk, b_desc + 2 * kk,
                            chunk != unit.chunk_begin || kk > 0);
        }
        WgmmaCommit();
        WgmmaWaitAll();
        FenceAccumulators<S::kTokens>(d);
        __syncwarp();
        if (lane == 0) BarrierArrive(&empty[s]);  // this warp's MMAs are done with the stage
      }
#pragma unroll
      for (int nt = 0; nt < S::kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][nt][e] = d[4 * nt + e];
      }
    }
    for (int chunk = unit.chunk_begin; !S::kWgmma && chunk < unit.chunk_end; ++chunk, ++q) {
      const int s = q % S::kStages;
      const uint32_t phase = (q / S::kStages) & 1;
      BarrierWait(&full[s], phase);
      const unsigned char* stage = ring + s * S::kStageBytes;
#pragma unroll
      for (int pp = 0; pp < S::kWarpPieces; ++pp) {
        const int p = warp_k + pp * S::kWarpsK;
        const unsigned char* x_slot = stage + S::kWBytes + p * S::kXSlotBytes;
#pragma unroll
        for (int kk = 0; kk < kPieceK / 16; ++kk) {
          // B: x rows are the n8 tiles; each ldmatrix.x4 gives two n-tiles' fragments (or one,
          // with lanes 16-31 repeating lanes 0-15's addresses).
          uint32_t b_frag[S::kNTiles][2];
          if constexpr (S::kNTiles == 1) {
            uint32_t r[4];
            LdMatrixX4(r, x_slot + Swizzle128(lane % 8, kk * 2 + (lane / 8) % 2));
            b_frag[0][0] = r[0];
            b_frag[0][1] = r[1];
          } else {
#pragma unroll
            for (int np = 0; np < S::kNTiles / 2; ++np) {
              const int token = np * 16 + (lane % 8) + 8 * (lane / 16);
              uint32_t r[4];
              LdMatrixX4(r, x_slot + Swizzle128(token, kk * 2 + (lane / 8) % 2));
              b_frag[2 * np][0] = r[0];
              b_frag[2 * np][1] = r[1];
              b_frag[2 * np + 1][0] = r[2];
              b_frag[2 * np + 1][1] = r[3];
            }
          }
#pragma unroll
          for (int i = 0; i < S::kWarpMTiles; ++i) {
            const int mtile = warp_m + i * S::kWarpsM;
            // A: lanes 0-15 the 16 rows at k 0-7, lanes 16-31 at k 8-15.
            uint32_t a_frag[4];
            LdMatrixX4(a_frag, stage + (p * S::kMTiles + mtile) * kMTileBytes +
                                   Swizzle128(lane % 16, kk * 2 + lane / 16));
#pragma unroll
            for (int nt = 0; nt < S::kNTiles; ++nt) {
              Mma16816<T>(acc[i][nt], a_frag, b_frag[nt][0], b_frag[nt][1]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) BarrierArrive(&empty[s]);  // this warp is done with the stage
    }

    // The unit's sums: each warp's to its k-group's reduction rows, then summed over the groups
    // into group 0's rows (in group order).
    {
      const int g = lane / 4, t2 = 2 * (lane % 4);
      float* red = s_red + warp_k * S::kTileRows * S::kOutStride;
#pragma unroll
      for (int i = 0; i < S::kWarpMTiles; ++i) {
        const int row = (warp_m + i * S::kWarpsM) * 16 + g;
#pragma unroll
        for (int nt = 0; nt < S::kNTiles; ++nt) {
          const int token = nt * 8 + t2;
          red[row * S::kOutStride + token] = acc[i][nt][0];
          red[row * S::kOutStride + token + 1] = acc[i][nt][1];
          red[(row + 8) * S::kOutStride + token] = acc[i][nt][2];
          red[(row + 8) * S::kOutStride + token + 1] = acc[i][nt][3];
        }
      }
    }
    ConsumerBarrier<kConsumerThreads>();
    if constexpr (S::kWarpsK > 1) {
      for (int i = tid; i < S::kTileRows * S::kTokens; i += kConsumerThreads) {
        const int at = (i / S::kTokens) * S::kOutStride + i % S::kTokens;
        float sum = s_red[at];
#pragma unroll
        for (int kg = 1; kg < S::kWarpsK; ++kg) sum += s_red[kg * S::kTileRows * S::kOutStride + at];
        s_red[at] = sum;
      }
      ConsumerBarrier<kConsumerThreads>();
    }
    bool write = true;
    if (unit.split >= 0) {
      // A split unit: its sums to memory; the last of the tile's units to arrive sums them all,
      // in split order (the same sum whichever block is last).
      const int tail_tile = unit.tile - sched.full_tiles;
      constexpr int kPartial = S::kTileRows * S::kTokens;
      float* tile_partials = a.partials + int64_t{tail_tile} * sched.splits * kPartial;
      for (int i = tid; i < kPartial; i += kConsumerThreads) {
        tile_partials[unit.split * kPartial + i] =
            s_red[(i / S::kTokens) * S::kOutStride + i % S::kTokens];
      }
      __threadfence();  // the partial is visible before this unit counts as arrived
      ConsumerBarrier<kConsumerThreads>();
      if (tid == 0) {
        const int arrived = atomicAdd(&a.counters[tail_tile], 1) + 1;
        const int last = arrived == sched.splits;
        if (last) a.counters[tail_tile] = 0;  // ready for the next launch
        *s_last = last;
      }
      ConsumerBarrier<kConsumerThreads>();
      write = *s_last != 0;
      if (write) {
        __threadfence();
        for (int i = tid; i < kPartial; i += kConsumerThreads) {
          float v[kStreamGemmMaxSplits];
#pragma unroll
          for (int s = 0; s < kStreamGemmMaxSplits; ++s) {
            v[s] = s < sched.splits ? __ldcg(tile_partials + s * kPartial + i) : 0.0f;
          }
          float sum = 0.0f;
#pragma unroll
          for (int s = 0; s < kStreamGemmMaxSplits; ++s) sum += v[s];
          s_red[(i / S::kTokens) * S::kOutStride + i % S::kTokens] = sum;
        }
      }
      ConsumerBarrier<kConsumerThreads>();
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
          // Column j: with wgmma, gate row j and up row 64 + j; else m16 tile j / 8, its gate
          // row j % 8 and up row 8 + j % 8.
          const int gate_row = S::kWgmma ? j : (j / 8) * 16 + j % 8;
          const int up_row = S::kWgmma ? 64 + j : gate_row + 8;
          const float gate = ToFloat(FromFloat<T>(s_red[gate_row * S::kOutStride + token]));
          const float up = ToFloat(FromFloat<T>(s_red[up_row * S::kOutStride + token]));
          v = gate / (1.0f + __expf(-gate)) * up;
        } else {
          v = s_red[j * S::kOutStride + token];
        }
        StoreOut(y + token * a.y_stride + col, v);
      }
    }
    ConsumerBarrier<kConsumerThreads>();  // the reduction rows are free for the next unit
  }
}

template <typename OutT, typename S, bool kSiluAndMul>
cudaError_t LaunchShape(const StreamGemmParams& p, KernelArgs args, cudaStream_t stream) {
  auto kernel = StreamGemmKernel<OutT, S, kSiluAndMul>;
  static const cudaError_t attribute_status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  LMSERVE_CUDA_RETURN_IF_ERROR(attribute_status);
  constexpr int kCols = kSiluAndMul ? S::kTileRows / 2 : S::kTileRows;
  args.schedule = MakeStreamGemmSchedule(CeilDiv(args.n_out, kCols), CeilDiv(args.k, S::kStageK),
                                         StreamGemmGridLimit());
  const int grid = std::min(args.schedule.num_units, StreamGemmGridLimit());
  return LaunchKernel(kernel, dim3(grid), dim3(S::kThreads), S::kSmemBytes, stream,
                      S::kWgmma ? p.w->map_wide : p.w->map, p.x->map, args);
}

template <typename OutT, bool kSiluAndMul, int kVariant>
cudaError_t LaunchBucket(const StreamGemmParams& p, const KernelArgs& args, cudaStream_t stream) {
  switch (StreamGemmBucket(p.x->rows)) {
    case 8:
      return LaunchShape<OutT, ShapeFor<8, kVariant>, kSiluAndMul>(p, args, stream);
    case 16:
      return LaunchShape<OutT, ShapeFor<16, kVariant>, kSiluAndMul>(p, args, stream);
    case 32:
      return LaunchShape<OutT, ShapeFor<32, kVariant>, kSiluAndMul>(p, args, stream);
    default:
      return LaunchShape<OutT, ShapeFor<64, kVariant>, kSiluAndMul>(p, args, stream);
  }
}

template <typename OutT, bool kSiluAndMul>
cudaError_t LaunchVariant(const StreamGemmParams& p, const KernelArgs& args, cudaStream_t stream) {
  if (StreamGemmVariant() == 1) return LaunchBucket<OutT, kSiluAndMul, 1>(p, args, stream);
  return LaunchBucket<OutT, kSiluAndMul, 0>(p, args, stream);
}

}  // namespace

cudaError_t Launch(const StreamGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  const int64_t n = p.w->rows;
  KernelArgs args{};
  args.y = p.y;
  args.m = static_cast<int>(p.x->rows);
  args.k = static_cast<int>(p.w->cols);
  args.n_out = static_cast<int>(p.silu_and_mul ? n / 2 : n);
  args.y_stride = p.y_stride != 0 ? p.y_stride : args.n_out;
  args.up_offset = static_cast<int>(n / 2);
  args.counters = static_cast<int*>(p.workspace);
  args.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) +
                                           kStreamGemmCounterBytes);
  if (p.output_dtype == DType::kF32) return LaunchVariant<float, false>(p, args, stream);
  if (p.silu_and_mul) return LaunchVariant<T, true>(p, args, stream);
  return LaunchVariant<T, false>(p, args, stream);
}

}  // namespace lmserve::kernels::cuda
