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

template <typename T, typename OutT>
struct SkinnyArgs {
  const T* x;
  const T* w;
  OutT* y;
  int n, k;
  int64_t x_stride, y_stride;
  const T* norm_weight;   // kNorm: RMSNorm weight [k]
  const T* residual_add;  // kNorm: added to x first, or null
  T* residual_out;        // kNorm: the sum, written by block 0, or null
  float epsilon;
};

// The input rows of a kNorm kernel, normalized into shared memory (s_x: [M][k]) by every block:
// h = x (+ residual_add, rounded to T as FusedAddRmsNorm stores it), then h / rms(h) * weight,
// rounded to T. Block 0 writes h to residual_out. Every thread of the block calls it.
template <typename T, typename OutT, int M>
__device__ __forceinline__ void NormalizeInput(const SkinnyArgs<T, OutT>& a, T* s_x) {
  __shared__ float s_partial[kWarps][M];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunks = a.k / 8;
  const bool write_residual = blockIdx.x == 0 && a.residual_out != nullptr;
  float squares[M];
#pragma unroll
  for (int t = 0; t < M; ++t) squares[t] = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float h[8];
      uint4 packed = Load16(a.x + t * a.x_stride + c * 8);
      if (a.residual_add != nullptr) {
        float r[8];
        Unpack8<T>(packed, h);
        Unpack8<T>(Load16(a.residual_add + int64_t{t} * a.k + c * 8), r);
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] += r[j];
        packed = Pack8<T>(h);
        if (write_residual) Store16(a.residual_out + int64_t{t} * a.k + c * 8, packed);
      }
      Unpack8<T>(packed, h);
#pragma unroll
      for (int j = 0; j < 8; ++j) squares[t] += h[j] * h[j];
      Store16(s_x + t * a.k + c * 8, packed);
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t) {
    squares[t] = WarpSum(squares[t]);
    if (lane == 0) s_partial[warp][t] = squares[t];
  }
  __syncthreads();
  float inv_rms[M];
#pragma unroll
  for (int t = 0; t < M; ++t) {
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) total += s_partial[i][t];
    inv_rms[t] = rsqrtf(total / static_cast<float>(a.k) + a.epsilon);
  }
  for (int c = threadIdx.x; c < chunks; c += kThreads) {  // the pieces this thread stored
    float g[8];
    Unpack8<T>(Load16(a.norm_weight + c * 8), g);
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float h[8];
      Unpack8<T>(*reinterpret_cast<const uint4*>(s_x + t * a.k + c * 8), h);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = h[j] * inv_rms[t] * g[j];
      Store16(s_x + t * a.k + c * 8, Pack8<T>(h));
    }
  }
  __syncthreads();
}

// A warp per task, kRowsPerWarp rows of W: task i takes rows i * kRowsPerWarp + [0,
// kRowsPerWarp), or with kSiluAndMul output column i: the gate row i and the up row i + n / 2.
// With kNorm each block first normalizes the input rows into shared memory.
template <typename T, typename OutT, int M, bool kSiluAndMul, bool kNorm>
__global__ void __launch_bounds__(kThreads) SkinnyGemmKernel(SkinnyArgs<T, OutT> a) {
  static_assert(!kSiluAndMul || kRowsPerWarp == 2, "a warp holds a gate row and its up row");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_x = reinterpret_cast<T*>(smem_raw);
  const int lane = threadIdx.x % 32;
  const int num_tasks = kSiluAndMul ? a.n / 2 : (a.n + kRowsPerWarp - 1) / kRowsPerWarp;
  const int row_step = kSiluAndMul ? a.n / 2 : 1;  // between a task's rows
  const int k = a.k, chunks = k / 8;
  const int task = blockIdx.x * kWarps + threadIdx.x / 32;
  if (!kNorm && task >= num_tasks) {
    WaitForPriorKernels();
    return;
  }
  auto first_row = [&](int i) { return kSiluAndMul ? i : i * kRowsPerWarp; };
  const T* w_rows[kRowsPerWarp];
  auto set_rows = [&](int i) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = min(first_row(i) + r * row_step, a.n - 1);  // an odd n's last task
      w_rows[r] = a.w + int64_t{row} * k;
    }
  };
  uint4 wv[kUnroll][kRowsPerWarp];
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[u][r] = LoadStream16(w_rows[r] + (c + 32 * u) * 8);
    }
  };
  auto x_piece = [&](int t, int c) -> uint4 {
    if constexpr (kNorm) return *reinterpret_cast<const uint4*>(s_x + t * k + c * 8);
    return __ldg(reinterpret_cast<const uint4*>(a.x + t * a.x_stride + c * 8));
  };
  // The weights do not depend on the previous kernel: the first pieces are requested before
  // waiting for it (programmatic dependent launch, common.cuh).
  const bool full_step = lane + 32 * (kUnroll - 1) < chunks;
  if (task < num_tasks) {
    set_rows(task);
    if (full_step) load_w(lane);
  }
  WaitForPriorKernels();
  AllowDependentLaunch();
  if constexpr (kNorm) NormalizeInput<T, OutT, M>(a, s_x);

  if (task < num_tasks) {
    float acc[kRowsPerWarp][M];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
    }
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      if (c != lane) load_w(c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int t = 0; t < M; ++t) {
          float xf[8];
          Unpack8<T>(x_piece(t, c + 32 * u), xf);
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
      uint4 wt[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wt[r] = LoadStream16(w_rows[r] + c * 8);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float xf[8];
        Unpack8<T>(x_piece(t, c), xf);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float wf[8];
          Unpack8<T>(wt[r], wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[e], xf[e], acc[r][t]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]);
    }
    if (lane != 0) return;
    if constexpr (kSiluAndMul) {
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const float gate = ToFloat(FromFloat<T>(acc[0][t])), up = ToFloat(FromFloat<T>(acc[1][t]));
        Store(a.y + t * a.y_stride + task, gate / (1.0f + __expf(-gate)) * up);
      }
    } else {
      const int row0 = first_row(task);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (row0 + r >= a.n) continue;
#pragma unroll
        for (int t = 0; t < M; ++t) Store(a.y + t * a.y_stride + row0 + r, acc[r][t]);
      }
    }
  }
}

