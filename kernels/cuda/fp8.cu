#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/residual_fold.cuh"

namespace lmserve::kernels::cuda {
namespace {

// 4 E4M3 bytes of a word (lowest byte first) to fp32.
__device__ __forceinline__ void UnpackF8x4(uint32_t word, float* out) {
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

// ---- F8QuantizeRows: one block a row.

constexpr int kQuantizeThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    F8QuantizeRowsKernel(const T* __restrict__ src, uint8_t* __restrict__ dst,
                         float* __restrict__ scales, int cols, int64_t src_stride,
                         int64_t dst_stride) {
  __shared__ float scratch[32];
  BeginDependentKernel();
  const T* row = src + blockIdx.x * src_stride;
  uint8_t* out = dst + blockIdx.x * dst_stride;
  float amax = 0.0f;
  for (int c = threadIdx.x * 8; c < cols; c += kQuantizeThreads * 8) {
    float v[8];
    Load8(row + c, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
  }
  const float multiplier = F8RowMultiplier(BlockMax(amax, scratch), scales + blockIdx.x);
  for (int c = threadIdx.x * 8; c < cols; c += kQuantizeThreads * 8) {
    float v[8];
    Load8(row + c, v);
    *reinterpret_cast<uint2*>(out + c) = F8x8Quantize(v, multiplier);
  }
}

// ---- F8ScaleOutput: a block of 256 threads per row, 8 columns a thread at a time.

constexpr int kScaleThreads = 256;

__global__ void __launch_bounds__(kScaleThreads)
    F8ScaleOutputKernel(__nv_bfloat16* __restrict__ y, const float* __restrict__ row_scales,
                        const float* __restrict__ col_scales, int n, int64_t y_stride) {
  BeginDependentKernel();
  __nv_bfloat16* row = y + blockIdx.x * y_stride;
  const float row_scale = row_scales[blockIdx.x];
  for (int c = threadIdx.x * 8; c < n; c += kScaleThreads * 8) {
    float v[8];
    Load8(row + c, v);
    LoadAndApplyF8OutputScales(v, row_scale, col_scales + c);  // the rounding Store8 does again
    Store8(row + c, v);
  }
}

// ---- F8SkinnyGemm: as skinny_gemm.cu's kernel, over 16 E4M3 weights a 16-byte piece.

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;  // 16-byte pieces of each W row in flight per lane

template <typename T>
__device__ __forceinline__ void Store(T* p, float v) {
  *p = FromFloat<T>(v);
}
template <>
__device__ __forceinline__ void Store<float>(float* p, float v) {
  *p = v;
}

// acc[r][t] += W piece r . x piece of token t (16 elements at column chunk c); with kFolded, x
// is the folded add + RMSNorm's row in shared memory (residual_fold.cuh), one token.
template <typename T, int M, bool kFolded = false>
__device__ __forceinline__ void MultiplyPiece(const uint4 (&wv)[kRowsPerWarp], const T* x,
                                              int64_t x_stride, int c,
                                              float (&acc)[kRowsPerWarp][M]) {
  float wf[kRowsPerWarp][16];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    UnpackF8x4(wv[r].x, wf[r]);
    UnpackF8x4(wv[r].y, wf[r] + 4);
    UnpackF8x4(wv[r].z, wf[r] + 8);
    UnpackF8x4(wv[r].w, wf[r] + 12);
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    const uint4* xp = reinterpret_cast<const uint4*>(x + t * x_stride + c * 16);
    float xf[16];
    float (&x_lo)[8] = *reinterpret_cast<float(*)[8]>(xf);
    float (&x_hi)[8] = *reinterpret_cast<float(*)[8]>(xf + 8);
    if constexpr (kFolded) {
      Unpack8<T>(xp[0], x_lo);
      Unpack8<T>(xp[1], x_hi);
    } else {
      Unpack8<T>(__ldg(xp), x_lo);
      Unpack8<T>(__ldg(xp + 1), x_hi);
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[r][t] = fmaf(wf[r][e], xf[e], acc[r][t]);
    }
  }
}

// grid: ceil(n / (kWarps * kRowsPerWarp)); the mapping of skinny_gemm.cu. At one row, 64
// registers (four blocks a multiprocessor), as without the scales' copy. kAddNorm: the add +
// RMSNorm folded in, as skinny_gemm.cu's (x then reads the row from shared memory).
template <typename T, typename OutT, int M, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu, bool kAddNorm = false>
__global__ void __launch_bounds__(kThreads, M == 1 ? 4 : 1)
    F8SkinnyGemmKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                       const float* __restrict__ w_scales, OutT* __restrict__ y, int n, int k,
                       int64_t x_stride, int64_t y_stride, bool late_dependents,
                       ResidualFoldArgs fold) {
  static_assert(!kAddNorm || M == 1, "the folded add + RMSNorm takes one row");
  const int lane = threadIdx.x % 32;
  const int warp_index = blockIdx.x * kWarps + threadIdx.x / 32;
  const int row0 = kSiluAndMul ? warp_index : warp_index * kRowsPerWarp;
  if (row0 >= (kSiluAndMul ? n / 2 : n)) {
    WaitForPriorKernels();
    // Its share of the folded norm's row, and the barrier.
    if constexpr (kAddNorm) AddNormScale<T, kThreads>(x, fold, k);
    return;
  }
  // The settle first, before W's pieces are requested (residual_fold.cuh says why).
  if constexpr (!kSiluAndMul && !kAddNorm) {  // Validate(): never both
    if (fold.settle_residual != nullptr) {
      SettleResidualRows<OutT, kRowsPerWarp>(fold.settle_residual, y, row0, n, lane);
    }
  }
  const int row_step = kSiluAndMul ? n / 2 : 1;
  const int chunks = k / 16;
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
  }
  const uint8_t* w_rows[kRowsPerWarp];
  int rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    rows[r] = min(row0 + r * row_step, n - 1);  // an odd last row reads its neighbour, unused
    w_rows[r] = w + int64_t{rows[r]} * k;
  }
  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[u][r] = LoadStream16(w_rows[r] + (c + 32 * u) * 16);
    }
  };
  constexpr int kStep = 32 * kUnroll;
  int c = lane;
  if (kStep <= chunks) load_w(c);  // weights before the wait (skinny_gemm.cu says why)
  // The rows' scales too, into shared memory (no registers held through the products): read
  // after them they would be one more round trip to memory, and not from L2, at every warp's end.
  static_assert(kRowsPerWarp == 2);
  __shared__ float row_scales[kWarps][kRowsPerWarp];
  const int warp = threadIdx.x / 32;
  if (lane < kRowsPerWarp) {
    CpAsync4(&row_scales[warp][lane], w_scales + (lane == 0 ? rows[0] : rows[1]));
  }
  CpAsyncCommit();
  if constexpr (kAddNorm) {
    if (warp == 0 && lane == 0) PrefetchAddNormWeight<T>(fold, k);
  }
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  [[maybe_unused]] float add_norm_scale = 1.0f;
  if constexpr (kAddNorm) {
    add_norm_scale = AddNormScale<T, kThreads>(x, fold, k);
    x = reinterpret_cast<const T*>(AddNormRowMemory());
  }
  for (; c - lane + kStep <= chunks; c += kStep) {
    if (c != lane) {
      load_w(c);
      __syncwarp();  // every load of the step before its products (skinny_gemm.cu)
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      MultiplyPiece<T, M, kAddNorm>(wv[u], x, x_stride, c + 32 * u, acc);
    }
  }
  for (; c < chunks; c += 32) {  // the tail
    uint4 tail[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) tail[r] = LoadStream16(w_rows[r] + c * 16);
    MultiplyPiece<T, M, kAddNorm>(tail, x, x_stride, c, acc);
  }
  if (late_dependents) AllowDependentLaunch();
  CpAsyncWait<0>();
  __syncwarp();
  float scale[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) scale[r] = row_scales[warp][r];
  if constexpr (kAddNorm) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) scale[r] *= add_norm_scale;
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]) * scale[r];
  }
  if constexpr (kSiluAndMul) {
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const float gate = ToFloat(FromFloat<T>(acc[0][t])), up = ToFloat(FromFloat<T>(acc[1][t]));
        Store(y + t * y_stride + row0, GateActivationOf<kActivation, true>(gate) * up);
      }
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (row0 + r >= n) continue;
#pragma unroll
      for (int t = 0; t < M; ++t) Store(y + t * y_stride + row0 + r, acc[r][t]);
    }
  }
}

