#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ssm.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kConvThreads = 128;
constexpr int kLanesPerRow = 4;  // threads per head dim in the scans: each holds state_size / 4

__device__ __forceinline__ float Silu(float v) { return v / (1.0f + expf(-v)); }
// With the fast exponential and division (a few ulp; past v = -87 the result is -0 rather than a
// tiny negative): the prefill conv's SiLU, where the precise one's instructions cost as much as
// the kernel's bytes.
__device__ __forceinline__ float FastSilu(float v) { return __fdividef(v, 1.0f + __expf(-v)); }

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

// Sequence i's tokens in the step: its context after the step, the row of its first new token,
// and how many new tokens it has.
struct SequenceTokens {
  int ctx, first, len;
};
__device__ __forceinline__ SequenceTokens TokensOf(const Sequences& seqs, int i) {
  const int first = seqs.query_start[i];
  return {seqs.context_lens[i], first, seqs.query_start[i + 1] - first};
}

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
  const SequenceTokens tokens = TokensOf(a.seqs, i);
  const int ctx = tokens.ctx, first = tokens.first, len = tokens.len;
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
  const SequenceTokens tokens = TokensOf(a.seqs, i);
  const int ctx = tokens.ctx, first = tokens.first, len = tokens.len;
  if (ctx == 0 || len == 0) return;
  const int start = ctx - len;
  float* ring = a.states + static_cast<int64_t>(a.seqs.state_slots[i]) * a.kernel * a.channels;
  for (int q = max(start, ctx - (a.kernel - 1)); q < ctx; ++q) {
    ring[static_cast<int64_t>(q % a.kernel) * a.channels + c] =
        ToFloat(a.input[(first + q - start) * a.input_stride + c]);
  }
}

constexpr int kConvRun = 16;   // tokens a thread of SsmConvVecKernel computes
constexpr int kConvVecTaps = 4;  // its window: kernels of 2 to 4 taps (Mamba-2's is 4)

// The conv over 8 channels a thread (16-byte loads and stores) and a run of kConvRun tokens of
// one sequence, the window slid in registers: each input is read once (the taps before the run
// come from the step's inputs or, before the step, the ring), 4 tokens' loads issued together.
// A kernel of fewer than kConvVecTaps taps takes the window's last taps (the first weights zero).
// REQUIRES: channels, the input stride and the pointers aligned to 8 elements (16 bytes).
template <typename T>
__global__ void __launch_bounds__(kConvThreads) SsmConvVecKernel(ConvArgs<T> a) {
  constexpr int kK = kConvVecTaps;
  constexpr int kStep = 4;  // tokens whose loads are issued together
  const int c = (blockIdx.x * kConvThreads + threadIdx.x) * 8;
  const int i = blockIdx.y;
  const int pad = kK - a.kernel;
  float w[kK][8] = {};
  float bias[8] = {};
  if (c < a.channels) {  // weights: constant, read before the wait
#pragma unroll
    for (int ch = 0; ch < 8; ++ch) {
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        if (k >= pad) {
          w[k][ch] = ToFloat(a.weight[static_cast<int64_t>(c + ch) * a.kernel + k - pad]);
        }
      }
    }
    if (a.bias != nullptr) Load8<T>(a.bias + c, bias);
  }
  BeginDependentKernel();
  if (c >= a.channels) return;
  const SequenceTokens tokens = TokensOf(a.seqs, i);
  const int ctx = tokens.ctx, first = tokens.first, len = tokens.len;
  const int t0 = blockIdx.z * kConvRun;
  if (ctx == 0 || t0 >= len) return;
  const int start = ctx - len;
  const float* ring =
      a.states + static_cast<int64_t>(a.seqs.state_slots[i]) * a.kernel * a.channels;
  // win[k]: the input kK - 1 - k tokens before the current one.
  float win[kK - 1][8];
#pragma unroll
  for (int k = 0; k < kK - 1; ++k) {
    const int j = t0 - (kK - 1) + k;  // step token (j < 0: position start + j)
    const int q = start + j;
    if (j >= 0) {
      Load8<T>(a.input + (first + j) * a.input_stride + c, win[k]);
    } else if (k >= pad && start > 0 && q >= 0) {
      Load8<float>(ring + static_cast<int64_t>(q % a.kernel) * a.channels + c, win[k]);
    } else {
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) win[k][ch] = 0.0f;
    }
  }
  const int end = min(len, t0 + kConvRun);
  for (int t = t0; t < end; t += kStep) {
    float x[kStep][8];
#pragma unroll
    for (int s = 0; s < kStep; ++s) {
      if (t + s < end) {
        Load8<T>(a.input + (first + t + s) * a.input_stride + c, x[s]);
      } else {
#pragma unroll
        for (int ch = 0; ch < 8; ++ch) x[s][ch] = 0.0f;
      }
    }
#pragma unroll
    for (int s = 0; s < kStep; ++s) {
      float o[8];
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) {
        float acc = bias[ch];
#pragma unroll
        for (int k = 0; k < kK - 1; ++k) acc += w[k][ch] * win[k][ch];
        acc += w[kK - 1][ch] * x[s][ch];
        o[ch] = FastSilu(acc);
      }
#pragma unroll
      for (int k = 0; k < kK - 2; ++k) {
#pragma unroll
        for (int ch = 0; ch < 8; ++ch) win[k][ch] = win[k + 1][ch];
      }
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) win[kK - 2][ch] = x[s][ch];
      if (t + s < end) {
        Store8<T>(a.output + (first + t + s) * static_cast<int64_t>(a.channels) + c, o);
      }
    }
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

// Head h's constants: A = -exp(A_log), D and dt's bias.
struct HeadConstants {
  float A, d, dt_bias;
};
template <typename T>
__device__ __forceinline__ HeadConstants HeadOf(const ScanArgs<T>& a, int h) {
  return {-expf(ToFloat(a.a_log[h])), ToFloat(a.d[h]), ToFloat(a.dt_bias[h])};
}

