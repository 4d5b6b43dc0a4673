// Mixture-of-experts MLP on the GPU (CPU twin: kernels/cpu/moe.h, the same definition):
//   router_logits = x R^T (fp32); weights = softmax over all experts; top_k taken (ties: the lower
//   expert index), renormalized when normalize_top_k;
//   out[t] = sum_k weight[t, k] * down_e(silu(x Wg_e^T) * (x Wu_e^T)), e = expert[t, k].
// Weight layout as engine/model/ops.h's MoeLayer: gate_up [E * 2I, hidden], expert e's gate rows
// then its up rows; down [E * hidden, I], expert e's rows at [e * hidden, (e + 1) * hidden).
//
// Launch(MoeParams) enqueues, on one stream and without a host synchronization (so decode steps
// stay capturable in CUDA graphs: every count and offset lives in device memory):
//   1. the router GEMM (fp32 logits; its weights requested before it waits for the previous
//      kernel), then one of two paths:
//   fused (small decode batches, MoePath::kFused): 2. gate/up with SiLU-and-mul for each (token,
//      k) slot, reading only its expert's rows, and 3. down with the weighted combine, a warp per
//      output feature of a token summing over the token's k experts. No routing kernel runs:
//      every warp of both routes its token from the logits itself (softmax, top-k,
//      renormalization, as the routing kernel; down does so, and requests its first expert rows,
//      before waiting for gate/up). At batch 1 the step reads exactly the top_k experts' weights.
//   grouped (MoePath::kGrouped): 2. the routing kernel (a warp per token), 3. the slots sorted by
//      expert (counts, offsets and tiles of up to 8 rows per expert, in device memory), 4. gate/up
//      + SiLU-and-mul and 5. down, each a grouped GEMM over tiles of one expert's rows (each
//      expert's weights streamed once per tile), and 6. the weighted combine back to token order.
//      Tokens go in chunks of kMoeChunkTokens.
// The expert GEMMs stream weights like the skinny GEMM (skinny_gemm.h): 16-byte pieces, several
// in flight per lane, fp32 sums on the CUDA cores. Memory-bound shapes (decode) run near the
// bandwidth; large prefills are compute-bound there (no tensor cores yet).
// bf16, fp16 or fp32 activations and weights (fp32: the runner's float32 mode); math in fp32.
// Kernels launch with programmatic dependent launch (common.cuh).

#ifndef LMSERVE_KERNELS_CUDA_MOE_H_
#define LMSERVE_KERNELS_CUDA_MOE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int64_t kMaxCudaMoeExperts = 256;
inline constexpr int64_t kMaxCudaMoeTopK = 32;
// Tokens per pass of the grouped path (the workspace holds one pass).
inline constexpr int64_t kMoeChunkTokens = 512;

enum class MoePath : uint8_t {
  kAuto,   // fused when num_tokens * top_k * 2 <= num_experts (or one token), else grouped
  kFused,  // at most kMoeChunkTokens tokens
  kGrouped,
};

struct MoeParams {
  const void* input = nullptr;    // [num_tokens, hidden]; device, 16-byte aligned
  const void* router = nullptr;   // [num_experts, hidden]; device, 16-byte aligned
  const void* gate_up = nullptr;  // [num_experts * 2 * intermediate, hidden]; device, aligned
  const void* down = nullptr;     // [num_experts * hidden, intermediate]; device, aligned
  void* output = nullptr;         // [num_tokens, hidden]; device; may not alias input
  void* workspace = nullptr;      // WorkspaceBytes(num_tokens or more, ...); device
  int64_t num_tokens = 0;
  int64_t hidden = 0;        // multiple of 8
  int64_t intermediate = 0;  // one expert's; multiple of 8
  int64_t num_experts = 0;   // 1 .. kMaxCudaMoeExperts
  int64_t top_k = 0;         // 1 .. min(num_experts, kMaxCudaMoeTopK)
  bool normalize_top_k = true;
  DType dtype = DType::kBF16;  // of input, weights and output: kBF16, kF16 or kF32
  MoePath path = MoePath::kAuto;

  absl::Status Validate() const;
  // The path Launch takes.
  MoePath Resolved() const;
  // Scratch for steps of up to max_tokens tokens (any path).
  static int64_t WorkspaceBytes(int64_t max_tokens, int64_t num_experts, int64_t top_k,
                                int64_t hidden, int64_t intermediate, DType dtype);
};

cudaError_t Launch(const MoeParams& params, cudaStream_t stream);

// The routing kernel alone, over fp32 router logits (the twin of kernels::MoeRouting).
struct MoeRoutingParams {
  const float* logits = nullptr;  // [num_tokens, num_experts]; device
  int32_t* expert_ids = nullptr;  // [num_tokens, top_k]; device: by descending weight
  float* weights = nullptr;       // [num_tokens, top_k]; device
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool normalize_top_k = true;

  absl::Status Validate() const;
};

cudaError_t Launch(const MoeRoutingParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_MOE_H_
