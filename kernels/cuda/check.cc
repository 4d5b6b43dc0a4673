#include "kernels/cuda/check.h"

#include "common/strings.h"
#include "kernels/cuda/dispatch.h"

namespace lmserve::kernels::cuda {

absl::Status CheckActivationDType(const char* kernel, DType dtype) {
  if (SupportsActivationDType(dtype)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(kernel, ": dtype ", DTypeName(dtype),
                                           " is not supported (supported: ",
                                           kActivationDTypeList, ")"));
}

absl::Status KernelError(const char* kernel, const std::string& message) {
  return absl::InvalidArgumentError(StrCat(kernel, ": ", message));
}

}  // namespace lmserve::kernels::cuda
