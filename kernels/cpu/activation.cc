#include "kernels/cpu/activation.h"

#include <cmath>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/parallel.h"

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

namespace {

// A thread's least share of a step's rows, in elements (as the norms').
constexpr int64_t kMinElementsPerThread = int64_t{1} << 14;

}  // namespace

void SiluAndMul(const SiluAndMulParams& p) {
  CheckValid(p.Validate(), "SiluAndMul");
  const int64_t n = p.intermediate_size;
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = p.gate_up + t * 2 * n;
      const float* up = gate + n;
      float* out = p.output + t * n;
      if (p.activation == GateActivation::kGeluTanh) {
        for (int64_t i = 0; i < n; ++i) out[i] = GeluTanh(gate[i]) * up[i];
      } else {
        SiluMul(gate, up, out, n);
      }
    }
  };
  ParallelFor(p.num_tokens, ThreadsForWork(p.num_tokens * n, kMinElementsPerThread, p.num_threads),
              rows);
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
