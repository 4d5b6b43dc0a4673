#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/qkv_postprocess.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;

struct QkvArgs {
  const void* qkv;
  const void* bias;
  const int32_t* positions;
  const float* cos_sin;
  const int64_t* slot_mapping;
  void* query_out;
  void* key_cache;
  void* value_cache;
  int num_heads, num_kv_heads, head_dim;
  int64_t qkv_stride, query_out_stride, max_position;
};

// The rotation of a pair (a, b) by (cos c, sin s): (a c - b s, a s + b c). With kExact (fp32 I/O)
// each product and sum is rounded on its own, as the CPU twin computes it; the 16-bit types let
// the compiler fuse them (their rounding on output dwarfs the difference).
template <bool kExact>
__device__ __forceinline__ void Rotate(float a, float b, float c, float s, float* x, float* y) {
  if constexpr (kExact) {
    *x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *y = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  } else {
    *x = a * c - b * s;
    *y = a * s + b * c;
  }
}

// grid (num_tokens, units / kThreads); a unit is 16 elements of one head: in the half-split layout
// elements [8u, 8u + 8) and [half + 8u, half + 8u + 8) (8 pairs), in the interleaved layout
// [16u, 16u + 16) (8 pairs); value heads are copied 16 contiguous elements at a time.
template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kThreads) QkvPostProcessKernel(QkvArgs a) {
  // The next kernel (decode attention, which loads the old keys and values before it waits) may
  // launch before this one waits: on an H200 at batch 1 the attention then ends ~0.9 us sooner
  // after this kernel.
  AllowDependentLaunch();
  WaitForPriorKernels();
  const int64_t token = blockIdx.x;
  const int units_per_head = a.head_dim / 16;
  const int num_all_heads = a.num_heads + 2 * a.num_kv_heads;
  const int unit = blockIdx.y * kThreads + threadIdx.x;
  if (unit >= num_all_heads * units_per_head) return;
  const int head = unit / units_per_head;
  const int u = unit - head * units_per_head;
  const int half = a.head_dim / 2;
  const bool is_value = head >= a.num_heads + a.num_kv_heads;
  const bool contiguous = kInterleaved || is_value;
  const int off0 = contiguous ? 16 * u : 8 * u;
  const int off1 = contiguous ? 16 * u + 8 : half + 8 * u;

  constexpr bool kExact = std::is_same_v<T, float>;
  const T* src = static_cast<const T*>(a.qkv) + token * a.qkv_stride + head * a.head_dim;
  float x0[8], x1[8];
  Load8<T>(src + off0, x0);
  Load8<T>(src + off1, x1);
  if (a.bias != nullptr) {
    const T* b = static_cast<const T*>(a.bias) + head * a.head_dim;
    float b0[8], b1[8];
    Load8<T>(b + off0, b0);
    Load8<T>(b + off1, b1);
#pragma unroll
    for (int j = 0; j < 8; ++j) x0[j] += b0[j], x1[j] += b1[j];
  }
  if (!is_value && a.cos_sin != nullptr) {
    int64_t pos = a.positions[token];
    pos = pos < 0 ? 0 : (pos >= a.max_position ? a.max_position - 1 : pos);
    const float* row = a.cos_sin + pos * a.head_dim + 8 * u;  // pairs [8u, 8u + 8)
    float c[8], s[8];
    *reinterpret_cast<float4*>(c) = *reinterpret_cast<const float4*>(row);
    *reinterpret_cast<float4*>(c + 4) = *reinterpret_cast<const float4*>(row + 4);
    *reinterpret_cast<float4*>(s) = *reinterpret_cast<const float4*>(row + half);
    *reinterpret_cast<float4*>(s + 4) = *reinterpret_cast<const float4*>(row + half + 4);
    if constexpr (kInterleaved) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {  // pairs 0..3 in x0, 4..7 in x1
        Rotate<kExact>(x0[2 * p], x0[2 * p + 1], c[p], s[p], &x0[2 * p], &x0[2 * p + 1]);
        Rotate<kExact>(x1[2 * p], x1[2 * p + 1], c[p + 4], s[p + 4], &x1[2 * p], &x1[2 * p + 1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) Rotate<kExact>(x0[j], x1[j], c[j], s[j], &x0[j], &x1[j]);
    }
  }
  T* dst;
  if (head < a.num_heads) {
    dst = static_cast<T*>(a.query_out) + token * a.query_out_stride + head * a.head_dim;
  } else {
    const int64_t slot = a.slot_mapping[token];
    if (slot < 0) return;
    const int kv_head = is_value ? head - a.num_heads - a.num_kv_heads : head - a.num_heads;
    T* cache = static_cast<T*>(is_value ? a.value_cache : a.key_cache);
    dst = cache + (slot * a.num_kv_heads + kv_head) * a.head_dim;
  }
  Store8<T>(dst + off0, x0);
  Store8<T>(dst + off1, x1);
}

}  // namespace

cudaError_t Launch(const QkvPostProcessParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  QkvArgs a{p.qkv,
            p.bias,
            p.positions,
            p.cos_sin,
            p.slot_mapping,
            p.query_out,
            p.key_cache,
            p.value_cache,
            static_cast<int>(p.num_heads),
            static_cast<int>(p.num_kv_heads),
            static_cast<int>(p.head_dim),
            p.qkv_stride != 0 ? p.qkv_stride : (p.num_heads + 2 * p.num_kv_heads) * p.head_dim,
            p.query_out_stride != 0 ? p.query_out_stride : p.num_heads * p.head_dim,
            p.max_position};
  const int64_t units = (p.num_heads + 2 * p.num_kv_heads) * (p.head_dim / 16);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(CeilDiv(units, kThreads)));
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.layout == RotaryLayout::kInterleaved) {
      return LaunchKernel(QkvPostProcessKernel<T, true>, grid, kThreads, 0, stream, a);
    }
    return LaunchKernel(QkvPostProcessKernel<T, false>, grid, kThreads, 0, stream, a);
  });
}

}  // namespace lmserve::kernels::cuda
