#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/mma.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kCombineThreads = 128;
constexpr int kDecodeRows = 16;  // query heads per block: the M rows of the mma.sync tiles
// How far (log2 units) a tile's largest score may pass the running maximum before the softmax's
// accumulators are rescaled: weights up to 2^8 sit well inside fp16's range (FlashAttention-4's
// conditional rescaling). At 1,024 sequences of 193 keys on an H100 it took the FP8 cache's
// kernel from 184.3 to 181.8 us (bench/results section 34); bf16's was unchanged.
constexpr float kDecodeRescaleSlack = 8.0f;

struct DecodeArgs {
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* context_lens;
  const int32_t* block_table_start;
  const int32_t* block_table_ids;
  void* output;
  float* partial_out;  // [num_seqs, num_heads, max_splits, head_dim]
  float* partial_lse;  // [num_seqs, num_heads, max_splits], log2 domain
  int num_heads, num_kv_heads, group_size, head_chunks, block_size, max_splits;
  int window;  // 0: none
  int64_t query_stride;
  // Scores are kept in the log2 domain for exp2f: q.k * score_scale without a soft-cap
  // (scale * log2(e)), else cap_log2 * tanh(q.k * score_scale) (scale / softcap and
  // softcap * log2(e)).
  float score_scale;
  float cap_log2;  // 0: no soft-cap
  // The output's factor: the FP8 cache's value scale (kF8 only).
  float out_scale;
};

// The keys a sequence's one query token sees: [first, context_len), first > 0 only with a window.
__device__ __forceinline__ int DecodeFirstKey(int context_len, int window) {
  return window > 0 && context_len > window ? context_len - window : 0;
}

// A raw score q.k in the log2 domain, soft-capped where the launch asks; `scale`: the launch's
// score_scale, or that times a power of two (kF8's query scaling, undone).
__device__ __forceinline__ float DecodeScore(float dot, float scale, const DecodeArgs& a) {
  return a.cap_log2 > 0.0f ? a.cap_log2 * tanhf(dot * scale) : dot * scale;
}

// The query heads of a KV head are the M rows of mma.sync m16n8k16 tiles (up to 16 heads; larger
// groups take several blocks), so a key's dot products with the whole group are one tensor-core
// operation. Each warp owns every kWarps-th tile of kTileN keys of the block's split, streams it
// through its own kStages-deep ring (no block barrier in the loop) and keeps its own online softmax
// (the register layout of prefill_attention.cu's); the warps merge through shared memory at the
// end. The ring is filled by bulk copies counted off mbarriers on Hopper (kBulk, where
// UseHopperKernels()), by cp.async (sm_80+) on the portable path; the rest is the same code.
// (A CUDA-core kernel with a lane group per key, shuffles for the dot products, was 10-15% slower
// at batch 64 on an H200: 349 against 302 us for 64 x 4096 keys.)
//
// Blocks of 4 warps, or of 2 where a launch has blocks enough without splits (a large batch): all
// of them then fit on the multiprocessors at once (4 a multiprocessor), and the start and end of
// a block, where the memory idles, come once per launch instead of once per wave. (Batch 64 at
// 1024 keys ran at 72% of the copy bandwidth in two waves of 4-warp blocks, and at 87% at 4096
// keys, whose blocks stream four times longer.) Where a block of 4 warps would take more shared
// memory than the device gives a block, 2 warps (head dim 256 on sm_86/sm_89, 99 KB a block).
// Blocks of 1 warp where a launch has kDecodeOneWarpBlocks blocks a multiprocessor or more
// (serving's decode steps of ~1,024 sequences): each warp streams its split alone, with no warp
// of its block to wait for at the end. On an H100 at 1,024 sequences of 129-256 keys the kernel
// alone is as fast either way (FP8 cache 179.2 against 180.4 us, bf16 315.0 against 313.1), and
// FP8 serving at 1,024 streams gained 0.5-0.8% (bench/results section 34); at 256 sequences 1
// warp was 4-11% slower, hence the bound.
//
// kF8 (an FP8 cache): the ring holds E4M3 rows of kHeadDim bytes, padded to kCacheStride, and
// each lane reads the bytes of its own mma.sync B fragments straight from a landed stage (16-byte
// shared-memory loads at head dim 128) and widens them in registers to fp16 (F8x4ToF16 below):
// no 16-bit copy of the tile, no ldmatrix. The products run in fp16 whatever T is
// (E4M3 values are fp16 values; the query is scaled by a power of two a row into fp16's range and
// the scores scaled back). For a lane's fragment bytes to be contiguous, the products take the
// head dimension in another order, the same for the query and the keys (a dot product does not
// depend on the order of its terms), and the values' head dimension in another order too, undone
// when the warps merge; the layouts are at F8Layout. (Run 2 of branch fp8-kv widened each landed
// stage into a 16-bit tile in shared memory for the 16-bit code's ldmatrix reads: 24-32 KB of
// shared-memory traffic a tile of 4 KB, 62% of the copy bandwidth at batch 64 x 4096 keys on an
// H100.) The ring's stages stay as deep as bf16's: its bytes in flight are half of bf16's.
template <int kHeadDim, int kWarps_, bool kBulk_, bool kF8_ = false>
struct DecodeShape {
  static constexpr int kWarps = kWarps_;
  static constexpr bool kBulk = kBulk_;
  static constexpr bool kF8 = kF8_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kDecodeRows;
  static constexpr int kTileN = 16;  // keys per warp step
  static constexpr int kStride = kHeadDim + 8;  // padded shared-memory row: ldmatrix conflict-free
  // Hopper: three stages up to head dim 128. Portable: two, so that 4 warps at head dim 128 fit
  // the 99 KB a block of sm_86 and sm_89 (three take 102 KB); an FP8 ring, half the bytes, takes
  // three either way (4 warps at head dim 128: 55 KB).
  static constexpr int kStages = (kBulk || kF8) && kHeadDim <= 128 ? 3 : 2;
  static constexpr int kCacheBytes = kF8 ? 1 : 2;  // of a cache element
  // A ring row, in cache elements (16-byte multiples).
  static constexpr int kCacheStride = kF8 ? kHeadDim + 16 : kStride;
  static constexpr int kCacheTileElements = kTileN * kCacheStride;
  // A warp's ring: [stage][K, V][key][dim] cache elements.
  static constexpr int kWarpBytes = kStages * 2 * kCacheTileElements * kCacheBytes;
  static constexpr int kLoadBytes = kWarps * kWarpBytes;
  // The merge's rows of fp32 values (kF8: a float of padding every 32, for the scattered stores
  // of the reordered dimensions).
  static constexpr int kAccStride = kF8 ? kHeadDim + kHeadDim / 32 : kHeadDim;
  static constexpr int kMergeBytes = kWarps * kRows * kAccStride * 4;
  static constexpr int kSmemBytes = kLoadBytes > kMergeBytes ? kLoadBytes : kMergeBytes;
};

