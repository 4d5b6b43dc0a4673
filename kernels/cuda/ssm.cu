#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ssm.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kConvThreads = 128;
constexpr int kNormThreads = 256;
constexpr int kLanesPerRow = 4;  // threads per head dim in the scans: each holds state_size / 4

__device__ __forceinline__ float Silu(float v) { return v / (1.0f + expf(-v)); }

// softplus as PyTorch computes it (threshold 20), then the clamp of kernels/cpu/ssm.h.
__device__ __forceinline__ float StepSize(float raw, float dt_min, float dt_max) {
  float dt = raw > 20.0f ? raw : log1pf(expf(raw));
  dt = fmaxf(dt, dt_min);
  return dt_max > 0.0f ? fminf(dt, dt_max) : dt;
}

struct Sequences {
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* state_slots;
};

template <typename T>
struct ConvArgs {
  Sequences seqs;
  const T* input;
  int64_t input_stride;
  const T* weight;
  const T* bias;
  T* output;
  float* states;
  int channels;
  int kernel;
};

constexpr int kConvTokens = 16;  // tokens a conv thread computes

// One thread per (channel, sequence, run of kConvTokens tokens): every token's window read
// afresh (from the step's inputs, or the ring for positions before the step), so that the
// tokens' loads are independent. The ring is not written here: SsmConvStateKernel does it after
// every block has read it.
template <typename T>
__global__ void __launch_bounds__(kConvThreads) SsmConvKernel(ConvArgs<T> a) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int i = blockIdx.y;
  float w[kSsmMaxConvKernel] = {};
  float bias = 0.0f;
  if (c < a.channels) {  // weights: constant, read before the wait
#pragma unroll
    for (int k = 0; k < kSsmMaxConvKernel; ++k) {
      if (k < a.kernel) w[k] = ToFloat(a.weight[static_cast<int64_t>(c) * a.kernel + k]);
    }
    if (a.bias != nullptr) bias = ToFloat(a.bias[c]);
  }
  BeginDependentKernel();
  if (c >= a.channels) return;
  const int ctx = a.seqs.context_lens[i];
  const int first = a.seqs.query_start[i];
  const int len = a.seqs.query_start[i + 1] - first;
  const int t0 = blockIdx.z * kConvTokens;
  if (ctx == 0 || t0 >= len) return;
  const int start = ctx - len, k1 = a.kernel - 1;
  const float* ring =
      a.states + static_cast<int64_t>(a.seqs.state_slots[i]) * a.kernel * a.channels;
  // Input at step token j (j < 0: position start + j, from the ring; zero before position 0).
  auto input = [&](int j) -> float {
    if (j >= 0) return ToFloat(a.input[(first + j) * a.input_stride + c]);
    const int q = start + j;
    return start == 0 || q < 0 ? 0.0f : ring[static_cast<int64_t>(q % a.kernel) * a.channels + c];
  };
#pragma unroll 4
  for (int t = t0; t < min(len, t0 + kConvTokens); ++t) {
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kSsmMaxConvKernel; ++k) {
      if (k <= k1) acc += w[k] * input(t - k1 + k);
    }
    a.output[(first + t) * static_cast<int64_t>(a.channels) + c] = FromFloat<T>(Silu(acc));
  }
}

// After SsmConvKernel: each sequence's new inputs at positions max(start, ctx - kernel + 1) ..
// ctx - 1 into their ring rows (older positions of the window are in the ring already).
template <typename T>
__global__ void __launch_bounds__(kConvThreads) SsmConvStateKernel(ConvArgs<T> a) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int i = blockIdx.y;
  BeginDependentKernel();
  if (c >= a.channels) return;
  const int ctx = a.seqs.context_lens[i];
  const int first = a.seqs.query_start[i];
  const int len = a.seqs.query_start[i + 1] - first;
  if (ctx == 0 || len == 0) return;
  const int start = ctx - len;
  float* ring = a.states + static_cast<int64_t>(a.seqs.state_slots[i]) * a.kernel * a.channels;
  for (int q = max(start, ctx - (a.kernel - 1)); q < ctx; ++q) {
    ring[static_cast<int64_t>(q % a.kernel) * a.channels + c] =
        ToFloat(a.input[(first + q - start) * a.input_stride + c]);
  }
}