// The state entries a thread holds of one state row split over kL adjacent lanes of a warp:
// lane s holds the float4s j * kL + s (j < kN / (4 * kL)), so that a row's lanes move
// 16 * kL contiguous bytes at once. The scan uses 4 lanes a row, the decode kernel 16 or 32.
template <int kN, int kL>
struct StateRow {
  static_assert(kN % (4 * kL) == 0 && kL <= 32 && (kL & (kL - 1)) == 0);
  static constexpr int kChunks = kN / (4 * kL);
  float4 v[kChunks];

  // kThroughL2: __ldcg, for the decode kernel's reads before its wait (SsmDecodeKernel says why
  // that is safe).
  template <bool kThroughL2 = false>
  __device__ __forceinline__ void Load(const float* row, int s, bool zero) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const float4* src = reinterpret_cast<const float4*>(row) + j * kL + s;
      if (zero) {
        v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      } else if constexpr (kThroughL2) {
        v[j] = __ldcg(src);
      } else {
        v[j] = *src;
      }
    }
  }
  __device__ __forceinline__ void Store(float* row, int s) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) reinterpret_cast<float4*>(row)[j * kL + s] = v[j];
  }
  // state = state * decay + dx * B; returns state . C over the row, in every lane of the row
  // (B, C: [kN] in shared memory). Every lane of the warp must call it.
  __device__ __forceinline__ float Update(float decay, float dx, const float* b, const float* c,
                                          int s) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int n = (j * kL + s) * 4;
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
#pragma unroll
    for (int o = 1; o < kL; o *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
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
  const HeadConstants head = HeadOf(a, h);
  const float A = head.A, dh = head.d, dt_bias = head.dt_bias;
  BeginDependentKernel();
  const SequenceTokens tokens = TokensOf(a.seqs, i);
  const int ctx = tokens.ctx, first = tokens.first, len = tokens.len;
  if (ctx == 0 || len == 0) return;  // the whole block
  float* state = a.states +
                 ((static_cast<int64_t>(a.seqs.state_slots[i]) * a.num_heads + h) * hd + p) * kN;
  StateRow<kN, kLanesPerRow> st;
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

// The chunked SSD scan (the Mamba-2 paper's algorithm) for 16-bit activations: one block of
// warps per (head, sequence) walks the sequence's tokens in chunks of kSsdChunk, the
// state carried from chunk to chunk in fp32 registers (mma accumulators). For a chunk of tokens
// t, u with cum_t = sum of dt_u A over u <= t in the chunk:
//   Y = exp(cum_t) (C S^T)[t, p] + ((C B^T) o L) X + D X,
//   L[t, u] = exp(cum_t - cum_u) dt_u (u <= t)
//   S' = exp(cum_last) S + (X o w)^T B,                     w_u = exp(cum_last - cum_u) dt_u
// The four products run on tensor cores (mma.sync m16n8k16, 16-bit operands, fp32 accumulation):
// C B^T and C S^T with the state rounded to the 16-bit type as an operand (it stays fp32 in the
// accumulators), (C B^T o L) rounded likewise, X o w too. The decays and cum in fp32. Rows past
// a short chunk's end are zero (dt 0: no decay, no contribution).
// Blocks of kWarps = 4 or 8 warps. For Y, warp w takes rows t [16 (w % 4), + 16) and columns p
// [(w / 4) P / 2, + P / 2) with 8 warps, all of them with 4 (the two warps of a row block each
// compute its C B^T; tiles above the diagonal are skipped); for S, warp w takes state rows p
// [16 (w % (P / 16)), + 16) and a part of the columns. 8 warps: 2 blocks a multiprocessor (128
// registers a thread); 4 warps: 3 (more registers a thread, no C B^T computed twice).
template <int kP, int kN, int kWarps>
struct SsdShape {
  static constexpr int kThreads = kWarps * 32;
  // Rows padded by 8 elements (16 bytes): an odd number of 16-byte units a row, so that
  // ldmatrix's 8 rows fall in distinct banks.
  static constexpr int kNs = kN + 8;  // row stride of C, B and the 16-bit state copy
  static constexpr int kPs = kP + 8;  // row stride of X
  static constexpr int kCOff = 0;
  static constexpr int kBOff = kCOff + kSsdChunk * kNs * 2;
  static constexpr int kXOff = kBOff + kSsdChunk * kNs * 2;
  static constexpr int kSOff = kXOff + kSsdChunk * kPs * 2;
  static constexpr int kCumOff = kSOff + kP * kNs * 2;
  static constexpr int kDtOff = kCumOff + kSsdChunk * 4;
  static constexpr int kBytes = kDtOff + kSsdChunk * 4;
  static constexpr int kYParts = kWarps / 4;      // warps a row block of Y is split over
  static constexpr int kYTiles = kP / kYParts / 8;  // n-tiles of 8 columns a warp's Y holds
  static constexpr int kRowBlocks = kP / 16;  // of the state
  // Warps a row block of the state is split over (by columns, 16 at least); the warps past
  // kRowBlocks * kParts hold none of it (small states).
  static constexpr int kParts =
      kWarps / kRowBlocks < kN / 16 ? kWarps / kRowBlocks : kN / 16;
  static constexpr int kSTiles = kN / kParts / 8;  // n-tiles a warp's state holds
  static_assert(kP % 32 == 0 && kWarps % kRowBlocks == 0 && kSTiles % 2 == 0 &&
                kN % 16 == 0 && kYTiles % 2 == 0 && (kWarps == 4 || kWarps == 8));
  static constexpr int kMinBlocks = kWarps == 8 ? 2 : 3;  // a multiprocessor
};

template <typename T, int kP, int kN, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, SsdShape<kP, kN, kWarps>::kMinBlocks)
    SsdScanKernel(ScanArgs<T> a) {
  using Shape = SsdShape<kP, kN, kWarps>;
  constexpr int kQ = kSsdChunk, kNs = Shape::kNs, kPs = Shape::kPs;
  constexpr int kSsdThreads = Shape::kThreads;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  T* cs = reinterpret_cast<T*>(smem + Shape::kCOff);   // [kQ][kNs]: C of the chunk's tokens
  T* bs = reinterpret_cast<T*>(smem + Shape::kBOff);   // [kQ][kNs]: B
  T* xs = reinterpret_cast<T*>(smem + Shape::kXOff);   // [kQ][kPs]: x of the head
  T* ss = reinterpret_cast<T*>(smem + Shape::kSOff);   // [kP][kNs]: the state entering the chunk
  float* cums = reinterpret_cast<float*>(smem + Shape::kCumOff);  // [kQ]
  float* dts = reinterpret_cast<float*>(smem + Shape::kDtOff);    // [kQ]
  const int h = blockIdx.x, i = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int fr = lane / 4, fc = (lane % 4) * 2;  // an mma fragment's row and first column
  const int lm = lane / 8, lr = lane % 8;        // ldmatrix: the lane's matrix and row
  const int g = h / (a.num_heads / a.n_groups);
  const int64_t inner = static_cast<int64_t>(a.num_heads) * kP;
  const HeadConstants head = HeadOf(a, h);
  const float A = head.A, dh = head.d, dt_bias = head.dt_bias;
  BeginDependentKernel();
  const SequenceTokens tokens = TokensOf(a.seqs, i);
  const int ctx = tokens.ctx, first = tokens.first, len = tokens.len;
  if (ctx == 0 || len == 0) return;  // the whole block
  float* state = a.states + (static_cast<int64_t>(a.seqs.state_slots[i]) * a.num_heads + h) *
                                static_cast<int64_t>(kP) * kN;
  // The state: warp's rows sp0 + fr (+ 8), columns sn0 + 8 j + fc (+ 1).
  const int sp0 = (warp % Shape::kRowBlocks) * 16;
  const int sn0 = (warp / Shape::kRowBlocks) * (kN / Shape::kParts);
  const bool s_owner = warp < Shape::kRowBlocks * Shape::kParts;
  float st[Shape::kSTiles][4];
  const bool fresh = ctx == len || !s_owner;
#pragma unroll
  for (int j = 0; j < Shape::kSTiles; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int p = sp0 + fr + half * 8, n = sn0 + j * 8 + fc;
      const float2 v = fresh ? make_float2(0.f, 0.f)
                             : *reinterpret_cast<const float2*>(state + p * kN + n);
      st[j][2 * half] = v.x;
      st[j][2 * half + 1] = v.y;
    }
  }
  auto store_state_copy = [&] {
    if (!s_owner) return;
#pragma unroll
    for (int j = 0; j < Shape::kSTiles; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = sp0 + fr + half * 8, n = sn0 + j * 8 + fc;
        *reinterpret_cast<uint32_t*>(ss + p * kNs + n) =
            Pack2<T>(st[j][2 * half], st[j][2 * half + 1]);
      }
    }
  };
  store_state_copy();
  const int64_t x_col = static_cast<int64_t>(h) * kP;
  const int64_t b_col = inner + static_cast<int64_t>(g) * kN;
  const int64_t c_col = inner + static_cast<int64_t>(a.n_groups + g) * kN;
  const int rt = warp % 4, t0w = rt * 16;  // the warp's rows of Y
  const int pw0 = (warp / 4) * (kP / Shape::kYParts);  // and its first column
  for (int c0 = 0; c0 < len; c0 += kQ) {
    const int l = min(kQ, len - c0);
    // The chunk's B, C and x rows (zero past l), 16 bytes a copy.
    for (int idx = threadIdx.x; idx < kQ * (kN / 8); idx += kSsdThreads) {
      const int t = idx / (kN / 8), q = (idx % (kN / 8)) * 8;
      const T* row = a.xbc + (first + c0 + min(t, l - 1)) * a.xbc_stride;
      CpAsync16(cs + t * kNs + q, row + c_col + q, t < l);
      CpAsync16(bs + t * kNs + q, row + b_col + q, t < l);
    }
    for (int idx = threadIdx.x; idx < kQ * (kP / 8); idx += kSsdThreads) {
      const int t = idx / (kP / 8), q = (idx % (kP / 8)) * 8;
      const T* row = a.xbc + (first + c0 + min(t, l - 1)) * a.xbc_stride;
      CpAsync16(xs + t * kPs + q, row + x_col + q, t < l);
    }
    CpAsyncCommit();
    // dt and the inclusive sum of dt A over the chunk (lane: tokens lane, lane + 32)
    if (warp == 0) {
      float v[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = lane + 32 * r;
        const float dt =
            t < l ? StepSize(ToFloat(a.dt[(first + c0 + t) * a.dt_stride + h]) + dt_bias,
                             a.dt_min, a.dt_max)
                  : 0.0f;
        dts[t] = dt;
        v[r] = dt * A;
      }
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float up = __shfl_up_sync(0xffffffffu, v[r], o);
          if (lane >= o) v[r] += up;
        }
      }
      v[1] += __shfl_sync(0xffffffffu, v[0], 31);
      cums[lane] = v[0];
      cums[lane + 32] = v[1];
    }
    CpAsyncWait<0>();
    __syncthreads();
    {
      // G = C B^T, rows t0w.., the u tiles at or below the diagonal.
      float gacc[kQ / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t af[4];
        LdMatrixX4(af, cs + (t0w + lane % 16) * kNs + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int ju = 0; ju < kQ / 8; ju += 2) {
          if (ju <= 2 * rt) {
            uint32_t bf[4];
            LdMatrixX4(bf, bs + (ju * 8 + lr + (lm / 2) * 8) * kNs + kk * 16 + (lm % 2) * 8);
            Mma16816<T>(gacc[ju], af, bf[0], bf[1]);
            Mma16816<T>(gacc[ju + 1], af, bf[2], bf[3]);
          }
        }
      }
      // M = G o L as the A operand of M X, 16 tokens u a k step.
      const float cum_lo = cums[t0w + fr], cum_hi = cums[t0w + fr + 8];
      uint32_t mf[kQ / 16][4];
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int j = 2 * kk + half;
          const int u = j * 8 + fc;
          float m[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = t0w + fr + (e / 2) * 8, uu = u + e % 2;
            const float cum_t = e < 2 ? cum_lo : cum_hi;
            m[e] = uu <= t ? gacc[j][e] * __expf(cum_t - cums[uu]) * dts[uu] : 0.0f;
          }
          mf[kk][2 * half] = Pack2<T>(m[0], m[1]);
          mf[kk][2 * half + 1] = Pack2<T>(m[2], m[3]);
        }
      }
      // Y = C S^T, scaled by exp(cum_t) a row, then + M X.
      float y[Shape::kYTiles][4] = {};
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t af[4];
        LdMatrixX4(af, cs + (t0w + lane % 16) * kNs + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int jp = 0; jp < Shape::kYTiles; jp += 2) {
          uint32_t bf[4];
          LdMatrixX4(bf, ss + (pw0 + jp * 8 + lr + (lm / 2) * 8) * kNs + kk * 16 + (lm % 2) * 8);
          Mma16816<T>(y[jp], af, bf[0], bf[1]);
          Mma16816<T>(y[jp + 1], af, bf[2], bf[3]);
        }
      }
      const float decay_lo = __expf(cum_lo), decay_hi = __expf(cum_hi);
