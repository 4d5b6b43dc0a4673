#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/qkv_postprocess.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnit = 16;  // elements of a head per thread

struct QkvArgs {
  const void* qkv;
  const void* bias;
  const int32_t* positions;
  const float* cos_sin;
  const void* q_norm;
  const void* k_norm;
  const int64_t* slot_mapping;
  void* query_out;
  void* key_cache;
  void* value_cache;
  int num_heads, num_kv_heads, head_dim, rotary_dim;
  int lanes_per_head;  // head_dim / kUnit rounded up to a power of two (at most 32)
  int64_t qkv_stride, query_out_stride, max_position;
  float norm_epsilon;
  float k_inv_scale, v_inv_scale;  // the FP8 cache's (kF8 only)
  const float* qkv_row_scales;     // an FP8 GEMM's output scales, or null (bf16 only)
  const float* qkv_col_scales;
};

// The rotation of a pair (a, b) by (cos c, sin s): (a c - b s, a s + b c); the first component
// when `first`, else the second. With kExact (fp32 I/O) each product and sum is rounded on its
// own, as the CPU twin computes it; the 16-bit types let the compiler fuse them (their rounding
// on output dwarfs the difference).
template <bool kExact>
__device__ __forceinline__ float Rotated(float a, float b, float c, float s, bool first) {
  if constexpr (kExact) {
    return first ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s))
                 : __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  } else {
    return first ? a * c - b * s : a * s + b * c;
  }
}