template <typename T>
struct ScanArgs {
  Sequences seqs;
  const T* xbc;
  int64_t xbc_stride;
  const T* dt;
  int64_t dt_stride;
  const T* dt_bias;
  const T* a_log;
  const T* d;
  T* output;
  float* states;
  int num_heads;
  int head_dim;
  int n_groups;
  float dt_min;
  float dt_max;
};

// The state entries a scan thread holds: lane s of a head dim's kLanesPerRow holds the float4s
// q = j * 4 + s (j < kN / 16) of its row, entries 4q .. 4q + 3, so that a row's lanes read and
// write 64 contiguous bytes at once.
template <int kN>
struct StateRow {
  static constexpr int kChunks = kN / (4 * kLanesPerRow);
  float4 v[kChunks];

  __device__ __forceinline__ void Load(const float* row, int s, bool zero) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      v[j] = zero ? make_float4(0.f, 0.f, 0.f, 0.f)
                  : reinterpret_cast<const float4*>(row)[j * kLanesPerRow + s];
    }
  }
  __device__ __forceinline__ void Store(float* row, int s) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) reinterpret_cast<float4*>(row)[j * kLanesPerRow + s] = v[j];
  }
  // state = state * decay + dx * B; returns this thread's part of state . C (B, C: [kN] in
  // shared memory).
  __device__ __forceinline__ float Update(float decay, float dx, const float* b, const float* c,
                                          int s) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int n = (j * kLanesPerRow + s) * 4;
      const float4 bv = *reinterpret_cast<const float4*>(b + n);
      const float4 cv = *reinterpret_cast<const float4*>(c + n);
      v[j].x = v[j].x * decay + dx * bv.x;
      v[j].y = v[j].y * decay + dx * bv.y;
      v[j].z = v[j].z * decay + dx * bv.z;
      v[j].w = v[j].w * decay + dx * bv.w;
      acc += v[j].x * cv.x;
      acc += v[j].y * cv.y;
      acc += v[j].z * cv.z;
      acc += v[j].w * cv.w;
    }
    // The row's kLanesPerRow lanes are adjacent in a warp.
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    return acc;
  }
};