template <typename T, typename OutT, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu>
cudaError_t LaunchSkinny(const F8SkinnyGemmParams& p, cudaStream_t stream) {
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  const int64_t y_stride = p.y_stride != 0 ? p.y_stride : (kSiluAndMul ? p.n / 2 : p.n);
  const unsigned blocks = static_cast<unsigned>(CeilDiv(p.n, int64_t{kWarps} * kRowsPerWarp));
  const T* x = static_cast<const T*>(p.x);
  const uint8_t* w = static_cast<const uint8_t*>(p.w);
  OutT* y = static_cast<OutT*>(p.y);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const ResidualFoldArgs fold = ResidualFoldArgsOf(p);
  if constexpr (std::is_same_v<OutT, T>) {
    if (p.add_norm_residual != nullptr) {  // Validate(): one row
      return LaunchKernel(F8SkinnyGemmKernel<T, OutT, 1, kSiluAndMul, kActivation, true>, blocks,
                          kThreads, static_cast<size_t>(p.k) * sizeof(T), stream, x, w,
                          p.w_scales, y, n, k, x_stride, y_stride, p.late_dependents, fold);
    }
  }
  switch (p.m) {
#define LMSERVE_F8_SKINNY_CASE(M)                                                              \
  case M:                                                                                      \
    return LaunchKernel(F8SkinnyGemmKernel<T, OutT, M, kSiluAndMul, kActivation>, blocks,      \
                        kThreads, 0, stream, x, w, p.w_scales, y, n, k, x_stride, y_stride,    \
                        p.late_dependents, fold);
    LMSERVE_F8_SKINNY_CASE(1)
    LMSERVE_F8_SKINNY_CASE(2)
    LMSERVE_F8_SKINNY_CASE(3)
    LMSERVE_F8_SKINNY_CASE(4)
    LMSERVE_F8_SKINNY_CASE(5)
    LMSERVE_F8_SKINNY_CASE(6)
    LMSERVE_F8_SKINNY_CASE(7)
    LMSERVE_F8_SKINNY_CASE(8)
#undef LMSERVE_F8_SKINNY_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t Launch(const F8QuantizeRowsParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const int64_t src_stride = p.src_stride != 0 ? p.src_stride : p.cols;
  const int64_t dst_stride = p.dst_stride != 0 ? p.dst_stride : p.cols;
  return DispatchElementwiseDType(p.src_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return LaunchKernel(F8QuantizeRowsKernel<T>, static_cast<unsigned>(p.rows), kQuantizeThreads,
                        0, stream, static_cast<const T*>(p.src), static_cast<uint8_t*>(p.dst),
                        p.scales, static_cast<int>(p.cols), src_stride, dst_stride);
  });
}

cudaError_t Launch(const F8ScaleOutputParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  return LaunchKernel(F8ScaleOutputKernel, static_cast<unsigned>(p.m), kScaleThreads, 0, stream,
                      static_cast<__nv_bfloat16*>(p.y), p.row_scales, p.col_scales,
                      static_cast<int>(p.n), p.y_stride != 0 ? p.y_stride : p.n);
}

cudaError_t Launch(const F8SkinnyGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchActivationDType(p.input_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.output_dtype == DType::kF32) return LaunchSkinny<T, float, false>(p, stream);
    if (p.silu_and_mul && p.activation == GateActivation::kGeluTanh) {
      return LaunchSkinny<T, T, true, GateActivation::kGeluTanh>(p, stream);
    }
    if (p.silu_and_mul) return LaunchSkinny<T, T, true>(p, stream);
    return LaunchSkinny<T, T, false>(p, stream);
  });
}

}  // namespace lmserve::kernels::cuda
