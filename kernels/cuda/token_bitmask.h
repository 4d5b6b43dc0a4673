// Structured output on the GPU: masks logits rows to -inf where a packed vocabulary bitmask has a
// clear bit, before sampling. The CPU twin is kernels::ApplyTokenBitmask (kernels/cpu/sampling.h).
//
// Row r is masked by bitmask[mask_index[r] * words, ...) with words = ceil(vocab_size / 32): bit
// t % 32 of word t / 32 keeps token t. A row whose mask_index is negative is left alone, so one
// launch serves a batch that mixes constrained and free rows (and an all-free batch costs one
// launch that writes nothing).

#ifndef LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_
#define LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels::cuda {

struct TokenBitmaskParams {
  float* logits = nullptr;             // [num_rows, logits_stride] fp32, masked in place; device
  const uint32_t* bitmask = nullptr;   // [masks, ceil(vocab_size / 32)]; device
  const int32_t* mask_index = nullptr; // [num_rows]: each row's mask, < 0: none; device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // 0 means vocab_size

  absl::Status Validate() const;
};

cudaError_t Launch(const TokenBitmaskParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_
