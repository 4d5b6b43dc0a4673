// Validate() of the token bitmasks, and the host's side of the gated one (token_bitmask.h).

#include <atomic>

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

absl::Status GatedTokenBitmaskParams::Validate() const {
  if (num_rows < 0 || vocab_size < 0) return KernelError("GatedTokenBitmask", "negative sizes");
  if (num_rows > 2147483647) {
    return KernelError("GatedTokenBitmask", StrCat(num_rows, " rows, above 2^31 - 1"));
  }
  if (logits_stride != 0 && logits_stride < vocab_size) {
    return KernelError("GatedTokenBitmask", StrCat("stride ", logits_stride,
                                                   " below the vocabulary ", vocab_size));
  }
  if (timeout_ns <= 0) {
    return KernelError("GatedTokenBitmask", StrCat("timeout ", timeout_ns, " ns: must be positive"));
  }
  if (num_rows > 0 && vocab_size > 0 &&
      (logits == nullptr || bitmask == nullptr || mask_index == nullptr || step == nullptr ||
       release == nullptr || timed_out == nullptr ||
       (!poll_per_row && gate == nullptr))) {
    return KernelError("GatedTokenBitmask", "null pointer");
  }
  return absl::OkStatus();
}

void ReleaseTokenBitmasks(uint64_t* release, uint64_t step, bool abandoned) {
  // A release store: the masks' stores, made before it by this thread, are visible to whoever
  // sees this value (on x86 a plain store in order; the device's side is ld.acquire.sys).
  std::atomic_ref<uint64_t>(*release).store(abandoned ? (step | kTokenBitmaskAbandoned) : step,
                                            std::memory_order_release);
}

uint64_t TokenBitmaskTimedOutStep(const uint64_t* timed_out) {
  return std::atomic_ref<const uint64_t>(*timed_out).load(std::memory_order_acquire);
}

uint64_t TokenBitmaskWaitedNs(const uint64_t* waited_ns) {
  return std::atomic_ref<const uint64_t>(*waited_ns).load(std::memory_order_acquire);
}

}  // namespace lmserve::kernels::cuda