#pragma unroll
      for (int jp = 0; jp < Shape::kYTiles; ++jp) {
        y[jp][0] *= decay_lo;
        y[jp][1] *= decay_lo;
        y[jp][2] *= decay_hi;
        y[jp][3] *= decay_hi;
      }
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) {
        if (kk <= rt) {
#pragma unroll
          for (int jp = 0; jp < Shape::kYTiles; jp += 2) {
            uint32_t bf[4];
            LdMatrixX4Trans(bf, xs + (kk * 16 + lr + (lm % 2) * 8) * kPs + pw0 + jp * 8 +
                                    (lm / 2) * 8);
            Mma16816<T>(y[jp], mf[kk], bf[0], bf[1]);
            Mma16816<T>(y[jp + 1], mf[kk], bf[2], bf[3]);
          }
        }
      }
      // + D x; rows past the chunk's end are not stored.
#pragma unroll
      for (int jp = 0; jp < Shape::kYTiles; ++jp) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int t = t0w + fr + half * 8, p = pw0 + jp * 8 + fc;
          if (t < l) {
            const float2 x = Unpack2<T>(*reinterpret_cast<const uint32_t*>(xs + t * kPs + p));
            *reinterpret_cast<uint32_t*>(a.output + (first + c0 + t) * inner + x_col + p) =
                Pack2<T>(y[jp][2 * half] + dh * x.x, y[jp][2 * half + 1] + dh * x.y);
          }
        }
      }
    }
    if (s_owner) {
      // S = exp(cum_last) S + (X o w)^T B.
      const float cum_last = cums[kQ - 1];
      const float decay = __expf(cum_last);
#pragma unroll
      for (int j = 0; j < Shape::kSTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] *= decay;
      }
