// State-space (Mamba-2) kernels over a ragged batch of sequences, each with a state slot: the
// causal depthwise conv1d with its rolling state, the SSD scan (chunked for prefill, the
// single-step recurrence for decode) with its recurrent state, and the gated RMSNorm. The CPU
// reference of kernels/cuda/ssm.h.
//
// Sequences: sequence i owns tokens [query_start[i], query_start[i+1]) of the step and state slot
// state_slots[i]. When its step starts at position 0 (context_lens[i] equals its query length)
// its state starts at zero whatever the slot held; otherwise the slot holds the state after its
// earlier tokens. Each kernel leaves in the slot the state after the step's last token.
//
// fp32 in and out. The scan computes in double within a step (its state is rounded to fp32 where
// the step leaves it) and the norm accumulates its mean of squares in double: chunks of a prompt
// change the outputs by about one fp32 rounding.

#ifndef LMSERVE_KERNELS_CPU_SSM_H_
#define LMSERVE_KERNELS_CPU_SSM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct SsmSequences {
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* state_slots = nullptr;   // [num_seqs], distinct, in [0, num_slots)
  int64_t num_seqs = 0;
  int64_t num_slots = 0;

  absl::Status Validate(const char* kernel) const;
  int64_t num_tokens() const { return num_seqs > 0 ? query_start[num_seqs] : 0; }
  // Whether sequence i's step starts at position 0 (its state starts at zero).
  bool Starts(int64_t i) const {
    return context_lens[i] == query_start[i + 1] - query_start[i];
  }
};

// out[t, c] = silu(bias[c] + sum_k weight[c, k] * x[t - (kernel - 1) + k, c]), where inputs
// before the sequence's first new token come from its conv state (zero for a sequence that
// starts): conv_states[slot] holds [kernel - 1, channels], oldest row first, and is left holding
// the last kernel - 1 inputs.
struct CausalConv1dParams {
  SsmSequences seqs;
  const float* input = nullptr;   // [num_tokens, input_stride]: channels at columns [0, channels)
  int64_t input_stride = 0;
  const float* weight = nullptr;  // [channels, kernel]
  const float* bias = nullptr;    // [channels]; null: none
  float* output = nullptr;        // [num_tokens, channels]
  float* conv_states = nullptr;   // [num_slots, kernel - 1, channels]
  int64_t channels = 0;
  int64_t kernel = 0;  // 1 to 8
  int num_threads = 1;

  absl::Status Validate() const;
};
void CausalConv1d(const CausalConv1dParams& params);

// The SSD scan. Per head h of num_heads (group g = h / (num_heads / n_groups)) and token t:
//   dt_t = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, dt_max)   (dt_max 0: no upper bound)
//   state_h = exp(dt_t A_h) state_h + dt_t x[t, h] B[t, g]^T         (A_h = -exp(a_log[h]))
//   y[t, h] = state_h C[t, g] + D_h x[t, h]
// with x [head_dim] of each head, B and C [state_size] of each group and the state
// [head_dim, state_size]. A step of several tokens is computed in chunks of chunk_size by the SSD
// form (the state carried from chunk to chunk); a step of one token by the recurrence above.
struct SsmScanParams {
  SsmSequences seqs;
  const float* xbc = nullptr;  // [num_tokens, xbc_stride]: x [num_heads * head_dim], then B
                               // [n_groups * state_size], then C [n_groups * state_size]
  int64_t xbc_stride = 0;
  const float* dt = nullptr;   // [num_tokens, dt_stride]: the raw dt of each head at [0, num_heads)
  int64_t dt_stride = 0;
  const float* dt_bias = nullptr;  // [num_heads]
  const float* a_log = nullptr;    // [num_heads]
  const float* d = nullptr;        // [num_heads]
  float* output = nullptr;         // [num_tokens, num_heads * head_dim]
  float* ssm_states = nullptr;     // [num_slots, num_heads, head_dim, state_size]
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t state_size = 0;
  int64_t n_groups = 1;
  int64_t chunk_size = 64;
  float dt_min = 0.0f;
  float dt_max = 0.0f;
  int num_threads = 1;

  absl::Status Validate() const;
};
void SsmScan(const SsmScanParams& params);

// out = weight * v / sqrt(mean over the group of v^2 + epsilon), v = y * silu(gate), per group of
// group_size features of each token's [width] row.
struct GatedRmsNormParams {
  const float* input = nullptr;  // y: [num_tokens, width]
  const float* gate = nullptr;   // z: [num_tokens, gate_stride], at columns [0, width)
  int64_t gate_stride = 0;
  const float* weight = nullptr;  // [width]
  float* output = nullptr;        // [num_tokens, width]; may be input
  int64_t num_tokens = 0;
  int64_t width = 0;
  int64_t group_size = 0;  // divides width
  double epsilon = 1e-5;

  absl::Status Validate() const;
};
void GatedRmsNorm(const GatedRmsNormParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_SSM_H_
