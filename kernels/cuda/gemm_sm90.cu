// The Hopper GEMM (gemm_sm90.h). A block of three warp groups, one a multiprocessor, takes output
// tiles of 128 x 256 in turn (unit b, b + gridDim.x, ...; clusters of two take pairs of row tiles):
//   warp group 0, the producer: one thread brings each 64-wide step of K, x's 128 rows (16 KB)
//     and W's 256 rows (two boxes of 128: with a gated epilogue the gate rows and their up rows),
//     by TMA into the next of 3 or 4 stages (128-byte swizzle), counted off the stage's `full`
//     barrier once every consumer warp has freed it (`empty`);
//   warp groups 1 and 2, the consumers: rows 0-63 and 64-127 of the tile, four m64n256k16 wgmmas
//     a stage into 128 fp32 accumulators a thread; a stage is freed once the wgmmas of the next
//     one are issued and its own have completed (one group in flight). The epilogue writes the
//     group's 64 output rows into shared memory (boxes of 64 columns, 128-byte swizzle) and one
//     thread stores them by TMA, which drains while the group multiplies its next tile.
// Tiles are taken in groups of group_m row tiles, rows fastest within a group, so that the
// blocks running at once share x's and W's tiles in L2. With clusters of two, the blocks of a
// cluster take row tiles 2i and 2i + 1 of one column tile, and each loads one of W's two boxes
// into both (TMA multicast), which halves W's reads from L2; a stage is then freed once the
// consumer warps of both blocks are done with it.
//
// (Measured on an H100 at the 8B model's prefill shapes: the epilogue storing from registers,
// with 4 stages, ran at 85-88% of the TMA epilogue's rate, since every block's epilogue idled the
// tensor cores at once; a cluster launch attribute of 1 x 1 x 1 cost 8-12%, so blocks without
// clusters are launched without it; remote arrivals with .release.cluster semantics cut the
// clustered kernel to 40% of its rate; clusters of 2 x 2, sharing x's tiles too, were slower than
// clusters of two: bench/results section 30.)

#include <cuda.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_sm90.h"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kBlockM = 128, kBlockN = 256, kBlockK = 64;
constexpr int kThreads = 384;
// setmaxnreg's shares of the 168 a thread the launch gives (65536 / 384, rounded down to 8).
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kABytes = kBlockM * kBlockK * 2;
constexpr int kBBytes = kBlockN * kBlockK * 2;
constexpr int kStageBytes = kABytes + kBBytes;

constexpr bool Gated(Sm90GemmEpilogue e) { return e != Sm90GemmEpilogue::kStore; }

// The ring takes what the output rows leave of the 227 KB a block: 3 stages beside a plain
// tile's rows (64 KB), 4 beside a gated tile's (32 KB).
template <Sm90GemmEpilogue kEpilogue>
struct GemmShapeOf {
  static constexpr int kOutCols = Gated(kEpilogue) ? kBlockN / 2 : kBlockN;  // of a tile
  static constexpr int kStagingBytes = 64 * kOutCols * 2;  // a consumer group's output rows
  static constexpr int kStages = Gated(kEpilogue) ? 4 : 3;
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStagingBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "a block's shared memory");
};

struct GemmArgs {
  int num_m;  // row tiles of the clusters' (pairs of row tiles with clusters of two)
  int num_n;  // column tiles
  int k_blocks;
  int group_m;
  int up_row;  // gated: W's first up row (n / 2); else kBlockN / 2, the second box's offset
};

__device__ __forceinline__ void TileOf(int tile, const GemmArgs& a, int* m_blk, int* n_blk) {
  const int per_group = a.group_m * a.num_n;
  const int group = tile / per_group;
  const int first_m = group * a.group_m;
  const int rows = min(a.group_m, a.num_m - first_m);
  const int in_group = tile - group * per_group;
  *m_blk = first_m + in_group % rows;
  *n_blk = in_group / rows;
}

