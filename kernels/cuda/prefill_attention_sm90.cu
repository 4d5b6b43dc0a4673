// Hopper prefill attention over the paged KV cache, in FlashAttention-3's manner (built for sm_90a
// alone: kernels/CMakeLists.txt, target lmserve_kernels_cuda_sm90a).
//
// Work items are (query tile of 128 rows, head) pairs, the tile plan of prefill_attention.cu (at
// 128 rows for every head dim), longest tiles first and heads fastest (a KV head's query heads
// side by side). With GQA packing (PrefillSm90Options::pack_gqa) an item's 128 rows are 128 / P
// tokens of P query heads of one KV head, token by token (row r: token r / P, head r % P), so a
// K or V tile serves P heads; the rows' positions, the masks and the output follow r / P. A block takes one item, or, for batches of short queries (PrefillSm90Options),
// persistent blocks (a block a multiprocessor) take items in turn; both run the same code. A block
// has three warpgroups:
//   - the producer: warp 0 loads Q (once the consumers are done with the last item's) and K,
//     warp 1 loads V (the other two warps leave at once but with an FP8 cache, below, and the
//     group gives its registers up with setmaxnreg), for each tile of 128 keys (64 at head dim
//     256) into a ring of shared-memory stages, by TMA: a box per cache block (R =
//     min(block_size, tile) slots of one KV head), so a paged block costs
//     one descriptor-based copy whatever its place in the pool, landing in the 128-byte-swizzled
//     layout wgmma reads. At head dim 128 one 5-D box brings both 64-element columns (the
//     "paired" layout, TileRowOffset); else a 3-D box per column. Boxes past the queries' last
//     key point past the pool's end and read as zeros. The many small boxes of the default block
//     size (16) are what the loads cost, not their bytes (bench/results/README.md, section 16).
//   - two consumer warpgroups, each owning 64 of the query rows: S = Q K^T by wgmma
//     (m64n128k16, m64n64k16 at head dim 256, both operands in shared memory), scale, mask
//     (only on tiles that cross a row's diagonal or the context's end), online softmax in fp32
//     registers, then O += P V by
//     wgmma with P straight from registers (the accumulator layout of S is the A-fragment
//     layout) and V read N-major (transposed) from the same swizzled tile. Each warp of both
//     groups frees a stage's K once its QK^T is done and its V once its PV is (mbarriers of 8
//     arrivals), so the next K tiles load while PV still reads V.
// K and V tiles have separate "full" barriers, so QK^T starts before V has landed. Three consumer
// loops (PrefillSm90Loop): serial, pipelined (tile j's QK^T and softmax under tile j-1's PV) and
// the default, ping-pong (pipelined, and the two groups take turns at issuing wgmmas through two
// named barriers, so one group's softmax runs under the other's matrix products).
// Head dims 64, 128 and 256; 80 and 96 run the head-dim-128 kernel, the tensor maps' columns past
// the head dim reading as zeros. At 256 a key tile is 64 keys (two stages of K and V beside Q's
// 64 KB), the scores m64n64 wgmmas and O's 256 columns two m64n128 products a step, in the serial
// loop (the overlapped ones spill there).
//
// Sliding windows and soft-caps (Gemma 2, Mistral; the kMasking instantiations): an item's key
// tiles start at its first row's window (earlier boxes, whose blocks may be gone from the table,
// are never read), tiles that cross a row's window start are masked as those that cross its
// diagonal, and the scores are capped before the softmax. FP8 E4M3 caches (kF8): the producer's
// two loading warps bring each tile's bytes by TMA into a staging ring, and all four of its warps
// (the loading ones between their loads) widen them exactly into the 16-bit stage the consumers
// read (fp8_cache.cuh), half a tile's rows each of two warps a tensor; the keys' scale goes into
// the score scale and the values' into the output.
//
// Cache slots past a sequence's context length hold whatever the pool held (possibly NaN bit
// patterns): their scores are masked, but P = 0 times a NaN value is NaN, so on the tile that
// reaches past the context the V warp waits for V itself, zeroes those rows and only then
// releases the tile to the consumers.

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/prefill_tiles.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace lmserve::kernels::cuda {
namespace {

// Query rows per block: the plan's when this kernel runs (LaunchPrefillPlan).
constexpr int kBlockM = kPrefillSm90BlockRows;
// Keys per tile: 128, or 64 at head dim 256 (the shared memory's room for two stages).
constexpr int Sm90BlockN(int64_t head_dim) { return head_dim > 128 ? 64 : 128; }
constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
constexpr int kRowBytes = 128;  // a swizzled row: 64 16-bit elements
// setmaxnreg's shares: the block is launched with 168 registers a thread (the launch bound's
// share of 64K, in whole 8s) and the consumers can take only what the producer gives up.
constexpr int kLaunchRegisters = 168, kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(128 * (kLaunchRegisters - kProducerRegisters) ==
                  256 * (kConsumerRegisters - kLaunchRegisters),
              "the consumers take what the producer gives up");

// kF8: the caches hold E4M3 bytes (PrefillAttentionParams::cache_fp8). Their tiles land by TMA
// in a staging ring of their own ([128 rows][kHeadDim bytes]) and are widened into the 16-bit
// tiles the consumers read; two 16-bit stages at head dim 128 leave room for it.
template <int kHeadDim, bool kF8>
struct Sm90Shape {
  static_assert(kHeadDim % 64 == 0, "head dims of whole 128-byte atoms");
  static_assert(!kF8 || kHeadDim <= 128, "FP8 staging at head dims up to 128");
  static constexpr int kBlockN = Sm90BlockN(kHeadDim);  // keys per tile
  static constexpr int kColumns = kHeadDim / 64;             // 64-element atom columns
  static constexpr int kStages = kHeadDim <= 64 ? 4 : kF8 || kHeadDim > 128 ? 2 : 3;  // ring depth
  static constexpr int kQGroupBytes = 64 * kHeadDim * 2;     // one consumer group's Q rows
  static constexpr int kQColumnBytes = 64 * kRowBytes;       // 64 rows of one column
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // a K or V tile
  static constexpr int kColumnBytes = kBlockN * kRowBytes;   // a tile's rows of one column
  static constexpr int kF8TileBytes = kF8 ? kBlockN * kHeadDim : 0;  // a staged E4M3 tile
  static constexpr int kKOffset = 2 * kQGroupBytes;
  static constexpr int kVOffset = kKOffset + kStages * kTileBytes;
  static constexpr int kF8KOffset = kVOffset + kStages * kTileBytes;
  static constexpr int kF8VOffset = kF8KOffset + kStages * kF8TileBytes;
  static constexpr int kBarrierOffset = kF8VOffset + kStages * kF8TileBytes;
  // q_full, q_empty, v_tail, k_full[], v_full[], k_empty[], v_empty[]; with kF8 also the staging
  // ring's f8_k_full[], f8_v_full[], f8_k_empty[], f8_v_empty[].
  static constexpr int kBarriers = 3 + (kF8 ? 8 : 4) * kStages;
  // A float per consumer thread that the overlapped loops store their row sums to each tile (see
  // the loop): written, never read.
  static constexpr int kSinkOffset = kBarrierOffset + kBarriers * 8;
  static constexpr int kSmemBytes = kSinkOffset + 256 * 4 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "a Hopper multiprocessor's shared memory for a block");
};

// A K or V tile's layout in shared memory, 128-byte rows of 64 elements in 8-row atoms, as the
// loads write it and the descriptors read it: unpaired, column after column ([column][128 rows]);
// paired (head dim 128, one box for both columns), each 8-row atom of column 0 followed by the
// same rows of column 1 ([row / 8][column][row % 8]), so that a box of a cache block's slots
// brings both columns at once. Returns the byte offset of row `row` of column `c`.
template <typename Shape, bool kPaired>
__host__ __device__ constexpr int TileRowOffset(int row, int c) {
  if constexpr (kPaired) {
    return (row / 8) * (Shape::kColumns * 8 * kRowBytes) + c * 8 * kRowBytes +
           (row % 8) * kRowBytes;
  } else {
    return c * Shape::kColumnBytes + row * kRowBytes;
  }
}

struct Sm90Args {
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* block_table_start;
  const int32_t* block_table_ids;
  const int32_t* tile_start;  // the plan
  void* output;
  int num_seqs, group_size, num_heads, block_size;
  int box_rows;       // cache slots per TMA box: min(block_size, kBlockN)
  int num_slots;      // num_blocks * block_size: a box there reads zeros
  float score_scale;  // scale * log2(e); with a soft-cap scale / softcap (times k_scale: kF8)
  float cap_log2;     // softcap * log2(e), 0 for none (kMasking)
  int window;         // the sliding window, 0 for none (kMasking)
  float out_scale;    // the output's factor: v_scale (kF8), else 1
  int heads_fastest;  // the work items' order: heads fastest (else tiles fastest)
  int pack_shift;     // log2 of the query heads an item takes (P above; 0 without packing)
  int head_dim;       // <= kHeadDim: the tensors' (80 and 96 run padded to 128, reading zeros)
};

// The consumer loops (PrefillSm90Loop in prefill_attention_sm90.h).
constexpr int kSerial = 0, kPipelined = 1, kPingpong = 2;

// Named barriers 1 and 2 (0 is __syncthreads): consumer group g waits on 1 + g for its turn to
// issue wgmmas, and hands the turn to the other group by arriving on the other's.
__device__ __forceinline__ void NamedBarrierSync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// kPaired: K and V tiles in the paired layout (TileRowOffset), k_map and v_map 5-D maps
// (EncodePairedMap); else unpaired, 3-D maps (EncodeMap).
// kF8: E4M3 caches (Sm90Shape), unpaired; k_map and v_map are maps of bytes (EncodeF8Map).
// kMasking: a sliding window and a soft-cap, as a.window and a.cap_log2 say (either may be 0).
template <typename T, int kHeadDim, int kLoop, bool kPaired, bool kF8, bool kMasking>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillSm90Kernel(const __grid_constant__ CUtensorMap q_map,
                      const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map, const Sm90Args a) {
  using Shape = Sm90Shape<kHeadDim, kF8>;
  static_assert(!kPaired || (Shape::kColumns == 2 && !kF8), "pairs of 16-bit columns");
  constexpr int kBlockN = Shape::kBlockN;
  constexpr bool kF16 = std::is_same_v<T, __half>;
  constexpr int kStages = Shape::kStages;
  extern __shared__ unsigned char smem_raw[];
  // Swizzled atoms want 1024-byte alignment.
  unsigned char* smem = smem_raw + ((1024 - (SmemAddress(smem_raw) & 1023)) & 1023);
  unsigned char* s_q = smem;
  unsigned char* s_k = smem + Shape::kKOffset;  // [stage][column][kBlockN rows][128 B]
  unsigned char* s_v = smem + Shape::kVOffset;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Shape::kBarrierOffset);
  uint64_t* q_empty = q_full + 1;
  uint64_t* v_tail = q_full + 2;
  uint64_t* k_full = q_full + 3;
  uint64_t* v_full = k_full + kStages;
  uint64_t* k_empty = v_full + kStages;
  uint64_t* v_empty = k_empty + kStages;
  uint64_t* f8_k_full = v_empty + kStages;  // kF8 alone: the staging ring
  uint64_t* f8_v_full = f8_k_full + kStages;
  uint64_t* f8_k_empty = f8_v_full + kStages;
  uint64_t* f8_v_empty = f8_k_empty + kStages;

  const int tid = threadIdx.x, lane = tid % 32;
  if (tid == 0) {
    MbarrierInit(q_full, 1);
    MbarrierInit(q_empty, 8);  // every consumer warp
    MbarrierInit(v_tail, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(k_full + s, 1);
      MbarrierInit(v_full + s, 1);
      MbarrierInit(k_empty + s, 8);  // every consumer warp
      MbarrierInit(v_empty + s, 8);
      if constexpr (kF8) {  // two warps widen each tile: they fill k_full and v_full
        MbarrierInit(k_full + s, 2);
        MbarrierInit(v_full + s, 2);
        MbarrierInit(f8_k_full + s, 1);
        MbarrierInit(f8_v_full + s, 1);
        MbarrierInit(f8_k_empty + s, 2);
        MbarrierInit(f8_v_empty + s, 2);
      }
    }
  }
  __syncthreads();

  // The work items, (query tile, head) pairs, or with packing (query tile, P heads from *head):
  // block b takes items b, b + gridDim.x, ... (one item per block when the grid has one block per
  // item), the longest tiles first (a sequence's later tiles reach more keys), heads fastest
  // unless a.heads_fastest is 0.
  const int num_tiles = a.tile_start[a.num_seqs];
  const int pack = 1 << a.pack_shift;
  const int num_units = a.num_heads >> a.pack_shift;  // an item's heads: a unit
  const int num_items = num_tiles * num_units;
  auto locate = [&](int item, PrefillTile* t, int* head) {
    int tile_index, unit;
    if (a.heads_fastest) {
      unit = item % num_units;
      tile_index = num_tiles - 1 - item / num_units;
    } else {
      unit = item / num_tiles;
      tile_index = num_tiles - 1 - item % num_tiles;
    }
    *head = unit << a.pack_shift;
    LocatePrefillTile(tile_index, kBlockM >> a.pack_shift, a.num_seqs, a.tile_start, a.query_start,
                      a.context_lens, t);
  };
  // Row r of an item: token r / P of its tile, head *head + r % P.
  auto row_token = [&](int r) { return r >> a.pack_shift; };
  // Stage and phase of the ring's g-th tile (counted over the block's items).
  auto stage_of = [](int g) { return g % kStages; };
  auto phase_of = [](int g) { return static_cast<uint32_t>((g / kStages) & 1); };

  if (tid < 128) {  // the producer warpgroup
    sm90::SetMaxRegistersDec<kProducerRegisters>();
    if (tid >= (kF8 ? 128 : 64)) return;
    // Warp 0 loads Q and K, warp 1 V: two warps issue the many small boxes side by side. With
    // kF8 they load into the staging ring, and warps 0 and 2 (K), 1 and 3 (V) widen each staged
    // tile into its 16-bit stage, half its rows each.
    const int warp = tid / 32;
    const bool loads_v = warp % 2 == 1;
    unsigned char* const s_kv = loads_v ? s_v : s_k;
    unsigned char* const s_f8 = smem + (loads_v ? Shape::kF8VOffset : Shape::kF8KOffset);
    const CUtensorMap* const kv_map = loads_v ? &v_map : &k_map;
    uint64_t* const kv_full = loads_v ? v_full : k_full;
    uint64_t* const kv_empty = loads_v ? v_empty : k_empty;
    uint64_t* const f8_full = loads_v ? f8_v_full : f8_k_full;
    uint64_t* const f8_empty = loads_v ? f8_v_empty : f8_k_empty;
    // kF8: lane i widens 16-byte chunk i % kChunksPerRow of rows i / kChunksPerRow + kRowsPerPass
    // * p (16 E4M3 values into two 16-byte chunks of the row's 128-byte-swizzled column, where
    // TMA would have placed them); this warp takes passes p = warp / 2, warp / 2 + 2, ..., so a
    // row's swizzle (row % 8) is the same at each of a lane's passes.
    constexpr int kChunksPerRow = kHeadDim / 16, kRowsPerPass = 32 / kChunksPerRow;
    static_assert(!kF8 || 2 * kRowsPerPass % 8 == 0, "a lane's rows share their swizzle");
    const int widen_row0 = lane / kChunksPerRow + (warp / 2) * kRowsPerPass;
    const int widen_c16 = (lane % kChunksPerRow) % 4 * 2;  // the first of its two chunks
    const int widen_base = TileRowOffset<Shape, false>(widen_row0, lane % kChunksPerRow / 4);
    const int widen_lo = widen_base + ((widen_c16 ^ (widen_row0 % 8)) << 4);
    const int widen_hi = widen_base + (((widen_c16 + 1) ^ (widen_row0 % 8)) << 4);
    int tiles_done = 0, items_done = 0, tails_done = 0;
    for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++items_done) {
      PrefillTile t;
      int head;
      locate(item, &t, &head);
      const int kv_head = head / a.group_size;
      const int context_len = t.context_len;
      const int kv_end = min(context_len, t.first_pos + t.rows);  // keys [0, kv_end)
      const int num_kv_tiles = (kv_end + kBlockN - 1) / kBlockN;
      const int first_key = PrefillFirstKey(t.first_pos, kMasking ? a.window : 0);
      const int first_tile = first_key / kBlockN;  // the tiles before hold no key of the item's
      if (tid == 0) {  // Q, once the consumers are done with the last item's
        // A box is a group's 64 rows: 64 / P tokens of P heads (q_map's box).
        MbarrierWait(q_empty, (items_done & 1) ^ 1);
        MbarrierArriveExpectTx(q_full, 2 * Shape::kQGroupBytes);
        for (int group = 0; group < 2; ++group) {
          for (int c = 0; c < Shape::kColumns; ++c) {
            sm90::TmaLoad3d(s_q + group * Shape::kQGroupBytes + c * Shape::kQColumnBytes, &q_map,
                            c * 64, head, t.seq_token0 + t.row0 + row_token(group * 64), q_full);
          }
        }
      }
      const int32_t* table = a.block_table_ids + a.block_table_start[t.seq];
      const int boxes = kBlockN / a.box_rows;  // <= 16: box_rows >= 8
      // Lane b's box of tile j: keys j * kBlockN + b * box_rows onwards, in one cache block (its
      // first slot a multiple of 8). A box wholly before the item's first key reads zeros: its
      // block may have left every query's window (-1 in the table).
      auto box_slot = [&](int j) {
        const int pos = j * kBlockN + lane * a.box_rows;
        if (lane < boxes && pos < kv_end && pos + a.box_rows > first_key) {
          const int block_index = pos / a.block_size;
          return table[block_index] * a.block_size + (pos - block_index * a.block_size);
        }
        return a.num_slots;
      };
      if constexpr (kF8) {
        // Warps 0 and 1 stage tile j + 1's bytes, then each warp widens its half of tile j.
        auto stage_tile = [&](int j) {
          const int ring = tiles_done + j - first_tile;
          const int stage = stage_of(ring);
          const int slot = box_slot(j);
          if (lane == 0) {
            MbarrierWait(f8_empty + stage, phase_of(ring) ^ 1);
            MbarrierArriveExpectTx(f8_full + stage, Shape::kF8TileBytes);
          }
          __syncwarp();
          if (lane < boxes) {
            sm90::TmaLoad3d(s_f8 + stage * Shape::kF8TileBytes + lane * a.box_rows * kHeadDim,
                            kv_map, 0, kv_head, slot, f8_full + stage);
          }
        };
        if (warp < 2) stage_tile(first_tile);
        for (int j = first_tile; j < num_kv_tiles; ++j) {
          if (warp < 2 && j + 1 < num_kv_tiles) stage_tile(j + 1);
          const int ring = tiles_done + j - first_tile;
          const int stage = stage_of(ring);
          const uint32_t phase = phase_of(ring);
          MbarrierWait(f8_full + stage, phase);
          MbarrierWait(kv_empty + stage, phase ^ 1);
          // E4M3 bytes past the context widen to finite values (fp8_cache.cuh): V needs no
          // tail zeroing.
          const unsigned char* in = s_f8 + stage * Shape::kF8TileBytes +
                                    widen_row0 * kHeadDim + (lane % kChunksPerRow) * 16;
          unsigned char* out = s_kv + stage * Shape::kTileBytes;
#pragma unroll 4
          for (int p = 0; p < kBlockN / kRowsPerPass / 2; ++p) {
            const uint4 bytes =
                *reinterpret_cast<const uint4*>(in + p * 2 * kRowsPerPass * kHeadDim);
            uint4 lo, hi;
            F8x16Widen<T>(bytes, lo, hi);
            *reinterpret_cast<uint4*>(out + widen_lo + p * 2 * kRowsPerPass * kRowBytes) = lo;
            *reinterpret_cast<uint4*>(out + widen_hi + p * 2 * kRowsPerPass * kRowBytes) = hi;
          }
          sm90::FenceProxyAsyncShared();  // the 16-bit tile, for wgmma's reads
          __syncwarp();
          if (lane == 0) {
            sm90::MbarrierArrive(f8_empty + stage);
            sm90::MbarrierArrive(kv_full + stage);
          }
        }
      } else {
        for (int j = first_tile; j < num_kv_tiles; ++j) {
          const int ring = tiles_done + j - first_tile;
          const int stage = stage_of(ring);
          const uint32_t phase = phase_of(ring);
          const int n0 = j * kBlockN;
          const int slot = box_slot(j);
          // The last tile, when it reaches past the context's end: a box loaded for keys below
          // kv_end may hold slots past the context (kv_end < context_len too, for a query tile that
          // is not the sequence's last), so V's rows from the context's end on are zeroed before
          // the consumers see them.
          const bool tail = loads_v && j == num_kv_tiles - 1 && n0 + kBlockN > context_len;
          // K and V stages are freed apart (K once QK^T is done, V once PV is), so K runs ahead.
          if (lane == 0) {
            MbarrierWait(kv_empty + stage, phase ^ 1);
            MbarrierArriveExpectTx(tail ? v_tail : kv_full + stage, Shape::kTileBytes);
          }
          __syncwarp();
          if (lane < boxes) {
            unsigned char* box = s_kv + stage * Shape::kTileBytes;
            if constexpr (kPaired) {  // both columns in one box
              sm90::TmaLoad5d(box + lane * a.box_rows * 2 * kRowBytes, kv_map, 0, 0, 0, slot / 8,
                              kv_head, tail ? v_tail : kv_full + stage);
            } else {
#pragma unroll
              for (int c = 0; c < Shape::kColumns; ++c) {
                sm90::TmaLoad3d(box + c * Shape::kColumnBytes + lane * a.box_rows * kRowBytes,
                                kv_map, c * 64, kv_head, slot, tail ? v_tail : kv_full + stage);
              }
            }
          }
          if (tail) {
            MbarrierWait(v_tail, tails_done & 1);  // at most one tail tile per item
            ++tails_done;
            const int first_row = context_len - n0;
            const int chunks = (kBlockN - first_row) * Shape::kColumns * (kRowBytes / 16);
            unsigned char* tile = s_v + stage * Shape::kTileBytes;
            for (int i = lane; i < chunks; i += 32) {  // 16-byte chunks of the rows' columns
              const int per_row = Shape::kColumns * (kRowBytes / 16);
              const int row = first_row + i / per_row, c = (i % per_row) / (kRowBytes / 16);
              const int chunk = i % (kRowBytes / 16);
              *reinterpret_cast<uint4*>(tile + TileRowOffset<Shape, kPaired>(row, c) + chunk * 16) =
                  make_uint4(0, 0, 0, 0);
            }
            sm90::FenceProxyAsyncShared();
            __syncwarp();
            if (lane == 0) sm90::MbarrierArrive(v_full + stage);
          }
        }
      }
      tiles_done += num_kv_tiles - first_tile;
    }
    return;
  }

  // A consumer warpgroup: 64 query rows of each item.
  sm90::SetMaxRegistersInc<kConsumerRegisters>();
  const int group = tid / 128 - 1;
  const int warp_in_group = (tid % 128) / 32;
  const int row_a = warp_in_group * 16 + lane / 4;  // this thread's rows: row_a, row_a + 8
  const unsigned char* q_group = s_q + group * Shape::kQGroupBytes;
  // The exponentials' factor: scores arrive in log2 units already when soft-capped.
  const float scale = kMasking && a.cap_log2 > 0.0f ? 1.0f : a.score_scale;
  volatile float* sink = reinterpret_cast<volatile float*>(smem + Shape::kSinkOffset);

  float o[kHeadDim / 2];
  float s[kBlockN / 2];                    // scores of a tile, then its softmax weights (fp32)
  uint32_t p[kBlockN / 4];                 // the weights as 16-bit pairs: wgmma's A fragments
  float m_a = -INFINITY, m_b = -INFINITY;  // running row maxima, unscaled scores
  float l_a = 0.0f, l_b = 0.0f;            // this thread's part of the row sums
  int pos_a = 0, pos_b = 0;                // this thread's rows' positions
  int kv_end = 0;                          // the item's keys: [0, kv_end)
  int tiles_done = 0;                      // the ring's tiles before this item's
  int first_tile = 0;                      // the item's first key tile (a window's start)

  // From one 8-row atom of a K or V column to the next.
  constexpr uint32_t kAtomStride = TileRowOffset<Shape, kPaired>(8, 0);
  auto issue_qk = [&](int stage) {
#pragma unroll
    for (int c = 0; c < Shape::kColumns; ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t q_desc =
            sm90::SmemDescriptor(q_group + c * Shape::kQColumnBytes + kk * 32, 0);
        const uint64_t k_desc = sm90::SmemDescriptor(
            s_k + stage * Shape::kTileBytes + TileRowOffset<Shape, kPaired>(0, c) + kk * 32, 0,
            kAtomStride);
        if constexpr (kBlockN == 128) {
          sm90::WgmmaSS_N128<kF16>(s, q_desc, k_desc, (c | kk) != 0 ? 1 : 0);
        } else {
          sm90::WgmmaSS_N64<kF16>(s, q_desc, k_desc, (c | kk) != 0 ? 1 : 0);
        }
      }
    }
    sm90::WgmmaCommit();
  };
  auto issue_pv = [&](int stage) {
    const unsigned char* v_tile = s_v + stage * Shape::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t pa[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      const uint64_t v_desc =
          sm90::SmemDescriptor(v_tile + TileRowOffset<Shape, kPaired>(kk * 16, 0),
                               TileRowOffset<Shape, kPaired>(0, 1), kAtomStride);
      if constexpr (kHeadDim == 256) {  // two products of 128 output columns
        const uint64_t v_desc_hi =
            sm90::SmemDescriptor(v_tile + TileRowOffset<Shape, kPaired>(kk * 16, 2),
                                 TileRowOffset<Shape, kPaired>(0, 1), kAtomStride);
        sm90::WgmmaRS_N128<kF16>(*reinterpret_cast<float(*)[64]>(o), pa, v_desc, 1);
        sm90::WgmmaRS_N128<kF16>(*reinterpret_cast<float(*)[64]>(o + 64), pa, v_desc_hi, 1);
      } else if constexpr (kHeadDim == 128) {
        sm90::WgmmaRS_N128<kF16>(o, pa, v_desc, 1);
      } else {
        sm90::WgmmaRS_N64<kF16>(o, pa, v_desc, 1);
      }
    }
    sm90::WgmmaCommit();
  };
  // Masks tile j's scores in s, turns them into weights in place, updates m and l; returns the
  // factors that bring O to the new maxima.
  // kMasked (std::integral_constant<bool, ...>): whether tile j may need the mask; the
  // pipelined loop splits its tiles so that no branch sits between a wgmma and its wait (ptxas
  // would serialize the wgmmas).
  auto softmax = [&](int j, auto kMasked, float& rescale_a, float& rescale_b) {
    if constexpr (kMasking) {  // the soft-cap: cap_log2 * tanh(q.k * scale / softcap)
      if (a.cap_log2 > 0.0f) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) {
          s[i] = a.cap_log2 * sm90::TanhApprox(s[i] * a.score_scale);
        }
      }
    }
    if (decltype(kMasked)::value) {
      // Score i's key is j * kBlockN + 2 * (lane % 4) + a constant: a row keeps the keys up to its
      // position and below kv_end, i.e. constants up to its limit, and with a window those from
      // its window's start on (constants from its low).
      const int base = j * kBlockN + 2 * (lane % 4);
      const int limit_a = min(pos_a, kv_end - 1) - base;
      const int limit_b = min(pos_b, kv_end - 1) - base;
      [[maybe_unused]] const bool windowed = kMasking && a.window > 0;
      [[maybe_unused]] const int low_a = windowed ? pos_a - a.window + 1 - base : -kBlockN;
      [[maybe_unused]] const int low_b = windowed ? pos_b - a.window + 1 - base : -kBlockN;
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int key = 8 * (i / 4) + (i & 1);
        if (key > ((i & 2) ? limit_b : limit_a)) s[i] = -INFINITY;
        if constexpr (kMasking) {
          if (key < ((i & 2) ? low_b : low_a)) s[i] = -INFINITY;
        }
      }
    }
    float max_a = m_a, max_b = m_b;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; i += 4) {
      max_a = fmaxf(max_a, fmaxf(s[i], s[i + 1]));
      max_b = fmaxf(max_b, fmaxf(s[i + 2], s[i + 3]));
    }
    max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, 1));
    max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, 2));
    max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, 1));
    max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, 2));
    // A row with no key yet keeps a zero base (its weights are all exp2(-inf) = 0).
    const float base_a = max_a == -INFINITY ? 0.0f : max_a * scale;
    const float base_b = max_b == -INFINITY ? 0.0f : max_b * scale;
    rescale_a = sm90::Exp2Ftz(m_a * scale - base_a);
    rescale_b = sm90::Exp2Ftz(m_b * scale - base_b);
    m_a = max_a;
    m_b = max_b;
    l_a *= rescale_a;
    l_b *= rescale_b;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; i += 4) {
      s[i] = sm90::Exp2Ftz(fmaf(s[i], scale, -base_a));
      s[i + 1] = sm90::Exp2Ftz(fmaf(s[i + 1], scale, -base_a));
      s[i + 2] = sm90::Exp2Ftz(fmaf(s[i + 2], scale, -base_b));
      s[i + 3] = sm90::Exp2Ftz(fmaf(s[i + 3], scale, -base_b));
      l_a += s[i] + s[i + 1];
      l_b += s[i + 2] + s[i + 3];
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int i = 0; i < kBlockN / 4; ++i) p[i] = Pack2<T>(s[2 * i], s[2 * i + 1]);
  };
  auto rescale_o = [&](float rescale_a, float rescale_b) {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; i += 4) {
      o[i] *= rescale_a;
      o[i + 1] *= rescale_a;
      o[i + 2] *= rescale_b;
      o[i + 3] *= rescale_b;
    }
  };
  auto release = [&](uint64_t* empty) {  // q_empty, or k_empty or v_empty of a stage
    __syncwarp();
    if (lane == 0) sm90::MbarrierArrive(empty);
  };

  // Ping-pong (FlashAttention-3's scheduler barrier): the two groups take turns to issue their
  // wgmmas, so one group's softmax runs under the other's matrix products. Each group takes
  // num_kv_tiles + 1 turns an item (tile 0's QK^T, one per later tile, the last PV; a skipped
  // tile is an empty turn), so the turns alternate across items too; group 1 hands group 0 its
  // first turn, and group 0 takes group 1's last hand-over after its last item.
  auto turn_begin = [&] {
    if constexpr (kLoop == kPingpong) NamedBarrierSync(1 + group);
  };
  auto turn_end = [&] {
    if constexpr (kLoop == kPingpong) NamedBarrierArrive(2 - group);
  };
  if constexpr (kLoop == kPingpong) {
    if (group == 1) NamedBarrierArrive(1);
  }

  int items_done = 0;
  for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++items_done) {
    PrefillTile t;
    int head;
    locate(item, &t, &head);
    const int first_pos = t.first_pos;  // position of the item's row 0
    kv_end = min(t.context_len, first_pos + t.rows);
    const int num_kv_tiles = (kv_end + kBlockN - 1) / kBlockN;
    first_tile = PrefillFirstKey(first_pos, kMasking ? a.window : 0) / kBlockN;
    // This group's rows' positions: the first and last, and this thread's two.
    const int group_first_pos = first_pos + row_token(group * 64);
    const int group_last_pos = first_pos + row_token(group * 64 + 63);
    pos_a = first_pos + row_token(group * 64 + row_a);
    pos_b = first_pos + row_token(group * 64 + row_a + 8);
    // The tiles with a key at or before this group's last row: a prefix of the item's tiles.
    const int group_tiles = min(num_kv_tiles, group_last_pos / kBlockN + 1);
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
    m_a = m_b = -INFINITY;
    l_a = l_b = 0.0f;

    MbarrierWait(q_full, items_done & 1);
    float rescale_a, rescale_b;
    if constexpr (kLoop != kSerial) {
      // FlashAttention-3's intra-warpgroup overlap: tile j's QK^T and tile j-1's PV are in flight
      // together, and tile j's softmax runs while PV still is. s holds tile j's scores (then
      // weights) while p holds tile j-1's weights, so both fit beside O.
      // Tiles from first_masked on may cross a row's diagonal or the context's end.
      const int mask_bound = min(group_first_pos - (kBlockN - 1), kv_end - kBlockN);
      const int first_masked = mask_bound < 0 ? 0 : mask_bound / kBlockN + 1;
      auto step = [&](int j, auto kMasked) {
        const int ring = tiles_done + j - first_tile;
        const int stage = stage_of(ring), prev = stage_of(ring - 1);
        pack_p();
        sm90::MbarrierWaitNoBranch(k_full + stage, phase_of(ring));
        turn_begin();
        sm90::WgmmaFence();
        issue_qk(stage);
        sm90::MbarrierWaitNoBranch(v_full + prev, phase_of(ring - 1));
        sm90::WgmmaFence();  // else ptxas inserts one after the wait's branch, and serializes
        issue_pv(prev);
        turn_end();
        sm90::WgmmaWait<1>();
        sm90::FenceRegisters(s);
        release(k_empty + stage);
        softmax(j, kMasked, rescale_a, rescale_b);
        // A store that needs every weight of the tile (through the row sums) keeps ptxas from
        // moving the wait for PV above the exponentials, which it did at head dim 128 (it sinks
        // them towards their use, next tile's packing), leaving the softmax overlapping nothing.
        sink[tid - 128] = l_a + l_b;
        sm90::WgmmaWait<0>();
        sm90::FenceRegisters(o);
        rescale_o(rescale_a, rescale_b);
        release(v_empty + prev);
      };
      // With a window, tiles before window_end may hold keys before some row's window.
      const int window_end =
          kMasking && a.window > 0
              ? max(0, group_last_pos + 1 - a.window + kBlockN - 1) / kBlockN
              : 0;
      const int stage0 = stage_of(tiles_done);
      MbarrierWait(k_full + stage0, phase_of(tiles_done));
      turn_begin();
      sm90::WgmmaFence();
      issue_qk(stage0);
      turn_end();
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(s);
      release(k_empty + stage0);
      softmax(first_tile, std::true_type{}, rescale_a, rescale_b);
      // Tiles [first_tile + 1, group_tiles): masked below window_end, unmasked up to
      // first_masked, masked from there.
      const int unmasked_begin = max(first_tile + 1, min(window_end, group_tiles));
      const int unmasked_end = max(unmasked_begin, min(first_masked, group_tiles));
      for (int j = first_tile + 1; j < unmasked_begin; ++j) step(j, std::true_type{});
      for (int j = unmasked_begin; j < unmasked_end; ++j) step(j, std::false_type{});
      for (int j = unmasked_end; j < group_tiles; ++j) step(j, std::true_type{});
      release(q_empty);  // every QK^T of the item is done
      const int last = tiles_done + group_tiles - 1 - first_tile, stage = stage_of(last);
      pack_p();
      MbarrierWait(v_full + stage, phase_of(last));
      turn_begin();
      sm90::WgmmaFence();
      issue_pv(stage);
      turn_end();
      sm90::WgmmaWait<0>();
      sm90::FenceRegisters(o);
      release(v_empty + stage);
    } else {
      for (int j = first_tile; j < group_tiles; ++j) {
        const int stage = stage_of(tiles_done + j - first_tile);
        const uint32_t phase = phase_of(tiles_done + j - first_tile);
        MbarrierWait(k_full + stage, phase);
        sm90::WgmmaFence();
        issue_qk(stage);
        sm90::WgmmaWait<0>();
        sm90::FenceRegisters(s);
        release(k_empty + stage);
        softmax(j, std::true_type{}, rescale_a, rescale_b);
        pack_p();
        rescale_o(rescale_a, rescale_b);
        MbarrierWait(v_full + stage, phase);
        sm90::WgmmaFence();
        issue_pv(stage);
        sm90::WgmmaWait<0>();
        sm90::FenceRegisters(o);
        release(v_empty + stage);
      }
      release(q_empty);
    }
    // The tiles past this group's rows (the other group's diagonal): only freed.
    for (int j = group_tiles; j < num_kv_tiles; ++j) {
      const int stage = stage_of(tiles_done + j - first_tile);
      const uint32_t phase = phase_of(tiles_done + j - first_tile);
      turn_begin();
      turn_end();
      MbarrierWait(k_full + stage, phase);
      release(k_empty + stage);
      MbarrierWait(v_full + stage, phase);
      release(v_empty + stage);
    }
    tiles_done += num_kv_tiles - first_tile;

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const float inv_a = l_a > 0.0f ? a.out_scale / l_a : 0.0f;
    const float inv_b = l_b > 0.0f ? a.out_scale / l_b : 0.0f;
    const int64_t out_stride = int64_t{a.num_heads} * a.head_dim;
    const int cta_row_a = group * 64 + row_a, cta_row_b = cta_row_a + 8;
    const int token_a = row_token(cta_row_a), token_b = row_token(cta_row_b);
    T* out = static_cast<T*>(a.output) + int64_t{t.seq_token0 + t.row0} * out_stride +
             int64_t{head} * a.head_dim + 2 * (lane % 4);
    T* const out_a = out + token_a * out_stride + (cta_row_a & (pack - 1)) * a.head_dim;
    T* const out_b = out + token_b * out_stride + (cta_row_b & (pack - 1)) * a.head_dim;
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c) {
      if (c * 8 >= a.head_dim) break;  // the padding's columns (all zero)
      if (token_a < t.rows) {
        *reinterpret_cast<uint32_t*>(out_a + c * 8) =
            Pack2<T>(o[4 * c] * inv_a, o[4 * c + 1] * inv_a);
      }
      if (token_b < t.rows) {
        *reinterpret_cast<uint32_t*>(out_b + c * 8) =
            Pack2<T>(o[4 * c + 2] * inv_b, o[4 * c + 3] * inv_b);
      }
    }
  }
  if constexpr (kLoop == kPingpong) {
    if (group == 0) NamedBarrierSync(1);  // group 1's last hand-over
  }
}