#pragma unroll
      for (int kk = 0; kk < kQ / 16; ++kk) {
        if (kk * 16 < l) {
          uint32_t af[4];  // X^T: rows p, columns u
          LdMatrixX4Trans(af, xs + (kk * 16 + lr + (lm / 2) * 8) * kPs + sp0 + (lm % 2) * 8);
          float wgt[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int u = kk * 16 + fc + (e / 2) * 8 + e % 2;
            wgt[e] = __expf(cum_last - cums[u]) * dts[u];
          }
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float2 v = Unpack2<T>(af[r]);
            const int e = (r / 2) * 2;  // a0, a1: columns fc, fc + 1; a2, a3: fc + 8, fc + 9
            af[r] = Pack2<T>(v.x * wgt[e], v.y * wgt[e + 1]);
          }
#pragma unroll
          for (int jn = 0; jn < Shape::kSTiles; jn += 2) {
            uint32_t bf[4];
            LdMatrixX4Trans(bf, bs + (kk * 16 + lr + (lm % 2) * 8) * kNs + sn0 + jn * 8 +
                                    (lm / 2) * 8);
            Mma16816<T>(st[jn], af, bf[0], bf[1]);
            Mma16816<T>(st[jn + 1], af, bf[2], bf[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with the chunk's buffers and the state copy
    if (c0 + kQ < len) store_state_copy();
  }
  if (!s_owner) return;
#pragma unroll
  for (int j = 0; j < Shape::kSTiles; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int p = sp0 + fr + half * 8, n = sn0 + j * 8 + fc;
      *reinterpret_cast<float2*>(state + p * kN + n) =
          make_float2(st[j][2 * half], st[j][2 * half + 1]);
    }
  }
}

constexpr int kDecodeThreads = 256;

// Lanes a state row is split over in the decode kernel: kMax (16 or 32; a row's lanes move
// 16 * kMax contiguous bytes at once), fewer for small states so that each lane holds a float4.
template <int kN, int kMax>
constexpr int DecodeLanes() {
  return kN / 4 < kMax ? kN / 4 : kMax;
}

// A decode-only step: one block of 256 threads per (rows of a head, sequence). The block's
// threads form 256 / kL groups of kL lanes; group g holds rows g, g + groups, ... (kR of them)
// of the block's kRows, each lane kN / kL entries of a row. Two shapes (Launch picks): small
// batches 16 lanes a row and one row a group (16 rows a block at state 128: many blocks a
// sequence, so that one sequence spreads over the GPU); large batches 32 lanes a row and 8 rows a
// group (64 rows, a whole head at state 128), so that the group's B and C conv, which every block
// computes, is computed once a head instead of once per 16 rows, and each thread keeps 128 bytes
// of state in flight. Rows past head_dim (a head_dim that kRows does not divide) are computed on
// zeros and not stored.
//
// A block computes the conv update of its group's B and C channels (the ring row written back by
// the group's first block) and of its rows' x channels, then the SSM update of its rows.
// Before its wait the kernel reads, besides weights, the step's sequence arrays (uploaded
// before the step's first kernel), its rows' SSM state and its channels' conv ring taps into
// registers: only this kernel of this layer writes those, in earlier steps, and the previous
// kernel (in_proj, a GEMM) lets this one launch only after its own wait, so every kernel before
// it has completed (common.cuh). The state therefore streams in while in_proj finishes; after
// the wait a block issues the loads of its new conv inputs and dt, and only then consumes the
// taps, so that a block launched after in_proj has completed waits for one round trip, not two.
// The ring row a step writes (position pos, row pos % kernel) holds position pos - kernel,
// which no block of the step reads.
// With kGated, the gated RMSNorm's gating and weight (SsmDecodeGatedNorm): the output is
// weight * v, v = y * silu(z), and the block's sum of v^2 goes to gn.partials[row * gridDim.x +
// blockIdx.x]. Each row's z and weight are read by its lanes with the step's other loads.
template <typename T>
struct GatedNormArgs {
  const T* gate;
  int64_t gate_stride;
  const T* weight;
  float* partials;
};

template <typename T, int kN, int kL, int kR, bool kGated = false>
__global__ void __launch_bounds__(kDecodeThreads)
    SsmDecodeKernel(ConvArgs<T> conv, ScanArgs<T> a, GatedNormArgs<T> gn, bool late_dependents) {
  constexpr int kGroups = kDecodeThreads / kL;
  constexpr int kRows = kGroups * kR;
  constexpr int kChannels = 2 * kN + kRows;  // B, C, then the block's x channels
  constexpr int kPerThread = (kChannels + kDecodeThreads - 1) / kDecodeThreads;
  constexpr int kTaps = kSsmMaxConvKernel - 1;  // older positions' taps, at most
  __shared__ __align__(16) float outs[kChannels];  // the conv outputs (B, C, x)
  __shared__ float s_dt;
  const float* bs = outs;
  const float* cs = outs + kN;
  const float* xs = outs + 2 * kN;
  const int hd = a.head_dim;
  const int row_blocks = (hd + kRows - 1) / kRows;
  const int h = blockIdx.x / row_blocks, p0 = (blockIdx.x % row_blocks) * kRows;
  const int i = blockIdx.y;
  const int group = threadIdx.x / kL, s = threadIdx.x % kL;
  const int heads_per_group = a.num_heads / a.n_groups;
  const int g = h / heads_per_group;
  const bool bc_owner = h % heads_per_group == 0 && p0 == 0;
  const int num_channels = 2 * kN + min(kRows, hd - p0);
  const int64_t inner = static_cast<int64_t>(a.num_heads) * hd;
  const HeadConstants head = HeadOf(a, h);
  const float A = head.A, dh = head.d, dt_bias = head.dt_bias;
  const int ctx = __ldcg(a.seqs.context_lens + i);  // step inputs: uploaded before the step
  const int k1 = conv.kernel - 1;
  const int pos = ctx - 1;
  const bool fresh = ctx == 1;
  const int64_t slot = ctx == 0 ? 0 : __ldcg(a.seqs.state_slots + i);
  // The global channel of block channel k.
  auto channel = [&](int k) -> int64_t {
    if (k < 2 * kN) {
      const int n = k % kN;
      return inner + static_cast<int64_t>(k >= kN ? a.n_groups + g : g) * kN + n;
    }
    return static_cast<int64_t>(h) * hd + p0 + (k - 2 * kN);
  };
  float* head_state = a.states + (slot * a.num_heads + h) * static_cast<int64_t>(hd) * kN;
  StateRow<kN, kL> st[kR];
  float taps[kPerThread][kTaps];  // ring values of the older positions (weighted: kEarlyConv)
  if (ctx != 0) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {  // first, so that its loads are in flight with the ring's
      const int p = p0 + group + r * kGroups;
      st[r].template Load</*kThroughL2=*/true>(head_state + static_cast<int64_t>(p) * kN, s,
                                                /*zero=*/fresh || p >= hd);
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int k = threadIdx.x + j * kDecodeThreads;
      const int64_t c = k < num_channels ? channel(k) : 0;
#pragma unroll
      for (int t = 0; t < kTaps; ++t) {  // unrolled: the loads issued together
        const int q = pos - k1 + t;
        taps[j][t] = k < num_channels && t < k1 && !fresh && q >= 0
                         ? __ldcg(conv.states + slot * conv.kernel * conv.channels +
                                  static_cast<int64_t>(q % conv.kernel) * conv.channels + c)
                         : 0.0f;
      }
    }
  }
  // The conv of the thread's j-th channel c, but for its newest input: bias + the weighted taps
  // of older positions (taps read only where ctx != 0), and the newest input's weight.
  auto conv_older = [&](int j, int64_t c, float& older, float& newest_w) {
    const T* w = conv.weight + c * conv.kernel;
    float acc = conv.bias != nullptr ? ToFloat(conv.bias[c]) : 0.0f;
#pragma unroll
    for (int t = 0; t < kTaps; ++t) {
      if (t < k1) acc += ToFloat(w[t]) * (ctx != 0 ? taps[j][t] : 0.0f);
    }
    older = acc;
    newest_w = ToFloat(w[k1]);
  };
  // Small blocks (small batches, where in_proj is the skinny GEMM and launches this kernel while
  // it finishes): that part before the wait too, so that the conv's weights (not in L2 after a
  // step's other layers) are not read after it. Large blocks take it after, once the step's
  // inputs are requested.
  constexpr bool kEarlyConv = kR == 1;
  [[maybe_unused]] float older[kEarlyConv ? kPerThread : 1];
  [[maybe_unused]] float newest_w[kEarlyConv ? kPerThread : 1];
  if constexpr (kEarlyConv) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int k = threadIdx.x + j * kDecodeThreads;
      conv_older(j, k < num_channels ? channel(k) : 0, older[j], newest_w[j]);
    }
  }
  // The norm's weight of each of the thread's rows (kGated).
  [[maybe_unused]] float norm_w[kGated ? kR : 1];
  if constexpr (kGated) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int p = p0 + group + r * kGroups;
      norm_w[r] = p < hd ? ToFloat(gn.weight[static_cast<int64_t>(h) * hd + p]) : 0.0f;
    }
  }
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  if (ctx == 0) return;  // padding: the whole block
  const int64_t row = a.seqs.query_start[i];
  if (threadIdx.x == 0) {
    s_dt = StepSize(ToFloat(a.dt[row * a.dt_stride + h]) + dt_bias, a.dt_min, a.dt_max);
  }
  float x_new[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int k = threadIdx.x + j * kDecodeThreads;
    x_new[j] = k < num_channels ? ToFloat(conv.input[row * conv.input_stride + channel(k)]) : 0.0f;
  }
  [[maybe_unused]] float z[kGated ? kR : 1];  // the gate of each of the thread's rows (kGated)
  if constexpr (kGated) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int p = p0 + group + r * kGroups;
      z[r] = p < hd ? ToFloat(gn.gate[row * gn.gate_stride + static_cast<int64_t>(h) * hd + p])
                    : 0.0f;
    }
  }
  float* ring_out = conv.states + slot * conv.kernel * conv.channels +
                    static_cast<int64_t>(pos % conv.kernel) * conv.channels;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int k = threadIdx.x + j * kDecodeThreads;
    if (k < num_channels) {
      const int64_t c = channel(k);
      float conv_part, conv_w;
      if constexpr (kEarlyConv) {
        conv_part = older[j], conv_w = newest_w[j];
      } else {
        conv_older(j, c, conv_part, conv_w);
      }
      outs[k] = Silu(conv_part + conv_w * x_new[j]);
      if (k >= 2 * kN || bc_owner) ring_out[c] = x_new[j];
    }
  }
  __syncthreads();
  const float dt = s_dt, decay = expf(dt * A);
  float squares = 0.0f;  // kGated: this lane's share of the block's sum of v^2
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int p = p0 + group + r * kGroups;
    const bool valid = p < hd;
    const float x = valid ? xs[p - p0] : 0.0f;
    const float acc = st[r].Update(decay, dt * x, bs, cs, s);  // every lane of the warp
    if (valid) {
      st[r].Store(head_state + static_cast<int64_t>(p) * kN, s);
      if (s == 0) {
        T* out = a.output + row * inner + static_cast<int64_t>(h) * hd + p;
        if constexpr (kGated) {
          const float v = ToFloat(FromFloat<T>(acc + dh * x)) * Silu(z[r]);
          squares += v * v;
          *out = FromFloat<T>(norm_w[r] * v);
        } else {
          *out = FromFloat<T>(acc + dh * x);
        }
      }
    }
  }
  if constexpr (kGated) {
    __shared__ float warp_squares[kDecodeThreads / 32];
    squares = WarpSum(squares);
    if (threadIdx.x % 32 == 0) warp_squares[threadIdx.x / 32] = squares;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeThreads / 32; ++w) sum += warp_squares[w];
      gn.partials[row * gridDim.x + blockIdx.x] = sum;
    }
  }
  if (late_dependents) AllowDependentLaunch();
}