// Writes the 4 bytes `word` at (row, col) of a group's staged output rows: boxes of 64 columns
// [col / 64][row][64], each row's 16-byte chunks swizzled by row % 8 as TMA's 128-byte swizzle.
__device__ __forceinline__ void StageWord(unsigned char* staging, int row, int col, uint32_t word) {
  unsigned char* p = staging + (col / 64) * (64 * 128) + row * 128 +
                     ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2;
  *reinterpret_cast<uint32_t*>(p) = word;
}

__device__ __forceinline__ void GroupBarrier(int group) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
}

// kCluster 2: blocks in clusters of two take row tiles 2i and 2i + 1 of the same column tile, and
// each loads half of W's tile into both (TMA multicast): W's reads from L2 halve. A stage is then
// freed once the consumer warps of both blocks are done with it.
template <typename T, Sm90GemmEpilogue kEpilogue, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    GemmSm90Kernel(const __grid_constant__ CUtensorMap a_map,
                   const __grid_constant__ CUtensorMap b_map,
                   const __grid_constant__ CUtensorMap y_map, const GemmArgs a) {
  constexpr bool kF16 = std::is_same_v<T, __half>;
  using Shape = GemmShapeOf<kEpilogue>;
  constexpr int kStages = Shape::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddress(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t full[kStages], empty[kStages];
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(&full[s], 1);
      MbarrierInit(&empty[s], 8 * kCluster);  // every consumer warp of the cluster
    }
  }
  if constexpr (kCluster > 1) {
    sm90::ClusterSync();
  } else {
    __syncthreads();
  }
  BeginDependentKernel();
  const uint32_t rank = kCluster > 1 ? sm90::ClusterRank() : 0;
  // The cluster's units: (row tile pair, column tile), unit u, u + clusters, ...
  const int first_unit = blockIdx.x / kCluster, unit_step = gridDim.x / kCluster;
  const int num_units = a.num_m * a.num_n;  // a.num_m counts row tiles of the cluster's
  auto locate = [&](int unit, int* m_blk, int* n_blk) {
    TileOf(unit, a, m_blk, n_blk);
    *m_blk = *m_blk * kCluster + rank;
  };

  if (tid < 128) {  // the producer
    sm90::SetMaxRegistersDec<kProducerRegisters>();
    if (tid == 0) {
      int step = 0;  // stages filled, over the block's tiles
      for (int unit = first_unit; unit < num_units; unit += unit_step) {
        int m_blk, n_blk;
        locate(unit, &m_blk, &n_blk);
        for (int kb = 0; kb < a.k_blocks; ++kb, ++step) {
          const int s = step % kStages;
          sm90::MbarrierWaitNoBranch(&empty[s], ((step / kStages) & 1) ^ 1);
          MbarrierArriveExpectTx(&full[s], kStageBytes);
          unsigned char* stage = smem + s * kStageBytes;
          sm90::TmaLoad2d(stage, &a_map, kb * kBlockK, m_blk * kBlockM, &full[s]);
          // W's two boxes of 128 rows: rows n_blk 128 (gated: of the gate) and their partners
          // a.up_row further; with a cluster, block r loads box r into both blocks.
          const int w_row = n_blk * (Gated(kEpilogue) ? kBlockN / 2 : kBlockN);
#pragma unroll
          for (int box = 0; box < 2; ++box) {
            unsigned char* dst = stage + kABytes + box * (kBBytes / 2);
            if constexpr (kCluster > 1) {
              if (box == static_cast<int>(rank)) {
                sm90::TmaLoad2dMulticast(dst, &b_map, kb * kBlockK, w_row + box * a.up_row,
                                         &full[s], 0x3);
              }
            } else {
              sm90::TmaLoad2d(dst, &b_map, kb * kBlockK, w_row + box * a.up_row, &full[s]);
            }
          }
        }
      }
    }
    if constexpr (kCluster > 1) sm90::ClusterSync();  // the other block's arrivals are in
    return;
  }

  sm90::SetMaxRegistersInc<kConsumerRegisters>();
  const int group = tid / 128 - 1;  // rows 64 group .. 64 group + 63 of a tile
  const int warp = (tid / 32) % 4, g = lane / 4, t = lane % 4;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  // Frees stage s in every block of the cluster.
  auto release = [&](int s) {
    if constexpr (kCluster > 1) {
      if (lane < kCluster) sm90::MbarrierArriveCluster(&empty[s], lane);  // lane r: block r's
    } else {
      if (lane == 0) sm90::MbarrierArrive(&empty[s]);
    }
  };
  int step = 0;
  for (int unit = first_unit; unit < num_units; unit += unit_step) {
    int m_blk, n_blk;
    locate(unit, &m_blk, &n_blk);
    for (int kb = 0; kb < a.k_blocks; ++kb, ++step) {
      const int s = step % kStages;
      sm90::MbarrierWaitNoBranch(&full[s], (step / kStages) & 1);
      const unsigned char* stage_a = smem + s * kStageBytes + group * (64 * 128);
      const unsigned char* stage_b = smem + s * kStageBytes + kABytes;
      sm90::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        sm90::WgmmaSS_N256<kF16>(acc, sm90::SmemDescriptor(stage_a + kk * 32, 0),
                                 sm90::SmemDescriptor(stage_b + kk * 32, 0), kb > 0 || kk > 0);
      }
      sm90::WgmmaCommit();
      sm90::WgmmaWait<1>();  // the previous stage's wgmmas have completed: free it
      if (kb > 0) release((step + kStages - 1) % kStages);
    }
    sm90::WgmmaWait<0>();
    sm90::FenceRegisters(acc);
    release((step + kStages - 1) % kStages);

    // acc[4 j + e]: row g (e < 2) or g + 8 of this warp's 16, column 8 j + 2 t + (e & 1). The
    // output's 4-byte words: word(j, h) for n8 block j of the output tile, rows g + 8 h.
    auto word = [&](int j, int h) -> uint32_t {
      if constexpr (!Gated(kEpilogue)) {
        return Pack2<T>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      } else {
        // Columns 0-127 are gate, 128-255 their up: act(gate) * up, each rounded to T first
        // (the product SiluAndMul would read). The epilogue idles the tensor cores, so it takes
        // the fast forms: SiLU's division by __fdividef (two instructions; SiluAndMul's IEEE
        // division, a branch and some twenty, made the SiLU epilogue 12% slower than the plain
        // one), GELU's tanh by tanh.approx; both far below the output's rounding.
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = ToFloat(FromFloat<T>(acc[4 * j + 2 * h + e]));
          const float up = ToFloat(FromFloat<T>(acc[4 * (j + kBlockN / 16) + 2 * h + e]));
          if constexpr (kEpilogue == Sm90GemmEpilogue::kSiluAndMul) {
            v[e] = __fdividef(gate, 1.0f + __expf(-gate)) * up;
          } else {  // GELU-tanh, its tanh by tanh.approx (relative error about 2^-11)
            constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
            constexpr float kKappa = 0.044715f;
            const float inner = kBeta * (gate + kKappa * gate * gate * gate);
            v[e] = 0.5f * gate * (1.0f + sm90::TanhApprox(inner)) * up;
          }
        }
        return Pack2<T>(v[0], v[1]);
      }
    };
    constexpr int kOutCols = Shape::kOutCols;
    unsigned char* const staging = smem + kStages * kStageBytes + group * Shape::kStagingBytes;
    if (tid % 128 == 0) sm90::BulkWaitRead<0>();  // the previous tile's stores have read it
    GroupBarrier(group);
    const int local = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < kOutCols / 8; ++j) {
      StageWord(staging, local, 8 * j + 2 * t, word(j, 0));
      StageWord(staging, local + 8, 8 * j + 2 * t, word(j, 1));
    }
    sm90::FenceProxyAsyncShared();
    GroupBarrier(group);
    if (tid % 128 == 0) {  // boxes past y's rows or columns store nothing there
#pragma unroll
      for (int box = 0; box < kOutCols / 64; ++box) {
        sm90::TmaStore2d(&y_map, staging + box * (64 * 128), n_blk * kOutCols + box * 64,
                         m_blk * kBlockM + group * 64);
      }
      sm90::BulkCommit();
    }
  }
  if (tid % 128 == 0) sm90::BulkWaitRead<0>();  // shared memory outlives the stores' reads
  if constexpr (kCluster > 1) sm90::ClusterSync();
}

