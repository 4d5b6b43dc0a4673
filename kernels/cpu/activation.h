// The gated activation of a GLU MLP over the fused [gate | up] projection:
//   out[t, i] = act(gate_up[t, i]) * gate_up[t, intermediate_size + i]
// with act silu(g) = g / (1 + e^-g) (SwiGLU: Llama, Qwen, Mistral) or GELU's tanh approximation
// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (GeGLU: Gemma), PyTorch's
// gelu(approximate="tanh"); and the soft-cap of final logits (Gemma 2). fp32 in, out and math.

#ifndef LMSERVE_KERNELS_CPU_ACTIVATION_H_
#define LMSERVE_KERNELS_CPU_ACTIVATION_H_

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels {

// GELU's tanh approximation in fp32, in the order of PyTorch's CPU kernel:
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
inline float GeluTanh(float g) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (g + kKappa * g * g * g);
  return 0.5f * g * (1.0f + std::tanh(inner));
}

struct SiluAndMulParams {
  const float* gate_up = nullptr;  // [num_tokens, 2 * intermediate_size]: gate then up, contiguous
  float* output = nullptr;         // [num_tokens, intermediate_size], contiguous
  int64_t num_tokens = 0;
  int64_t intermediate_size = 0;
  GateActivation activation = GateActivation::kSilu;  // act() of the gate
  int num_threads = 1;  // threads to split the tokens across (a prompt's; one row runs on one)

  absl::Status Validate() const;
};

// out = act(gate) * up. REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void SiluAndMul(const SiluAndMulParams& params);

// data[i] = cap * tanh(data[i] / cap) for i in [0, count), in place (Gemma 2's
// final_logit_softcapping). REQUIRES: count >= 0, cap > 0 and finite, data non-null if count > 0
// (checked).
void Softcap(float* data, int64_t count, float cap);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_ACTIVATION_H_
