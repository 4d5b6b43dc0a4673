// The attention block's input preparation, after the fused QKV projection, in this order: optional
// q/k/v bias, optional per-head RMSNorm of the query and key heads (Qwen3, Gemma 3: each head's
// head_dim values x * rsqrt(mean(x^2) + eps) * weight, as HeadRmsNorm computes them), rotary
// embedding of Q and K (partial: the first rotary_dim dimensions of each head), and the write of K
// and V into each token's slot of the paged KV cache. The CPU twin of the CUDA kernel in
// kernels/cuda/qkv_postprocess.h, built from the CPU kernels HeadRmsNorm, ApplyRotary and
// WriteKvCache.
//
// The fused projection's row holds the num_heads query heads, then the num_kv_heads key heads, then
// the num_kv_heads value heads, each head_dim wide.

#ifndef LMSERVE_KERNELS_CPU_QKV_POSTPROCESS_H_
#define LMSERVE_KERNELS_CPU_QKV_POSTPROCESS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/rotary.h"

namespace lmserve::kernels {

struct QkvPostProcessParams {
  const float* qkv = nullptr;   // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], row
                                // stride qkv_stride
  const float* bias = nullptr;  // [(num_heads + 2 * num_kv_heads) * head_dim], or null for none
  const int32_t* positions = nullptr;     // [num_tokens], >= 0
  const double* inv_freq = nullptr;       // [rotary_dim / 2], or null for no rotary embedding
  const float* q_norm = nullptr;  // [head_dim]: the query heads' RMSNorm weight, or null for none
  const float* k_norm = nullptr;  // [head_dim]: the key heads' RMSNorm weight; null iff q_norm is
  const int64_t* slot_mapping = nullptr;  // [num_tokens]: cache slot of each token; negative: none
  float* query_out = nullptr;             // [num_tokens, num_heads, head_dim], contiguous
  float* key_cache = nullptr;             // [num_blocks, block_size, num_kv_heads, head_dim]
  float* value_cache = nullptr;           // [num_blocks, block_size, num_kv_heads, head_dim]
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // even
  int64_t rotary_dim = 0;  // dimensions of a head that rotate: even, <= head_dim; 0: head_dim
  int64_t block_size = 0;
  int64_t num_blocks = 0;
  int64_t qkv_stride = 0;  // elements between rows of qkv; 0 means (num_heads + 2 kv) * head_dim
  RotaryLayout layout = RotaryLayout::kHalfSplit;
  double attention_factor = 1.0;  // cos and sin are multiplied by it (RotaryParams)
  float norm_epsilon = 1e-6f;     // of q_norm and k_norm

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void QkvPostProcess(const QkvPostProcessParams& params);

// The rotary table the GPU kernel reads: row p holds cos(p * inv_freq[k]) * attention_factor for k
// in [0, rotary_dim/2) then sin(p * inv_freq[k]) * attention_factor, each computed in double and
// rounded to fp32 exactly as ApplyRotary does, for positions [0, max_position).
// [max_position, rotary_dim] floats.
std::vector<float> RotaryCosSinTable(const double* inv_freq, int64_t rotary_dim,
                                     int64_t max_position, double attention_factor = 1.0);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_QKV_POSTPROCESS_H_