// A 3-D map over 16-bit elements [dim2][dim1][dim0] (dim0 contiguous), boxes of
// 64 x box1 x box_rows, 128-byte swizzle, zeros out of bounds.
bool EncodeMap(CUtensorMap* map, DType dtype, const void* base, uint64_t dim0, uint64_t dim1,
               uint64_t dim2, uint64_t stride1_bytes, uint64_t stride2_bytes, uint32_t box_rows,
               uint32_t box1 = 1) {
  const cuuint64_t dims[3] = {dim0, dim1, dim2};
  const cuuint64_t strides[2] = {stride1_bytes, stride2_bytes};
  const cuuint32_t box[3] = {64, box1, box_rows};
  return EncodeSwizzled16(map, dtype, base, 3, dims, strides, box);
}

// A 3-D map over E4M3 bytes [dim2][dim1][dim0] (dim0 contiguous), boxes of box0 x 1 x box_rows
// landing row after row (box0 bytes each, unswizzled), zeros out of bounds.
bool EncodeF8Map(CUtensorMap* map, const void* base, uint64_t dim0, uint64_t dim1, uint64_t dim2,
                 uint32_t box0, uint32_t box_rows) {
  const EncodeTiledFn encode = EncodeTiled();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {dim0, dim1, dim2};
  const cuuint64_t strides[2] = {dim0, dim0 * dim1};
  const cuuint32_t box[3] = {box0, 1, box_rows};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A K or V cache [slots][kv heads][128] of 16-bit elements as the 5-D map of the paired layout
// (TileRowOffset): dims (innermost first) 64 elements, 8 slots, 2 columns, slots / 8, kv heads;
// a box of 64 x 8 x 2 x box_rows / 8 x 1 lands as [row / 8][column][row % 8]. Slots past the
// pool's end read as zeros.
bool EncodePairedMap(CUtensorMap* map, DType dtype, const void* base, uint64_t num_kv_heads,
                     uint64_t num_slots, uint32_t box_rows) {
  if (num_slots % 8 != 0) return false;
  const uint64_t slot_bytes = num_kv_heads * 128 * 2;
  const cuuint64_t dims[5] = {64, 8, 2, num_slots / 8, num_kv_heads};
  const cuuint64_t strides[4] = {slot_bytes, 128, 8 * slot_bytes, 128 * 2};
  const cuuint32_t box[5] = {64, 8, 2, box_rows / 8, 1};
  return EncodeSwizzled16(map, dtype, base, 5, dims, strides, box);
}

std::atomic<PrefillSm90Loop> loop_choice{PrefillSm90Loop::kPingpong};
std::mutex options_mu;
PrefillSm90Options options_choice;  // guarded by options_mu

PrefillSm90Options CurrentOptions() {
  std::lock_guard<std::mutex> lock(options_mu);
  return options_choice;
}

// PrefillSm90Pack: the largest power of two up to 8 that divides the group, with pack_gqa.
int PackOf(const PrefillAttentionParams& p, const PrefillSm90Options& options) {
  if (!options.pack_gqa || p.num_kv_heads <= 0) return 1;
  const int64_t group = p.num_heads / p.num_kv_heads;
  int pack = 1;
  while (pack < 8 && group % (2 * pack) == 0) pack *= 2;
  return pack;
}

template <typename Kernel>
cudaError_t LaunchKernel(Kernel kernel, int smem_bytes, dim3 grid, const CUtensorMap& q_map,
                         const CUtensorMap& k_map, const CUtensorMap& v_map, const Sm90Args& a,
                         cudaStream_t stream) {
  LMSERVE_CUDA_RETURN_IF_ERROR(
      SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), smem_bytes));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(q_map, k_map, v_map, a);
  return cudaGetLastError();
}

