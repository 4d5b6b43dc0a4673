// SiLU-and-multiply, the gated activation of a SwiGLU MLP, over the fused [gate | up] projection:
//   out[t, i] = silu(gate_up[t, i]) * gate_up[t, intermediate_size + i],  silu(g) = g / (1 + e^-g)

#ifndef LMSERVE_KERNELS_CPU_ACTIVATION_H_
#define LMSERVE_KERNELS_CPU_ACTIVATION_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct SiluAndMulParams {
  const float* gate_up = nullptr;  // [num_tokens, 2 * intermediate_size]: gate then up, contiguous
  float* output = nullptr;         // [num_tokens, intermediate_size], contiguous
  int64_t num_tokens = 0;
  int64_t intermediate_size = 0;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void SiluAndMul(const SiluAndMulParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_ACTIVATION_H_
