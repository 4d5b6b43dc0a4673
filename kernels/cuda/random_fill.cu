#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/hash.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/random_fill.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RandomFillKernel(T* output, int64_t n, float low, float span, uint64_t seed) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    const uint64_t bits = SplitMix64At(seed, static_cast<uint64_t>(i));  // as engine::DummyUnit
    const float unit = static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1)
    if constexpr (std::is_same_v<T, float>) {
      // Rounded step by step, as engine::FillDummyF32 computes it: the CPU runner's values.
      output[i] = __fadd_rn(low, __fmul_rn(span, unit));
    } else {
      output[i] = FromFloat<T>(low + span * unit);
    }
  }
}

}  // namespace

cudaError_t Launch(const RandomFillParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_elements == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((p.num_elements + kThreads - 1) / kThreads, 65536);
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    RandomFillKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<T*>(p.output), p.num_elements, p.low, p.high - p.low, p.seed);
    return cudaGetLastError();
  });
}

}  // namespace lmserve::kernels::cuda