template <typename T, typename OutT, int M, bool kSiluAndMul, bool kNorm>
cudaError_t LaunchVariant(const SkinnyArgs<T, OutT>& a, cudaStream_t stream) {
  auto kernel = SkinnyGemmKernel<T, OutT, M, kSiluAndMul, kNorm>;
  const int64_t tasks = kSiluAndMul ? a.n / 2 : CeilDiv(a.n, kRowsPerWarp);
  const unsigned blocks = static_cast<unsigned>(CeilDiv(tasks, kWarps));
  if constexpr (!kNorm) {
    return LaunchKernel(kernel, blocks, kThreads, 0, stream, a);
  } else {
    static const cudaError_t attribute_status = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxSkinnyNormBytes));
    LMSERVE_CUDA_RETURN_IF_ERROR(attribute_status);
    const size_t smem_bytes = size_t{M} * a.k * sizeof(T);
    return LaunchKernel(kernel, blocks, kThreads, smem_bytes, stream, a);
  }
}

template <typename T, typename OutT, int M>
cudaError_t LaunchRows(const SkinnyGemmParams& p, const SkinnyArgs<T, OutT>& a,
                       cudaStream_t stream) {
  if constexpr (std::is_same_v<OutT, float>) {
    return LaunchVariant<T, OutT, M, false, false>(a, stream);
  } else {
    const bool norm = p.norm_weight != nullptr;
    if (p.silu_and_mul) {
      return norm ? LaunchVariant<T, OutT, M, true, true>(a, stream)
                  : LaunchVariant<T, OutT, M, true, false>(a, stream);
    }
    return norm ? LaunchVariant<T, OutT, M, false, true>(a, stream)
                : LaunchVariant<T, OutT, M, false, false>(a, stream);
  }
}

template <typename T, typename OutT>
cudaError_t LaunchTyped(const SkinnyGemmParams& p, cudaStream_t stream) {
  SkinnyArgs<T, OutT> a{};
  a.x = static_cast<const T*>(p.x);
  a.w = static_cast<const T*>(p.w);
  a.y = static_cast<OutT*>(p.y);
  a.n = static_cast<int>(p.n);
  a.k = static_cast<int>(p.k);
  a.x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  a.y_stride = p.y_stride != 0 ? p.y_stride : (p.silu_and_mul ? p.n / 2 : p.n);
  a.norm_weight = static_cast<const T*>(p.norm_weight);
  a.residual_add = static_cast<const T*>(p.residual_add);
  a.residual_out = static_cast<T*>(p.residual_out);
  a.epsilon = p.norm_epsilon;
  switch (p.m) {
    case 1: return LaunchRows<T, OutT, 1>(p, a, stream);
    case 2: return LaunchRows<T, OutT, 2>(p, a, stream);
    case 3: return LaunchRows<T, OutT, 3>(p, a, stream);
    case 4: return LaunchRows<T, OutT, 4>(p, a, stream);
    case 5: return LaunchRows<T, OutT, 5>(p, a, stream);
    case 6: return LaunchRows<T, OutT, 6>(p, a, stream);
    case 7: return LaunchRows<T, OutT, 7>(p, a, stream);
    case 8: return LaunchRows<T, OutT, 8>(p, a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t Launch(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  return DispatchActivationDType(p.input_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.output_dtype == DType::kF32) return LaunchTyped<T, float>(p, stream);
    return LaunchTyped<T, T>(p, stream);
  });
}

}  // namespace lmserve::kernels::cuda