constexpr int kGatedNormMaxThreads = 1024;

// Elements kVec at a time (8: 16-byte accesses; 1 where rows are not so aligned).
template <typename T, int kVec>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[kVec]) {
  if constexpr (kVec == 8) {
    Load8<T>(p, out);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = ToFloat(p[j]);
  }
}
template <typename T, int kVec>
__device__ __forceinline__ void StoreVec(T* p, const float (&in)[kVec]) {
  if constexpr (kVec == 8) {
    Store8<T>(p, in);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) p[j] = FromFloat<T>(in[j]);
  }
}

// One block per (token, group), up to 1024 threads, each kVec elements at a time: v = y *
// silu(z) into shared memory ([group_size] floats) while the squares are summed, then the
// normed v times the weight. The weight's first vector per thread is loaded before the wait.
template <typename T, int kVec>
__global__ void __launch_bounds__(kGatedNormMaxThreads)
    SsmGatedRmsNormKernel(const T* input, const T* gate, int64_t gate_stride, const T* weight,
                          T* output, int width, int group_size, float epsilon) {
  using Acc = std::conditional_t<std::is_same_v<T, float>, double, float>;
  extern __shared__ float4 smem4[];
  float* gated = reinterpret_cast<float*>(smem4);  // [group_size]
  __shared__ Acc scratch[32];
  const int g0 = blockIdx.y * group_size;
  const int num_vecs = group_size / kVec;
  float w0[kVec] = {};
  if (static_cast<int>(threadIdx.x) < num_vecs) {
    LoadVec<T, kVec>(weight + g0 + threadIdx.x * kVec, w0);
  }
  BeginDependentKernel();
  const int64_t t = blockIdx.x;
  const T* y = input + t * width + g0;
  const T* z = gate + t * gate_stride + g0;
  Acc sum = 0;
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    float yv[kVec], zv[kVec];
    LoadVec<T, kVec>(y + v * kVec, yv);
    LoadVec<T, kVec>(z + v * kVec, zv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float e = yv[j] * Silu(zv[j]);
      gated[v * kVec + j] = e;
      sum += static_cast<Acc>(e) * e;
    }
  }
  sum = BlockSum(sum, scratch);  // also orders the writes to `gated` before the reads below
  float scale;
  if constexpr (std::is_same_v<Acc, double>) {
    scale = static_cast<float>(1.0 / sqrt(sum / static_cast<double>(group_size) +
                                          static_cast<double>(epsilon)));
  } else {
    scale = rsqrtf(sum / static_cast<float>(group_size) + epsilon);
  }
  T* out = output + t * width + g0;
  for (int v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    float w[kVec], o[kVec];
    if (v == static_cast<int>(threadIdx.x)) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) w[j] = w0[j];
    } else {
      LoadVec<T, kVec>(weight + g0 + v * kVec, w);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) o[j] = w[j] * (gated[v * kVec + j] * scale);
    StoreVec<T, kVec>(out + v * kVec, o);
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