// A 2-D map over 16-bit rows [rows][cols] (cols contiguous, rows `stride` elements apart), boxes
// of 64 x box_rows, 128-byte swizzle, zeros out of bounds.
bool Encode2d(CUtensorMap* map, DType dtype, const void* base, uint64_t cols, uint64_t rows,
              uint64_t stride, uint32_t box_rows) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {stride * 2};
  const cuuint32_t box[2] = {64, box_rows};
  return EncodeSwizzled16(map, dtype, base, 2, dims, strides, box);
}

// How many clusters of `config` (its grid, block, shared memory and cluster attribute) of
// `kernel` fit on the current device at once; 0 where none does. Asked of the driver once per
// device and kernel: a step launches the same few kernels every layer.
int ClustersThatFit(const void* kernel, const cudaLaunchConfig_t& config) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> fits;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, kernel);
  if (const auto it = fits.find(key); it != fits.end()) return it->second;
  int fit = 0;
  if (cudaOccupancyMaxActiveClusters(&fit, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    fit = 0;
  }
  fits[key] = fit;
  return fit;
}

// Launches the kernel on persistent blocks: one a multiprocessor (or max_blocks), in clusters of
// kCluster, as many as fit at once; `units` counts the (row tile group, column tile) units.
template <typename T, Sm90GemmEpilogue kEpilogue, int kCluster>
cudaError_t LaunchTyped(const CUtensorMap& a_map, const CUtensorMap& b_map,
                        const CUtensorMap& y_map, const GemmArgs& args, int64_t units,
                        int max_blocks, cudaStream_t stream) {
  auto kernel = GemmSm90Kernel<T, kEpilogue, kCluster>;
  constexpr int kSmemBytes = GemmShapeOf<kEpilogue>::kSmemBytes;
  LMSERVE_CUDA_RETURN_IF_ERROR(
      SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), kSmemBytes));
  const int sms = CurrentMultiprocessorCount();
  if (sms < 1) return cudaErrorInvalidDevice;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = kCluster;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  // The first attribute alone without clusters, the second alone without programmatic launch.
  const bool pdl = ProgrammaticLaunchEnabled();
  config.attrs = attributes + (pdl ? 0 : 1);
  config.numAttrs = (pdl ? 1 : 0) + (kCluster > 1 ? 1 : 0);
  int clusters = sms / kCluster;
  if constexpr (kCluster > 1) {  // clusters sit within one GPC: fewer may fit at once
    config.gridDim = dim3(clusters * kCluster);
    const int fit = ClustersThatFit(reinterpret_cast<const void*>(kernel), config);
    if (fit < 1) {  // no cluster of two fits (a partitioned GPU): blocks alone
      GemmArgs single = args;
      single.num_m = args.num_m * 2;  // row tiles, not pairs (a last one past m reads zeros)
      return LaunchTyped<T, kEpilogue, 1>(a_map, b_map, y_map, single, units * 2, max_blocks,
                                          stream);
    }
    clusters = std::min(clusters, fit);
  }
  if (max_blocks > 0) clusters = std::max(1, std::min(clusters, max_blocks / kCluster));
  clusters = static_cast<int>(std::min<int64_t>(clusters, units));
  config.gridDim = dim3(clusters * kCluster);
  return cudaLaunchKernelEx(&config, kernel, a_map, b_map, y_map, args);
}