// Whether this device code converts E4M3 by instruction (sm_89+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr bool kDeviceConvertsF8 = true;
#else
constexpr bool kDeviceConvertsF8 = false;
#endif

// Bytes 0 and 1 of `word` (two E4M3 values) as an fp16 pair (byte 0 in the low half), and bytes 2
// and 3 likewise, exactly. kInteger: by integer operations (a byte permute, a shift and two logic
// operations a pair: the byte seeeemmm placed as the fp16 s 0eeee mmm0000000, which reads as its
// value times 2^-8, E4M3's subnormals landing on fp16 subnormals); the caller applies the 2^8.
// Else by two conversion instructions (cvt.rn.f16x2.e4m3x2, sm_89+ only), the values themselves.
// Either way E4M3's NaN (0x7f, 0xff) is not read as such (the instruction gives NaN, the integer
// operations 480 times 2^-8); caches hold no NaN.
template <bool kInteger>
__device__ __forceinline__ void F8x4ToF16(uint32_t word, uint32_t& lo, uint32_t& hi) {
  if constexpr (kInteger) {
    // Bytes 0, 1 (then 2, 3) in the high bytes of the halves (fp8_cache.cuh's F8PairScaledBits).
    lo = F8PairScaledBits<__half>(__byte_perm(word, 0u, 0x1100u));
    hi = F8PairScaledBits<__half>(__byte_perm(word, 0u, 0x3322u));
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(word));
#else
    __trap();  // callers take kInteger where !kDeviceConvertsF8
#endif
  }
}

// Values: the pair (byte i of `first`, byte i of `second`) as an fp16 pair, for i = 2p and 2p + 1
// (`lo`, `hi`), as F8x4ToF16 widens.
template <bool kInteger>
__device__ __forceinline__ void F8PairsToF16(uint32_t first, uint32_t second, int p, uint32_t& lo,
                                             uint32_t& hi) {
  if constexpr (kInteger) {
    // Byte i of each word into the high byte of its half, one permute a pair.
    lo = F8PairScaledBits<__half>(__byte_perm(first, second, p == 0 ? 0x4400u : 0x6622u));
    hi = F8PairScaledBits<__half>(__byte_perm(first, second, p == 0 ? 0x5511u : 0x7733u));
  } else {
    F8x4ToF16<false>(__byte_perm(first, second, p == 0 ? 0x5140u : 0x7362u), lo, hi);
  }
}

// kF8: the bytes of a landed E4M3 stage that lane (g = lane / 4, t = lane % 4) reads, and the
// orders of the head dimension that make them contiguous.
//
// Keys (S = Q K^T; the B operand of m16n8k16, [dim][key]): the lane holds, of each 16-slot slice
// kk of the products' head order, key g's elements (and key 8 + g's) at slots 2t, 2t + 1 (one
// register) and 2t + 8, 2t + 9 (another): the slots of its query A fragment. Slot
// 2t + (i & 1) + 8 (i >> 1) of slice kk is dimension t kKeyBytes + 4 kk + i of the cache and of
// the query, so the lane reads the kKeyBytes = kHeadDim / 4 bytes of key rows g and 8 + g from
// t kKeyBytes, a 32-bit word a slice (F8x4ToF16's lo and hi are its two registers).
//
// Values (O += P V; the B operand, [key][dim]): the lane holds, of each n-tile dt of 8 output
// columns, column g of keys 2t, 2t + 1 (one register) and of 2t + 8, 2t + 9 (another). Column g of
// n-tile dt is dimension g kValBytes + dt, kValBytes = kHeadDim / 8, so the lane reads the
// kValBytes bytes from g kValBytes of value rows 2t, 2t + 1, 2t + 8 and 2t + 9, and a byte permute
// pairs rows 2t and 2t + 1 (2t + 8 and 2t + 9) before the widening. Accumulator o[dt][e] (row g,
// or g + 8 where e >= 2; column 2t + (e & 1)) is dimension (2t + (e & 1)) kValBytes + dt.
//
// Each run is read in the widest loads of 16, 8, 4 or 2 bytes that its offsets align to (at
// head dim 128: 16-byte loads, two a key row and one a value row, conflict-free).
template <int kHeadDim>
struct F8Layout {
  static constexpr int kKeyBytes = kHeadDim / 4;
  static constexpr int kValBytes = kHeadDim / 8;
  static constexpr int Load(int bytes) {
    return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : 2;
  }
  static constexpr int kKeyLoad = Load(kKeyBytes);
  static constexpr int kValLoad = Load(kValBytes);
  static_assert(kHeadDim % 16 == 0 && kKeyLoad >= 4, "a key slice is one 32-bit word");
};

