#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// The input's prologue (skinny_gemm.h): none, Mamba-2's gated RMSNorm, or an RMSNorm.
enum class Prologue { kNone, kGatedNorm, kRmsNorm };

// The prologue's inputs; unused with Prologue::kNone.
template <typename T>
struct NormInput {
  const T* gate;  // kGatedNorm
  int64_t gate_stride;
  const T* weight;
  float epsilon;
};

// Input row t's 8 features from chunk c (x of type XT: T, or fp32 for kRmsNorm): x itself, or
// weight * v with v = x * silu(gate) (kGatedNorm) or v = x (kRmsNorm), adding sum(v^2) to
// *squares.
template <typename T, typename XT, Prologue kPrologue>
__device__ __forceinline__ void LoadInput(const XT* x, int64_t x_stride, const NormInput<T>& g,
                                          int t, int c, float (&xf)[8], float* squares) {
  if constexpr (std::is_same_v<XT, float>) {
    const float4* p = reinterpret_cast<const float4*>(x + t * x_stride + c * 8);
    const float4 lo = __ldg(p), hi = __ldg(p + 1);
    xf[0] = lo.x, xf[1] = lo.y, xf[2] = lo.z, xf[3] = lo.w;
    xf[4] = hi.x, xf[5] = hi.y, xf[6] = hi.z, xf[7] = hi.w;
  } else {
    Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(x + t * x_stride + c * 8)), xf);
  }
  if constexpr (kPrologue != Prologue::kNone) {
    float wf[8], gate[8];  // gate: silu(z), or 1 (kRmsNorm)
    Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(g.weight + c * 8)), wf);
    if constexpr (kPrologue == Prologue::kGatedNorm) {
      Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(g.gate + t * g.gate_stride + c * 8)), gate);
#pragma unroll
      for (int e = 0; e < 8; ++e) gate[e] = gate[e] / (1.0f + expf(-gate[e]));
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) gate[e] = 1.0f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float v = xf[e] * gate[e];
      *squares = fmaf(v, v, *squares);
      xf[e] = wf[e] * v;
    }
  }
}

// grid: ceil(n / (kWarps * kRowsPerWarp)); warp w of block b takes rows
// (b * kWarps + w) * kRowsPerWarp + [0, kRowsPerWarp). With kSiluAndMul, warp w takes output
// column j = b * kWarps + w: the gate row j and the up row j + n / 2, and writes
// act(gate) * up (kActivation). kPrologue: the norm of the input (skinny_gemm.h); with
// kAccumulate, y += the product rounded to T (y of type OutT: the residual stream).
template <typename T, typename OutT, int M, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu, Prologue kPrologue = Prologue::kNone,
          typename XT = T, bool kAccumulate = false>
