#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {
namespace {

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

// What a launch fuses around the product (SkinnyGemmParams): the RMSNorm in front, the residual
// add behind.
struct Fusion {
  const void* norm_weight;
  float norm_epsilon;
  void* residual;
  bool late_dependents;  // let the next kernel launch after the dot products, not at the start
  bool prefetch_l2;      // ask for the warp's rows in the L2 before waiting for the last kernel
};

// grid: ceil(n / (kWarps * kRowsPerWarp)); warp w of block b takes rows
// (b * kWarps + w) * kRowsPerWarp + [0, kRowsPerWarp). With kSiluAndMul, warp w takes output
// column j = b * kWarps + w: the gate row j and the up row j + n / 2.
// A kernel that streams W keeps as many bytes in flight as it has warps resident: for one row,
// four blocks a multiprocessor (64 registers a thread; the fused norm's sums would otherwise take
// it to 80 and three blocks, which cost an H200 a tenth of the bandwidth).
template <typename T, typename OutT, int M, bool kSiluAndMul, bool kNorm, bool kResidual>
__global__ void __launch_bounds__(kThreads, M == 1 ? 4 : 1)
    SkinnyGemmKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y,
                     int n, int k, int64_t x_stride, int64_t y_stride, Fusion fusion) {
  static_assert(!kSiluAndMul || kRowsPerWarp == 2, "a warp holds a gate row and its up row");
  static_assert(!kResidual || (!kSiluAndMul && std::is_same_v<OutT, T>), "residual add");
  const int lane = threadIdx.x % 32;
  const int warp_index = blockIdx.x * kWarps + threadIdx.x / 32;
  const int row0 = kSiluAndMul ? warp_index : warp_index * kRowsPerWarp;
  if (row0 >= (kSiluAndMul ? n / 2 : n)) {
    WaitForPriorKernels();
    return;
  }
  const int row_step = kSiluAndMul ? n / 2 : 1;  // between a warp's rows
  const int chunks = k / 8;
  const T* norm_weight = static_cast<const T*>(fusion.norm_weight);
  float acc[kRowsPerWarp][M];
  float squares[M];  // kNorm: this lane's share of each token's sum of squares
#pragma unroll
  for (int t = 0; t < M; ++t) squares[t] = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
  }
  const T* w_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) w_rows[r] = w + int64_t{row0 + r * row_step} * k;

  // One 16-byte piece of x (token t, piece c) for the dot products: with kNorm, its squares
  // summed first, then multiplied by the norm weight.
  auto x_piece = [&](int t, int c, const float (&g)[8], float (&xf)[8]) {
    Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(x + t * x_stride + c * 8)), xf);
    if constexpr (kNorm) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        squares[t] = fmaf(xf[e], xf[e], squares[t]);
        xf[e] *= g[e];
      }
    }
  };
  auto norm_piece = [&](int c, float (&g)[8]) {
    if constexpr (kNorm) Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(norm_weight + c * 8)), g);
  };

  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[u][r] = LoadStream16(w_rows[r] + (c + 32 * u) * 8);
    }
  };
  // The weights do not depend on the previous kernel: the first pieces are requested before
  // waiting for it (programmatic dependent launch, common.cuh).
  int c = lane;
  if (fusion.prefetch_l2 && lane < kRowsPerWarp) {
    // The whole row, while the previous kernel runs (it does not write W): one bulk prefetch.
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w_rows[lane]),
                 "r"(static_cast<uint32_t>(k) * static_cast<uint32_t>(sizeof(T)))
                 : "memory");
  }
  if (c + 32 * (kUnroll - 1) < chunks) load_w(c);
  WaitForPriorKernels();
  if (!fusion.late_dependents) AllowDependentLaunch();
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    if (c != lane) load_w(c);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float g[8];
      norm_piece(c + 32 * u, g);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float xf[8];
        x_piece(t, c + 32 * u, g, xf);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float wf[8];
          Unpack8<T>(wv[u][r], wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
        }
      }
    }
  }
  for (; c < chunks; c += 32) {  // the tail
    uint4 wv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wv[r] = LoadStream16(w_rows[r] + c * 8);
    float g[8];
    norm_piece(c, g);
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float xf[8];
      x_piece(t, c, g, xf);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float wf[8];
        Unpack8<T>(wv[r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
      }
    }
  }
  if (fusion.late_dependents) AllowDependentLaunch();
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]);
  }
  if constexpr (kNorm) {
    // Every warp sums the same pieces in the same order: all of them scale a token alike.
#pragma unroll
    for (int t = 0; t < M; ++t) {
      const float inv_rms =
          rsqrtf(WarpSum(squares[t]) / static_cast<float>(k) + fusion.norm_epsilon);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] *= inv_rms;
    }
  }
  if constexpr (kSiluAndMul) {
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const float gate = ToFloat(FromFloat<T>(acc[0][t])), up = ToFloat(FromFloat<T>(acc[1][t]));
        Store(y + t * y_stride + row0, gate / (1.0f + __expf(-gate)) * up);
      }
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (row0 + r >= n) continue;
#pragma unroll
      for (int t = 0; t < M; ++t) {
        if constexpr (kResidual) {
          T* at = static_cast<T*>(fusion.residual) + t * y_stride + row0 + r;
          *at = FromFloat<T>(ToFloat(FromFloat<T>(acc[r][t])) + ToFloat(*at));
        } else {
          Store(y + t * y_stride + row0 + r, acc[r][t]);
        }
      }
    }
  }
}