// kBytes (16, 8, 4 or 2) bytes of shared memory at p, aligned to kBytes, as 32-bit words (2 bytes:
// the low half of one).
template <int kBytes>
__device__ __forceinline__ void LoadSharedWords(const uint8_t* p, uint32_t (&w)[(kBytes + 3) / 4]) {
  if constexpr (kBytes == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kBytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (kBytes == 4) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else {
    static_assert(kBytes == 2, "16, 8, 4 or 2 bytes");
    w[0] = *reinterpret_cast<const uint16_t*>(p);
  }
}

// kF8: the exponent `shift` that scales a query row whose largest magnitude is max_abs into
// [2^14, 2^15), inside fp16's range (65504): every bf16 element within 2^-31 of the largest
// converts to fp16 exactly. 0 for a zero row (and for infinities and NaN, which stay as they are).
__device__ __forceinline__ int F16QueryShift(float max_abs) {
  if (!(max_abs > 0.0f) || isinf(max_abs)) return 0;
  int exponent;
  frexpf(max_abs, &exponent);  // max_abs in [2^(exponent - 1), 2^exponent)
  return min(max(15 - exponent, -64), 64);
}

// grid (max_splits, num_kv_heads * head_chunks, num_seqs), head_chunks = ceil(group / 16).
// kWidening (kF8 only): a DecodeF8Widening, how the keys and values are widened where the device
// converts E4M3 itself (elsewhere by integer operations).
template <typename T, int kHeadDim, int kWarps, bool kBulk, bool kF8, int kWidening = 0>
__global__ void __launch_bounds__(kWarps * 32) DecodeAttentionKernel(DecodeArgs a) {
  using Shape = DecodeShape<kHeadDim, kWarps, kBulk, kF8>;
  using C = std::conditional_t<kF8, uint8_t, T>;  // a cache element
  constexpr int kCacheStride = Shape::kCacheStride;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kRows = Shape::kRows;
  constexpr int kTileN = Shape::kTileN;
  constexpr int kStride = Shape::kStride;
  constexpr int kStages = Shape::kStages;
  using M = std::conditional_t<kF8, __half, T>;  // the products' 16-bit type
  using L = F8Layout<kHeadDim>;
  constexpr auto kMode = static_cast<DecodeF8Widening>(kWidening);
  constexpr bool kKeysByInteger = !kDeviceConvertsF8 || kMode == DecodeF8Widening::kInteger;
  constexpr bool kValuesByInteger = !kDeviceConvertsF8 || kMode != DecodeF8Widening::kConvert;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // The warps' rings; after the loop the whole buffer is reused for the merge.
  auto s_acc = reinterpret_cast<float (*)[kRows][Shape::kAccStride]>(smem_raw);
  __shared__ float s_m[kWarps][kRows];
  __shared__ float s_l[kWarps][kRows];
  // Each warp's ring (kBulk): a stage's keys and values landed.
  __shared__ uint64_t s_bar[kBulk ? kWarps : 1][kBulk ? kStages : 1];

  // Before waiting for the previous kernel (QKV post-processing, which writes only the new
  // token's K and V), a block reads its sequence's length and table (step inputs, copied before
  // the step's first kernel) and starts loading its first tiles of the cache; the row of the new
  // token, if one of them holds it, and the query only after the wait.
  const int split = blockIdx.x;
  const int kv_head = blockIdx.y / a.head_chunks;
  const int chunk = blockIdx.y - kv_head * a.head_chunks;
  const int seq = blockIdx.z;
  const int context_len = a.context_lens[seq];
  // The splits divide the keys in the window, [first_key, context_len): the blocks before it are
  // never read (their table entries may be -1).
  const int first_key = DecodeFirstKey(context_len, a.window);
  const DecodeSplit plan = DecodeSplitPlan(context_len - first_key, a.max_splits);
  const int head0 = kv_head * a.group_size + chunk * kRows;
  const int heads_here = min(kRows, a.group_size - chunk * kRows);
  T* output = static_cast<T*>(a.output) + (int64_t{seq} * a.num_heads + head0) * kHeadDim;
  if (plan.num_splits == 0) {  // no keys: a zero output, written by the first split's block
    BeginDependentKernel();
    if (split == 0) {
      for (int i = threadIdx.x; i < heads_here * kHeadDim; i += kThreads) output[i] = FromFloat<T>(0.0f);
    }
    return;
  }
  if (split >= plan.num_splits) {
    BeginDependentKernel();
    return;
  }
  const int begin = first_key + split * plan.chunk_len;
  const int end = min(context_len, begin + plan.chunk_len);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // This warp's tiles: warp, warp + kWarps, ... of the split's tiles.
  const int num_tiles = (end - begin + kTileN - 1) / kTileN;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + kWarps - 1) / kWarps : 0;
  C* ring = reinterpret_cast<C*>(smem_raw + warp * Shape::kWarpBytes);
  const C* key_cache = static_cast<const C*>(a.key_cache);
  const C* value_cache = static_cast<const C*>(a.value_cache);
  const int32_t* table = a.block_table_ids + a.block_table_start[seq];
  const int64_t token_stride = int64_t{a.num_kv_heads} * kHeadDim;
  const int new_key = context_len - 1;  // written by the previous kernel
  // Each warp streams its tiles through its ring. kBulk: lane r copies key row r and lane 16 + r
  // value row r of a tile (256 contiguous bytes each at head dim 128), one bulk copy a row,
  // counted off the stage's mbarrier. (cp.async in 16-byte pieces spread over the warp took a table
  // lookup and address per piece and 201 registers against 120; on an H200 the bulk copies took
  // batch 1's attention from 6.0 to 5.3 us a layer, batch 64's from 80.8 to 79.5 us.) Portable:
  // lanes 2r and 2r + 1 copy key and value rows r in cp.async pieces of 16 bytes (one table
  // lookup a lane), a commit group a tile; an FP8 tile's pieces are spread over the warp in row
  // order instead, the rows' slots shuffled from lanes 0-15. A row past the split's end copies
  // the tile's first row instead: any finite data will do, its score is masked to a weight of 0.
  // A lane's table entry for a tile is read one iteration of the loop before its copies
  // (entry_of; the loop says what that hides).
  constexpr uint32_t kRowBytes = kHeadDim * sizeof(C);
  static_assert(kTileN == 16, "lane r and lane 16 + r copy key and value row r");
  if constexpr (kBulk) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) MbarrierInit(&s_bar[warp][s], 1);
    }
    __syncwarp();
  }
  enum Rows { kAll, kAllButNew, kNewOnly };
  // The row of a tile whose table entry this lane reads (and, but for kF8 by cp.async, copies).
  const int load_row = kBulk || kF8 ? lane % 16 : lane / 2;
  // The cache block holding this lane's row of tile j, as its table entry and the row's offset in
  // the block ({0, 0} past my_tiles): the one division by the block size a lane and tile, done
  // where the entry's load is issued, the slot computed where the copies need it (slot_of). (The
  // FP8 pieces below each divided for their own row: ncu counted 604 instructions a warp and tile
  // at 1,024 sequences of 193 keys on an H100, 526 without; 182.7 against 178.8 us.)
  struct Entry {
    int32_t id, offset;
  };
  auto entry_of = [&](int j) -> Entry {
    if (j >= my_tiles) return {0, 0};
    const int t0 = begin + (warp + j * kWarps) * kTileN;
    const int pos = t0 + load_row < end ? t0 + load_row : t0;
    const int block_index = pos / a.block_size;
    return {table[block_index], pos - block_index * a.block_size};
  };
  // The row's cache slot (Validate keeps num_blocks * block_size within int32).
  auto slot_of = [&](Entry entry) -> int32_t { return entry.id * a.block_size + entry.offset; };
  // Tile j into its stage; `which`: every row, all but the new key's, or the new key's only.
  // `entry`: entry_of(j).
  auto load = [&](int j, Rows which, Entry entry) {
    const int t0 = begin + (warp + j * kWarps) * kTileN;
    C* const stage = ring + (j % kStages) * 2 * Shape::kCacheTileElements;  // [K, V][key][dim]
    if constexpr (kBulk) {
      // Lane r: key row r; lane 16 + r: value row r.
      const int row = load_row;
      if (which != kNewOnly && lane == 0) {
        MbarrierArriveExpectTx(&s_bar[warp][j % kStages], 2 * kTileN * kRowBytes);
      }
      __syncwarp();
      const int pos = t0 + row;
      if ((which == kAllButNew && pos == new_key) || (which == kNewOnly && pos != new_key)) return;
      const C* src = (lane < 16 ? key_cache : value_cache) +
                     int64_t{slot_of(entry)} * token_stride + int64_t{kv_head} * kHeadDim;
      BulkCopy(stage + (lane < 16 ? 0 : Shape::kCacheTileElements) + row * kCacheStride, src,
               kRowBytes, &s_bar[warp][j % kStages]);
    } else if constexpr (kF8) {
      // The tile's 16 key rows of kHeadDim bytes, then its 16 value rows, as consecutive 16-byte
      // pieces, piece c by lane c % 32: each request of the warp covers whole rows (4 rows of 128
      // bytes at head dim 128). Lane r (< 16) has row r's slot. (Lanes 2r and 2r + 1 taking
      // rows r in alternate pieces, as the 16-bit rows below, made 16 requests of 32 bytes each:
      // on an H100 at batch 64 x 4096 keys the L2 was 80% busy at 61% of the DRAM bandwidth, and
      // 3 splits took 275 us against 228 us now.)
      constexpr int kPieces = kHeadDim / 16;  // of a row
      const int32_t slot = slot_of(entry);    // lane r < 16: row r's
#pragma unroll
      for (int i = 0; i < (16 * kPieces + 31) / 32; ++i) {
        const int c = lane + 32 * i;  // the piece of the key rows (and of the value rows)
        const int row = min(c / kPieces, kTileN - 1), piece = c - row * kPieces;
        const int32_t row_slot = __shfl_sync(0xffffffffu, slot, row);
        if (16 * kPieces % 32 != 0 && c >= 16 * kPieces) continue;
        const int pos = t0 + row;
        if ((which == kAllButNew && pos == new_key) || (which == kNewOnly && pos != new_key)) {
          continue;
        }
        const int64_t offset =
            int64_t{row_slot} * token_stride + int64_t{kv_head} * kHeadDim + piece * 16;
        C* const dst_key = stage + row * kCacheStride + piece * 16;
        C* const dst_value = dst_key + Shape::kCacheTileElements;
        if (which == kNewOnly) {
          Store16(dst_key, __ldcg(reinterpret_cast<const uint4*>(key_cache + offset)));
          Store16(dst_value, __ldcg(reinterpret_cast<const uint4*>(value_cache + offset)));
        } else {
          CpAsync16(dst_key, key_cache + offset, true);
          CpAsync16(dst_value, value_cache + offset, true);
        }
      }
    } else {
      // Lanes 2r and 2r + 1: key and value rows r, in alternate 16-byte pieces, so that each
      // request of the warp covers 16 rows of 32 contiguous bytes (whole sectors; a row a lane
      // took 32 rows of 16 bytes a request). The caller commits the cp.async group; the new key's
      // rows, written by the previous kernel, are copied by plain loads and stores through L2, so
      // that they need no group of their own.
      constexpr int kPiece = 16 / sizeof(C);  // elements of a 16-byte piece
      static_assert(kHeadDim % 16 == 0, "rows are whole 16-byte pieces");
      const int row = load_row;
      const int pos = t0 + row;
      if ((which == kAllButNew && pos == new_key) || (which == kNewOnly && pos != new_key)) return;
      const int piece0 = kPiece * (lane % 2);
      const int64_t offset =
          int64_t{slot_of(entry)} * token_stride + int64_t{kv_head} * kHeadDim + piece0;
      C* const dst_key = stage + row * kCacheStride + piece0;
      C* const dst_value = dst_key + Shape::kCacheTileElements;
#pragma unroll
      for (int c = 0; c < kHeadDim; c += 2 * kPiece) {
        if (piece0 + c >= kHeadDim) break;
        if (which == kNewOnly) {
          Store16(dst_key + c, __ldcg(reinterpret_cast<const uint4*>(key_cache + offset + c)));
          Store16(dst_value + c, __ldcg(reinterpret_cast<const uint4*>(value_cache + offset + c)));
        } else {
          CpAsync16(dst_key + c, key_cache + offset + c, true);
          CpAsync16(dst_value + c, value_cache + offset + c, true);
        }
      }
    }
  };
  // The first kStages - 1 tiles before the wait; the new key's row, if one of them holds it,
  // after (its stage's phase completes only when it has landed too).
  bool new_key_early = false;
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < my_tiles) {
      load(j, kAllButNew, entry_of(j));
      const int t0 = begin + (warp + j * kWarps) * kTileN;
      new_key_early |= t0 <= new_key && new_key < t0 + kTileN;
    }
    if constexpr (!kBulk) CpAsyncCommit();  // group j holds tile j (empty past my_tiles)
  }
  BeginDependentKernel();
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (new_key_early && j < my_tiles) load(j, kNewOnly, entry_of(j));
  }
  // The query rows (zero past the group) as mma.sync A fragments, straight from memory: rows
  // lane / 4 and lane / 4 + 8, columns 2 (lane % 4) + {0, 1} and 8 further, of each 16-wide slice
  // (kF8: of the products' head order, F8Layout, in fp16 scaled by 2^q_shift a row).
  const T* q_base = static_cast<const T*>(a.query) + seq * a.query_stride + int64_t{head0} * kHeadDim;
  uint32_t qa[kHeadDim / 16][4];
  const int g = lane / 4, t = lane % 4;  // the row and column pair of mma.sync fragments
  // The score scale of rows g and g + 8 (kF8: times 2^-q_shift, undoing the query's scaling).
  float row_scale[2] = {a.score_scale, a.score_scale};
  if constexpr (kF8) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Dimensions t kKeyBytes .. (t + 1) kKeyBytes of row g + 8r.
      const bool valid = g + 8 * r < heads_here;
      const uint32_t* row =
          reinterpret_cast<const uint32_t*>(q_base + (g + 8 * r) * kHeadDim + t * L::kKeyBytes);
      float q[L::kKeyBytes];
      float max_abs = 0.0f;