template <typename T, int kHeadDim>
cudaError_t LaunchTyped(const PrefillAttentionParams& p, cudaStream_t stream) {
  const PrefillSm90Options options = CurrentOptions();
  const int64_t query_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * p.head_dim;
  const int64_t head_dim = p.head_dim;  // kHeadDim, or 80 or 96 under kHeadDim 128
  const int box_rows = static_cast<int>(std::min<int64_t>(p.block_size, Sm90BlockN(kHeadDim)));
  const uint64_t num_slots = static_cast<uint64_t>(p.num_blocks * p.block_size);
  const bool f8 = p.cache_fp8;
  const bool masking = p.window > 0 || p.softcap > 0;
  CUtensorMap q_map, k_map, v_map;
  // Head dim 128: 16-bit K and V in the paired layout (one box per block for both columns),
  // unless the driver refuses the 5-D maps or the options ask for the unpaired layout.
  bool paired = false;
  if constexpr (kHeadDim == 128) {
    paired = !f8 && head_dim == 128 && options.paired &&
             EncodePairedMap(&k_map, p.dtype, p.key_cache, p.num_kv_heads, num_slots, box_rows) &&
             EncodePairedMap(&v_map, p.dtype, p.value_cache, p.num_kv_heads, num_slots, box_rows);
  }
  // The maps span the tensors' head dim: a box's columns past it read as zeros, which pad 80 and
  // 96 to 128 (zero scores' terms, zero output columns, left unstored).
  bool kv_maps = paired;
  if (f8) {
    kv_maps = EncodeF8Map(&k_map, p.key_cache, head_dim, p.num_kv_heads, num_slots, kHeadDim,
                          box_rows) &&
              EncodeF8Map(&v_map, p.value_cache, head_dim, p.num_kv_heads, num_slots, kHeadDim,
                          box_rows);
  } else if (!paired) {
    kv_maps = EncodeMap(&k_map, p.dtype, p.key_cache, head_dim, p.num_kv_heads, num_slots,
                        head_dim * 2, p.num_kv_heads * head_dim * 2, box_rows) &&
              EncodeMap(&v_map, p.dtype, p.value_cache, head_dim, p.num_kv_heads, num_slots,
                        head_dim * 2, p.num_kv_heads * head_dim * 2, box_rows);
  }
  // Q: a consumer group's 64 rows a box, 64 / pack tokens of pack heads.
  const int pack = PackOf(p, options);
  if (!kv_maps || !EncodeMap(&q_map, p.dtype, p.query, head_dim, p.num_heads, p.num_tokens,
                             head_dim * 2, query_stride * 2, 64 / pack, pack)) {
    return cudaErrorInvalidValue;
  }
  constexpr float kLog2e = 1.4426950408889634f;
  Sm90Args a{};
  a.query_start = p.query_start;
  a.context_lens = p.context_lens;
  a.block_table_start = p.block_table_start;
  a.block_table_ids = p.block_table_ids;
  a.tile_start = static_cast<const int32_t*>(p.workspace);
  a.output = p.output;
  a.num_seqs = static_cast<int>(p.num_seqs);
  a.group_size = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.num_heads = static_cast<int>(p.num_heads);
  a.block_size = static_cast<int>(p.block_size);
  a.box_rows = box_rows;
  a.num_slots = static_cast<int>(num_slots);
  // The keys' scale in the scores', the values' in the output (fp8_cache.cuh).
  a.score_scale = (p.softcap > 0 ? p.scale / p.softcap : p.scale * kLog2e) * (f8 ? p.k_scale : 1);
  a.cap_log2 = p.softcap > 0 ? p.softcap * kLog2e : 0.0f;
  a.window = p.window;
  a.out_scale = f8 ? p.v_scale : 1.0f;
  a.head_dim = static_cast<int>(head_dim);
  // At most this many work items (the plan, on the device, has the exact count; its tiles are
  // kBlockM / pack tokens).
  const int64_t max_items =
      (CeilDiv(p.num_tokens, int64_t{kBlockM / pack}) + p.num_seqs) * (p.num_heads / pack);
  a.heads_fastest = options.heads_first ? 1 : 0;
  while ((1 << a.pack_shift) < pack) ++a.pack_shift;
  int64_t blocks = max_items;  // one item a block
  if (options.persistent ||
      (options.persistent_short && p.num_tokens <= kPrefillSm90ShortRows * p.num_seqs)) {
    const int sms = CurrentMultiprocessorCount();
    if (sms < 1) return cudaErrorInvalidDevice;
    blocks = std::min<int64_t>(max_items, options.max_blocks > 0 ? options.max_blocks : sms);
  }
  const dim3 grid(static_cast<unsigned>(blocks));
  const PrefillSm90Loop loop = loop_choice.load(std::memory_order_relaxed);
  // The instantiation for these switches (each a std::integral_constant<bool, ...>).
  auto launch = [&](auto kPaired, auto kF8, auto kMasking) {
    constexpr bool kP = decltype(kPaired)::value, kF = decltype(kF8)::value,
                   kM = decltype(kMasking)::value;
    constexpr int kSmemBytes = Sm90Shape<kHeadDim, kF>::kSmemBytes;
    // Head dim 256 runs the serial loop whatever the choice: the overlapped loops keep a second
    // tile's scores beside O's 128 floats a thread and spill (bench/results section 29).
    if constexpr (kHeadDim == 256) {
      return LaunchKernel(PrefillSm90Kernel<T, kHeadDim, kSerial, kP, kF, kM>, kSmemBytes, grid,
                          q_map, k_map, v_map, a, stream);
    } else {
      const auto kernel = loop == PrefillSm90Loop::kSerial
                              ? PrefillSm90Kernel<T, kHeadDim, kSerial, kP, kF, kM>
                          : loop == PrefillSm90Loop::kPingpong
                              ? PrefillSm90Kernel<T, kHeadDim, kPingpong, kP, kF, kM>
                              : PrefillSm90Kernel<T, kHeadDim, kPipelined, kP, kF, kM>;
      return LaunchKernel(kernel, kSmemBytes, grid, q_map, k_map, v_map, a, stream);
    }
  };
  auto with_masking = [&](auto kPaired, auto kF8) {
    return masking ? launch(kPaired, kF8, std::true_type{})
                   : launch(kPaired, kF8, std::false_type{});
  };
  if constexpr (kHeadDim <= 128) {  // PrefillSm90Supports: no FP8 at head dim 256
    if (f8) return with_masking(std::false_type{}, std::true_type{});
  }
  if constexpr (kHeadDim == 128) {
    if (paired) return with_masking(std::true_type{}, std::false_type{});
  }
  return with_masking(std::false_type{}, std::false_type{});
}

}  // namespace

