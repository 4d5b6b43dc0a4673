#include <limits>

#include "kernels/cuda/token_bitmask.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per logit: the 32 threads of a warp read one mask word (a broadcast) and write 32
// consecutive logits (coalesced). Grid: x over the vocabulary, y over rows.
__global__ void __launch_bounds__(kThreads)
    TokenBitmaskKernel(float* logits, const uint32_t* bitmask, const int32_t* mask_index,
                       int64_t vocab_size, int64_t stride, int64_t words) {
  const int64_t row = blockIdx.y;
  const int32_t mask = mask_index[row];
  if (mask < 0) return;
  const uint32_t* row_mask = bitmask + int64_t{mask} * words;
  float* row_logits = logits + row * stride;
  const int64_t step = int64_t{gridDim.x} * kThreads;
  for (int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x; t < vocab_size; t += step) {
    if (((row_mask[t >> 5] >> (t & 31)) & 1u) == 0u) {
      row_logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace

cudaError_t Launch(const TokenBitmaskParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_rows == 0 || p.vocab_size == 0) return cudaSuccess;
  const int64_t stride = p.logits_stride == 0 ? p.vocab_size : p.logits_stride;
  const int64_t words = (p.vocab_size + 31) / 32;
  const int64_t blocks = std::min<int64_t>((p.vocab_size + kThreads - 1) / kThreads, 128);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.num_rows));
  TokenBitmaskKernel<<<grid, kThreads, 0, stream>>>(p.logits, p.bitmask, p.mask_index,
                                                    p.vocab_size, stride, words);
  return cudaGetLastError();
}

}  // namespace lmserve::kernels::cuda
