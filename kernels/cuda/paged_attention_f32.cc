#include "kernels/cuda/paged_attention_f32.h"

#include <cmath>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {

absl::Status PagedAttentionF32Params::Validate() const {
  constexpr const char* kName = "PagedAttentionF32";
  if (dtype != DType::kF32) {
    return KernelError(kName, StrCat("dtype ", DTypeName(dtype),
                                     " is not supported (supported: f32; the 16-bit types go to "
                                     "DecodeAttention and PrefillAttention)"));
  }
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    return KernelError(kName,
                       StrCat("head_dim ", head_dim, " is not supported (1 to ", kMaxHeadDim, ")"));
  }
  if (num_seqs < 0 || num_tokens < 0 || num_tokens > (int64_t{1} << 31) - 1) {
    return KernelError(kName, StrCat("bad num_seqs ", num_seqs, " or num_tokens ", num_tokens));
  }
  if (num_tokens > 0 && num_seqs == 0) return KernelError(kName, "tokens without sequences");
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads > 65535) {
    return KernelError(
        kName, StrCat("num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
                      num_kv_heads, "), at most 65535"));
  }
  if (block_size <= 0 || num_blocks <= 0) {
    return KernelError(kName, "block_size and num_blocks must be positive");
  }
  if (query_stride != 0 && query_stride < num_heads * head_dim) {
    return KernelError(kName, StrCat("query_stride ", query_stride, " is smaller than a row (",
                                     num_heads * head_dim, ")"));
  }
  if (!(scale > 0) || !std::isfinite(scale)) {
    return KernelError(kName, "scale must be positive and finite");
  }
  LMSERVE_RETURN_IF_ERROR(CheckWindowAndSoftcap(kName, window, softcap));
  if (num_tokens == 0) return absl::OkStatus();
  if (query == nullptr || key_cache == nullptr || value_cache == nullptr ||
      query_start == nullptr || context_lens == nullptr || block_table_start == nullptr ||
      block_table_ids == nullptr || output == nullptr) {
    return KernelError(kName, "a null pointer");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