#pragma unroll
      for (int i = 0; i < L::kKeyBytes / 2; ++i) {
        const float2 v = valid ? Unpack2<T>(row[i]) : make_float2(0.0f, 0.0f);
        q[2 * i] = v.x;
        q[2 * i + 1] = v.y;
        max_abs = fmaxf(max_abs, fmaxf(fabsf(v.x), fabsf(v.y)));
      }
      max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, 1));
      max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, 2));
      const int q_shift = std::is_same_v<T, __half> ? 0 : F16QueryShift(max_abs);
      const float q_scale = ldexpf(1.0f, q_shift);
      // Keys widened by integer operations are 2^-8 times their values (F8x4ToF16). A power of
      // two, so the score scale times it scales a dot product as the two factors in turn do.
      row_scale[r] = a.score_scale * ldexpf(1.0f, (kKeysByInteger ? 8 : 0) - q_shift);
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        qa[kk][r] = Pack2<__half>(q[4 * kk] * q_scale, q[4 * kk + 1] * q_scale);
        qa[kk][2 + r] = Pack2<__half>(q[4 * kk + 2] * q_scale, q[4 * kk + 3] * q_scale);
      }
    }
  } else {
    const int t2 = 2 * t;
    const bool low = g < heads_here, high = g + 8 < heads_here;
    const uint32_t* row_low = reinterpret_cast<const uint32_t*>(q_base + g * kHeadDim + t2);
    const uint32_t* row_high = reinterpret_cast<const uint32_t*>(q_base + (g + 8) * kHeadDim + t2);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      qa[kk][0] = low ? row_low[kk * 8] : 0u;
      qa[kk][1] = high ? row_high[kk * 8] : 0u;
      qa[kk][2] = low ? row_low[kk * 8 + 4] : 0u;
      qa[kk][3] = high ? row_high[kk * 8 + 4] : 0u;
    }
  }

  float o[kHeadDim / 8][4];
