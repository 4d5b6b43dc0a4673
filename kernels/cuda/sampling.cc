#include "kernels/cuda/sampling.h"

#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {
namespace {

absl::Status CheckRows(const char* kernel, const float* logits, int64_t num_rows,
                       int64_t vocab_size, int64_t logits_stride) {
  if (num_rows < 0 || num_rows > 65535 || vocab_size <= 0 || vocab_size % 4 != 0 ||
      vocab_size > (int64_t{1} << 30)) {
    return KernelError(kernel, StrCat("shape [", num_rows, ", ", vocab_size,
                                      "] is not supported (at most 65535 rows; vocab_size a "
                                      "positive multiple of 4)"));
  }
  if (logits_stride != 0 && (logits_stride < vocab_size || logits_stride % 4 != 0)) {
    return KernelError(kernel, StrCat("logits_stride ", logits_stride,
                                      " must be a multiple of 4 and at least vocab_size"));
  }
  if (num_rows > 0 && (logits == nullptr || !Aligned16(logits))) {
    return KernelError(kernel, "logits must be non-null and 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ArgmaxParams::Validate() const {
  if (absl::Status s = CheckRows("Argmax", logits, num_rows, vocab_size, logits_stride); !s.ok()) {
    return s;
  }
  if (num_rows > 0 && output == nullptr) return KernelError("Argmax", "null output");
  return absl::OkStatus();
}

absl::Status SamplingParams::Validate() const {
  if (absl::Status s = CheckRows("Sample", logits, num_rows, vocab_size, logits_stride); !s.ok()) {
    return s;
  }
  if (num_rows > 0 &&
      (output == nullptr || temperature == nullptr || seeds == nullptr || steps == nullptr)) {
    return KernelError("Sample", "null output, temperature, seeds or steps");
  }
  return absl::OkStatus();
}

absl::Status PendingTokensParams::Validate() const {
  if (count < 0) return absl::InvalidArgumentError("pending tokens: negative count");
  if (count > 0 && (ids == nullptr || pairs == nullptr || sampled == nullptr)) {
    return absl::InvalidArgumentError("pending tokens: null pointer");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
