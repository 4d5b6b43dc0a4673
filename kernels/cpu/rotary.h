// Rotary position embedding (RoPE), applied in place to the query and key heads of a batch of
// tokens.
//
// Only the first rotary_dim dimensions of a head rotate (partial rotary: Phi-3's
// partial_rotary_factor, GPT-NeoX's rotary_pct; rotary_dim = head_dim by default); the others pass
// through. Pair k of a head (k in [0, rotary_dim/2)) is rotated by the angle
// position * inv_freq[k]:
//   (a, b) -> (a cos - b sin, a sin + b cos)
// where the pair is (x[k], x[k + rotary_dim/2]) in the half-split layout (Hugging Face, GPT-NeoX)
// and (x[2k], x[2k+1]) in the interleaved layout (GPT-J, llama.cpp's llama GGUF). The angle, its
// cosine and sine are computed in double, multiplied by attention_factor (longrope's and YaRN's
// magnitude scaling; 1 leaves them exact) and rounded to fp32; the rotation itself is fp32.

#ifndef LMSERVE_KERNELS_CPU_ROTARY_H_
#define LMSERVE_KERNELS_CPU_ROTARY_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

enum class RotaryLayout : uint8_t {
  kHalfSplit,    // pairs (k, k + rotary_dim/2)
  kInterleaved,  // pairs (2k, 2k + 1)
};

struct RotaryParams {
  float* query = nullptr;  // [num_tokens, num_heads, head_dim], row stride query_stride
  float* key = nullptr;    // [num_tokens, num_kv_heads, head_dim], row stride key_stride;
                           // may be null (query only)
  const int32_t* positions = nullptr;  // [num_tokens], >= 0
  const double* inv_freq = nullptr;    // [rotary_dim / 2]
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;      // even, at most kMaxHeadDim
  int64_t rotary_dim = 0;    // dimensions that rotate: even, at most head_dim; 0 means head_dim
  double attention_factor = 1.0;  // cos and sin are multiplied by it (positive)
  int64_t query_stride = 0;  // elements between tokens; 0 means num_heads * head_dim
  int64_t key_stride = 0;    // elements between tokens; 0 means num_kv_heads * head_dim
  RotaryLayout layout = RotaryLayout::kHalfSplit;

  static constexpr int64_t kMaxHeadDim = 1024;

  int64_t RotaryDim() const { return rotary_dim != 0 ? rotary_dim : head_dim; }
  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void ApplyRotary(const RotaryParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_ROTARY_H_