#pragma unroll
  for (int i = 0; i < kHeadDim / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lane / 4 and lane / 4 + 8
  [[maybe_unused]] const int ldm = lane / 8, ldr = lane % 8;  // ldmatrix: matrix and row

  // The table entry of the next tile to load, read an iteration before its copies are issued.
  // (At 1,024 sequences of 193 keys on an H100, ncu finds the FP8 kernel's warps waiting on it
  // about half as often as on the tiles themselves. Reading it two iterations ahead did not help:
  // passing the pending load from one register to the next waits for it there; and writing the
  // loop body out twice, one register each, took the kernel from 168 to 192 registers.)
  Entry next_entry = entry_of(kStages - 1);
  for (int j = 0; j < my_tiles; ++j) {
    if (j + kStages - 1 < my_tiles) load(j + kStages - 1, kAll, next_entry);
    next_entry = entry_of(j + kStages);
    if constexpr (kBulk) {
      MbarrierWait(&s_bar[warp][j % kStages], (j / kStages) & 1);
    } else {
      // Groups 0 .. j + kStages - 1 are committed, group i holding tile i: tile j has landed
      // once at most kStages - 1 groups are pending. The warp barrier makes every lane's copies
      // (and the new key's stores) visible to the others.
      CpAsyncCommit();
      CpAsyncWait<kStages - 1>();
      __syncwarp();
    }
    // This stage's keys and values: [K, V][key][dim] cache elements.
    const C* const stage = ring + (j % kStages) * 2 * Shape::kCacheTileElements;
    float s[2][4] = {};
    if constexpr (kF8) {
      // Key rows g and 8 + g, the lane's kKeyBytes (F8Layout), widened a word (a slice) at a time.
      const uint8_t* key_low = stage + g * kCacheStride + t * L::kKeyBytes;
      const uint8_t* key_high = key_low + 8 * kCacheStride;
#pragma unroll
      for (int c = 0; c < L::kKeyBytes; c += L::kKeyLoad) {
        uint32_t low[L::kKeyLoad / 4], high[L::kKeyLoad / 4];
        LoadSharedWords<L::kKeyLoad>(key_low + c, low);
        LoadSharedWords<L::kKeyLoad>(key_high + c, high);
#pragma unroll
        for (int w = 0; w < L::kKeyLoad / 4; ++w) {
          uint32_t kb[4];
          F8x4ToF16<kKeysByInteger>(low[w], kb[0], kb[1]);
          F8x4ToF16<kKeysByInteger>(high[w], kb[2], kb[3]);
          Mma16816<__half>(s[0], qa[c / 4 + w], kb[0], kb[1]);
          Mma16816<__half>(s[1], qa[c / 4 + w], kb[2], kb[3]);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t kb[4];
        LdMatrixX4(kb, stage + ((ldm / 2) * 8 + ldr) * kStride + kk * 16 + (ldm % 2) * 8);
        Mma16816<T>(s[0], qa[kk], kb[0], kb[1]);
        Mma16816<T>(s[1], qa[kk], kb[2], kb[3]);
      }
    }
    const int t0 = begin + (warp + j * kWarps) * kTileN;
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = t0 + nt * 8 + 2 * t + (e & 1);
        s[nt][e] = key < end ? DecodeScore(s[nt][e], row_scale[e / 2], a) : -INFINITY;
        row_max[e / 2] = fmaxf(row_max[e / 2], s[nt][e]);
      }
    }
    // The running maxima move only where a tile's score exceeds one by more than
    // kDecodeRescaleSlack (the whole warp then takes the exact maxima and rescales its
    // accumulators, 64 products a lane at head dim 128); otherwise the weights are taken against
    // the stale maxima, at most 2^kDecodeRescaleSlack each, and the accumulators stay as they are.
    // The merge and the splits' log-sum-exps read m, l and o together, so any m will do.
    bool stale = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
      row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
      stale |= row_max[r] > m[r] + kDecodeRescaleSlack;  // m = -inf: any finite score
    }
    if (__any_sync(0xffffffffu, stale)) {
      float rescale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], row_max[r]);
        rescale[r] = exp2f(m[r] - (m_new == -INFINITY ? 0.0f : m_new));
        m[r] = m_new;
        l[r] *= rescale[r];
      }