bool SsmConvUsesVectors(const SsmConvParams& p) {
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return !p.scalar && p.kernel <= kConvVecTaps && p.channels % 8 == 0 && p.input_stride % 8 == 0 &&
         aligned(p.input) && aligned(p.output) && aligned(p.conv_states) &&
         (p.bias == nullptr || aligned(p.bias));
}

cudaError_t Launch(const SsmConvParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.seqs.num_seqs == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t tokens = std::max<int64_t>(p.num_tokens, 1);
    if (SsmConvUsesVectors(p)) {
      const dim3 grid(static_cast<unsigned>(CeilDiv(p.channels / 8, kConvThreads)),
                      static_cast<unsigned>(p.seqs.num_seqs),
                      static_cast<unsigned>(CeilDiv(tokens, kConvRun)));
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(SsmConvVecKernel<T>, grid, dim3(kConvThreads), 0,
                                                stream, MakeConvArgs<T>(p)));
    } else {
      const dim3 grid(static_cast<unsigned>(CeilDiv(p.channels, kConvThreads)),
                      static_cast<unsigned>(p.seqs.num_seqs),
                      static_cast<unsigned>(CeilDiv(tokens, kConvTokens)));
      LMSERVE_CUDA_RETURN_IF_ERROR(LaunchKernel(SsmConvKernel<T>, grid, dim3(kConvThreads), 0,
                                                stream, MakeConvArgs<T>(p)));
    }
    const dim3 state_grid(static_cast<unsigned>(CeilDiv(p.channels, kConvThreads)),
                          static_cast<unsigned>(p.seqs.num_seqs));
    return LaunchKernel(SsmConvStateKernel<T>, state_grid, dim3(kConvThreads), 0, stream,
                        MakeConvArgs<T>(p));
  });
}

