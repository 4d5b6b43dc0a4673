// Paged decode attention on the GPU: one query token per sequence, attending to every position of
// its context through its block table (CPU twin: kernels/cpu/paged_attention.h with one query token
// per sequence). With a sliding window the token attends to its last `window` positions only, and
// only their blocks are read: the splits divide the window's keys, so the cost follows the window,
// not the context, and table entries of blocks wholly before the window (which may be -1) are
// never read. An optional soft-cap bounds the scores (Gemma 2).
//
// Work decomposition: a thread block per (split, KV head, sequence) reads its KV head once for the
// whole query group (GQA/MQA; the group's heads are the 16 rows of tensor-core tiles, larger groups
// take a block per 16 heads). Long contexts are split along the keys (flash-decoding): the number
// of splits of a sequence is chosen on the device from its length (DecodeSplitPlan), at most
// max_splits; blocks past a sequence's splits exit at once, and a second kernel merges the splits'
// partial results by their log-sum-exp. The launch configuration depends on num_seqs, the head
// counts and max_splits only, so one configuration (and one captured CUDA graph) serves every
// context length.
//
// Inside a block, each warp streams its own tiles of 16 keys through a cp.async ring in shared
// memory (no block barrier in the loop), computes the group's scores and weighted values with
// mma.sync, and keeps its own online softmax; the warps merge at the end. bf16 or fp16 query,
// cache and output; fp32 scores, softmax and accumulation.
//
// FP8 cache (cache_fp8; fp8_cache.cuh): the ring holds the tiles' E4M3 bytes (half the bytes
// streamed from memory); each lane reads its tensor-core operands' bytes straight from the ring
// and widens them in registers to fp16 (exactly: E4M3 values are fp16 values), and the products
// run in fp16 (a bf16 query scaled by a power of two a row into fp16's range); the keys' scale is
// folded into the score scale, the values' into the output.

#ifndef LMSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_
#define LMSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

// Tokens a split covers at least, and the granularity of split boundaries.
inline constexpr int kDecodeMinSplitTokens = 64;
inline constexpr int kDecodeSplitAlign = 64;
inline constexpr int kDecodeMaxSplits = 128;

// The splits of a sequence's `context_len` keys (the keys in its window, where it has one):
// num_splits blocks of chunk_len keys (the last one shorter). Host and device compute it
// identically.
struct DecodeSplit {
  int num_splits;
  int chunk_len;
};
#ifdef __CUDACC__
__host__ __device__
#endif
    inline DecodeSplit
    DecodeSplitPlan(int context_len, int max_splits) {
  if (context_len <= 0) return {0, 0};
  int splits = (context_len + kDecodeMinSplitTokens - 1) / kDecodeMinSplitTokens;
  splits = splits < max_splits ? splits : max_splits;
  splits = splits < 1 ? 1 : splits;
  int chunk = (context_len + splits - 1) / splits;
  chunk = (chunk + kDecodeSplitAlign - 1) / kDecodeSplitAlign * kDecodeSplitAlign;
  return {(context_len + chunk - 1) / chunk, chunk};
}

