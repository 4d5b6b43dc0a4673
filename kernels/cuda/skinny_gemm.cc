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
  if (accumulate && (gate != nullptr || rms_norm || silu_and_mul || output_dtype != DType::kF32)) {
    return KernelError("SkinnyGemm", "accumulate needs an fp32 output and no prologue or epilogue");
  }
  if (rms_norm && (gate != nullptr || silu_and_mul || output_dtype != input_dtype ||
                   norm_weight == nullptr || !Aligned16(norm_weight))) {
    return KernelError("SkinnyGemm",
                       "the RMSNorm prologue needs a norm weight (16-byte aligned), the input "
                       "type out, and neither the gated norm nor silu_and_mul");
  }
  if (gate != nullptr &&
      (silu_and_mul || output_dtype != input_dtype || norm_weight == nullptr ||
       gate_stride < k || gate_stride % 8 != 0 || !Aligned16(gate) || !Aligned16(norm_weight))) {
    return KernelError(
        "SkinnyGemm",
        "the gated-norm prologue needs a norm weight, a gate stride of at least k "
        "(a multiple of 8), 16-byte alignment, the input type out, and no silu_and_mul");
  }
  if (x == nullptr || w == nullptr || y == nullptr) return KernelError("SkinnyGemm", "null pointer");
  if (!Aligned16(x) || !Aligned16(w)) {
    return KernelError("SkinnyGemm", "x and W must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