// One block per (head, sequence), kLanesPerRow threads per head dim p. Tokens go in chunks of
// kScanChunk staged in shared memory (x, B, C, dt), the recurrence within a chunk.
template <typename T, int kN>
__global__ void SsmScanKernel(ScanArgs<T> a) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int hd = a.head_dim;
  float* bs = smem;                   // [kScanChunk, kN]
  float* cs = bs + kScanChunk * kN;   // [kScanChunk, kN]
  float* xs = cs + kScanChunk * kN;   // [kScanChunk, hd]
  float* dts = xs + kScanChunk * hd;  // [kScanChunk]
  const int h = blockIdx.x, i = blockIdx.y;
  const int p = threadIdx.x / kLanesPerRow, s = threadIdx.x % kLanesPerRow;
  const int g = h / (a.num_heads / a.n_groups);
  const int64_t inner = static_cast<int64_t>(a.num_heads) * hd;
  const float A = -expf(ToFloat(a.a_log[h]));
  const float dh = ToFloat(a.d[h]);
  const float dt_bias = ToFloat(a.dt_bias[h]);
  BeginDependentKernel();
  const int ctx = a.seqs.context_lens[i];
  const int first = a.seqs.query_start[i];
  const int len = a.seqs.query_start[i + 1] - first;
  if (ctx == 0 || len == 0) return;  // the whole block
  float* state = a.states +
                 ((static_cast<int64_t>(a.seqs.state_slots[i]) * a.num_heads + h) * hd + p) * kN;
  StateRow<kN> st;
  st.Load(state, s, /*zero=*/ctx == len);
  const int64_t b_col = inner + static_cast<int64_t>(g) * kN;
  const int64_t c_col = inner + static_cast<int64_t>(a.n_groups + g) * kN;
  for (int c0 = 0; c0 < len; c0 += kScanChunk) {
    const int l = min(kScanChunk, len - c0);
    __syncthreads();  // the previous chunk is read
    for (int idx = threadIdx.x; idx < l * hd; idx += blockDim.x) {
      const int t = idx / hd, q = idx % hd;
      xs[idx] = ToFloat(a.xbc[(first + c0 + t) * a.xbc_stride + static_cast<int64_t>(h) * hd + q]);
    }
    for (int idx = threadIdx.x; idx < l * kN; idx += blockDim.x) {
      const int t = idx / kN, n = idx % kN;
      const int64_t row = (first + c0 + t) * a.xbc_stride;
      bs[idx] = ToFloat(a.xbc[row + b_col + n]);
      cs[idx] = ToFloat(a.xbc[row + c_col + n]);
    }
    for (int t = threadIdx.x; t < l; t += blockDim.x) {
      dts[t] = StepSize(ToFloat(a.dt[(first + c0 + t) * a.dt_stride + h]) + dt_bias, a.dt_min,
                        a.dt_max);
    }
    __syncthreads();
    for (int t = 0; t < l; ++t) {
      const float dt = dts[t], x = xs[t * hd + p];
      const float acc = st.Update(expf(dt * A), dt * x, bs + t * kN, cs + t * kN, s);
      if (s == 0) {
        a.output[(first + c0 + t) * inner + static_cast<int64_t>(h) * hd + p] =
            FromFloat<T>(acc + dh * x);
      }
    }
  }
  st.Store(state, s);
}

// A decode-only step: one block per (rows of a head, sequence), kLanesPerRow threads per head
// dim: the conv update of its x channels and of its group's B and C channels (the B and C ones
// computed by every block of the group, written back by the group's first), then the SSM update
// of its rows. `rows` head dims a block: 16 (8 where head_dim is not a multiple of 16), so that a
// batch of one sequence still spreads over the SMs.
template <typename T, int kN>
__global__ void SsmDecodeKernel(ConvArgs<T> conv, ScanArgs<T> a, int rows) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* bs = smem;      // [kN]
  float* cs = bs + kN;   // [kN]
  float* xs = cs + kN;   // [rows]
  float* dts = xs + rows;  // [1]
  const int hd = a.head_dim;
  const int row_blocks = hd / rows;
  const int h = blockIdx.x / row_blocks, p0 = (blockIdx.x % row_blocks) * rows;
  const int i = blockIdx.y;
  const int p = p0 + threadIdx.x / kLanesPerRow, s = threadIdx.x % kLanesPerRow;
  const int heads_per_group = a.num_heads / a.n_groups;
  const int g = h / heads_per_group;
  const bool bc_owner = h % heads_per_group == 0 && p0 == 0;
  const int64_t inner = static_cast<int64_t>(a.num_heads) * hd;
  const float A = -expf(ToFloat(a.a_log[h]));
  const float dh = ToFloat(a.d[h]);
  const float dt_bias = ToFloat(a.dt_bias[h]);
  BeginDependentKernel();
  const int ctx = a.seqs.context_lens[i];
  if (ctx == 0) return;  // padding: the whole block
  const int64_t row = a.seqs.query_start[i];
  const int pos = ctx - 1, k1 = conv.kernel - 1;
  const bool fresh = ctx == 1;
  const int64_t slot = a.seqs.state_slots[i];
  float* ring = conv.states + slot * conv.kernel * conv.channels;
  const int num_channels = rows + 2 * kN;
  for (int k = threadIdx.x; k < num_channels; k += blockDim.x) {
    int64_t c;
    float* out;
    bool owner = true;
    if (k < 2 * kN) {
      const int n = k % kN;
      const bool is_c = k >= kN;
      c = inner + static_cast<int64_t>(is_c ? a.n_groups + g : g) * kN + n;
      out = (is_c ? cs : bs) + n;
      owner = bc_owner;
    } else {
      c = static_cast<int64_t>(h) * hd + p0 + (k - 2 * kN);
      out = xs + (k - 2 * kN);
    }
    const T* w = conv.weight + c * conv.kernel;
    const float x_new = ToFloat(conv.input[row * conv.input_stride + c]);
    float acc = conv.bias != nullptr ? ToFloat(conv.bias[c]) : 0.0f;
    for (int j = 0; j < k1; ++j) {
      const int q = pos - k1 + j;
      const float v =
          fresh || q < 0 ? 0.0f : ring[static_cast<int64_t>(q % conv.kernel) * conv.channels + c];
      acc += ToFloat(w[j]) * v;
    }
    acc += ToFloat(w[k1]) * x_new;
    *out = Silu(acc);
    // Row pos % kernel holds position pos - kernel, which no block of this step reads.
    if (owner) ring[static_cast<int64_t>(pos % conv.kernel) * conv.channels + c] = x_new;
  }
  if (threadIdx.x == 0) {
    dts[0] = StepSize(ToFloat(a.dt[row * a.dt_stride + h]) + dt_bias, a.dt_min, a.dt_max);
  }
  __syncthreads();
  float* state = a.states + ((slot * a.num_heads + h) * hd + p) * kN;
  StateRow<kN> st;
  st.Load(state, s, fresh);
  const float dt = dts[0], x = xs[p - p0];
  const float acc = st.Update(expf(dt * A), dt * x, bs, cs, s);
  st.Store(state, s);
  if (s == 0) a.output[row * inner + static_cast<int64_t>(h) * hd + p] = FromFloat<T>(acc + dh * x);
}

