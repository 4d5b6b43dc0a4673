// QKV post-processing on the GPU, in one kernel for a batch that mixes prefill and decode tokens
// (CPU twin: kernels/cpu/qkv_postprocess.h), in this order: optional q/k/v bias, optional per-head
// RMSNorm of the query and key heads (Qwen3, Gemma 3), rotary embedding of the first rotary_dim
// dimensions of each query and key head (partial rotary: the others pass through), the write of Q
// to its own buffer and of K and V into each token's slot of the paged KV cache.
//
// Rotary scaling (default, linear, llama3, longrope, explicit GGUF factors) lives in the inverse
// frequencies the engine computes and in the attention factor; the kernel reads the fp32 cos/sin
// table that RotaryCosSinTable (kernels/cpu/qkv_postprocess.h) builds from them once at start-up.
// Positions and slots are read from device memory, so one launch configuration serves every batch
// of the same token count.
//
// Work: 16 contiguous elements of one head of one token per thread (two 8-element loads and
// stores); a head's threads are consecutive lanes of one warp (head_dim / 16 of them, padded to a
// power of two), which sum the norm's squares with shuffles; a rotary partner is in the same
// lane (interleaved pairs), a shuffle away (split halves whose half is a multiple of 16), or
// exchanged through shared memory (other partial rotaries). bf16, fp16 or fp32 in and out, fp32
// math. With fp32 the rotation and the norm
// round each product and sum on their own (no fused multiply-adds) and the norm sums its squares
// in double, as the CPU twin does: the results are the CPU's bit for bit (up to the order of the
// double sum of squares, which decides a rounding about once in 10^8 heads).

#ifndef LMSERVE_KERNELS_CUDA_QKV_POSTPROCESS_H_
#define LMSERVE_KERNELS_CUDA_QKV_POSTPROCESS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/rotary.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int64_t kQkvMaxHeadDim = 512;

struct QkvPostProcessParams {
  const void* qkv = nullptr;   // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], row
                               // stride qkv_stride: query heads, key heads, value heads; device
  const void* bias = nullptr;  // [(num_heads + 2 * num_kv_heads) * head_dim] or null; device
  const int32_t* positions = nullptr;  // [num_tokens]; device. Clamped to [0, max_position).
  const float* cos_sin = nullptr;  // [max_position, rotary_dim] (RotaryCosSinTable); device;
                                   // null: no rotary embedding
  const void* q_norm = nullptr;  // [head_dim]: the query heads' RMSNorm weight; device; null: none
  const void* k_norm = nullptr;  // [head_dim]: the key heads' RMSNorm weight; device; null iff
                                 // q_norm is
  const int64_t* slot_mapping = nullptr;  // [num_tokens]: cache slot; negative: no write (padding);
                                          // device
  void* query_out = nullptr;  // [num_tokens, num_heads, head_dim], row stride query_out_stride;
                              // device; may be qkv itself (query_out_stride = qkv_stride)
  void* key_cache = nullptr;    // [num_blocks, block_size, num_kv_heads, head_dim]; device
  void* value_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim]; device
  // The caches hold FP8 E4M3 bytes (fp8_cache.cuh): a key x is stored as E4M3(x * (1 / k_scale)),
  // a value as E4M3(x * (1 / v_scale)), rounded to nearest even and saturated at +-448. Only with
  // dtype kBF16 or kF16.
  bool cache_fp8 = false;
  float k_scale = 1.0f;  // > 0
  float v_scale = 1.0f;  // > 0
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // multiple of 16, at most kQkvMaxHeadDim
  int64_t rotary_dim = 0;  // dimensions of a head that rotate: even, <= head_dim; 0: head_dim
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  int64_t qkv_stride = 0;        // multiple of 8; 0 means (num_heads + 2 * num_kv_heads) * head_dim
  int64_t query_out_stride = 0;  // multiple of 8; 0 means num_heads * head_dim
  int64_t max_position = 0;      // rows of cos_sin
  RotaryLayout layout = RotaryLayout::kHalfSplit;
  float norm_epsilon = 1e-6f;  // of q_norm and k_norm
  DType dtype = DType::kBF16;  // of qkv, bias, q_norm, k_norm, query_out and the caches (unless
                               // cache_fp8): kBF16, kF16 or kF32
  // qkv as an FP8 GEMM left it, unscaled (GemmPlan::Run's `unscaled`): each value is first
  // multiplied by qkv_row_scales[t] * qkv_col_scales[column] and rounded to bf16, as
  // F8ScaleOutput would have stored it. Both or neither; bf16 only.
  const float* qkv_row_scales = nullptr;  // [num_tokens]; device
  const float* qkv_col_scales = nullptr;  // [(num_heads + 2 * num_kv_heads) * head_dim]; device,
                                          // 16-byte aligned

  absl::Status Validate() const;
};

cudaError_t Launch(const QkvPostProcessParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_QKV_POSTPROCESS_H_