#pragma unroll
      for (int dt = 0; dt < kHeadDim / 8; ++dt) {
        o[dt][0] *= rescale[0];
        o[dt][1] *= rescale[0];
        o[dt][2] *= rescale[1];
        o[dt][3] *= rescale[1];
      }
    }
    const float base[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - base[e / 2]);
        l[e / 2] += s[nt][e];
      }
    }
    // O += P V, P straight from the score registers (two 8-key accumulator tiles are one 16-key
    // A operand).
    uint32_t pa[4];
    pa[0] = Pack2<M>(s[0][0], s[0][1]);
    pa[1] = Pack2<M>(s[0][2], s[0][3]);
    pa[2] = Pack2<M>(s[1][0], s[1][1]);
    pa[3] = Pack2<M>(s[1][2], s[1][3]);
    const C* const sv = stage + Shape::kCacheTileElements;
    if constexpr (kF8) {
      // Value rows 2t, 2t + 1, 2t + 8 and 2t + 9, the lane's kValBytes (F8Layout): dimension pair
      // (c + 2p, c + 2p + 1) is n-tiles c + 2p and c + 2p + 1.
      const uint8_t* value_row = sv + 2 * t * kCacheStride + g * L::kValBytes;
#pragma unroll
      for (int c = 0; c < L::kValBytes; c += L::kValLoad) {
        uint32_t v[4][(L::kValLoad + 3) / 4];
        LoadSharedWords<L::kValLoad>(value_row + c, v[0]);
        LoadSharedWords<L::kValLoad>(value_row + kCacheStride + c, v[1]);
        LoadSharedWords<L::kValLoad>(value_row + 8 * kCacheStride + c, v[2]);
        LoadSharedWords<L::kValLoad>(value_row + 9 * kCacheStride + c, v[3]);
#pragma unroll
        for (int p = 0; p < L::kValLoad / 2; ++p) {
          // Bytes 2 (p % 2) and 2 (p % 2) + 1 of word p / 2 of two rows, paired:
          // (row 2t, row 2t + 1) of the first dimension, then of the second.
          uint32_t vb[4];
          F8PairsToF16<kValuesByInteger>(v[0][p / 2], v[1][p / 2], p % 2, vb[0], vb[1]);
          F8PairsToF16<kValuesByInteger>(v[2][p / 2], v[3][p / 2], p % 2, vb[2], vb[3]);
          Mma16816<__half>(o[c + 2 * p], pa, vb[0], vb[2]);
          Mma16816<__half>(o[c + 2 * p + 1], pa, vb[1], vb[3]);
        }
      }
    } else {
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        uint32_t vb[4];
        LdMatrixX4Trans(vb, sv + ((ldm % 2) * 8 + ldr) * kStride + dd * 16 + (ldm / 2) * 8);
        Mma16816<T>(o[2 * dd], pa, vb[0], vb[1]);
        Mma16816<T>(o[2 * dd + 1], pa, vb[2], vb[3]);
      }
    }
    __syncwarp();  // every lane is done with this stage before it is loaded again
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // every warp is done with its ring before the rings become s_acc

  // Merge the warps' partial softmaxes.
  const int row_a = lane / 4, row_b = row_a + 8;
  if (lane % 4 == 0) {
    s_m[warp][row_a] = m[0];
    s_m[warp][row_b] = m[1];
    s_l[warp][row_a] = l[0];
    s_l[warp][row_b] = l[1];
  }
  // kF8: a padding float every 32 (kAccStride), so that the lanes' columns fall in distinct banks.
  auto acc_column = [](int d) { return kF8 ? d + d / 32 : d; };
#pragma unroll
  for (int dt = 0; dt < kHeadDim / 8; ++dt) {
    if constexpr (kF8) {
      // o[dt][e]: dimension (2t + (e & 1)) kValBytes + dt (F8Layout).
      const int d0 = 2 * t * L::kValBytes + dt, d1 = d0 + L::kValBytes;
      s_acc[warp][row_a][acc_column(d0)] = o[dt][0];
      s_acc[warp][row_a][acc_column(d1)] = o[dt][1];
      s_acc[warp][row_b][acc_column(d0)] = o[dt][2];
      s_acc[warp][row_b][acc_column(d1)] = o[dt][3];
    } else {
      const int col = dt * 8 + 2 * t;
      *reinterpret_cast<float2*>(&s_acc[warp][row_a][col]) = make_float2(o[dt][0], o[dt][1]);
      *reinterpret_cast<float2*>(&s_acc[warp][row_b][col]) = make_float2(o[dt][2], o[dt][3]);
    }
  }
  __syncthreads();
  for (int i = tid; i < heads_here * kHeadDim; i += kThreads) {
    const int h = i / kHeadDim, d = i - h * kHeadDim;
    float max_m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max_m = fmaxf(max_m, s_m[w][h]);
    float sum_l = 0.0f, out = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = s_m[w][h] == -INFINITY ? 0.0f : exp2f(s_m[w][h] - max_m);
      sum_l += s_l[w][h] * weight;
      out += s_acc[w][h][acc_column(d)] * weight;
    }
    float value = out / sum_l;
    // Values widened by integer operations are 2^-8 times their values (F8x4ToF16).
    if constexpr (kF8) value *= kValuesByInteger ? 256.0f * a.out_scale : a.out_scale;
    if (plan.num_splits == 1) {
      output[i] = FromFloat<T>(value);
    } else {
      const int64_t index = (int64_t{seq} * a.num_heads + head0 + h) * a.max_splits + split;
      a.partial_out[index * kHeadDim + d] = value;
      if (d == 0) a.partial_lse[index] = max_m + log2f(sum_l);
    }
  }
}