// One block per (token, group): v = y * silu(z), normed over the group, times the weight.
template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    SsmGatedRmsNormKernel(const T* input, const T* gate, int64_t gate_stride, const T* weight,
                          T* output, int width, int group_size, float epsilon) {
  using Acc = std::conditional_t<std::is_same_v<T, float>, double, float>;
  __shared__ Acc scratch[32];
  BeginDependentKernel();
  const int64_t t = blockIdx.x;
  const int g0 = blockIdx.y * group_size;
  const T* y = input + t * width + g0;
  const T* z = gate + t * gate_stride + g0;
  Acc sum = 0;
  for (int k = threadIdx.x; k < group_size; k += kNormThreads) {
    const float v = ToFloat(y[k]) * Silu(ToFloat(z[k]));
    sum += static_cast<Acc>(v) * v;
  }
  sum = BlockSum(sum, scratch);
  float scale;
  if constexpr (std::is_same_v<Acc, double>) {
    scale = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(group_size) +
                                          static_cast<double>(epsilon)));
  } else {
    scale = rsqrtf(sum / static_cast<float>(group_size) + epsilon);
  }
  T* out = output + t * width + g0;
  for (int k = threadIdx.x; k < group_size; k += kNormThreads) {
    const float v = ToFloat(y[k]) * Silu(ToFloat(z[k]));
    out[k] = FromFloat<T>(ToFloat(weight[g0 + k]) * (v * scale));
  }
}

Sequences DeviceSequences(const SsmDeviceSequences& seqs) {
  return {seqs.query_start, seqs.context_lens, seqs.state_slots};
}

template <typename T>
ConvArgs<T> MakeConvArgs(const SsmConvParams& p) {
  return {DeviceSequences(p.seqs),
          static_cast<const T*>(p.input),
          p.input_stride,
          static_cast<const T*>(p.weight),
          static_cast<const T*>(p.bias),
          static_cast<T*>(p.output),
          p.conv_states,
          static_cast<int>(p.channels),
          static_cast<int>(p.kernel)};
}

