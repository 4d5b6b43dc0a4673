#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/norm.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;

// One block per token. Thread i holds vectors i, i + 256, ... (8 elements each) of the row in
// registers between the reduction and the write.
template <typename T, int kVecs, bool kFused>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const T* input, int64_t input_stride, T* __restrict__ residual,
                  const T* __restrict__ weight, T* output, int64_t output_stride, int hidden_size,
                  float epsilon, bool early_dependents) {
  __shared__ float scratch[32];
  BeginDependentKernel(early_dependents);
  const int64_t token = blockIdx.x;
  const int num_vecs = hidden_size / 8;
  const T* in_row = input + token * input_stride;
  T* res_row = kFused ? residual + token * hidden_size : nullptr;
  float x[kVecs][8];
  float sum_squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kNormThreads;
    if (v < num_vecs) {
      Unpack8<T>(LoadStream16(in_row + v * 8), x[i]);
      if constexpr (kFused) {
        float r[8];
        Unpack8<T>(LoadStream16(res_row + v * 8), r);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[i][j] += r[j];
        const uint4 packed = Pack8<T>(x[i]);
        Store16(res_row + v * 8, packed);
        Unpack8<T>(packed, x[i]);  // normalize the residual as stored
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_squares += x[i][j] * x[i][j];
    }
  }
  sum_squares = BlockSum(sum_squares, scratch);
  const float inv_rms = rsqrtf(sum_squares / static_cast<float>(hidden_size) + epsilon);
  T* out_row = output + token * output_stride;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kNormThreads;
    if (v < num_vecs) {
      float w[8];
      Unpack8<T>(Load16(weight + v * 8), w);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[i][j] = x[i][j] * inv_rms * w[j];
      Store16(out_row + v * 8, Pack8<T>(x[i]));
    }
  }
}

template <typename T, bool kFused>
cudaError_t LaunchNorm(const T* input, int64_t input_stride, T* residual, const T* weight,
                       T* output, int64_t output_stride, int64_t num_tokens, int64_t hidden_size,
                       float epsilon, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t num_vecs = hidden_size / 8;
  const int64_t vecs_per_thread = CeilDiv(num_vecs, kNormThreads);
  const int threads =
      vecs_per_thread == 1 ? static_cast<int>(CeilDiv(num_vecs, 32) * 32) : kNormThreads;
  const dim3 grid(static_cast<unsigned>(num_tokens));
  const int hidden = static_cast<int>(hidden_size);
  auto launch = [&](auto kernel) {
    return LaunchKernel(kernel, grid, threads, 0, stream, input, input_stride, residual, weight,
                        output, output_stride, hidden, epsilon, EarlyDependentLaunch("norm"));
  };
  if (vecs_per_thread <= 1) return launch(RmsNormKernel<T, 1, kFused>);
  if (vecs_per_thread <= 2) return launch(RmsNormKernel<T, 2, kFused>);
  if (vecs_per_thread <= 4) return launch(RmsNormKernel<T, 4, kFused>);
  if (vecs_per_thread <= 8) return launch(RmsNormKernel<T, 8, kFused>);
  return launch(RmsNormKernel<T, 16, kFused>);  // hidden_size <= 32768
}

}  // namespace

cudaError_t Launch(const RmsNormParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchActivationDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchNorm<T, false>(static_cast<const T*>(p.input),
                                p.input_stride != 0 ? p.input_stride : p.hidden_size, nullptr,
                                static_cast<const T*>(p.weight), static_cast<T*>(p.output),
                                p.output_stride != 0 ? p.output_stride : p.hidden_size,
                                p.num_tokens, p.hidden_size, p.epsilon, stream);
  });
}

cudaError_t Launch(const FusedAddRmsNormParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchActivationDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchNorm<T, true>(static_cast<const T*>(p.input), p.hidden_size,
                               static_cast<T*>(p.residual), static_cast<const T*>(p.weight),
                               static_cast<T*>(p.output), p.hidden_size, p.num_tokens,
                               p.hidden_size, p.epsilon, stream);
  });
}

}  // namespace lmserve::kernels::cuda
