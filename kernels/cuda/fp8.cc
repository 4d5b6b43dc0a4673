// Validate() of the FP8 kernels (fp8.h).

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {

absl::Status F8QuantizeRowsParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("F8QuantizeRows", src_dtype));
  if (rows < 0 || cols <= 0 || cols % 16 != 0) {
    return KernelError("F8QuantizeRows", StrCat("shape [", rows, ", ", cols,
                                                "] is not supported (cols a multiple of 16)"));
  }
  const int64_t ss = src_stride != 0 ? src_stride : cols, ds = dst_stride != 0 ? dst_stride : cols;
  if (ss < cols || ss % 8 != 0 || ds < cols || ds % 16 != 0) {
    return KernelError("F8QuantizeRows", StrCat("strides src ", ss, ", dst ", ds,
                                                " are not supported (multiples of 8 and 16)"));
  }
  if (rows > 0 && (src == nullptr || dst == nullptr || scales == nullptr)) {
    return KernelError("F8QuantizeRows", "null pointer");
  }
  if (!Aligned16(src) || reinterpret_cast<uintptr_t>(dst) % 8 != 0) {
    return KernelError("F8QuantizeRows", "src must be 16-byte and dst 8-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status F8SkinnyGemmParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckHalfDType("F8SkinnyGemm", input_dtype, "none (bf16 or f16 x)"));
  if (output_dtype != input_dtype && output_dtype != DType::kF32) {
    return KernelError("F8SkinnyGemm", "the output type must be the input type or f32");
  }
  if (m < 1 || m > kMaxSkinnyGemmRows || n <= 0 || n % 2 != 0 || k <= 0 || k % 16 != 0) {
    return KernelError("F8SkinnyGemm",
                       StrCat("shape m ", m, ", n ", n, ", k ", k, " is not supported (m in [1, ",
                              kMaxSkinnyGemmRows, "], n even, k a multiple of 16)"));
  }
  if (activation != GateActivation::kSilu && activation != GateActivation::kGeluTanh) {
    return KernelError("F8SkinnyGemm", StrCat("unknown activation ", static_cast<int>(activation)));
  }
  if (silu_and_mul && output_dtype != input_dtype) {
    return KernelError("F8SkinnyGemm", "silu_and_mul writes the input type");
  }
  const int64_t y_columns = silu_and_mul ? n / 2 : n;
  const int64_t xs = x_stride != 0 ? x_stride : k, ys = y_stride != 0 ? y_stride : y_columns;
  if (xs < k || xs % 8 != 0 || ys < y_columns) {
    return KernelError("F8SkinnyGemm", StrCat("strides x ", xs, ", y ", ys, " are not supported"));
  }
  if (add_norm_residual != nullptr &&
      (m != 1 || output_dtype != input_dtype || k > kMaxSkinnyAddNormK ||
       add_norm_weight == nullptr || !Aligned16(add_norm_residual) ||
       !Aligned16(add_norm_weight))) {
    return KernelError("F8SkinnyGemm",
                       StrCat("the folded add + RMSNorm takes one row, y in the input type, k up "
                              "to ", kMaxSkinnyAddNormK, ", and an aligned residual and weight"));
  }
  if (settle_residual != nullptr &&
      (silu_and_mul || m != 1 || output_dtype != input_dtype || add_norm_residual != nullptr)) {
    return KernelError("F8SkinnyGemm",
                       "settle_residual takes one row, y in the input type, no silu_and_mul and no "
                       "folded add + RMSNorm");
  }
  if (x == nullptr || w == nullptr || w_scales == nullptr || y == nullptr) {
    return KernelError("F8SkinnyGemm", "null pointer");
  }
  if (!Aligned16(x) || !Aligned16(w)) {
    return KernelError("F8SkinnyGemm", "x and W must be 16-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status F8ScaleOutputParams::Validate() const {
  const int64_t ys = y_stride != 0 ? y_stride : n;
  if (m < 0 || n <= 0 || n % 8 != 0 || ys < n || ys % 8 != 0) {
    return KernelError("F8ScaleOutput", StrCat("shape [", m, ", ", n, "], stride ", ys,
                                               " is not supported (n and stride multiples of 8)"));
  }
  if (m > 0 && (y == nullptr || row_scales == nullptr || col_scales == nullptr)) {
    return KernelError("F8ScaleOutput", "null pointer");
  }
  if (!Aligned16(y)) return KernelError("F8ScaleOutput", "y must be 16-byte aligned");
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
