// Causal attention over a paged KV cache, for a ragged batch of sequences; and the write of new
// tokens' keys and values into their cache slots.
//
// Cache layout, per layer: key_cache and value_cache are [num_blocks, block_size, num_kv_heads,
// head_dim], fp32. A slot is block_id * block_size + offset. Sequence i's block table is
// block_table_ids[block_table_start[i] .. block_table_start[i+1]); its block j holds positions
// [j * block_size, (j + 1) * block_size).
//
// Sequence i has query_lens[i] = query_start[i+1] - query_start[i] new tokens at positions
// [context_lens[i] - query_lens[i], context_lens[i]); all of its keys and values up to
// context_lens[i] are in the cache (write the new ones first). The query token at position p of
// head h attends to positions [0, p] of KV head h / (num_heads / num_kv_heads) (GQA; MQA when
// num_kv_heads is 1), with scores q.k * scale and an fp32 softmax that subtracts the row maximum.
//
// Sliding window (window > 0, Hugging Face's sliding_window): the token at position p attends to
// positions (p - window, p] only, the last `window` positions including its own. The keys before
// the window are never read: a block-table entry for a block that lies wholly before the first key
// any of the sequence's query tokens can see (position context_lens[i] - query_lens[i] - window
// + 1) may be -1 (the engine frees blocks that left the window).
//
// Score soft-cap (softcap > 0, Gemma 2's attn_logit_softcapping): each score is
// softcap * tanh(q.k * scale / softcap), before the causal/window mask and the softmax.

#ifndef LMSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
#define LMSERVE_KERNELS_CPU_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct PagedAttentionParams {
  const float* query = nullptr;        // [num_tokens, num_heads, head_dim], row stride query_stride
  const float* key_cache = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]
  const float* value_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]
  const int32_t* query_start = nullptr;        // [num_seqs + 1], query_start[0] = 0
  const int32_t* context_lens = nullptr;       // [num_seqs]
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1], block_table_start[0] = 0
  const int32_t* block_table_ids = nullptr;    // [block_table_start[num_seqs]], in [0, num_blocks)
                                               // (or -1 before the window: see above)
  float* output = nullptr;                     // [num_tokens, num_heads, head_dim], contiguous
  float* workspace = nullptr;  // [WorkspaceFloats(max_context_len, num_heads, num_kv_heads,
                               //  num_threads)]: softmax scratch
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;  // query_start[num_seqs]
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;     // divides num_heads
  int64_t head_dim = 0;         // even, at most kMaxHeadDim
  int64_t block_size = 0;       // tokens per block
  int64_t num_blocks = 0;       // blocks in the cache
  int64_t query_stride = 0;     // elements between query rows; 0 means num_heads * head_dim
  int64_t max_context_len = 0;  // >= every context_lens[i]; sizes the workspace
  float scale = 0;              // score multiplier, usually 1 / sqrt(head_dim)
  int32_t window = 0;           // sliding window in positions (> 0), or 0: every earlier position
  float softcap = 0;            // score soft-cap (> 0), or 0: none
  int num_threads = 1;          // threads to split (sequence, KV head, query rows) work across

  static constexpr int64_t kMaxHeadDim = 1024;

  // Floats of workspace the kernel needs.
  static int64_t WorkspaceFloats(int64_t max_context_len, int64_t num_heads, int64_t num_kv_heads,
                                 int num_threads);

  // Checks the shapes and the batch metadata: monotone starts, 1 <= query_lens[i] <=
  // context_lens[i] <= max_context_len, block tables covering every context, block ids in range
  // (or -1 for blocks wholly before the window of every query token of the sequence).
  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void PagedAttention(const PagedAttentionParams& params);

struct WriteKvCacheParams {
  const float* key = nullptr;    // [num_tokens, num_kv_heads, head_dim], row stride key_stride
  const float* value = nullptr;  // [num_tokens, num_kv_heads, head_dim], row stride value_stride
  const int64_t* slot_mapping = nullptr;  // [num_tokens]: slot of each token, in [0, num_blocks *
                                          // block_size)
  float* key_cache = nullptr;             // [num_blocks, block_size, num_kv_heads, head_dim]
  float* value_cache = nullptr;           // [num_blocks, block_size, num_kv_heads, head_dim]
  int64_t num_tokens = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  int64_t key_stride = 0;    // 0 means num_kv_heads * head_dim
  int64_t value_stride = 0;  // 0 means num_kv_heads * head_dim

  // Checks the shapes and every slot.
  absl::Status Validate() const;
};

// Copies each token's keys and values into its slot. REQUIRES: params.Validate().ok() (checked).
void WriteKvCache(const WriteKvCacheParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