// grid (num_tokens, ceil(num_all_heads * lanes_per_head / kThreads)). Thread `lane` of a head's
// lanes_per_head consecutive threads holds the head's elements [16 lane, 16 lane + 16) in fp32
// registers (lanes past head_dim / 16 hold none). Every thread of a block reaches the shuffles
// and the warp barrier: none returns early. kF8: the caches hold E4M3 (fp8_cache.cuh): a key or
// value thread stores its 16 values as 16 bytes.
template <typename T, bool kInterleaved, bool kF8>
__global__ void __launch_bounds__(kThreads) QkvPostProcessKernel(QkvArgs a) {
  // A head's values after the bias and the norm, for the rotary partners held by other lanes.
  __shared__ __align__(16) float s_x[kThreads * kUnit];
  // The next kernel (decode attention, which loads the old keys and values before it waits) may
  // launch before this one waits: on an H200 at batch 1 the attention then ends ~0.9 us sooner
  // after this kernel.
  AllowDependentLaunch();
  constexpr bool kExact = std::is_same_v<T, float>;
  const int64_t token = blockIdx.x;
  const int units_per_head = a.head_dim / kUnit;
  const int num_all_heads = a.num_heads + 2 * a.num_kv_heads;
  const int index = blockIdx.y * kThreads + threadIdx.x;
  const int head = index / a.lanes_per_head;
  const int u = index - head * a.lanes_per_head;
  const bool active = head < num_all_heads && u < units_per_head;
  const bool is_value = head >= a.num_heads + a.num_kv_heads;
  const bool is_key = !is_value && head >= a.num_heads;
  const int off = kUnit * u;
  // An FP8 product's column scales are constant (weights): loaded before the wait.
  constexpr bool kMayScale = std::is_same_v<T, __nv_bfloat16>;
  const bool scaled = kMayScale && a.qkv_row_scales != nullptr;
  [[maybe_unused]] float col_scales[kMayScale ? kUnit : 1];
  if constexpr (kMayScale) {
    if (scaled && active) {
      const float* cols = a.qkv_col_scales + head * a.head_dim + off;
      Load8<float>(cols, *reinterpret_cast<float(*)[8]>(col_scales));
      Load8<float>(cols + 8, *reinterpret_cast<float(*)[8]>(col_scales + 8));
    }
  }
  // So are the bias, the q/k norm's weights and the rotary table; the token's position is a step
  // input, uploaded before the step's first kernel (read through L2, as the contract in
  // common.cuh allows, the previous kernel being a GEMM that lets this one launch after its own
  // wait). The token's cos/sin row goes to shared memory: every head of the block shares it.
  // Read after the wait, each was one more round trip, mostly not from L2.
  __shared__ float s_cos_sin[kQkvMaxHeadDim];  // rotary_dim <= head_dim
  if (a.cos_sin != nullptr) {
    int64_t pos = __ldcg(a.positions + token);
    pos = pos < 0 ? 0 : (pos >= a.max_position ? a.max_position - 1 : pos);
    for (int i = threadIdx.x; i < a.rotary_dim; i += kThreads) {
      s_cos_sin[i] = a.cos_sin[pos * a.rotary_dim + i];
    }
  }
  float bias[kUnit], norm_w[kUnit];
  if (a.bias != nullptr && active) {
    const T* b = static_cast<const T*>(a.bias) + head * a.head_dim + off;
    Load8<T>(b, *reinterpret_cast<float(*)[8]>(bias));
    Load8<T>(b + 8, *reinterpret_cast<float(*)[8]>(bias + 8));
  }
  if (a.q_norm != nullptr && active && !is_value) {
    const T* weight = static_cast<const T*>(is_key ? a.k_norm : a.q_norm) + off;
    Load8<T>(weight, *reinterpret_cast<float(*)[8]>(norm_w));
    Load8<T>(weight + 8, *reinterpret_cast<float(*)[8]>(norm_w + 8));
  }
  WaitForPriorKernels();
  __syncthreads();  // s_cos_sin
  [[maybe_unused]] const float row_scale = scaled && active ? a.qkv_row_scales[token] : 0.0f;

  float x[kUnit];
  if (active) {
    const T* src = static_cast<const T*>(a.qkv) + token * a.qkv_stride + head * a.head_dim + off;
    Load8<T>(src, *reinterpret_cast<float(*)[8]>(x));
    Load8<T>(src + 8, *reinterpret_cast<float(*)[8]>(x + 8));
    if constexpr (kMayScale) {
      if (scaled) {
        ApplyF8OutputScales(*reinterpret_cast<float(*)[8]>(x), row_scale,
                            *reinterpret_cast<const float(*)[8]>(col_scales));
        ApplyF8OutputScales(*reinterpret_cast<float(*)[8]>(x + 8), row_scale,
                            *reinterpret_cast<const float(*)[8]>(col_scales + 8));
      }
    }
    if (a.bias != nullptr) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) x[j] += bias[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) x[j] = 0.0f;
  }

  // Per-head RMSNorm of queries and keys: the head's lanes sum the squares (in double for fp32,
  // as the CPU twin) with shuffles inside their aligned group of lanes_per_head lanes.
  if (a.q_norm != nullptr) {
    using Acc = std::conditional_t<kExact, double, float>;
    const bool normed = active && !is_value;
    Acc sum_squares = 0;
    if (normed) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) sum_squares += static_cast<Acc>(x[j]) * x[j];
    }
    for (int offset = 1; offset < a.lanes_per_head; offset <<= 1) {
      sum_squares += __shfl_xor_sync(0xffffffffu, sum_squares, offset);
    }
    if (normed) {
      float inv_rms;
      if constexpr (kExact) {
        inv_rms = static_cast<float>(1.0 / sqrt(sum_squares / static_cast<double>(a.head_dim) +
                                                static_cast<double>(a.norm_epsilon)));
      } else {
        inv_rms = rsqrtf(sum_squares / static_cast<float>(a.head_dim) + a.norm_epsilon);
      }
#pragma unroll
      for (int j = 0; j < kUnit; ++j) x[j] = __fmul_rn(__fmul_rn(x[j], inv_rms), norm_w[j]);
    }
  }

  // Rotary embedding of the first rotary_dim dimensions: pairs (2k, 2k + 1), in the same lane,
  // or (k, k + rotary_dim / 2), whose partners sit in another lane: where rotary_dim / 2 is a
  // multiple of kUnit (every family but some partial rotaries), element j of the lane
  // rotary_dim / (2 kUnit) lanes away, fetched by a shuffle; elsewhere exchanged through shared
  // memory. (The exchange through shared memory for every layout, whose reads of a warp's four
  // heads hit the same banks 8 ways, held an H200 to 29% of the copy bandwidth at 8192 tokens:
  // bench/results section 28.)
  const int half = a.rotary_dim / 2;
  if (a.cos_sin != nullptr && (kInterleaved || half % kUnit == 0)) {
    const bool first = off < half;  // of the pairs' first elements (half split)
    [[maybe_unused]] float partner[kUnit];
    if constexpr (!kInterleaved) {
      const int lane = threadIdx.x % 32, apart = half / kUnit;
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        partner[j] = __shfl_sync(0xffffffffu, x[j], first ? lane + apart : lane - apart);
      }
    }
    if (active && !is_value && off < a.rotary_dim) {
      // The lane's 16 pairs' cosines and sines, from k0 on (interleaved: 8, from off / 2).
      const int k0 = kInterleaved ? off / 2 : (first ? off : off - half);
      const float* cos_row = s_cos_sin + k0;
      const float* sin_row = s_cos_sin + half + k0;
      if constexpr (kInterleaved) {
#pragma unroll
        for (int k = 0; k < kUnit / 2; ++k) {
          if (off + 2 * k >= a.rotary_dim) break;  // rotary_dim and off are even
          const float first_x = x[2 * k], second_x = x[2 * k + 1];
          x[2 * k] = Rotated<kExact>(first_x, second_x, cos_row[k], sin_row[k], true);
          x[2 * k + 1] = Rotated<kExact>(first_x, second_x, cos_row[k], sin_row[k], false);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          x[j] = first ? Rotated<kExact>(x[j], partner[j], cos_row[j], sin_row[j], true)
                       : Rotated<kExact>(partner[j], x[j], cos_row[j], sin_row[j], false);
        }
      }
    }
  } else if (a.cos_sin != nullptr) {
    auto* mine = reinterpret_cast<float4*>(s_x + threadIdx.x * kUnit);
#pragma unroll
    for (int q = 0; q < kUnit / 4; ++q) {
      mine[q] = make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
    }
    __syncwarp();
    if (active && !is_value && off < a.rotary_dim) {
      const float* head_x = s_x + (threadIdx.x - u) * kUnit;  // the head's element 0
      const float* cos_row = s_cos_sin;
      const float* sin_row = cos_row + half;
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        const int i = off + j;
        if (i >= a.rotary_dim) break;
        int k, ia, ib;
        bool first;
        if constexpr (kInterleaved) {
          k = i >> 1, ia = 2 * k, ib = ia + 1, first = (i & 1) == 0;
        } else {
          first = i < half;
          k = first ? i : i - half, ia = k, ib = k + half;
        }
        x[j] = Rotated<kExact>(head_x[ia], head_x[ib], cos_row[k], sin_row[k], first);
      }
    }
  }
  if (!active) return;
  T* dst;
  if (head < a.num_heads) {
    dst = static_cast<T*>(a.query_out) + token * a.query_out_stride + head * a.head_dim;
  } else {
    const int64_t slot = a.slot_mapping[token];
    if (slot < 0) return;
    const int kv_head = is_value ? head - a.num_heads - a.num_kv_heads : head - a.num_heads;
    const int64_t element = (slot * a.num_kv_heads + kv_head) * a.head_dim;
    if constexpr (kF8) {
      const float inv_scale = is_value ? a.v_inv_scale : a.k_inv_scale;
      uint8_t* cache = static_cast<uint8_t*>(is_value ? a.value_cache : a.key_cache);
      Store16(cache + element + off,
              make_uint4(F8x4Quantize(x, inv_scale), F8x4Quantize(x + 4, inv_scale),
                         F8x4Quantize(x + 8, inv_scale), F8x4Quantize(x + 12, inv_scale)));
      return;
    }
    dst = static_cast<T*>(is_value ? a.value_cache : a.key_cache) + element;
  }
  Store8<T>(dst + off, *reinterpret_cast<const float(*)[8]>(x));
  Store8<T>(dst + off + 8, *reinterpret_cast<const float(*)[8]>(x + 8));
}

}  // namespace

