// Paged causal attention in fp32 on the CUDA cores, for a ragged batch that mixes prefill and
// decode tokens (CPU twin: kernels/cpu/paged_attention.h). The runner's float32 mode takes it for
// every attention, decode steps included: DecodeAttention and PrefillAttention multiply on the
// tensor cores in 16 bits.
//
// Semantics, as the CPU twin's: sequence i's query_lens[i] = query_start[i + 1] - query_start[i]
// tokens sit at positions [context_lens[i] - query_lens[i], context_lens[i]), so a query may start
// mid-sequence (prefix-cache hits, chunked prefill); the token at position p attends to positions
// [0, p] of its KV head (GQA: head h reads KV head h / (num_heads / num_kv_heads)), or to
// (p - window, p] with a sliding window (only those keys are read: table entries wholly before
// the window may be -1), its scores soft-capped where softcap > 0. Every key and
// value, the new tokens' included, is read from the cache through the block tables (QkvPostProcess
// writes the new ones first). A sequence with fewer keys than query tokens (a decode graph's
// padding: context 0) gets zeros for the tokens that see no key.
//
// Work: a thread block of kPagedAttentionF32Warps warps per (query token, query head). The warps
// take the keys in turn (warp w: keys w, w + warps, ...); for each key the warp's lanes split the
// head's dimensions, a warp sum gives the score, and the warp keeps an online softmax (running
// maximum, sum of exponentials, weighted sum of values) in fp32 with expf. The warps' partial
// results are merged at the end by their maxima. The token's sequence is found by binary search
// in query_start, so there is no plan and no workspace, and the launch configuration depends on
// num_tokens and num_heads only: one captured CUDA graph serves a decode bucket at any lengths.
// Not fast (one key per warp step; each query head reads its KV head again): correct and clear.

#ifndef LMSERVE_KERNELS_CUDA_PAGED_ATTENTION_F32_H_
#define LMSERVE_KERNELS_CUDA_PAGED_ATTENTION_F32_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int kPagedAttentionF32Warps = 4;

struct PagedAttentionF32Params {
  const void* query = nullptr;  // [num_tokens, num_heads, head_dim] fp32, row stride query_stride;
                                // device
  const void* key_cache = nullptr;        // [num_blocks, block_size, num_kv_heads, head_dim] fp32;
                                          // device
  const void* value_cache = nullptr;      // [num_blocks, block_size, num_kv_heads, head_dim] fp32;
                                          // device
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[0] = 0,
                                          // query_start[num_seqs] = num_tokens; device
  const int32_t* context_lens = nullptr;  // [num_seqs]; device
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1] (CSR offsets); device
  const int32_t* block_table_ids = nullptr;    // block ids, each in [0, num_blocks) (or -1 for
                                               // a block wholly before the window); device
  void* output = nullptr;  // [num_tokens, num_heads, head_dim] fp32, contiguous; device
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;     // at most 65535
  int64_t num_kv_heads = 0;  // divides num_heads
  int64_t head_dim = 0;      // 1 .. kMaxHeadDim
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  int64_t query_stride = 0;   // elements between query rows; 0: num_heads * head_dim
  float scale = 0;            // score multiplier, usually 1 / sqrt(head_dim)
  int32_t window = 0;  // > 0: the token at position p attends to (p - window, p]; 0: to [0, p]
  float softcap = 0;   // > 0: scores are softcap * tanh(scale * q.k / softcap); 0: none
  DType dtype = DType::kF32;  // of query, caches and output: kF32 only (the 16-bit types go to
                              // DecodeAttention / PrefillAttention)

  static constexpr int64_t kMaxHeadDim = 256;

  absl::Status Validate() const;  // shapes and pointers; the lengths and tables live on the device
};

// Returns cudaErrorInvalidValue when Validate() fails, else the launch's error.
cudaError_t Launch(const PagedAttentionF32Params& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_PAGED_ATTENTION_F32_H_
