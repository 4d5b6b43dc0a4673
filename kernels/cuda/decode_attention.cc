#include "kernels/cuda/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/dispatch.h"

namespace lmserve::kernels::cuda {

int64_t DecodeAttentionParams::WorkspaceBytes(int64_t num_seqs, int64_t num_heads,
                                              int64_t head_dim, int max_splits) {
  if (max_splits <= 1) return 0;
  // fp32 partial outputs [num_seqs, num_heads, max_splits, head_dim], then their log-sum-exps.
  const int64_t partials = num_seqs * num_heads * max_splits;
  return partials * head_dim * 4 + partials * 4;
}

absl::Status DecodeAttentionParams::Validate() const {
  constexpr const char* kName = "DecodeAttention";
  if (absl::Status s = CheckHalfDType(kName, dtype, "PagedAttentionF32 (paged_attention_f32.h)");
      !s.ok()) {
    return s;
  }
  if (!SupportsHeadDim(head_dim)) {
    return KernelError(kName, StrCat("head_dim ", head_dim, " is not supported (supported: ",
                                     kHeadDimList, ")"));
  }
  if (num_seqs < 0 || num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0) {
    return KernelError(kName, StrCat("num_heads (", num_heads,
                                     ") must be a positive multiple of num_kv_heads (",
                                     num_kv_heads, ")"));
  }
  if (block_size <= 0 || num_blocks <= 0) {
    return KernelError(kName, "block_size and num_blocks must be positive");
  }
  if (num_blocks > std::numeric_limits<int32_t>::max() / block_size) {
    return KernelError(kName, StrCat("a cache of ", num_blocks, " blocks of ", block_size,
                                     " tokens has more slots than int32 indexes"));
  }
  if (query_stride != 0 && (query_stride < num_heads * head_dim || query_stride % 8 != 0)) {
    return KernelError(kName, StrCat("query_stride ", query_stride,
                                     " must be a multiple of 8 and at least a row"));
  }
  if (max_splits < 1 || max_splits > kDecodeMaxSplits) {
    return KernelError(kName, StrCat("max_splits ", max_splits, " outside [1, ",
                                     kDecodeMaxSplits, "]"));
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
      context_lens == nullptr || block_table_start == nullptr || block_table_ids == nullptr ||
      output == nullptr) {
    return KernelError(kName, "a null pointer");
  }
  if (WorkspaceBytes(num_seqs, num_heads, head_dim, max_splits) > 0 &&
      (workspace == nullptr || !Aligned16(workspace))) {
    return KernelError(kName, "max_splits > 1 needs a 16-byte aligned workspace");
  }
  if (!Aligned16(query) || !Aligned16(key_cache) || !Aligned16(value_cache) ||
      !Aligned16(output)) {
    return KernelError(kName, "query, caches and output must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
