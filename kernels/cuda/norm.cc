#include "kernels/cuda/norm.h"

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {
namespace {

absl::Status CheckShape(const char* kernel, int64_t num_tokens, int64_t hidden_size,
                        float epsilon) {
  if (num_tokens < 0) return KernelError(kernel, StrCat("num_tokens is negative (", num_tokens, ")"));
  if (hidden_size <= 0 || hidden_size % 8 != 0 || hidden_size > RmsNormParams::kMaxHiddenSize) {
    return KernelError(kernel, StrCat("hidden_size ", hidden_size,
                                      " is not supported (a positive multiple of 8, at most ",
                                      RmsNormParams::kMaxHiddenSize, ")"));
  }
  if (!(epsilon > 0)) return KernelError(kernel, "epsilon must be positive");
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNormParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckShape("RmsNorm", num_tokens, hidden_size, epsilon));
  LMSERVE_RETURN_IF_ERROR(CheckDTypeOrF32("RmsNorm", "input_dtype", dtype, input_dtype));
  if ((input_stride != 0 && (input_stride < hidden_size || input_stride % 8 != 0)) ||
      (output_stride != 0 && (output_stride < hidden_size || output_stride % 8 != 0))) {
    return KernelError("RmsNorm", StrCat("row strides (", input_stride, ", ", output_stride,
                                         ") must be multiples of 8 and at least hidden_size ",
                                         hidden_size));
  }
  if (num_tokens > 0) {
    if (input == nullptr || weight == nullptr || output == nullptr) {
      return KernelError("RmsNorm", "null input, weight or output");
    }
    if (!Aligned16(input) || !Aligned16(weight) || !Aligned16(output)) {
      return KernelError("RmsNorm", "input, weight and output must be 16-byte aligned");
    }
    if (input == output && input_dtype.value_or(dtype) != dtype) {
      return KernelError("RmsNorm", "output may be input only when input_dtype is dtype");
    }
  }
  return absl::OkStatus();
}

absl::Status FusedAddRmsNormParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckShape("FusedAddRmsNorm", num_tokens, hidden_size, epsilon));
  LMSERVE_RETURN_IF_ERROR(
      CheckDTypeOrF32("FusedAddRmsNorm", "residual_dtype", dtype, residual_dtype));
  LMSERVE_RETURN_IF_ERROR(
      CheckF8OutputScales("FusedAddRmsNorm", input_row_scales, input_col_scales, dtype));
  if (num_tokens > 0) {
    if (residual == nullptr || input == nullptr || weight == nullptr) {
      return KernelError("FusedAddRmsNorm", "null residual, input or weight");
    }
    if (output == residual) return KernelError("FusedAddRmsNorm", "output may not alias residual");
    if ((f8_output == nullptr) != (f8_output_scales == nullptr)) {
      return KernelError("FusedAddRmsNorm", "f8_output and f8_output_scales go together");
    }
    if (f8_output != nullptr && (dtype != DType::kBF16 || output != nullptr ||
                                 reinterpret_cast<uintptr_t>(f8_output) % 8 != 0)) {
      return KernelError("FusedAddRmsNorm",
                         "an FP8 output takes bf16, no output beside it and 8-byte alignment");
    }
    if (!Aligned16(residual) || !Aligned16(input) || !Aligned16(weight) ||
        (output != nullptr && !Aligned16(output))) {
      return KernelError("FusedAddRmsNorm", "every tensor must be 16-byte aligned");
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