__global__ void __launch_bounds__(kThreads)
    SkinnyGemmKernel(const XT* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y,
                     int n, int k, int64_t x_stride, int64_t y_stride, bool late_dependents,
                     NormInput<T> norm) {
  static_assert(!kSiluAndMul || (kPrologue == Prologue::kNone && !kAccumulate));
  static_assert(std::is_same_v<XT, T> || kPrologue == Prologue::kRmsNorm);
  static_assert(!kSiluAndMul || kRowsPerWarp == 2, "a warp holds a gate row and its up row");
  const int lane = threadIdx.x % 32;
  const int warp_index = blockIdx.x * kWarps + threadIdx.x / 32;
  const int row0 = kSiluAndMul ? warp_index : warp_index * kRowsPerWarp;
  if (row0 >= (kSiluAndMul ? n / 2 : n)) {
    WaitForPriorKernels();
    return;
  }
  const int row_step = kSiluAndMul ? n / 2 : 1;  // between a warp's rows
  const int chunks = k / 8;
  float acc[kRowsPerWarp][M];
  float squares[M];  // with a prologue: this lane's sum of v^2 per input row
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

  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[u][r] = LoadStream16(w_rows[r] + (c + 32 * u) * 8);
    }
  };
  // The weights do not depend on the previous kernel: the first pieces are requested before
  // waiting for it (programmatic dependent launch, common.cuh). A step takes kUnroll pieces a
  // lane, 32 * kUnroll chunks a warp; the steps where every lane has all of its pieces run here,
  // the warp converged, and the pieces left over run in the tail loop below.
  constexpr int kStep = 32 * kUnroll;
  int c = lane;
  if (kStep <= chunks) load_w(c);
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  for (; c - lane + kStep <= chunks; c += kStep) {
    if (c != lane) {
      load_w(c);
      // All of the step's loads before any of its products. Without this barrier, CUDA 13.0's
      // ptxas folds the loads into the products as predicated loads and issues the last one only
      // after the products of the first piece, which wait for it to arrive: a step then waits
      // for two round trips to memory instead of one. (An H200, Llama-3-8B's shapes, batch 1:
      // the projections streamed at 3.9-4.4 TB/s without it and 4.0-4.6 with it.)
      __syncwarp();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float xf[8];
        LoadInput<T, XT, kPrologue>(x, x_stride, norm, t, c + 32 * u, xf, &squares[t]);
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
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float xf[8];
      LoadInput<T, XT, kPrologue>(x, x_stride, norm, t, c, xf, &squares[t]);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float wf[8];
        Unpack8<T>(wv[r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
      }
    }
  }
  // With late_dependents the next kernel may launch only once every warp has read its share of
  // W, not right after the wait (common.cuh): a next GEMM's blocks, streaming weights too, then
  // do not take the memory from this one's. An H200, Llama-3-8B's shapes at batch 1: 4.15 ms a
  // step against 4.21 with it everywhere, 4.12 with it for the gate/up projection alone.
  if (late_dependents) AllowDependentLaunch();
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]);
  }
  if constexpr (kPrologue != Prologue::kNone) {
#pragma unroll
    for (int t = 0; t < M; ++t) {
      const float scale = rsqrtf(WarpSum(squares[t]) / static_cast<float>(k) + norm.epsilon);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] *= scale;
    }
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
      for (int t = 0; t < M; ++t) {
        OutT* out = y + t * y_stride + row0 + r;
        if constexpr (kAccumulate) {
          // As the fused add + RMSNorm would add this product: rounded to T, the sum to OutT.
          Store(out, ToFloat(*out) + ToFloat(FromFloat<T>(acc[r][t])));
        } else {
          Store(out, acc[r][t]);
        }
      }
    }
  }
}

template <typename T, typename OutT, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu, Prologue kPrologue = Prologue::kNone,
          typename XT = T, bool kAccumulate = false>
cudaError_t LaunchTyped(const SkinnyGemmParams& p, cudaStream_t stream) {
  const NormInput<T> norm{static_cast<const T*>(p.gate), p.gate_stride,
                          static_cast<const T*>(p.norm_weight), p.norm_epsilon};
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  const int64_t y_stride = p.y_stride != 0 ? p.y_stride : (kSiluAndMul ? p.n / 2 : p.n);
  const unsigned blocks =
      static_cast<unsigned>(CeilDiv(p.n, int64_t{kWarps} * kRowsPerWarp));  // both mappings
  const XT* x = static_cast<const XT*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  OutT* y = static_cast<OutT*>(p.y);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  switch (p.m) {
#define LMSERVE_SKINNY_CASE(M)                                                          \
  case M:                                                                               \
    return LaunchKernel(SkinnyGemmKernel<T, OutT, M, kSiluAndMul, kActivation, kPrologue, XT,   \
                                         kAccumulate>,                                        \
                        blocks, kThreads, 0, stream, x, w, y, n, k, x_stride, y_stride,           \
                        p.late_dependents, norm);
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
  return DispatchActivationDType(p.input_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Validate() allows the activation and the norms with the input type out only, the norm
    // prologues' fused forms (residual stream in fp32) as below only.
    constexpr GateActivation kSilu = GateActivation::kSilu;
    if (p.accumulate) {  // Mamba-2's out_proj into the fp32 residual
      return LaunchTyped<T, float, false, kSilu, Prologue::kNone, T, true>(p, stream);
    }
    if (p.rms_norm) {  // the next layer's in_proj over the fp32 residual
      return LaunchTyped<T, T, false, kSilu, Prologue::kRmsNorm, float>(p, stream);
    }
    if (p.output_dtype == DType::kF32) return LaunchTyped<T, float, false>(p, stream);
    if (p.silu_and_mul && p.activation == GateActivation::kGeluTanh) {
      return LaunchTyped<T, T, true, GateActivation::kGeluTanh>(p, stream);
    }
    if (p.silu_and_mul) return LaunchTyped<T, T, true>(p, stream);
    if (p.gate != nullptr) return LaunchTyped<T, T, false, kSilu, Prologue::kGatedNorm>(p, stream);
    return LaunchTyped<T, T, false>(p, stream);
  });
}

}  // namespace lmserve::kernels::cuda
