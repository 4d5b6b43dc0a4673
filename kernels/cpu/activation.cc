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
  if (activation != GateActivation::kSilu && activation != GateActivation::kGeluTanh) {
    return absl::InvalidArgumentError(
        StrCat("SiluAndMul: unknown activation ", static_cast<int>(activation)));
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
    if (p.activation == GateActivation::kGeluTanh) {
      for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(gate[i]) * up[i];
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
  }
}

void Softcap(float* data, int64_t count, float cap) {
  CheckValid(count < 0 || !(cap > 0) || !std::isfinite(cap) || (count > 0 && data == nullptr)
                 ? absl::InvalidArgumentError(StrCat("Softcap: bad count ", count, " or cap ", cap,
                                                     " (want count >= 0, cap > 0 and finite)"))
                 : absl::OkStatus(),
             "Softcap");
  for (int64_t i = 0; i < count; ++i) data[i] = cap * std::tanh(data[i] / cap);
}

}  // namespace lmserve::kernels