template <typename T, typename OutT, bool kSiluAndMul, bool kNorm, bool kResidual>
cudaError_t LaunchTyped(const SkinnyGemmParams& p, cudaStream_t stream) {
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  const int64_t y_stride = p.y_stride != 0 ? p.y_stride : (kSiluAndMul ? p.n / 2 : p.n);
  const unsigned blocks =
      static_cast<unsigned>(CeilDiv(p.n, int64_t{kWarps} * kRowsPerWarp));  // both mappings
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  OutT* y = static_cast<OutT*>(p.y);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  static const bool late = [] {
    const char* env = std::getenv("LMSERVE_SKINNY_TRIGGER");
    return env == nullptr || std::string_view(env) != "start";
  }();
  const Fusion fusion{p.norm_weight, p.norm_epsilon, p.residual, late, p.prefetch_l2};
  switch (p.m) {
#define LMSERVE_SKINNY_CASE(M)                                                                 \
  case M:                                                                                      \
    return LaunchKernel(SkinnyGemmKernel<T, OutT, M, kSiluAndMul, kNorm, kResidual>, blocks,   \
                        kThreads, 0, stream, x, w, y, n, k, x_stride, y_stride, fusion);
    LMSERVE_SKINNY_CASE(1)
    LMSERVE_SKINNY_CASE(2)
    LMSERVE_SKINNY_CASE(3)
    LMSERVE_SKINNY_CASE(4)
    LMSERVE_SKINNY_CASE(5)
    LMSERVE_SKINNY_CASE(6)
    LMSERVE_SKINNY_CASE(7)
    LMSERVE_SKINNY_CASE(8)
#undef LMSERVE_SKINNY_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t Launch(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  // Validate() allows the activation and the fusions with the input type out only, and the
  // fusions with bf16 only.
  if (p.input_dtype == DType::kBF16) {
    using T = __nv_bfloat16;
    const bool norm = p.norm_weight != nullptr;
    if (p.output_dtype == DType::kF32) return LaunchTyped<T, float, false, false, false>(p, stream);
    if (p.silu_and_mul) {
      return norm ? LaunchTyped<T, T, true, true, false>(p, stream)
                  : LaunchTyped<T, T, true, false, false>(p, stream);
    }
    if (p.residual != nullptr) return LaunchTyped<T, T, false, false, true>(p, stream);
    return norm ? LaunchTyped<T, T, false, true, false>(p, stream)
                : LaunchTyped<T, T, false, false, false>(p, stream);
  }
  return DispatchActivationDType(p.input_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.output_dtype == DType::kF32) return LaunchTyped<T, float, false, false, false>(p, stream);
    if (p.silu_and_mul) return LaunchTyped<T, T, true, false, false>(p, stream);
    return LaunchTyped<T, T, false, false, false>(p, stream);
  });
}

}  // namespace lmserve::kernels::cuda
