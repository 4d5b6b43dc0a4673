// Validate() of the skinny GEMM (skinny_gemm.h).

#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {

absl::Status SkinnyGemmParams::Validate() const {
  if (absl::Status s = CheckHalfDType("SkinnyGemm", input_dtype, "a GemmPlan (gemm.h)"); !s.ok()) {
    return s;
  }
  if (output_dtype != input_dtype && output_dtype != DType::kF32) {
    return KernelError("SkinnyGemm", "the output type must be the input type or f32");
  }
  if (m < 1 || m > kMaxSkinnyGemmRows || n <= 0 || n % 2 != 0 || k <= 0 || k % 8 != 0) {
    return KernelError("SkinnyGemm",
                       StrCat("shape m ", m, ", n ", n, ", k ", k, " is not supported (m in [1, ",
                              kMaxSkinnyGemmRows, "], n even, k a multiple of 8)"));
  }
  if (activation != GateActivation::kSilu && activation != GateActivation::kGeluTanh) {
    return KernelError("SkinnyGemm", StrCat("unknown activation ", static_cast<int>(activation)));
  }
  if (silu_and_mul && output_dtype != input_dtype) {
    return KernelError("SkinnyGemm", "silu_and_mul writes the input type");
  }
  const int64_t y_columns = silu_and_mul ? n / 2 : n;
  const int64_t xs = x_stride != 0 ? x_stride : k, ys = y_stride != 0 ? y_stride : y_columns;
  if (xs < k || xs % 8 != 0 || ys < y_columns) {
    return KernelError("SkinnyGemm", StrCat("strides x ", xs, ", y ", ys, " are not supported"));
  }
  if (l2_prefetch_bytes < 0) return KernelError("SkinnyGemm", "negative l2_prefetch_bytes");
  if (k_split < 0 || k_split > 2) return KernelError("SkinnyGemm", "k_split is 0, 1 or 2");
  if (norm_partials != nullptr &&
      (silu_and_mul || m != 1 || num_norm_partials <= 0 ||
       num_norm_partials > kMaxSkinnyNormPartials || norm_width <= 0)) {
    return KernelError("SkinnyGemm", StrCat("the norm epilogue takes one row, 1 to ",
                                            kMaxSkinnyNormPartials,
                                            " partials and a width, and no silu_and_mul"));
  }
  if (add_norm_residual != nullptr &&
      (m != 1 || norm_partials != nullptr || output_dtype != input_dtype ||
       k_split == 2 || k > kMaxSkinnyAddNormK || add_norm_weight == nullptr ||
       !Aligned16(add_norm_residual) ||
       !Aligned16(add_norm_weight))) {
    return KernelError("SkinnyGemm",
                       StrCat("the folded add + RMSNorm takes one row, y in the input type, k up "
                              "to ", kMaxSkinnyAddNormK, ", no norm epilogue or k split, and an "
                              "aligned residual and weight"));
  }
  if (settle_residual != nullptr &&
      (silu_and_mul || m != 1 || output_dtype != input_dtype || add_norm_residual != nullptr)) {
    return KernelError("SkinnyGemm",
                       "settle_residual takes one row, y in the input type, no silu_and_mul and no "
                       "folded add + RMSNorm");
  }
  if (x == nullptr || w == nullptr || y == nullptr) return KernelError("SkinnyGemm", "null pointer");
  if (!Aligned16(x) || !Aligned16(w)) {
    return KernelError("SkinnyGemm", "x and W must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