cudaError_t Launch(const QkvPostProcessParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  int lanes_per_head = 1;
  while (lanes_per_head < p.head_dim / kUnit) lanes_per_head *= 2;
  QkvArgs a{p.qkv,
            p.bias,
            p.positions,
            p.cos_sin,
            p.q_norm,
            p.k_norm,
            p.slot_mapping,
            p.query_out,
            p.key_cache,
            p.value_cache,
            static_cast<int>(p.num_heads),
            static_cast<int>(p.num_kv_heads),
            static_cast<int>(p.head_dim),
            static_cast<int>(p.rotary_dim != 0 ? p.rotary_dim : p.head_dim),
            lanes_per_head,
            p.qkv_stride != 0 ? p.qkv_stride : (p.num_heads + 2 * p.num_kv_heads) * p.head_dim,
            p.query_out_stride != 0 ? p.query_out_stride : p.num_heads * p.head_dim,
            p.max_position,
            p.norm_epsilon,
            1.0f / p.k_scale,
            1.0f / p.v_scale,
            p.qkv_row_scales,
            p.qkv_col_scales};
  const int64_t threads = (p.num_heads + 2 * p.num_kv_heads) * lanes_per_head;
  const dim3 grid(static_cast<unsigned>(p.num_tokens),
                  static_cast<unsigned>(CeilDiv(threads, kThreads)));
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool interleaved = p.layout == RotaryLayout::kInterleaved;
    if constexpr (!std::is_same_v<T, float>) {
      if (p.cache_fp8) {
        return interleaved
                   ? LaunchKernel(QkvPostProcessKernel<T, true, true>, grid, kThreads, 0, stream, a)
                   : LaunchKernel(QkvPostProcessKernel<T, false, true>, grid, kThreads, 0, stream,
                                  a);
      }
    }
    return interleaved
               ? LaunchKernel(QkvPostProcessKernel<T, true, false>, grid, kThreads, 0, stream, a)
               : LaunchKernel(QkvPostProcessKernel<T, false, false>, grid, kThreads, 0, stream, a);
  });
}

}  // namespace lmserve::kernels::cuda
