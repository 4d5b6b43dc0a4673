// Internal to the stream GEMM (stream_gemm.h): its tile shapes and how a launch divides the work
// among its blocks. Shared by the host code and the kernel; not a public interface.

#ifndef LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_
#define LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_

#include <cstdint>

namespace lmserve::kernels::cuda {

inline constexpr int kStreamGemmChunk = 64;    // k per ring stage (128 bytes of a 16-bit row)
inline constexpr int kStreamGemmBoxRows = 32;  // W rows per copy-engine box
inline constexpr int kStreamGemmMaxSplits = 16;
// Tile counters, at the start of the workspace: one int per split tile (fewer than the grid).
inline constexpr int64_t kStreamGemmCounterBytes = 64 * 1024;

// W rows per tile: 64 (four warps of one m16 tile each) up to 16 tokens, else 128 (two each, so
// that each x fragment read from shared memory serves twice the rows).
constexpr int StreamGemmTileRows(int tokens) { return tokens <= 16 ? 64 : 128; }
// Ring stages: about 100 KB up to 16 tokens, so that two launches' blocks fit on a
// multiprocessor together (the next one fills its ring while this one drains); 6 deeper ones.
constexpr int StreamGemmStages(int tokens) { return tokens <= 16 ? 10 : 6; }
// Floats of one split unit's partial sums.
constexpr int64_t StreamGemmPartialFloats(int tokens) {
  return int64_t{StreamGemmTileRows(tokens)} * tokens;
}

// Work units, in order: tiles [0, full_tiles) over all of k, then each remaining tile as `splits`
// units of num_chunks / splits chunks each. Block b takes units b, b + grid, b + 2 grid, ...: the
// whole tiles are whole waves of the grid, and the rest is split finely enough that the last wave
// is about as long as the others, with at most 2 * grid split units (their partial sums go
// through memory).
struct StreamGemmSchedule {
  int num_tiles = 0;
  int num_chunks = 0;  // k / kStreamGemmChunk, rounded up
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
      // The longest block's chunks: its whole tiles, then its split units.
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

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_STREAM_GEMM_SCHEDULE_H_