template <typename T, Sm90GemmEpilogue kEpilogue>
cudaError_t LaunchClustered(const Sm90GemmParams& p, const CUtensorMap& a_map,
                            const CUtensorMap& b_map, const CUtensorMap& y_map,
                            const GemmArgs& args, int64_t units, cudaStream_t stream) {
  return p.cluster == 2
             ? LaunchTyped<T, kEpilogue, 2>(a_map, b_map, y_map, args, units, p.max_blocks, stream)
             : LaunchTyped<T, kEpilogue, 1>(a_map, b_map, y_map, args, units, p.max_blocks, stream);
}

template <typename T>
cudaError_t LaunchFor(const Sm90GemmParams& p, const CUtensorMap& a_map, const CUtensorMap& b_map,
                      const CUtensorMap& y_map, const GemmArgs& args, int64_t units,
                      cudaStream_t stream) {
  switch (p.epilogue) {
    case Sm90GemmEpilogue::kSiluAndMul:
      return LaunchClustered<T, Sm90GemmEpilogue::kSiluAndMul>(p, a_map, b_map, y_map, args, units,
                                                               stream);
    case Sm90GemmEpilogue::kGeluTanhAndMul:
      return LaunchClustered<T, Sm90GemmEpilogue::kGeluTanhAndMul>(p, a_map, b_map, y_map, args,
                                                                   units, stream);
    default:
      return LaunchClustered<T, Sm90GemmEpilogue::kStore>(p, a_map, b_map, y_map, args, units,
                                                          stream);
  }
}

