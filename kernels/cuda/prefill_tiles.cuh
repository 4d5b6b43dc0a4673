// The prefill attention kernels' work plan, read on the device: a block takes one tile of up to
// kBlockM query rows of one sequence, and `tile_start` (the plan, [num_seqs + 1]) holds each
// sequence's first tile, the last entry the total. Shared by the mma.sync kernel
// (prefill_attention.cu) and the Hopper one (prefill_attention_sm90.cu).

#ifndef LMSERVE_KERNELS_CUDA_PREFILL_TILES_CUH_
#define LMSERVE_KERNELS_CUDA_PREFILL_TILES_CUH_

#include <cstdint>

namespace lmserve::kernels::cuda {

// One tile's sequence and rows.
struct PrefillTile {
  int seq;          // its sequence
  int seq_token0;   // the sequence's first query token in the batch
  int query_len;    // the sequence's query rows
  int context_len;  // its context, the new tokens included
  int row0;         // the tile's first row within the sequence
  int rows;         // the tile's rows: min(block_m, query_len - row0)
  int first_pos;    // the position of row 0
};

// Finds tile `tile` of the plan: false when the plan has fewer tiles (the grid is sized for the
// most a batch may need).
__device__ inline bool LocatePrefillTile(int tile, int block_m, int num_seqs,
                                         const int32_t* __restrict__ tile_start,
                                         const int32_t* __restrict__ query_start,
                                         const int32_t* __restrict__ context_lens,
                                         PrefillTile* t) {
  if (tile >= tile_start[num_seqs]) return false;
  int lo = 0, hi = num_seqs - 1;  // the last sequence whose first tile is <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  t->seq = lo;
  t->seq_token0 = query_start[lo];
  t->query_len = query_start[lo + 1] - t->seq_token0;
  t->context_len = context_lens[lo];
  t->row0 = (tile - tile_start[lo]) * block_m;
  t->rows = min(block_m, t->query_len - t->row0);
  t->first_pos = t->context_len - t->query_len + t->row0;
  return true;
}

// The first key any row of a tile whose row 0 sits at `first_pos` attends to: row 0's window's
// start with a sliding window (`window` > 0: the token at p attends to (p - window, p]), else 0.
// Keys before it are never loaded (their blocks may have left the table: -1).
__device__ inline int PrefillFirstKey(int first_pos, int window) {
  return window > 0 ? max(0, first_pos - window + 1) : 0;
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_PREFILL_TILES_CUH_