namespace {

// Calls f(std::integral_constant<int, P>, std::integral_constant<int, N>) for the head shapes
// the SSD kernel is built for: (head_dim, state) (64, 128) (Mamba-2's), (64, 64), (32, 128) and
// (32, 16) (the mamba2-ssm test fixture's).
template <typename F>
cudaError_t DispatchSsdShape(int64_t head_dim, int64_t state_size, F&& f) {
  static_assert(kSsdChunk == 64, "the kernel's warps take 16 rows each of 64");
  if (head_dim == 32 && state_size == 16) {
    return f(std::integral_constant<int, 32>{}, std::integral_constant<int, 16>{});
  }
  if (head_dim == 64 && state_size == 128) {
    return f(std::integral_constant<int, 64>{}, std::integral_constant<int, 128>{});
  }
  if (head_dim == 64 && state_size == 64) {
    return f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
  }
  if (head_dim == 32 && state_size == 128) {
    return f(std::integral_constant<int, 32>{}, std::integral_constant<int, 128>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool SsmScanUsesSsd(const SsmScanParams& p) {
  auto aligned = [](const void* ptr, int bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  const bool shape = (p.head_dim == 64 && (p.state_size == 128 || p.state_size == 64)) ||
                     (p.head_dim == 32 && (p.state_size == 128 || p.state_size == 16));
  return !p.recurrence && shape && p.dtype != DType::kF32 && p.xbc_stride % 8 == 0 &&
         aligned(p.xbc, 16) && aligned(p.output, 4) && aligned(p.ssm_states, 8);
}

cudaError_t Launch(const SsmScanParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.seqs.num_seqs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.seqs.num_seqs));
  if (SsmScanUsesSsd(p)) {
    auto launch = [&](auto tag) {
      using T = typename decltype(tag)::type;
      return DispatchSsdShape(p.head_dim, p.state_size, [&](auto p_tag, auto n_tag) {
        constexpr int kP = decltype(p_tag)::value, kN = decltype(n_tag)::value;
        auto run = [&](auto kernel, int threads, int smem) {
          LMSERVE_CUDA_RETURN_IF_ERROR(
              SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), smem));
          return LaunchKernel(kernel, grid, dim3(static_cast<unsigned>(threads)),
                              static_cast<size_t>(smem), stream, MakeScanArgs<T>(p));
        };
        if (p.ssd_warps == 8) {
          using Shape = SsdShape<kP, kN, 8>;
          return run(SsdScanKernel<T, kP, kN, 8>, Shape::kThreads, Shape::kBytes);
        }
        using Shape = SsdShape<kP, kN, 4>;
        return run(SsdScanKernel<T, kP, kN, 4>, Shape::kThreads, Shape::kBytes);
      });
    };
    if (p.dtype == DType::kBF16) return launch(TypeTag<__nv_bfloat16>{});
    return launch(TypeTag<__half>{});
  }
  return DispatchElementwiseDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchStateSize(p.state_size, [&](auto n_tag) {
      constexpr int kN = decltype(n_tag)::value;
      const int smem = static_cast<int>((kScanChunk * (2 * kN + p.head_dim) + kScanChunk) *
                                        static_cast<int64_t>(sizeof(float)));
      LMSERVE_CUDA_RETURN_IF_ERROR(
          SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(SsmScanKernel<T, kN>), smem));
      const dim3 block(static_cast<unsigned>(p.head_dim * kLanesPerRow));
      return LaunchKernel(SsmScanKernel<T, kN>, grid, block, static_cast<size_t>(smem), stream,
                          MakeScanArgs<T>(p));
    });
  });
}