bool PrefillSm90Supports(const PrefillAttentionParams& p) {
  const bool block_fits =
      p.block_size % 8 == 0 && (Sm90BlockN(p.head_dim) % p.block_size == 0 ||
                                p.block_size % Sm90BlockN(p.head_dim) == 0);
  return (p.head_dim == 64 || p.head_dim == 80 || p.head_dim == 96 || p.head_dim == 128 ||
          (p.head_dim == 256 && !p.cache_fp8)) &&
         block_fits &&
         p.num_blocks * p.block_size < (int64_t{1} << 31) &&
         (p.dtype == DType::kBF16 || p.dtype == DType::kF16);
}

void SetPrefillSm90Loop(PrefillSm90Loop loop) { loop_choice.store(loop); }
int PrefillSm90Pack(const PrefillAttentionParams& p) { return PackOf(p, CurrentOptions()); }
int PrefillSm90TileTokens(const PrefillAttentionParams& p) {
  return kBlockM / PrefillSm90Pack(p);
}
void SetPrefillSm90Options(const PrefillSm90Options& options) {
  std::lock_guard<std::mutex> lock(options_mu);
  options_choice = options;
}

bool PrefillSm90Available() {
  return Sm90KernelRuns(reinterpret_cast<const void*>(
      PrefillSm90Kernel<__nv_bfloat16, 128, kPingpong, true, /*kF8=*/false, /*kMasking=*/false>));
}

cudaError_t LaunchPrefillSm90(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64) {
    return p.dtype == DType::kF16 ? LaunchTyped<__half, 64>(p, stream)
                                  : LaunchTyped<__nv_bfloat16, 64>(p, stream);
  }
  if (p.head_dim == 256) {
    return p.dtype == DType::kF16 ? LaunchTyped<__half, 256>(p, stream)
                                  : LaunchTyped<__nv_bfloat16, 256>(p, stream);
  }
  // 80, 96 and 128: 80 and 96 padded to 128.
  return p.dtype == DType::kF16 ? LaunchTyped<__half, 128>(p, stream)
                                : LaunchTyped<__nv_bfloat16, 128>(p, stream);
}

}  // namespace lmserve::kernels::cuda