struct DecodeAttentionParams {
  const void* query = nullptr;  // [num_seqs, num_heads, head_dim], row stride query_stride; device
  const void* key_cache = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]; device
  const void* value_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]; device
  const int32_t* context_lens = nullptr;       // [num_seqs]: keys to attend to; device. A
                                               // sequence with 0 keys gets a zero output.
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1] (CSR offsets); device
  const int32_t* block_table_ids = nullptr;    // block ids, each in [0, num_blocks) (or -1 for
                                               // a block wholly before the window); device
  void* output = nullptr;     // [num_seqs, num_heads, head_dim], contiguous; device
  void* workspace = nullptr;  // WorkspaceBytes(...) bytes, 16-byte aligned; device; null if 0
  int64_t num_seqs = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // divides num_heads
  int64_t head_dim = 0;      // 32, 64, 80, 96, 128 or 256
  int64_t block_size = 0;    // tokens per cache block
  int64_t num_blocks = 0;
  int64_t query_stride = 0;  // elements between query rows, multiple of 8; 0: num_heads * head_dim
  int max_splits = 1;        // in [1, kDecodeMaxSplits]; ChooseMaxSplits() picks one
  float scale = 0;           // score multiplier, usually 1 / sqrt(head_dim)
  int32_t window = 0;  // > 0: the token at position p attends to (p - window, p]; 0: to [0, p]
  float softcap = 0;   // > 0: scores are softcap * tanh(scale * q.k / softcap); 0: none
  DType dtype = DType::kBF16;  // of query, caches (unless cache_fp8) and output: kBF16 or kF16
  // The caches hold FP8 E4M3 bytes: key = k_scale * E4M3 value, value = v_scale * E4M3 value
  // (QkvPostProcessParams::cache_fp8 writes them).
  bool cache_fp8 = false;
  float k_scale = 1.0f;  // > 0, finite
  float v_scale = 1.0f;  // > 0, finite

  // Scratch for the split partial results.
  static int64_t WorkspaceBytes(int64_t num_seqs, int64_t num_heads, int64_t head_dim,
                                int max_splits);
  // A split cap for this batch shape on the current device: the smallest that fills the
  // multiprocessors in whole waves (blocks resident at once, from the kernel's occupancy), or 1.
  // Lengths are not needed: shorter contexts take fewer splits on the device. `min_waves` (a
  // tuning knob for benchmarks; at least 1) asks for at least that many waves. `cache_fp8`: the
  // FP8 cache's kernel (its shared memory differs; at most 4 of its blocks a multiprocessor are
  // counted, as many as bf16's fit: one wave of them streamed faster than two of more).
  static int ChooseMaxSplits(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_dim, DType dtype, double min_waves = 1.0,
                             bool cache_fp8 = false);

  absl::Status Validate() const;  // shapes and pointers; the lengths and tables live on the device
};

cudaError_t Launch(const DecodeAttentionParams& params, cudaStream_t stream);

// How an FP8 cache's tiles reach shared memory on the Hopper path: by cp.async in 16-byte pieces
// (the default, as on the portable path) or, on, by a bulk copy a row as the 16-bit caches'. A
// bulk copy a row moves 128 bytes of an E4M3 row at head dim 128 against bf16's 256, and the
// copies' count, not their bytes, looked like their bound (an H100, batch 64 x 4096 keys: 342 us,
// 52% of the copy bandwidth, 87% of bf16's time; bench/results section 17.2). With the fragments
// widened in registers (section 17.3) the bulk copies took 267 us at 1 split and 241 at 3,
// against the cp.async pieces' 217.5 and 228. Process-wide (an atomic read at each launch); for
// benchmarks and tests.
void SetDecodeF8BulkCopies(bool on);

// How an FP8 cache's bytes are widened to fp16 in registers where the device converts E4M3
// itself (sm_89+; elsewhere always by integer operations): by its conversion instructions (one a
// pair of values), by integer operations (four a pair: the bits moved, the 2^8 they lack applied
// to the scores and the output), or the keys by instruction and the values by integer operations
// (their work on different units). The last two at head dim 128 on the cp.async path only
// (elsewhere the setting changes nothing). Process-wide, as SetDecodeF8BulkCopies; for the
// benchmark's comparison.
enum class DecodeF8Widening { kConvert, kInteger, kConvertKeys };
void SetDecodeF8Widening(DecodeF8Widening widening);

// Warps a block: 0 (the default) chooses (4; 2 where the launch has blocks enough to fill the
// device without splits; 1 where it has several times that); 1, 2 or 4 forces it where the shared
// memory allows. Process-wide, as SetDecodeF8BulkCopies; for the benchmark's comparison and tests.
void SetDecodeWarps(int warps);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_DECODE_ATTENTION_H_
