// Validate() of the token bitmask (token_bitmask.h).

#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/token_bitmask.h"

namespace lmserve::kernels::cuda {

absl::Status TokenBitmaskParams::Validate() const {
  if (num_rows < 0 || vocab_size < 0) return KernelError("TokenBitmask", "negative sizes");
  if (num_rows > 65535) {
    return KernelError("TokenBitmask", StrCat(num_rows, " rows, above 65535"));
  }
  if (logits_stride != 0 && logits_stride < vocab_size) {
    return KernelError("TokenBitmask", StrCat("stride ", logits_stride, " below the vocabulary ",
                                              vocab_size));
  }
  if (num_rows > 0 && vocab_size > 0 &&
      (logits == nullptr || bitmask == nullptr || mask_index == nullptr)) {
    return KernelError("TokenBitmask", "null pointer");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
