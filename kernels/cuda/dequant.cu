#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// As GetScaleMinK4 in kernels/cpu/dequant.cc.
__device__ __forceinline__ void ScaleMinK4(int j, const uint8_t* q, float* scale, float* min) {
  if (j < 4) {
    *scale = static_cast<float>(q[j] & 63);
    *min = static_cast<float>(q[j + 4] & 63);
  } else {
    *scale = static_cast<float>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<float>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// The 32 outputs of group g (32 consecutive elements) of a tensor of type kType.
template <DType kType>
__device__ __forceinline__ void DequantizeGroup(const uint8_t* src, int64_t g, float (&y)[32]) {
  if constexpr (kType == DType::kQ8_0) {
    const uint8_t* x = src + g * 34;
    const float d = LoadHalf(x);
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = __fmul_rn(static_cast<float>(static_cast<int8_t>(x[2 + j])), d);
  } else if constexpr (kType == DType::kQ4_0) {
    const uint8_t* x = src + g * 18;
    const float d = LoadHalf(x);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = __fmul_rn(static_cast<float>((x[2 + j] & 0x0F) - 8), d);
      y[j + 16] = __fmul_rn(static_cast<float>((x[2 + j] >> 4) - 8), d);
    }
  } else if constexpr (kType == DType::kQ4_1) {
    const uint8_t* x = src + g * 20;
    const float d = LoadHalf(x), m = LoadHalf(x + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = __fadd_rn(__fmul_rn(static_cast<float>(x[4 + j] & 0x0F), d), m);
      y[j + 16] = __fadd_rn(__fmul_rn(static_cast<float>(x[4 + j] >> 4), d), m);
    }
  } else if constexpr (kType == DType::kQ4_K || kType == DType::kQ5_K) {
    constexpr int kBytes = kType == DType::kQ4_K ? 144 : 176;
    const int sub = static_cast<int>(g % 8);  // sub-block: 32 elements
    const uint8_t* x = src + (g / 8) * kBytes;
    const float d = LoadHalf(x), dmin = LoadHalf(x + 2);
    float sc, mn;
    ScaleMinK4(sub, x + 4, &sc, &mn);
    const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, mn);
    const uint8_t* q = x + (kType == DType::kQ4_K ? 16 : 48) + (sub / 2) * 32;
    const int nibble_shift = (sub % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> nibble_shift) & 0xF;
      if constexpr (kType == DType::kQ5_K) v += (x[16 + l] >> sub) & 1 ? 16 : 0;
      y[l] = __fsub_rn(__fmul_rn(d1, static_cast<float>(v)), m1);
    }
  } else if constexpr (kType == DType::kQ6_K) {
    const int sub = static_cast<int>(g % 8);  // half n = sub / 4, quarter = sub % 4
    const uint8_t* x = src + (g / 8) * 210;
    const int half = sub / 4, quarter = sub % 4;
    const uint8_t* ql = x + half * 64 + (quarter % 2) * 32;
    const uint8_t* qh = x + 128 + half * 32;
    const auto* scales = reinterpret_cast<const int8_t*>(x + 192 + half * 8);
    const float d = LoadHalf(x + 208);
    const int low_shift = (quarter / 2) * 4, high_shift = quarter * 2;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> low_shift) & 0xF) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
      const float scale = static_cast<float>(scales[l / 16 + 2 * quarter]);
      y[l] = __fmul_rn(__fmul_rn(d, scale), static_cast<float>(q));
    }
  } else if constexpr (kType == DType::kF32) {
    const float* x = reinterpret_cast<const float*>(src) + g * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = x[j];
  } else if constexpr (kType == DType::kF16) {
    const __half* x = reinterpret_cast<const __half*>(src) + g * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = __half2float(x[j]);
  } else {  // kBF16
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(src) + g * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = __bfloat162float(x[j]);
  }
}

template <DType kType, typename Out>
__global__ void __launch_bounds__(kThreads)
    DequantizeKernel(const uint8_t* __restrict__ src, Out* __restrict__ dst, int64_t num_groups) {
  const int64_t g = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (g >= num_groups) return;
  float y[32];
  DequantizeGroup<kType>(src, g, y);
  Out* out = dst + g * 32;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    float part[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) part[j] = y[8 * v + j];
    Store8<Out>(out + 8 * v, part);
  }
}

template <DType kType>
cudaError_t LaunchDequantize(const DequantizeParams& p, cudaStream_t stream) {
  const int64_t groups = p.num_elements / 32;
  const auto blocks = static_cast<unsigned>(CeilDiv(groups, kThreads));
  const auto* src = static_cast<const uint8_t*>(p.src);
  if (p.output_dtype == DType::kF32) {
    DequantizeKernel<kType, float>
        <<<blocks, kThreads, 0, stream>>>(src, static_cast<float*>(p.dst), groups);
  } else {
    DequantizeKernel<kType, __nv_bfloat16>
        <<<blocks, kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(p.dst), groups);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t Launch(const DequantizeParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_elements == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kF32:
      return LaunchDequantize<DType::kF32>(p, stream);
    case DType::kF16:
      return LaunchDequantize<DType::kF16>(p, stream);
    case DType::kBF16:
      return LaunchDequantize<DType::kBF16>(p, stream);
    case DType::kQ8_0:
      return LaunchDequantize<DType::kQ8_0>(p, stream);
    case DType::kQ4_0:
      return LaunchDequantize<DType::kQ4_0>(p, stream);
    case DType::kQ4_1:
      return LaunchDequantize<DType::kQ4_1>(p, stream);
    case DType::kQ4_K:
      return LaunchDequantize<DType::kQ4_K>(p, stream);
    case DType::kQ5_K:
      return LaunchDequantize<DType::kQ5_K>(p, stream);
    case DType::kQ6_K:
      return LaunchDequantize<DType::kQ6_K>(p, stream);
    case DType::kF8E4M3:  // Validate() refuses it
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

}  // namespace lmserve::kernels::cuda
