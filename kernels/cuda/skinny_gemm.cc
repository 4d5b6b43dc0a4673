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
  if (silu_and_mul && output_dtype != input_dtype) {
    return KernelError("SkinnyGemm", "silu_and_mul writes the input type");
  }
  const int64_t y_columns = silu_and_mul ? n / 2 : n;
  const int64_t xs = x_stride != 0 ? x_stride : k, ys = y_stride != 0 ? y_stride : y_columns;
  if (xs < k || xs % 8 != 0 || ys < y_columns) {
    return KernelError("SkinnyGemm", StrCat("strides x ", xs, ", y ", ys, " are not supported"));
  }
  if (norm_weight != nullptr || residual != nullptr) {
    if (input_dtype != DType::kBF16 || output_dtype != DType::kBF16) {
      return KernelError("SkinnyGemm", "the fused norm and residual add are bf16 only");
    }
    if (residual != nullptr && (silu_and_mul || norm_weight != nullptr)) {
      return KernelError("SkinnyGemm", "the residual add goes with a plain product only");
    }
    if (norm_weight != nullptr && (!Aligned16(norm_weight) || !(norm_epsilon > 0))) {
      return KernelError("SkinnyGemm", "the norm weight must be 16-byte aligned, epsilon > 0");
    }
  }
  if (x == nullptr || w == nullptr || (y == nullptr && residual == nullptr)) {
    return KernelError("SkinnyGemm", "null pointer");
  }
  if (!Aligned16(x) || !Aligned16(w)) {
    return KernelError("SkinnyGemm", "x and W must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
