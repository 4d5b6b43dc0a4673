// Fills a bf16, fp16 or fp32 buffer with uniform random values in [low, high) on the GPU: the
// weights of the dummy load format (vLLM's `--load-format dummy`), which measures a model's speed
// without its checkpoint. The value of element i is a pure function of (seed, i): a counter-based
// hash, so the fill is reproducible and needs no generator state. In fp32 the values are those of
// engine::FillDummyF32 (the CPU runner's dummy weights) bit for bit, given span = high - low
// computed on the host as it does.

#ifndef LMSERVE_KERNELS_CUDA_RANDOM_FILL_H_
#define LMSERVE_KERNELS_CUDA_RANDOM_FILL_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct RandomFillParams {
  void* output = nullptr;  // [num_elements]; device
  int64_t num_elements = 0;
  float low = -1.0f;
  float high = 1.0f;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // kBF16, kF16 or kF32

  absl::Status Validate() const;
};

cudaError_t Launch(const RandomFillParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_RANDOM_FILL_H_
