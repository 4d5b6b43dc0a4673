// Validate() of the element-wise kernels (activation.h, embedding.h).

#include <cmath>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/embedding.h"

namespace lmserve::kernels::cuda {

absl::Status SiluAndMulParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("SiluAndMul", dtype));
  if (num_tokens < 0 || intermediate_size <= 0 || intermediate_size % 8 != 0) {
    return KernelError("SiluAndMul", StrCat("shape [", num_tokens, ", ", intermediate_size,
                                            "] is not supported (intermediate_size a positive "
                                            "multiple of 8)"));
  }
  if (activation != GateActivation::kSilu && activation != GateActivation::kGeluTanh) {
    return KernelError("SiluAndMul",
                       StrCat("unknown activation ", static_cast<int>(activation)));
  }
  if ((f8_output == nullptr) != (f8_output_scales == nullptr)) {
    return KernelError("SiluAndMul", "f8_output and f8_output_scales go together");
  }
  if (f8_output != nullptr && (dtype != DType::kBF16 || output != nullptr)) {
    return KernelError("SiluAndMul", "an FP8 output takes bf16 and no output beside it");
  }
  if (num_tokens > 0) {
    if (gate_up == nullptr || (output == nullptr && f8_output == nullptr)) {
      return KernelError("SiluAndMul", "null pointer");
    }
    if (!Aligned16(gate_up) || (output != nullptr && !Aligned16(output)) ||
        reinterpret_cast<uintptr_t>(f8_output) % 8 != 0) {
      return KernelError("SiluAndMul",
                         "gate_up and output must be 16-byte aligned, an FP8 output 8-byte");
    }
  }
  return CheckF8OutputScales("SiluAndMul", row_scales, col_scales, dtype);
}

absl::Status SoftcapParams::Validate() const {
  if (count < 0 || !(cap > 0) || !std::isfinite(cap)) {
    return KernelError("Softcap", StrCat("bad count ", count, " or cap ", cap,
                                         " (want count >= 0, cap > 0 and finite)"));
  }
  if (count > 0 && data == nullptr) return KernelError("Softcap", "null data");
  return absl::OkStatus();
}

absl::Status EmbeddingParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckDTypeOrF32("Embedding", "output_dtype", dtype, output_dtype));
  if (num_tokens < 0 || vocab_size <= 0 || hidden_size <= 0 || hidden_size % 8 != 0) {
    return KernelError("Embedding", StrCat("shape (tokens ", num_tokens, ", vocab ", vocab_size,
                                           ", hidden ", hidden_size,
                                           ") is not supported (hidden a multiple of 8)"));
  }
  if (num_tokens > 0) {
    if (table == nullptr || ids == nullptr || output == nullptr) {
      return KernelError("Embedding", "null pointer");
    }
    if (!Aligned16(table) || !Aligned16(output)) {
      return KernelError("Embedding", "table and output must be 16-byte aligned");
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
