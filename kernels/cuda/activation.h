// SiLU-and-multiply over the fused [gate | up] projection, on the GPU (CPU twin:
// kernels/cpu/activation.h):  out[t, i] = silu(gate_up[t, i]) * gate_up[t, intermediate_size + i].
// bf16, fp16 or fp32 in and out, fp32 math (fp32: expf, as the CPU twin's std::exp; the 16-bit
// types: the faster __expf).

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

  absl::Status Validate() const;
};

cudaError_t Launch(const SiluAndMulParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_ACTIVATION_H_