// grid (num_heads, num_seqs): merges a sequence's splits, weighting each by exp2(lse - max lse).
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) DecodeCombineKernel(DecodeArgs a, int head_dim) {
  constexpr int kThreads = kCombineThreads;
  __shared__ float s_weight[kDecodeMaxSplits];
  __shared__ float scratch[32];
  const int head = blockIdx.x, seq = blockIdx.y;
  const int context_len = a.context_lens[seq];  // a step input
  const DecodeSplit plan =
      DecodeSplitPlan(context_len - DecodeFirstKey(context_len, a.window), a.max_splits);
  BeginDependentKernel();
  if (plan.num_splits <= 1) return;
  const int64_t base = (int64_t{seq} * a.num_heads + head) * a.max_splits;
  T* output = static_cast<T*>(a.output) + (int64_t{seq} * a.num_heads + head) * head_dim;
  // With few splits and a dimension a thread, each thread's partial values are requested with the
  // log-sum-exps, before the reductions: one round trip to memory.
  constexpr int kEarly = 32;
  const bool early = plan.num_splits <= kEarly && head_dim <= kThreads;
  float early_values[kEarly];
  if (early && threadIdx.x < head_dim) {
    const float* partial = a.partial_out + base * head_dim + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kEarly; ++i) {
      early_values[i] = i < plan.num_splits ? partial[i * head_dim] : 0.0f;
    }
  }
  const float lse = threadIdx.x < plan.num_splits ? a.partial_lse[base + threadIdx.x] : -INFINITY;
  const float max_lse = BlockMax(lse, scratch);
  const float w = threadIdx.x < plan.num_splits ? exp2f(lse - max_lse) : 0.0f;
  if (threadIdx.x < plan.num_splits) s_weight[threadIdx.x] = w;
  const float inv_total = 1.0f / BlockSum(w, scratch);  // BlockSum's barriers publish s_weight
  if (early) {
    if (threadIdx.x < head_dim) {
      float out = 0.0f;
#pragma unroll
      for (int i = 0; i < kEarly; ++i) {
        if (i < plan.num_splits) out += s_weight[i] * early_values[i];
      }
      output[threadIdx.x] = FromFloat<T>(out * inv_total);
    }
    return;
  }
  // kUnroll partial results in flight per thread: the loads do not wait on one another.
  constexpr int kUnroll = 8;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    const float* partial = a.partial_out + base * head_dim + d;
    float sums[kUnroll] = {};
    int i = 0;
    for (; i + kUnroll <= plan.num_splits; i += kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = partial[(i + u) * head_dim];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sums[u] += s_weight[i + u] * v[u];
    }
    for (; i < plan.num_splits; ++i) sums[0] += s_weight[i] * partial[i * head_dim];
    float out = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out += sums[u];
    output[d] = FromFloat<T>(out * inv_total);
  }
}

// Blocks of one warp where a launch has at least this many blocks a multiprocessor (DecodeWarps;
// 1,024 sequences of 8 KV heads are 62 on an H100, 256 are 15.5).
constexpr int kDecodeOneWarpBlocks = 48;

// Whether a launch of `blocks` blocks a split on `sms` multiprocessors is large enough for blocks
// of one warp (kDecodeOneWarpBlocks).
bool TakesOneWarpBlocks(int64_t blocks, int sms) {
  return sms > 0 && blocks >= int64_t{kDecodeOneWarpBlocks} * sms;
}

// SetDecodeWarps' setting (0: chosen).
std::atomic<int> forced_warps{0};

// Warps per block (DecodeShape): 2 where a block of 4 (`four_warp_bytes` of shared memory) would
// not fit the current device's limit; else SetDecodeWarps' 1, 2 or 4 where set; else 1 where
// `blocks` (a launch's blocks per split) are kDecodeOneWarpBlocks a multiprocessor or more, 2
// where they fill the device without splits at 4 of them a multiprocessor, 4 otherwise.
int DecodeWarps(int64_t blocks, int sms, int four_warp_bytes) {
  const int max_bytes = CurrentMaxSharedMemoryPerBlock();
  if (max_bytes > 0 && four_warp_bytes > max_bytes) return 2;
  if (const int forced = forced_warps.load(); forced == 1 || forced == 2 || forced == 4) {
    return forced;
  }
  if (TakesOneWarpBlocks(blocks, sms)) return 1;
  return sms > 0 && blocks >= static_cast<int64_t>(0.85 * 4 * sms) ? 2 : 4;
}

// FP8 tiles by bulk copies on Hopper (SetDecodeF8BulkCopies), else by cp.async.
std::atomic<bool> f8_bulk_copies{false};
// How FP8 tiles are widened (SetDecodeF8Widening).
std::atomic<DecodeF8Widening> f8_widening{DecodeF8Widening::kConvert};

// DecodeWarps for a head dim, path and cache type.
template <int kHeadDim, bool kF8>
int DecodeWarpsFor(bool bulk, int64_t blocks, int sms) {
  return DecodeWarps(blocks, sms,
                     bulk ? DecodeShape<kHeadDim, 4, true, kF8>::kSmemBytes
                          : DecodeShape<kHeadDim, 4, false, kF8>::kSmemBytes);
}

// f(std::bool_constant<cache_fp8>{}).
template <typename F>
cudaError_t DispatchCacheFp8(bool cache_fp8, F&& f) {
  return cache_fp8 ? f(std::true_type{}) : f(std::false_type{});
}

// f(warps, bulk) with both as compile-time constants (std::integral_constant).
template <typename F>
cudaError_t DispatchWarpsAndPath(int warps, bool bulk, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if (warps == 1) return bulk ? f(One{}, std::true_type{}) : f(One{}, std::false_type{});
  if (warps == 2) return bulk ? f(Two{}, std::true_type{}) : f(Two{}, std::false_type{});
  return bulk ? f(Four{}, std::true_type{}) : f(Four{}, std::false_type{});
}

}  // namespace

void SetDecodeF8BulkCopies(bool on) { f8_bulk_copies.store(on); }
void SetDecodeF8Widening(DecodeF8Widening widening) { f8_widening.store(widening); }
void SetDecodeWarps(int warps) { forced_warps.store(warps); }