// The strides and output width a launch of `p` uses (its zeros resolved).
struct Layout {
  int64_t x_stride, out_cols, y_stride;
};
Layout LayoutOf(const Sm90GemmParams& p) {
  const int64_t out_cols = Gated(p.epilogue) ? p.n / 2 : p.n;
  return {p.x_stride != 0 ? p.x_stride : p.k, out_cols, p.y_stride != 0 ? p.y_stride : out_cols};
}

}  // namespace

bool Sm90GemmAvailable() {
  return Sm90KernelRuns(
      reinterpret_cast<const void*>(GemmSm90Kernel<__nv_bfloat16, Sm90GemmEpilogue::kStore, 1>));
}

bool Sm90GemmSupports(const Sm90GemmParams& p) {
  const auto [x_stride, out_cols, y_stride] = LayoutOf(p);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return (p.dtype == DType::kBF16 || p.dtype == DType::kF16) && p.m > 0 && p.n > 0 && p.k > 0 &&
         p.m < (int64_t{1} << 31) && p.n < (int64_t{1} << 31) && p.k % 8 == 0 && p.n % 8 == 0 &&
         x_stride % 8 == 0 && x_stride >= p.k && y_stride % 8 == 0 && y_stride >= out_cols &&
         aligned(p.x) && aligned(p.w) && aligned(p.y) && p.group_m > 0 &&
         (p.cluster == 1 || p.cluster == 2) && (!Gated(p.epilogue) || p.n % kBlockN == 0);
}

cudaError_t LaunchSm90Gemm(const Sm90GemmParams& p, cudaStream_t stream) {
  if (!Sm90GemmSupports(p)) return cudaErrorInvalidValue;
  const auto [x_stride, out_cols, y_stride] = LayoutOf(p);
  CUtensorMap a_map, b_map, y_map;
  if (!Encode2d(&a_map, p.dtype, p.x, p.k, p.m, x_stride, kBlockM) ||
      !Encode2d(&b_map, p.dtype, p.w, p.k, p.n, p.k, kBlockN / 2) ||
      !Encode2d(&y_map, p.dtype, p.y, out_cols, p.m, y_stride, 64)) {
    return cudaErrorInvalidValue;
  }
  GemmArgs args;
  const int64_t row_tiles = (p.m + kBlockM - 1) / kBlockM;
  args.num_m = static_cast<int>((row_tiles + p.cluster - 1) / p.cluster);
  args.num_n = static_cast<int>(Gated(p.epilogue) ? p.n / kBlockN : (p.n + kBlockN - 1) / kBlockN);
  args.k_blocks = static_cast<int>((p.k + kBlockK - 1) / kBlockK);
  args.group_m = p.group_m;
  args.up_row = static_cast<int>(Gated(p.epilogue) ? p.n / 2 : kBlockN / 2);
  const int64_t units = int64_t{args.num_m} * args.num_n;
  return p.dtype == DType::kF16
             ? LaunchFor<__half>(p, a_map, b_map, y_map, args, units, stream)
             : LaunchFor<__nv_bfloat16>(p, a_map, b_map, y_map, args, units, stream);
}

}  // namespace lmserve::kernels::cuda