template <typename T>
ScanArgs<T> MakeScanArgs(const SsmScanParams& p) {
  return {DeviceSequences(p.seqs),
          static_cast<const T*>(p.xbc),
          p.xbc_stride,
          static_cast<const T*>(p.dt),
          p.dt_stride,
          static_cast<const T*>(p.dt_bias),
          static_cast<const T*>(p.a_log),
          static_cast<const T*>(p.d),
          static_cast<T*>(p.output),
          p.ssm_states,
          static_cast<int>(p.num_heads),
          static_cast<int>(p.head_dim),
          static_cast<int>(p.n_groups),
          p.dt_min,
          p.dt_max};
}

// Calls f(std::integral_constant<int, N>) for a supported state size.
template <typename F>
cudaError_t DispatchStateSize(int64_t state_size, F&& f) {
  switch (state_size) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t Launch(const SsmConvParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.seqs.num_seqs == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.channels, kConvThreads)),
                    static_cast<unsigned>(p.seqs.num_seqs),
                    static_cast<unsigned>(CeilDiv(std::max<int64_t>(p.num_tokens, 1), kConvTokens)));
    LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(SsmConvKernel<T>, grid, dim3(kConvThreads), 0,
                                              stream, MakeConvArgs<T>(p)));
    const dim3 state_grid(grid.x, grid.y);
    return LaunchKernel(SsmConvStateKernel<T>, state_grid, dim3(kConvThreads), 0, stream,
                        MakeConvArgs<T>(p));
  });
}

cudaError_t Launch(const SsmScanParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.seqs.num_seqs == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchStateSize(p.state_size, [&](auto n_tag) {
      constexpr int kN = decltype(n_tag)::value;
      const int smem = static_cast<int>((kScanChunk * (2 * kN + p.head_dim) + kScanChunk) *
                                        static_cast<int64_t>(sizeof(float)));
      LMSERVE_CUDA_RETURN_IF_ERROR(
          SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(SsmScanKernel<T, kN>), smem));
      const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.seqs.num_seqs));
      const dim3 block(static_cast<unsigned>(p.head_dim * kLanesPerRow));
      return LaunchKernel(SsmScanKernel<T, kN>, grid, block, static_cast<size_t>(smem), stream,
                          MakeScanArgs<T>(p));
    });
  });
}

cudaError_t Launch(const SsmDecodeParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.scan.seqs.num_seqs == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.scan.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchStateSize(p.scan.state_size, [&](auto n_tag) {
      constexpr int kN = decltype(n_tag)::value;
      const int rows = p.scan.head_dim % 16 == 0 ? 16 : 8;
      const size_t smem = static_cast<size_t>(2 * kN + rows + 1) * sizeof(float);
      const dim3 grid(static_cast<unsigned>(p.scan.num_heads * (p.scan.head_dim / rows)),
                      static_cast<unsigned>(p.scan.seqs.num_seqs));
      const dim3 block(static_cast<unsigned>(rows * kLanesPerRow));
      return LaunchKernel(SsmDecodeKernel<T, kN>, grid, block, smem, stream,
                          MakeConvArgs<T>(p.conv), MakeScanArgs<T>(p.scan), rows);
    });
  });
}

cudaError_t Launch(const SsmGatedRmsNormParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(p.num_tokens),
                    static_cast<unsigned>(p.width / p.group_size));
    return LaunchKernel(SsmGatedRmsNormKernel<T>, grid, dim3(kNormThreads), 0, stream,
                        static_cast<const T*>(p.input), static_cast<const T*>(p.gate),
                        p.gate_stride, static_cast<const T*>(p.weight), static_cast<T*>(p.output),
                        static_cast<int>(p.width), static_cast<int>(p.group_size), p.epsilon);
  });
}

}  // namespace lmserve::kernels::cuda
