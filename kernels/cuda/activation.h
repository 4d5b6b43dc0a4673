// The gated activation of a GLU MLP over the fused [gate | up] projection, on the GPU (CPU twin:
// kernels/cpu/activation.h):  out[t, i] = act(gate_up[t, i]) * gate_up[t, intermediate_size + i],
// act SiLU or GELU's tanh approximation (GateActivation); and the soft-cap of final logits.
// bf16, fp16 or fp32 in and out, fp32 math (fp32: expf and tanhf, as the CPU twin's std::exp and
// std::tanh up to their last-ulp differences; the 16-bit types: the faster __expf and SiLU's fast
// division).

#ifndef LMSERVE_KERNELS_CUDA_ACTIVATION_H_
#define LMSERVE_KERNELS_CUDA_ACTIVATION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct SiluAndMulParams {
  const void* gate_up = nullptr;  // [num_tokens, 2 * intermediate_size], contiguous; device
  void* output = nullptr;         // [num_tokens, intermediate_size], contiguous; device
  int64_t num_tokens = 0;
  int64_t intermediate_size = 0;  // multiple of 8
  DType dtype = DType::kBF16;     // kBF16, kF16 or kF32
  GateActivation activation = GateActivation::kSilu;  // act() of the gate
  // The scales of an FP8 GEMM that left gate_up unscaled (GemmPlan::Run's `unscaled`), applied
  // as each value is read: gate_up[t, j] * (row_scales[t] * col_scales[j]), rounded to bf16
  // before the activation, so that the output is bit for bit F8ScaleOutput's followed by this
  // kernel's. Both or neither; bf16 only.
  const float* row_scales = nullptr;  // [num_tokens]; device
  const float* col_scales = nullptr;  // [2 * intermediate_size], 16-byte aligned; device
  // The output rows quantized per token for an FP8 GEMM instead of written to `output` (null
  // then): E4M3 bytes and a scale a row, bit for bit what F8QuantizeRows (fp8.h) makes of the
  // bf16 rows `output` would have held. bf16 only. f8_output_scales may be row_scales (a row's
  // block reads its scale before it writes its own).
  void* f8_output = nullptr;          // [num_tokens, intermediate_size] bytes; device, 8-byte
                                      // aligned
  float* f8_output_scales = nullptr;  // [num_tokens]; device

  absl::Status Validate() const;
};

cudaError_t Launch(const SiluAndMulParams& params, cudaStream_t stream);

// data[i] = cap * tanh(data[i] / cap), in place, fp32 (Gemma 2's final_logit_softcapping on the
// LM head's fp32 logits).
struct SoftcapParams {
  float* data = nullptr;  // [count]; device
  int64_t count = 0;
  float cap = 0;  // positive and finite

  absl::Status Validate() const;
};

cudaError_t Launch(const SoftcapParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_ACTIVATION_H_
