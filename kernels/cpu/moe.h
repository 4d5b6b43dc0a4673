// Mixture-of-experts MLP on the CPU (fp32), the reference for kernels/cuda/moe.h:
//   router_logits = x R^T; weights = softmax over all experts; the top_k largest taken (ties: the
//   lower expert index), renormalized to sum to 1 when normalize_top_k;
//   out[t] = sum_k weight[t, k] * down_e(silu(x Wg_e^T) * (x Wu_e^T)), e = expert[t, k].
// Tokens are grouped by expert and each expert runs one GEMM over its tokens (OpenBLAS), so the
// work is what the chosen experts take, not num_experts times a dense MLP.
//
// Weight layout (engine/model/ops.h's MoeLayer): gate_up is [num_experts * 2 * intermediate,
// hidden], expert e's gate rows then its up rows at rows [e * 2I, (e + 1) * 2I); down is
// [num_experts * hidden, intermediate], expert e's rows at [e * hidden, (e + 1) * hidden).

#ifndef LMSERVE_KERNELS_CPU_MOE_H_
#define LMSERVE_KERNELS_CPU_MOE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace lmserve::kernels {

inline constexpr int64_t kMaxMoeExperts = 256;
inline constexpr int64_t kMaxMoeTopK = 32;

// Softmax over each token's router logits, top-k, renormalization.
struct MoeRoutingParams {
  const float* logits = nullptr;  // [num_tokens, num_experts]
  int32_t* expert_ids = nullptr;  // [num_tokens, top_k]: by descending weight (ties: lower id)
  float* weights = nullptr;       // [num_tokens, top_k]
  int64_t num_tokens = 0;
  int64_t num_experts = 0;  // 1 .. kMaxMoeExperts
  int64_t top_k = 0;        // 1 .. min(num_experts, kMaxMoeTopK)
  bool normalize_top_k = true;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise). Sums in double.
void MoeRouting(const MoeRoutingParams& params);

// The (token, k) slots of `expert_ids` grouped by expert: expert e's slots, ascending, are
// sorted_slots[expert_offsets[e] .. expert_offsets[e + 1]); slot s is token s / top_k's k-th
// choice, s % top_k. The CUDA twin groups the same slots, in any order within an expert.
struct MoeGroupParams {
  const int32_t* expert_ids = nullptr;  // [num_slots], each in [0, num_experts)
  int32_t* expert_offsets = nullptr;    // [num_experts + 1]
  int32_t* sorted_slots = nullptr;      // [num_slots]
  int64_t num_slots = 0;
  int64_t num_experts = 0;

  absl::Status Validate() const;
};

void MoeGroupByExpert(const MoeGroupParams& params);

// Scratch of Moe, grown as needed; reuse one across calls to avoid allocations.
struct MoeWorkspace {
  std::vector<float> router_logits, weights, rows, gate_up, act, expert_out;
  std::vector<int32_t> expert_ids, expert_offsets, sorted_slots;
};

struct MoeParams {
  const float* input = nullptr;    // [num_tokens, hidden]
  const float* router = nullptr;   // [num_experts, hidden]
  const float* gate_up = nullptr;  // [num_experts * 2 * intermediate, hidden]
  const float* down = nullptr;     // [num_experts * hidden, intermediate]
  float* output = nullptr;         // [num_tokens, hidden]; may not alias input
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool normalize_top_k = true;
  MoeWorkspace* workspace = nullptr;  // optional

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void Moe(const MoeParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_MOE_H_
