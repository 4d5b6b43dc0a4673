#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/norm.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kNormThreads = 256;

// One block per token. Thread i holds vectors i, i + 256, ... (8 elements each) of the row in
// registers between the reduction and the write. The 16-bit types sum the squares in fp32; fp32
// rows sum them in double and take the inverse RMS in double, as the CPU twin does, so that the
// runner's float32 mode normalizes as the CPU runner does up to the order of the sum.
//
// T is the type of the weight and the output; R the residual stream's (T, or float beside a
// 16-bit T): the plain norm's input, the fused norm's residual (its addend `input` is T). The sum
// is rounded to R, not T, before it is stored and normalized.
template <typename T, typename R, int kVecs, bool kFused>
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const std::conditional_t<kFused, T, R>* input, int64_t input_stride,
                  R* __restrict__ residual, const T* __restrict__ weight, T* output,
                  int64_t output_stride, int hidden_size, float epsilon,
                  const float* __restrict__ in_row_scales,
                  const float* __restrict__ in_col_scales, uint8_t* __restrict__ f8_output,
                  float* f8_scales) {
  using In = std::conditional_t<kFused, T, R>;
  using Acc = std::conditional_t<std::is_same_v<T, float>, double, float>;
  __shared__ Acc scratch[32];
  const int num_vecs = hidden_size / 8;
  // An FP8 product's scales (FusedAddRmsNormParams::input_row_scales): bf16 input only.
  constexpr bool kMayScale = kFused && std::is_same_v<T, __nv_bfloat16>;
  const bool scaled = kMayScale && in_row_scales != nullptr;
  // Up to 4 vectors a thread (hidden sizes up to 8192) every load of the row is issued before
  // any is used; beyond, vector by vector (registers).
  constexpr bool kAhead = kVecs <= 4;
  // The weight (and an FP8 product's column scales) are constant: loaded before waiting for the
  // previous kernel, so that after the wait a token costs one round trip to memory (its rows),
  // not two.
  float w[kVecs][8];
  [[maybe_unused]] float cols[kMayScale && kAhead ? kVecs : 1][8];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kNormThreads;
    if (v < num_vecs) {
      Load8<T>(weight + v * 8, w[i]);
      if constexpr (kMayScale && kAhead) {
        if (scaled) Load8<float>(in_col_scales + v * 8, cols[i]);
      }
    }
  }
  BeginDependentKernel();
  const int64_t token = blockIdx.x;
  const In* in_row = input + token * input_stride;
  R* res_row = kFused ? residual + token * hidden_size : nullptr;
  float x[kVecs][8];
  [[maybe_unused]] float r[kFused && kAhead ? kVecs : 1][8];
  auto load = [&](int i, int v, float (&res)[8]) {
    LoadStream8<In>(in_row + v * 8, x[i]);
    if constexpr (kFused) LoadStream8<R>(res_row + v * 8, res);
  };
  if constexpr (kFused && kAhead) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int v = threadIdx.x + i * kNormThreads;
      if (v < num_vecs) load(i, v, r[i]);
    }
  }
  [[maybe_unused]] const float row_scale = scaled ? in_row_scales[token] : 0.0f;
  Acc sum_squares = 0;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kNormThreads;
    if (v < num_vecs) {
      if constexpr (kFused) {
        // The FP8 scales, then the residual's addition, stored rounded as the residual.
        auto add = [&](const float (&res)[8]) {
          if constexpr (kMayScale) {
            if (scaled) {
              if constexpr (kAhead) {
                ApplyF8OutputScales(x[i], row_scale, cols[i]);
              } else {
                LoadAndApplyF8OutputScales(x[i], row_scale, in_col_scales + v * 8);
              }
            }
          }
#pragma unroll
          for (int j = 0; j < 8; ++j) x[i][j] += res[j];
          RoundTrip8<R>(x[i]);  // normalize the residual as stored
          Store8<R>(res_row + v * 8, x[i]);
        };
        if constexpr (kAhead) {
          add(r[i]);
        } else {
          float res[8];
          load(i, v, res);
          add(res);
        }
      } else {
        LoadStream8<In>(in_row + v * 8, x[i]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_squares += static_cast<Acc>(x[i][j]) * x[i][j];
    }
  }
  // The add alone (FusedAddRmsNormParams::output).
  if (kFused && output == nullptr && f8_output == nullptr) return;
  sum_squares = BlockSum(sum_squares, scratch);
  float inv_rms;
  if constexpr (std::is_same_v<Acc, double>) {
    inv_rms = static_cast<float>(
        1.0 / sqrt(sum_squares / static_cast<double>(hidden_size) + static_cast<double>(epsilon)));
  } else {
    inv_rms = rsqrtf(sum_squares / static_cast<float>(hidden_size) + epsilon);
  }
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    if (threadIdx.x + i * kNormThreads < num_vecs) {
#pragma unroll
      for (int j = 0; j < 8; ++j) x[i][j] = x[i][j] * inv_rms * w[i][j];
    }
  }
  if constexpr (kMayScale) {
    if (f8_output != nullptr) {
      // The rows F8QuantizeRows would read (rounded to bf16), their largest magnitude, then its
      // arithmetic. The row's input scale was read above, before BlockSum's barriers: the scale
      // written here may overwrite it.
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (threadIdx.x + i * kNormThreads < num_vecs) {
          RoundTrip8<T>(x[i]);
#pragma unroll
          for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[i][j]));
        }
      }
      const float multiplier = F8RowMultiplier(BlockMax(amax, scratch), f8_scales + token);
      uint8_t* q_row = f8_output + token * hidden_size;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const int v = threadIdx.x + i * kNormThreads;
        if (v < num_vecs) *reinterpret_cast<uint2*>(q_row + v * 8) = F8x8Quantize(x[i], multiplier);
      }
      return;
    }
  }
  T* out_row = output + token * output_stride;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kNormThreads;
    if (v < num_vecs) Store8<T>(out_row + v * 8, x[i]);
  }
}