int DecodeAttentionParams::ChooseMaxSplits(int64_t num_seqs, int64_t num_heads,
                                           int64_t num_kv_heads, int64_t head_dim, DType dtype,
                                           double min_waves, bool cache_fp8) {
  if (num_seqs <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return 1;
  const int64_t group_size = num_heads / num_kv_heads;
  const int sms = CurrentMultiprocessorCount();
  if (sms <= 0) return 1;
  const int64_t blocks = num_seqs * num_kv_heads * CeilDiv(group_size, kDecodeRows);
  // A launch large enough for one-warp blocks (DecodeWarps) fills the device many times over
  // without splits, and a split would only add the combine. (The waves' filling below could
  // otherwise ask for 2 splits of a 16-bit cache's launch of 6.2 waves.)
  if (TakesOneWarpBlocks(blocks, sms)) return 1;
  int resident = 0;
  const bool bulk = UseHopperKernels() && (!cache_fp8 || f8_bulk_copies.load());
  const cudaError_t status = DispatchActivationDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchHeadDim(head_dim, [&](auto head_dim_constant) {
      constexpr int kHeadDim = decltype(head_dim_constant)::value;
      return DispatchCacheFp8(cache_fp8, [&](auto f8_constant) {
        constexpr bool kF8 = decltype(f8_constant)::value;
        const int warps = DecodeWarpsFor<kHeadDim, kF8>(bulk, blocks, sms);
        return DispatchWarpsAndPath(warps, bulk, [&](auto warps_constant, auto bulk_constant) {
          using Shape = DecodeShape<kHeadDim, decltype(warps_constant)::value,
                                    decltype(bulk_constant)::value, kF8>;
          auto kernel = DecodeAttentionKernel<T, kHeadDim, Shape::kWarps, Shape::kBulk, kF8>;
          LMSERVE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
          return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, Shape::kThreads,
                                                               Shape::kSmemBytes);
        });
      });
    });
  });
  if (status != cudaSuccess || resident <= 0) {
    cudaGetLastError();
    resident = 2;
  }
  // An FP8 cache's blocks take half the shared memory, so more of them fit (6 of 2 warps on an
  // H100 at head dim 128), but a launch of one wave of as many blocks as bf16's (4 a
  // multiprocessor) streams faster than two waves of 6: at batch 64 x 4096 keys on an H100, 1
  // split (0.65 of a wave of 6) took 217.5 us, 2 splits 273, 3 splits (1.94 waves) 228
  // (bench/results section 17.3).
  if (cache_fp8) resident = std::min(resident, 4);
  const double slots = static_cast<double>(sms) * resident * std::max(1.0, min_waves);
  int best = 1;
  double best_efficiency = 0;
  for (int splits = 1; splits <= kDecodeMaxSplits; ++splits) {
    const double waves = static_cast<double>(blocks) * splits / slots;
    if (waves < 0.85) continue;
    const double efficiency = waves / std::ceil(waves);  // the last wave's filling
    if (efficiency >= 0.9) return splits;
    if (efficiency > best_efficiency) best = splits, best_efficiency = efficiency;
  }
  return best_efficiency > 0 ? best : kDecodeMaxSplits;
}

cudaError_t Launch(const DecodeAttentionParams& p, cudaStream_t stream) {
  static_assert(kDecodeMaxSplits <= kCombineThreads, "the combine kernel holds a split per thread");
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  const int64_t group_size = p.num_heads / p.num_kv_heads;
  DecodeArgs a{};
  a.query = p.query;
  a.key_cache = p.key_cache;
  a.value_cache = p.value_cache;
  a.context_lens = p.context_lens;
  a.block_table_start = p.block_table_start;
  a.block_table_ids = p.block_table_ids;
  a.output = p.output;
  if (p.max_splits > 1) {
    a.partial_out = static_cast<float*>(p.workspace);
    a.partial_lse = a.partial_out + p.num_seqs * p.num_heads * p.max_splits * p.head_dim;
  }
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(p.num_kv_heads);
  a.group_size = static_cast<int>(group_size);
  a.block_size = static_cast<int>(p.block_size);
  a.max_splits = p.max_splits;
  a.query_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * p.head_dim;
  a.window = p.window;
  constexpr float kLog2e = 1.4426950408889634f;
  if (p.softcap > 0) {
    a.score_scale = p.scale / p.softcap;
    a.cap_log2 = p.softcap * kLog2e;
  } else {
    a.score_scale = p.scale * kLog2e;
    a.cap_log2 = 0.0f;
  }
  const int sms = CurrentMultiprocessorCount();
  const bool bulk = UseHopperKernels() && (!p.cache_fp8 || f8_bulk_copies.load());
  return DispatchActivationDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.cache_fp8) {
      a.score_scale *= p.k_scale;
      a.out_scale = p.v_scale;
    }
    return DispatchHeadDim(p.head_dim, [&](auto head_dim_constant) {
      constexpr int kHeadDim = decltype(head_dim_constant)::value;
      return DispatchCacheFp8(p.cache_fp8, [&](auto f8_constant) {
      constexpr bool kF8 = decltype(f8_constant)::value;
      a.head_chunks = static_cast<int>(CeilDiv(group_size, kDecodeRows));
      const int64_t blocks = p.num_kv_heads * a.head_chunks * p.num_seqs;
      const int warps = DecodeWarpsFor<kHeadDim, kF8>(bulk, blocks, sms);
      return DispatchWarpsAndPath(warps, bulk, [&](auto warps_constant, auto bulk_constant) {
        using Shape = DecodeShape<kHeadDim, decltype(warps_constant)::value,
                                  decltype(bulk_constant)::value, kF8>;
        const dim3 grid(p.max_splits, static_cast<unsigned>(p.num_kv_heads * a.head_chunks),
                        static_cast<unsigned>(p.num_seqs));
        auto kernel = DecodeAttentionKernel<T, kHeadDim, Shape::kWarps, Shape::kBulk, kF8>;
        if constexpr (kF8 && kHeadDim == 128 && !Shape::kBulk) {
          constexpr int kWarpCount = Shape::kWarps;
          switch (f8_widening.load()) {
            case DecodeF8Widening::kInteger:
              kernel = DecodeAttentionKernel<T, kHeadDim, kWarpCount, false, true,
                                             static_cast<int>(DecodeF8Widening::kInteger)>;
              break;
            case DecodeF8Widening::kConvertKeys:
              kernel = DecodeAttentionKernel<T, kHeadDim, kWarpCount, false, true,
                                             static_cast<int>(DecodeF8Widening::kConvertKeys)>;
              break;
            case DecodeF8Widening::kConvert:
              break;
          }
        }
        LMSERVE_CUDA_RETURN_IF_ERROR(
            SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), Shape::kSmemBytes));
        LMSERVE_CUDA_RETURN_IF_ERROR(
            LaunchKernel(kernel, grid, Shape::kThreads, Shape::kSmemBytes, stream, a));
        if (p.max_splits <= 1) return cudaSuccess;
        const dim3 combine_grid(static_cast<unsigned>(p.num_heads),
                                static_cast<unsigned>(p.num_seqs));
        return LaunchKernel(DecodeCombineKernel<T>, combine_grid, kCombineThreads, 0, stream, a,
                            static_cast<int>(kHeadDim));
      });
      });
    });
  });
}

}  // namespace lmserve::kernels::cuda
