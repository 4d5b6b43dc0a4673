#include "kernels/cpu/activation.h"

#include <cmath>

#include "common/strings.h"
#include "kernels/cpu/check.h"

namespace lmserve::kernels {

absl::Status SiluAndMulParams::Validate() const {
  if (num_tokens < 0 || intermediate_size <= 0) {
    return absl::InvalidArgumentError(
        StrCat("SiluAndMul: bad shape [", num_tokens, ", ", intermediate_size, "]"));
  }
  if (num_tokens > 0 && (gate_up == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("SiluAndMul: null gate_up or output");
  }
  return absl::OkStatus();
}

void SiluAndMul(const SiluAndMulParams& p) {
  CheckValid(p.Validate(), "SiluAndMul");
  const int64_t n = p.intermediate_size;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* gate = p.gate_up + t * 2 * n;
    const float* up = gate + n;
    float* out = p.output + t * n;
    for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

}  // namespace lmserve::kernels
