#include "kernels/cuda/qkv_postprocess.h"

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {

absl::Status QkvPostProcessParams::Validate() const {
  constexpr const char* kName = "QkvPostProcess";
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType(kName, dtype));
  if (head_dim <= 0 || head_dim % 16 != 0 || head_dim > kQkvMaxHeadDim) {
    return KernelError(kName, StrCat("head_dim ", head_dim,
                                     " is not supported (a positive multiple of 16, at most ",
                                     kQkvMaxHeadDim, ")"));
  }
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || block_size <= 0 ||
      num_blocks <= 0) {
    return KernelError(kName, StrCat("bad shape (tokens ", num_tokens, ", heads ", num_heads,
                                     ", kv heads ", num_kv_heads, ", blocks ", num_blocks, " x ",
                                     block_size, ")"));
  }
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return KernelError(kName, StrCat("rotary_dim ", rotary_dim,
                                     " is not supported (even, at most head_dim ", head_dim,
                                     "; 0 for head_dim)"));
  }
  if (cache_fp8 && dtype == DType::kF32) {
    return KernelError(kName, "an FP8 cache needs bf16 or f16 activations, not f32");
  }
  if (cache_fp8 && !(k_scale > 0 && v_scale > 0)) {
    return KernelError(kName, StrCat("the FP8 cache's scales must be positive (k_scale ", k_scale,
                                     ", v_scale ", v_scale, ")"));
  }
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return KernelError(kName, "q_norm and k_norm come together");
  }
  LMSERVE_RETURN_IF_ERROR(CheckF8OutputScales(kName, qkv_row_scales, qkv_col_scales, dtype));
  if (q_norm != nullptr && !(norm_epsilon > 0)) {
    return KernelError(kName, "norm_epsilon must be positive");
  }
  const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
  if (qkv_stride != 0 && (qkv_stride < row || qkv_stride % 8 != 0)) {
    return KernelError(kName, StrCat("qkv_stride ", qkv_stride,
                                     " must be a multiple of 8 and at least ", row));
  }
  if (query_out_stride != 0 &&
      (query_out_stride < num_heads * head_dim || query_out_stride % 8 != 0)) {
    return KernelError(kName, StrCat("query_out_stride ", query_out_stride,
                                     " must be a multiple of 8 and at least ",
                                     num_heads * head_dim));
  }
  if (cos_sin != nullptr && max_position <= 0) {
    return KernelError(kName, "max_position must be positive with a cos/sin table");
  }
  if (num_tokens > 0) {
    if (qkv == nullptr || positions == nullptr || slot_mapping == nullptr ||
        query_out == nullptr || key_cache == nullptr || value_cache == nullptr) {
      return KernelError(kName, "a null pointer");
    }
    if (!Aligned16(qkv) || !Aligned16(query_out) || !Aligned16(key_cache) ||
        !Aligned16(value_cache) || (bias != nullptr && !Aligned16(bias)) ||
        (cos_sin != nullptr && !Aligned16(cos_sin)) || (q_norm != nullptr && !Aligned16(q_norm)) ||
        (k_norm != nullptr && !Aligned16(k_norm))) {
      return KernelError(kName, "tensors must be 16-byte aligned");
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
