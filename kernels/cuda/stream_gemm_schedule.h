// Internal to the stream GEMM (stream_gemm.h): its tile shapes and how a launch divides the work
// among its blocks. Shared by the host code and the kernel; not a public interface.

#ifndef LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_
#define LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_

#include <cstdint>

namespace lmserve::kernels::cuda {

inline constexpr int kStreamGemmPieceK = 64;  // k per copy-engine box: one 128-byte swizzled row
inline constexpr int kStreamGemmMaxSplits = 16;
// Tile counters, at the start of the workspace: one int per split tile (fewer than the grid).
inline constexpr int64_t kStreamGemmCounterBytes = 64 * 1024;
// W rows per copy-engine box: 16 (an m16 tile), or 8 with the SiLU epilogue (a tile's 8 gate
// rows and its 8 up rows are two boxes that together make one m16 tile).
constexpr int StreamGemmWeightBoxRows(bool silu_and_mul) { return silu_and_mul ? 8 : 16; }

// A kernel configuration: the shape of a tile and of a ring stage, and the matrix instruction.
struct StreamGemmConfig {
  int tokens;      // x rows the tiles hold: 8, 16, 32 or 64 (a launch computes m <= tokens)
  int tile_rows;   // W rows per tile: a multiple of 16 (128 with wgmma)
  int stage_k;     // k per ring stage: a multiple of kStreamGemmPieceK (64 with wgmma)
  int warps;       // consumer warps (8, two warpgroups, with wgmma)
  int stages;      // ring depth
  bool wgmma;      // warpgroup MMAs (sm_90a) with W's rows as M = 64 per warpgroup; else mma.sync
};

// The configurations, by token bucket; `variant` 0 is the default, 1 an alternative kept for
// benchmarks ($LMSERVE_STREAM_GEMM_VARIANT). Up to 16 tokens the mma.sync kernels keep up with
// the memory; beyond, mma.sync cannot (at 64 tokens a stream of W at 4.4 TB/s asks ~290 TFLOP/s
// of it), and warpgroup MMAs read both operands straight from the ring. The rings hold 170-190
// KB: bytes in flight per multiprocessor are what a streaming kernel's bandwidth rests on.
constexpr StreamGemmConfig StreamGemmConfigFor(int tokens, int variant) {
  if (tokens <= 8) {
    return variant == 0 ? StreamGemmConfig{8, 16, 256, 4, 16, false}
                        : StreamGemmConfig{8, 16, 256, 4, 8, false};
  }
  if (tokens <= 16) {
    return variant == 0 ? StreamGemmConfig{16, 16, 256, 4, 12, false}
                        : StreamGemmConfig{16, 16, 256, 4, 6, false};
  }
  if (tokens <= 32) {
    return variant == 0 ? StreamGemmConfig{32, 128, 64, 8, 8, true}
                        : StreamGemmConfig{32, 64, 128, 4, 7, false};
  }
  return variant == 0 ? StreamGemmConfig{64, 128, 64, 8, 7, true}
                      : StreamGemmConfig{64, 128, 128, 8, 4, false};
}

// W rows per copy-engine box of the wide descriptor (StreamGemmOperand::map_wide): a warpgroup's
// M.
inline constexpr int kStreamGemmWideBoxRows = 64;

// The tokens a launch for m rows computes with: 8, 16, 32 or 64.
constexpr int StreamGemmBucket(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// Work units, in order: tiles [0, full_tiles) over all of k, then each remaining tile as `splits`
// units of about num_chunks / splits stages each. Block b takes units b, b + grid, b + 2 grid,
// ...: the whole tiles are whole waves of the grid, and the rest is split finely enough that the
// last wave is about as long as the others, with at most 2 * grid split units (their partial
// sums go through memory).
struct StreamGemmSchedule {
  int num_tiles = 0;
  int num_chunks = 0;  // ring stages per tile: k / stage_k, rounded up
  int full_tiles = 0;
  int splits = 1;
  int num_units = 0;
};

inline StreamGemmSchedule MakeStreamGemmSchedule(int64_t num_tiles, int64_t num_chunks,
                                                 int grid_limit) {
  StreamGemmSchedule s;
  s.num_tiles = static_cast<int>(num_tiles);
  s.num_chunks = static_cast<int>(num_chunks);
  const int64_t grid = grid_limit < 1 ? 1 : grid_limit;
  const int64_t waves = num_tiles / grid;
  const int64_t rest = num_tiles - waves * grid;
  int best_splits = 1;
  int64_t best_cost = -1;
  if (rest > 0) {
    for (int64_t splits = 1; splits <= kStreamGemmMaxSplits && splits <= num_chunks; ++splits) {
      const int64_t units = rest * splits;
      if (splits > 1 && units > 2 * grid) break;
      // The longest block's stages: its whole tiles, then its split units.
      const int64_t per_unit = (num_chunks + splits - 1) / splits;
      const int64_t cost = waves * num_chunks + (units + grid - 1) / grid * per_unit;
      if (best_cost < 0 || cost < best_cost) best_cost = cost, best_splits = static_cast<int>(splits);
    }
  }
  s.splits = best_splits;
  s.full_tiles = best_splits == 1 ? s.num_tiles : static_cast<int>(waves * grid);
  s.num_units = s.full_tiles + (s.num_tiles - s.full_tiles) * s.splits;
  return s;
}

// Blocks a launch may have: one per multiprocessor of the current device (host only).
int StreamGemmGridLimit();
// $LMSERVE_STREAM_GEMM_VARIANT (0 or 1; default 0), read once (host only).
int StreamGemmVariant();

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_
