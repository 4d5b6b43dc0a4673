#include "common/strings.h"
#include "kernels/cuda/allreduce.h"

namespace lmserve::kernels::cuda {

absl::Status PeerAllReduceParams::Validate() const {
  const int64_t element_bytes = dtype == DType::kF32 ? 4 : 2;
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError("peer all-reduce: dtype must be f32, bf16 or f16");
  }
  if (size < 2 || size > kPeerAllReduceMaxRanks || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        StrCat("peer all-reduce: rank ", rank, " of ", size, " (2 to ", kPeerAllReduceMaxRanks,
               " ranks)"));
  }
  if (count < 0 || count * element_bytes > kPeerAllReduceMaxBytes ||
      (count * element_bytes) % 16 != 0) {
    return absl::InvalidArgumentError(
        StrCat("peer all-reduce: ", count * element_bytes, " bytes (a multiple of 16, at most ",
               kPeerAllReduceMaxBytes, ")"));
  }
  if (data == nullptr || counters == nullptr || reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return absl::InvalidArgumentError("peer all-reduce: null or misaligned data or counters");
  }
  for (int r = 0; r < size; ++r) {
    if (staging[r] == nullptr || flags[r] == nullptr) {
      return absl::InvalidArgumentError(StrCat("peer all-reduce: rank ", r, " has no buffers"));
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
