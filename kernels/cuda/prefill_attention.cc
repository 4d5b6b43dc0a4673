#include "kernels/cuda/prefill_attention.h"

#include <cmath>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/prefill_attention_sm90.h"

namespace lmserve::kernels::cuda {

absl::Status PrefillAttentionParams::Validate() const {
  constexpr const char* kName = "PrefillAttention";
  if (absl::Status s = CheckHalfDType(kName, dtype, "PagedAttentionF32 (paged_attention_f32.h)");
      !s.ok()) {
    return s;
  }
  if (!SupportsHeadDim(head_dim)) {
    return KernelError(kName, StrCat("head_dim ", head_dim, " is not supported (supported: ",
                                     kHeadDimList, ")"));
  }
  if (num_seqs < 0 || num_tokens < 0 || num_tokens > (int64_t{1} << 30)) {
    return KernelError(kName, StrCat("bad num_seqs ", num_seqs, " or num_tokens ", num_tokens));
  }
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads > 65535) {
    return KernelError(kName, StrCat("num_heads (", num_heads,
                                     ") must be a positive multiple of num_kv_heads (",
                                     num_kv_heads, "), at most 65535"));
  }
  if (block_size <= 0 || num_blocks <= 0) {
    return KernelError(kName, "block_size and num_blocks must be positive");
  }
  if (query_stride != 0 && (query_stride < num_heads * head_dim || query_stride % 8 != 0)) {
    return KernelError(kName, StrCat("query_stride ", query_stride,
                                     " must be a multiple of 8 and at least a row"));
  }
  if (!(scale > 0) || !std::isfinite(scale)) {
    return KernelError(kName, "scale must be positive and finite");
  }
  if (cache_fp8 && !(k_scale > 0 && v_scale > 0 && std::isfinite(k_scale) &&
                     std::isfinite(v_scale))) {
    return KernelError(kName, StrCat("the FP8 cache's scales must be positive and finite (k_scale ",
                                     k_scale, ", v_scale ", v_scale, ")"));
  }
  LMSERVE_RETURN_IF_ERROR(CheckWindowAndSoftcap(kName, window, softcap));
  if (num_seqs == 0) return absl::OkStatus();
  if (query == nullptr || key_cache == nullptr || value_cache == nullptr ||
      query_start == nullptr || context_lens == nullptr || block_table_start == nullptr ||
      block_table_ids == nullptr || output == nullptr || workspace == nullptr) {
    return KernelError(kName, "a null pointer");
  }
  if (!Aligned16(query) || !Aligned16(key_cache) || !Aligned16(value_cache) ||
      !Aligned16(output)) {
    return KernelError(kName, "query, caches and output must be 16-byte aligned");
  }
  return absl::OkStatus();
}

PrefillKernelKind ChoosePrefillKernel(const PrefillAttentionParams& params) {
  if (UseHopperKernels() && PrefillSm90Supports(params) && PrefillSm90Available()) {
    return PrefillKernelKind::kWgmmaSm90;
  }
  return PrefillKernelKind::kMmaSync;
}

}  // namespace lmserve::kernels::cuda