template <typename T, typename R, bool kFused>
cudaError_t LaunchNorm(const std::conditional_t<kFused, T, R>* input, int64_t input_stride,
                       R* residual, const T* weight, T* output, int64_t output_stride,
                       int64_t num_tokens, int64_t hidden_size, float epsilon,
                       cudaStream_t stream, const float* in_row_scales = nullptr,
                       const float* in_col_scales = nullptr, uint8_t* f8_output = nullptr,
                       float* f8_scales = nullptr) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t num_vecs = hidden_size / 8;
  const int64_t vecs_per_thread = CeilDiv(num_vecs, kNormThreads);
  const int threads =
      vecs_per_thread == 1 ? static_cast<int>(CeilDiv(num_vecs, 32) * 32) : kNormThreads;
  const dim3 grid(static_cast<unsigned>(num_tokens));
  const int hidden = static_cast<int>(hidden_size);
  auto launch = [&](auto kernel) {
    return LaunchKernel(kernel, grid, threads, 0, stream, input, input_stride, residual, weight,
                        output, output_stride, hidden, epsilon, in_row_scales, in_col_scales,
                        f8_output, f8_scales);
  };
  if (vecs_per_thread <= 1) return launch(RmsNormKernel<T, R, 1, kFused>);
  if (vecs_per_thread <= 2) return launch(RmsNormKernel<T, R, 2, kFused>);
  if (vecs_per_thread <= 4) return launch(RmsNormKernel<T, R, 4, kFused>);
  if (vecs_per_thread <= 8) return launch(RmsNormKernel<T, R, 8, kFused>);
  return launch(RmsNormKernel<T, R, 16, kFused>);  // hidden_size <= 32768
}

// Calls f(TypeTag<T>{}, TypeTag<R>{}): R is float where `residual_dtype` is kF32, else T.
template <typename F>
cudaError_t DispatchResidualDType(DType dtype, std::optional<DType> residual_dtype, F&& f) {
  return DispatchElementwiseDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, float>) {
      if (residual_dtype.value_or(dtype) == DType::kF32) return f(tag, TypeTag<float>{});
    }
    return f(tag, tag);
  });
}

}  // namespace

cudaError_t Launch(const RmsNormParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchResidualDType(p.dtype, p.input_dtype, [&](auto tag, auto residual_tag) {
    using T = typename decltype(tag)::type;
    using R = typename decltype(residual_tag)::type;
    return LaunchNorm<T, R, false>(static_cast<const R*>(p.input),
                                   p.input_stride != 0 ? p.input_stride : p.hidden_size, nullptr,
                                   static_cast<const T*>(p.weight), static_cast<T*>(p.output),
                                   p.output_stride != 0 ? p.output_stride : p.hidden_size,
                                   p.num_tokens, p.hidden_size, p.epsilon, stream);
  });
}

cudaError_t Launch(const FusedAddRmsNormParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchResidualDType(p.dtype, p.residual_dtype, [&](auto tag, auto residual_tag) {
    using T = typename decltype(tag)::type;
    using R = typename decltype(residual_tag)::type;
    return LaunchNorm<T, R, true>(static_cast<const T*>(p.input), p.hidden_size,
                                  static_cast<R*>(p.residual), static_cast<const T*>(p.weight),
                                  static_cast<T*>(p.output), p.hidden_size, p.num_tokens,
                                  p.hidden_size, p.epsilon, stream, p.input_row_scales,
                                  p.input_col_scales, static_cast<uint8_t*>(p.f8_output),
                                  p.f8_output_scales);
  });
}

}  // namespace lmserve::kernels::cuda