namespace {

// The decode kernel's large-block shape for state kN: lanes a row, rows a group, rows a block.
template <int kN>
struct LargeDecodeShape {
  static constexpr int kL = DecodeLanes<kN, 32>();
  static constexpr int kR = 32 * kL / kN;
  static constexpr int kRows = kDecodeThreads / kL * kR;
};

// Whether Launch runs the large blocks (Mamba-2-2.7B: from 7 sequences): 32 lanes a row and 32
// floats of state a thread (kN 128: 8 rows a group, 64 a block), where its rows divide head_dim
// and it still makes 4 blocks a multiprocessor or more.
template <int kN>
bool LargeDecodeBlocks(const SsmDecodeParams& p) {
  if constexpr (kN >= 64) {
    constexpr int kRows = LargeDecodeShape<kN>::kRows;
    const int64_t seqs = p.scan.seqs.num_seqs, heads = p.scan.num_heads, hd = p.scan.head_dim;
    const bool large =
        p.blocks == SsmDecodeBlocks::kLarge ||
        (p.blocks == SsmDecodeBlocks::kAuto &&
         seqs * heads * (hd / kRows) >= 4 * int64_t{CurrentMultiprocessorCount()});
    return hd % kRows == 0 && large;
  } else {
    return false;
  }
}

// Rows a block of the decode kernel's small shape.
template <int kN>
constexpr int SmallDecodeRows() {
  return kDecodeThreads / DecodeLanes<kN, 16>();
}

}  // namespace

int64_t SsmDecodeNormPartials(const SsmDecodeParams& p) {
  int64_t rows = 0;
  const cudaError_t error = DispatchStateSize(p.scan.state_size, [&](auto n_tag) {
    constexpr int kN = decltype(n_tag)::value;
    rows = LargeDecodeBlocks<kN>(p) ? LargeDecodeShape<kN>::kRows : SmallDecodeRows<kN>();
    return cudaSuccess;
  });
  if (error != cudaSuccess) return 0;
  return p.scan.num_heads * CeilDiv(p.scan.head_dim, rows);
}

cudaError_t Launch(const SsmDecodeParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.scan.seqs.num_seqs == 0) return cudaSuccess;
  return DispatchElementwiseDType(p.scan.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DispatchStateSize(p.scan.state_size, [&](auto n_tag) -> cudaError_t {
      constexpr int kN = decltype(n_tag)::value;
      const int64_t seqs = p.scan.seqs.num_seqs, heads = p.scan.num_heads, hd = p.scan.head_dim;
      const GatedNormArgs<T> gn{static_cast<const T*>(p.norm.gate), p.norm.gate_stride,
                                static_cast<const T*>(p.norm.weight), p.norm.partials};
      const bool gated = p.norm.partials != nullptr;
      auto launch = [&](auto kernel, auto gated_kernel, int rows) {
        const dim3 grid(static_cast<unsigned>(heads * CeilDiv(hd, rows)),
                        static_cast<unsigned>(seqs));
        return LaunchKernel(gated ? gated_kernel : kernel, grid, dim3(kDecodeThreads), 0, stream,
                            MakeConvArgs<T>(p.conv), MakeScanArgs<T>(p.scan), gn,
                            p.late_dependents);
      };
      if constexpr (kN >= 64) {
        using Shape = LargeDecodeShape<kN>;
        if (LargeDecodeBlocks<kN>(p)) {
          return launch(SsmDecodeKernel<T, kN, Shape::kL, Shape::kR>,
                        SsmDecodeKernel<T, kN, Shape::kL, Shape::kR, true>, Shape::kRows);
        }
      }
      constexpr int kL = DecodeLanes<kN, 16>();
      return launch(SsmDecodeKernel<T, kN, kL, 1>, SsmDecodeKernel<T, kN, kL, 1, true>,
                    SmallDecodeRows<kN>());
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
    const int smem = static_cast<int>(p.group_size * static_cast<int64_t>(sizeof(float)));
    auto launch = [&](auto kernel, int vec) -> cudaError_t {
      if (smem > 48 * 1024) {
        LMSERVE_CUDA_RETURN_IF_ERROR(
            SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), smem));
      }
      const int64_t threads =
          std::min<int64_t>(kGatedNormMaxThreads, CeilDiv(p.group_size / vec, 32) * 32);
      return LaunchKernel(kernel, grid, dim3(static_cast<unsigned>(threads)),
                          static_cast<size_t>(smem), stream, static_cast<const T*>(p.input),
                          static_cast<const T*>(p.gate), p.gate_stride,
                          static_cast<const T*>(p.weight), static_cast<T*>(p.output),
                          static_cast<int>(p.width), static_cast<int>(p.group_size), p.epsilon);
    };
    // 16-byte accesses where every row and group starts 16-byte aligned.
    auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    if (p.group_size % 8 == 0 && p.width % 8 == 0 && p.gate_stride % 8 == 0 &&
        aligned(p.input) && aligned(p.gate) && aligned(p.weight) && aligned(p.output)) {
      return launch(SsmGatedRmsNormKernel<T, 8>, 8);
    }
    return launch(SsmGatedRmsNormKernel<T, 1>, 1);
  });
}

}  // namespace lmserve::kernels::cuda
