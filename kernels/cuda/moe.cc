// Validate() and workspace sizes of the mixture-of-experts kernels (moe.h).

#include "kernels/cuda/moe.h"

#include <algorithm>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/moe_workspace.h"

namespace lmserve::kernels::cuda {
namespace {

absl::Status CheckExperts(const char* kernel, int64_t num_experts, int64_t top_k) {
  if (num_experts < 1 || num_experts > kMaxCudaMoeExperts || top_k < 1 ||
      top_k > std::min(num_experts, kMaxCudaMoeTopK)) {
    return KernelError(kernel, StrCat(num_experts, " experts, top ", top_k,
                                      " are not supported (1 to ", kMaxCudaMoeExperts,
                                      " experts; top 1 to min(experts, ", kMaxCudaMoeTopK, "))"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeRoutingParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckExperts("MoeRouting", num_experts, top_k));
  if (num_tokens < 0) return KernelError("MoeRouting", "num_tokens is negative");
  if (num_tokens > 0 && (logits == nullptr || expert_ids == nullptr || weights == nullptr)) {
    return KernelError("MoeRouting", "null pointer");
  }
  return absl::OkStatus();
}

absl::Status MoeParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckExperts("Moe", num_experts, top_k));
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("Moe", dtype));
  if (num_tokens < 0 || hidden <= 0 || hidden % 8 != 0 || intermediate <= 0 ||
      intermediate % 8 != 0) {
    return KernelError(
        "Moe", StrCat(num_tokens, " tokens, hidden ", hidden, ", intermediate ", intermediate,
                      " are not supported (hidden and intermediate multiples of 8)"));
  }
  if (path == MoePath::kFused && num_tokens > kMoeChunkTokens) {
    return KernelError("Moe", StrCat("the fused path takes at most ", kMoeChunkTokens, " tokens"));
  }
  if (num_tokens > 0) {
    if (input == nullptr || router == nullptr || gate_up == nullptr || down == nullptr ||
        output == nullptr || workspace == nullptr) {
      return KernelError("Moe", "null pointer");
    }
    if (!Aligned16(input) || !Aligned16(router) || !Aligned16(gate_up) || !Aligned16(down) ||
        !Aligned16(output) || !Aligned16(workspace)) {
      return KernelError("Moe", "input, weights, output and workspace must be 16-byte aligned");
    }
    if (input == output) return KernelError("Moe", "output may not alias input");
  }
  return absl::OkStatus();
}

MoePath MoeParams::Resolved() const {
  if (path != MoePath::kAuto) return path;
  return num_tokens <= 1 || num_tokens * top_k * 2 <= num_experts ? MoePath::kFused
                                                                  : MoePath::kGrouped;
}

int64_t MoeParams::WorkspaceBytes(int64_t max_tokens, int64_t num_experts, int64_t top_k,
                                  int64_t hidden, int64_t intermediate, DType dtype) {
  return MoeWorkspaceLayout::For(std::min(std::max<int64_t>(max_tokens, 1), kMoeChunkTokens),
                                 num_experts, top_k, hidden, intermediate,
                                 dtype == DType::kF32 ? 4 : 2)
      .total;
}

}  // namespace lmserve::kernels::cuda
