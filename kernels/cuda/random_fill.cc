// Validate() of the random fill (random_fill.h).

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/random_fill.h"

namespace lmserve::kernels::cuda {

absl::Status RandomFillParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("RandomFill", dtype));
  if (num_elements < 0) return KernelError("RandomFill", "negative element count");
  if (num_elements > 0 && output == nullptr) return KernelError("RandomFill", "null output");
  if (!(low <= high)) {
    return KernelError("RandomFill", StrCat("range [", low, ", ", high, ") is empty"));
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
