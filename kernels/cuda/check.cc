#include "kernels/cuda/check.h"

#include <cmath>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/dispatch.h"

namespace lmserve::kernels::cuda {

absl::Status CheckActivationDType(const char* kernel, DType dtype) {
  if (SupportsActivationDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(kernel, ": dtype ", DTypeName(dtype),
                                           " is not supported (supported: ",
                                           kActivationDTypeList, ")"));
}

absl::Status CheckHalfDType(const char* kernel, DType dtype, const char* f32_instead) {
  if (dtype == DType::kF32) {
    return absl::InvalidArgumentError(
        StrCat(kernel, ": dtype F32 is not supported (supported: ", kActivationDTypeList,
               ": a 16-bit kernel); for fp32 use ", f32_instead));
  }
  return CheckActivationDType(kernel, dtype);
}

absl::Status CheckElementwiseDType(const char* kernel, DType dtype) {
  if (SupportsElementwiseDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(kernel, ": dtype ", DTypeName(dtype),
                                           " is not supported (supported: ", kElementwiseDTypeList,
                                           ")"));
}

absl::Status CheckDTypeOrF32(const char* kernel, const char* field, DType dtype,
                             std::optional<DType> other) {
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType(kernel, dtype));
  if (!other.has_value() || *other == dtype || *other == DType::kF32) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(kernel, ": ", field, " ", DTypeName(*other),
                                           " is not supported with dtype ", DTypeName(dtype),
                                           " (supported: ", DTypeName(dtype),
                                           dtype == DType::kF32 ? ")" : " or F32)"));
}

absl::Status CheckWindowAndSoftcap(const char* kernel, int32_t window, float softcap) {
  if (window < 0) {
    return absl::InvalidArgumentError(StrCat(kernel, ": window ", window, " is negative"));
  }
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    return absl::InvalidArgumentError(
        StrCat(kernel, ": softcap must be 0 (none) or positive and finite"));
  }
  return absl::OkStatus();
}

absl::Status CheckF8OutputScales(const char* kernel, const float* rows, const float* cols,
                                 DType dtype) {
  if ((rows == nullptr) != (cols == nullptr)) {
    return KernelError(kernel, "the FP8 output's row and column scales come together");
  }
  if (cols == nullptr) return absl::OkStatus();
  if (dtype != DType::kBF16) return KernelError(kernel, "FP8 output scales need bf16 data");
  if (!Aligned16(cols)) return KernelError(kernel, "the FP8 column scales must be 16-byte aligned");
  return absl::OkStatus();
}

absl::Status KernelError(const char* kernel, const std::string& message) {
  return absl::InvalidArgumentError(StrCat(kernel, ": ", message));
}

}  // namespace lmserve::kernels::cuda
