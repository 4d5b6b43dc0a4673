// Prefill attention over the paged KV cache on the GPU, for a ragged batch (CPU twin:
// kernels/cpu/paged_attention.h). Causal: sequence i's query_lens[i] tokens sit at positions
// [context_lens[i] - query_lens[i], context_lens[i]), so a query may start mid-sequence (prefix
// cache hits, chunked prefill); decode tokens (one query token) may be mixed in. The new tokens' K
// and V must already be in the cache (QkvPostProcess writes them).
//
// Flash-attention tiling on the tensor cores (mma.sync m16n8k16, fp32 accumulation): a thread
// block of 4 warps takes PrefillBlockRows(head_dim) query rows of one head and walks the key tiles
// up to the diagonal (with a sliding window, from the first tile any of its rows' windows reaches:
// tiles wholly outside every row's window are skipped, as are those above the diagonal, and table
// entries before the window, which may be -1, are never read), gathering K and V tiles from the
// cache blocks with cp.async into double-buffered shared memory; online softmax in fp32 registers,
// after an optional soft-cap of the scores (Gemma 2). Which block takes which (sequence, query
// tile) comes from a tile plan computed on the device from query_start, so the launch
// configuration depends on num_tokens and num_seqs only. On Hopper a second kernel takes the
// common shapes (PrefillKernelKind below); both read the same plan.

#ifndef LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
#define LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

// Query rows per thread block of the mma.sync kernel: 4 warps of 32 rows, or of 16 rows for head
// dim 256 (the Hopper kernel's: kPrefillSm90BlockRows, prefill_attention_sm90.h).
constexpr int PrefillBlockRows(int64_t head_dim) { return head_dim <= 128 ? 128 : 64; }

struct PrefillAttentionParams {
  const void* query = nullptr;  // [num_tokens, num_heads, head_dim], row stride query_stride; device
  const void* key_cache = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]; device
  const void* value_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]; device
  const int32_t* query_start = nullptr;   // [num_seqs + 1], query_start[num_seqs] = num_tokens;
                                          // device
  const int32_t* context_lens = nullptr;  // [num_seqs], >= each query length; device
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1] (CSR offsets); device
  const int32_t* block_table_ids = nullptr;    // block ids, each in [0, num_blocks) (or -1 for
                                               // a block wholly before every query's window);
                                               // device
  void* output = nullptr;     // [num_tokens, num_heads, head_dim], contiguous; device
  void* workspace = nullptr;  // WorkspaceBytes(num_seqs) bytes: the tile plan; device
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // divides num_heads
  int64_t head_dim = 0;      // 32, 64, 80, 96, 128 or 256
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  int64_t query_stride = 0;  // elements between query rows, multiple of 8; 0: num_heads * head_dim
  float scale = 0;           // score multiplier, usually 1 / sqrt(head_dim)
  int32_t window = 0;  // > 0: the token at position p attends to (p - window, p]; 0: to [0, p]
  float softcap = 0;   // > 0: scores are softcap * tanh(scale * q.k / softcap); 0: none
  DType dtype = DType::kBF16;  // of query, caches (unless cache_fp8) and output: kBF16 or kF16
  // The caches hold FP8 E4M3 bytes: key = k_scale * E4M3 value, value = v_scale * E4M3 value
  // (fp8_cache.cuh). Both kernels stage each tile's bytes in a buffer of their own (cp.async, or
  // TMA on Hopper) and widen them into the 16-bit K and V tiles their products read.
  bool cache_fp8 = false;
  float k_scale = 1.0f;  // > 0, finite
  float v_scale = 1.0f;  // > 0, finite
  // The workspace already holds this batch's tile plan (LaunchPrefillPlan ran after the batch's
  // query_start was last written, for params that choose the same kernel): Launch skips
  // recomputing it. Plan once per step, run per layer.
  bool plan_ready = false;

  static int64_t WorkspaceBytes(int64_t num_seqs) { return (num_seqs + 1) * 4; }

  absl::Status Validate() const;  // shapes and pointers; the lengths and tables live on the device
};

// The two kernels behind Launch. kWgmmaSm90 (prefill_attention_sm90.h): FlashAttention-3's
// manner, TMA producer warps and two wgmma consumer warpgroups, head dims 64/80/96/128/256
// (windows, soft-caps and FP8 caches included, but FP8 at 256), on a compute capability 9.0 GPU
// on the Hopper kernel path (UseHopperKernels()). kMmaSync (this file's): everything else (head
// dim 32, FP8 at 256, block sizes the TMA boxes do not fit), and the portable path.
enum class PrefillKernelKind : uint8_t { kMmaSync, kWgmmaSm90 };
// Which kernel Launch runs for these (valid) params on the current device and kernel path.
PrefillKernelKind ChoosePrefillKernel(const PrefillAttentionParams& params);

// Computes the tile plan into params.workspace (one small kernel).
cudaError_t LaunchPrefillPlan(const PrefillAttentionParams& params, cudaStream_t stream);
// The plan (unless params.plan_ready), then the attention.
cudaError_t Launch(const PrefillAttentionParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_H_
