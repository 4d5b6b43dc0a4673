// The quantized-weight kernels (quant_gemm.h).
//
// Every type is read in units: a unit is one lane's share of a row, 32 weights (Q8_0, Q4_0,
// Q4_K) or 64 (Q6_K), brought in by 16-byte loads, and decodes to runs of 16 consecutive
// weights, each run w = scale * q - min (min only in Q4_K) with q small integers. The integers
// become floats by the exponent trick (q | 0x4B000000 is 2^23 + q as a float; one byte permute
// and one subtraction an element). Q4_K, Q8_0 and Q6_K at a few tokens skip the floats: their
// products run in integers against x rounded to 16-bit digits (the section below).

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/quant_gemm.h"
#include "kernels/cuda/residual_fold.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::kernels::cuda {
namespace {

__host__ __device__ constexpr int64_t AlignUp256(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

__device__ __forceinline__ float HalfBits(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xffffu)));
}
__device__ __forceinline__ float LoadHalfAt(const uint8_t* p) {  // 2-byte aligned
  return HalfBits(*reinterpret_cast<const unsigned short*>(p));
}

// Byte i (0..3) of `word` as the float 2^23 + byte, less `offset` (2^23 + the quants' zero).
template <int kByte>
__device__ __forceinline__ float ByteAsFloat(uint32_t word, float offset) {
  return __uint_as_float(__byte_perm(word, 0x4B00u, 0x5440u + kByte)) - offset;
}
// The 16 bytes of v (lowest first) as floats, less offset.
__device__ __forceinline__ void BytesAsFloats(const uint4& v, float offset, float (&out)[16]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[4 * i + 0] = ByteAsFloat<0>(words[i], offset);
    out[4 * i + 1] = ByteAsFloat<1>(words[i], offset);
    out[4 * i + 2] = ByteAsFloat<2>(words[i], offset);
    out[4 * i + 3] = ByteAsFloat<3>(words[i], offset);
  }
}
__device__ __forceinline__ uint4 Map4(const uint4& v, uint32_t mask, int shift) {
  return make_uint4((v.x >> shift) & mask, (v.y >> shift) & mask, (v.z >> shift) & mask,
                    (v.w >> shift) & mask);
}
// A small non-negative integer (below 2^23) as a float: the exponent trick.
__device__ __forceinline__ float SmallUintAsFloat(uint32_t v) {
  return __uint_as_float(0x4B000000u | v) - 8388608.0f;
}

constexpr float kTwo23 = 8388608.0f;

// The device layout of a matrix (quant_gemm.h) and its units. Row() finds a row's places once;
// Load() brings unit u of the row (u < 2^24: offsets in 32 bits); Decode() gives run `run` of
// it as small integers in floats, q[16], with the run's scale and min: w = scale * q - min.
template <DType kType>
struct Quant;

template <>
struct Quant<DType::kQ8_0> {
  static constexpr int kUnitElements = 32, kRuns = 2;
  static constexpr bool kHasMin = false;
  struct Row {
    const uint8_t* q;  // the row's quants, k bytes
    const uint8_t* d;  // its blocks' fp16 scales
  };
  struct Raw {
    uint4 q[2];
    float d;
  };
  __device__ static Row RowOf(const uint8_t* w, int64_t rows, int64_t cols, int64_t row) {
    return {w + row * cols, w + AlignUp256(rows * cols) + row * (cols / 32) * 2};
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    const uint8_t* q = row.q + u * 32;
    raw.q[0] = LoadStream16(q);
    raw.q[1] = LoadStream16(q + 16);
    raw.d = LoadHalfAt(row.d + u * 2);
  }
  __device__ static int RunStart(int u, int run) { return u * 32 + run * 16; }
  __device__ static void Decode(const Raw& raw, int /*u*/, int run, float (&q)[16], float& scale,
                                float& min) {
    const uint4 v = raw.q[run];
    BytesAsFloats(
        make_uint4(v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u),
        kTwo23 + 128.0f, q);
    scale = raw.d;
    min = 0.0f;
  }
};

template <>
struct Quant<DType::kQ4_0> {
  static constexpr int kUnitElements = 32, kRuns = 2;
  static constexpr bool kHasMin = false;
  struct Row {
    const uint8_t* q;  // 16 bytes a block
    const uint8_t* d;
  };
  struct Raw {
    uint4 q;
    float d;
  };
  __device__ static Row RowOf(const uint8_t* w, int64_t rows, int64_t cols, int64_t row) {
    return {w + row * (cols / 32) * 16, w + AlignUp256(rows * cols / 2) + row * (cols / 32) * 2};
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    raw.q = LoadStream16(row.q + u * 16);
    raw.d = LoadHalfAt(row.d + u * 2);
  }
  __device__ static int RunStart(int u, int run) { return u * 32 + run * 16; }
  __device__ static void Decode(const Raw& raw, int /*u*/, int run, float (&q)[16], float& scale,
                                float& min) {
    BytesAsFloats(Map4(raw.q, 0x0F0F0F0Fu, 4 * run), kTwo23 + 8.0f, q);
    scale = raw.d;
    min = 0.0f;
  }
};

template <>
struct Quant<DType::kQ4_K> {
  static constexpr int kUnitElements = 32, kRuns = 2;
  static constexpr bool kHasMin = true;
  struct Row {
    const uint8_t* blocks;  // 144 bytes each
  };
  struct Raw {
    uint4 header;  // d, dmin, 12 bytes of 6-bit scales and mins
    uint4 q;       // 16 bytes of a pair of sub-blocks' quants
  };
  __device__ static Row RowOf(const uint8_t* w, int64_t /*rows*/, int64_t cols, int64_t row) {
    return {w + row * (cols / 256) * 144};
  }
  // Unit u is unit j = u % 8 of block u / 8: pair j / 2 of sub-blocks, half j % 2 of their bytes.
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    const uint8_t* block = row.blocks + (u >> 3) * 144;
    const int j = u & 7;
    raw.header = __ldg(reinterpret_cast<const uint4*>(block));
    raw.q = LoadStream16(block + 16 + (j >> 1) * 32 + (j & 1) * 16);
  }
  __device__ static int RunStart(int u, int run) {
    const int j = u & 7;
    return (u >> 3) * 256 + (j >> 1) * 64 + run * 32 + (j & 1) * 16;
  }
  // Sub-block s's 6-bit scale and min (ScaleMinK4 of kernels/cpu/dequant.cc): the 12 bytes
  // q[0..11] from byte 4 of the header are its words y, z, w; byte s & 3 of each.
  __device__ static void ScaleMin(const uint4& header, int s, float& sc, float& mn) {
    const int shift = 8 * (s & 3);
    const uint32_t y = (header.y >> shift) & 0xFFu, z = (header.z >> shift) & 0xFFu,
                   w = (header.w >> shift) & 0xFFu;
    if (s < 4) {  // q[s] & 63, q[s + 4] & 63
      sc = SmallUintAsFloat(y & 63u);
      mn = SmallUintAsFloat(z & 63u);
    } else {  // (q[s + 4] & 15) | (q[s - 4] >> 6) << 4, (q[s + 4] >> 4) | (q[s] >> 6) << 4
      sc = SmallUintAsFloat((w & 0xFu) | ((y >> 6) << 4));
      mn = SmallUintAsFloat((w >> 4) | ((z >> 6) << 4));
    }
  }
  __device__ static void Decode(const Raw& raw, int u, int run, float (&q)[16], float& scale,
                                float& min) {
    BytesAsFloats(Map4(raw.q, 0x0F0F0F0Fu, 4 * run), kTwo23, q);
    float sc, mn;
    ScaleMin(raw.header, ((u & 7) >> 1) * 2 + run, sc, mn);
    scale = __fmul_rn(HalfBits(raw.header.x), sc);
    min = __fmul_rn(HalfBits(raw.header.x >> 16), mn);
  }
};

template <>
struct Quant<DType::kQ6_K> {
  static constexpr int kUnitElements = 64, kRuns = 4;
  static constexpr bool kHasMin = false;
  struct Row {
    const uint8_t* q;       // ql and qh, 192 bytes a block
    const uint8_t* scales;  // 16 a block
    const uint8_t* d;       // fp16, one a block
  };
  struct Raw {
    uint4 ql0, ql1, qh;
    uint4 scales;  // the block's 16 int8 scales
    float d;
  };
  __device__ static Row RowOf(const uint8_t* w, int64_t rows, int64_t cols, int64_t row) {
    const int64_t blocks = rows * (cols / 256), first = row * (cols / 256);
    const uint8_t* scales = w + AlignUp256(blocks * 192);
    return {w + first * 192, scales + first * 16, scales + AlignUp256(blocks * 16) + first * 2};
  }
  // Unit u is unit j = u % 4 of block u / 4: half j / 2, from l = 16 * (j % 2).
  __device__ static void LoadQuants(const Row& row, int u, uint4& ql0, uint4& ql1, uint4& qh) {
    const int j = u & 3;
    const int half = j >> 1, l = (j & 1) * 16;
    const uint8_t* block = row.q + (u >> 2) * 192;
    ql0 = LoadStream16(block + 64 * half + l);
    ql1 = LoadStream16(block + 64 * half + 32 + l);
    qh = LoadStream16(block + 128 + 32 * half + l);
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    const int b = u >> 2;
    LoadQuants(row, u, raw.ql0, raw.ql1, raw.qh);
    raw.scales = __ldg(reinterpret_cast<const uint4*>(row.scales + b * 16));
    raw.d = LoadHalfAt(row.d + b * 2);
  }
  __device__ static int RunStart(int u, int run) {
    const int j = u & 3;
    return (u >> 2) * 256 + (j >> 1) * 128 + (j & 1) * 16 + run * 32;
  }
  __device__ static void Decode(const Raw& raw, int u, int run, float (&q)[16], float& scale,
                                float& min) {
    // Runs 0..3: ql0 low, ql1 low, ql0 high, ql1 high nibbles, qh bits 2 * run.
    const uint4& ql = run % 2 == 0 ? raw.ql0 : raw.ql1;
    const uint4 low = Map4(ql, 0x0F0F0F0Fu, 4 * (run / 2));
    const uint4 high = Map4(raw.qh, 0x03030303u, 2 * run);
    BytesAsFloats(make_uint4(low.x | (high.x << 4), low.y | (high.y << 4), low.z | (high.z << 4),
                             low.w | (high.w << 4)),
                  kTwo23 + 32.0f, q);
    // Scale 8 * half + (j % 2) + 2 * run: word 2 * half + run / 2, byte (j % 2) + 2 * (run % 2).
    const int j = u & 3;
    const bool high_half = j >= 2;
    const uint32_t word = run < 2 ? (high_half ? raw.scales.z : raw.scales.x)
                                  : (high_half ? raw.scales.w : raw.scales.y);
    const int byte = (j & 1) + 2 * (run % 2);
    const int sc = static_cast<int32_t>(word << (24 - 8 * byte)) >> 24;  // sign-extended
    scale = __fmul_rn(raw.d, static_cast<float>(sc));
    min = 0.0f;
  }
};

// ---- QuantSkinnyGemm.

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T>
__device__ __forceinline__ void StoreOut(T* p, float v) {
  *p = FromFloat<T>(v);
}
template <>
__device__ __forceinline__ void StoreOut<float>(float* p, float v) {
  *p = v;
}

// 16 elements of x from `p` (16-byte aligned) as floats.
template <typename T>
__device__ __forceinline__ void LoadX16(const T* p, float (&out)[16]) {
  const uint4* v = reinterpret_cast<const uint4*>(p);
  float (&lo)[8] = *reinterpret_cast<float(*)[8]>(out);
  float (&hi)[8] = *reinterpret_cast<float(*)[8]>(out + 8);
  Unpack8<T>(__ldg(v), lo);
  Unpack8<T>(__ldg(v + 1), hi);
}

// The row of W that output slot r of a warp whose outputs start at out0 reads: with
// silu_and_mul, R / 2 gate rows and their up rows n / 2 further. Rows past the end (and whole
// warps past it) read the last row; nothing of theirs is stored.
template <int R, bool kSiluAndMul>
__device__ __forceinline__ int RowOfSlot(int out0, int r, int n) {
  constexpr int kOutputs = kSiluAndMul ? R / 2 : R;
  const int row = kSiluAndMul ? (r < kOutputs ? out0 + r : out0 + r - kOutputs + n / 2) : out0 + r;
  return min(row, n - 1);
}

// The warp's sums to y (lane 0), after summing them over the lanes: with silu_and_mul,
// act(gate) * up, each rounded to T first.
template <typename T, typename OutT, int M, int R, bool kSiluAndMul, GateActivation kActivation>
__device__ __forceinline__ void StoreWarpSums(float (&acc)[R][M], OutT* __restrict__ y,
                                              int64_t y_stride, int m, int out0,
                                              int num_outputs) {
  constexpr int kOutputs = kSiluAndMul ? R / 2 : R;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = WarpSum(acc[r][t]);
  }
  if (threadIdx.x % 32 != 0) return;
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) {
    if (out0 + o >= num_outputs) break;
#pragma unroll
    for (int t = 0; t < M; ++t) {
      if (t >= m) break;
      if constexpr (kSiluAndMul) {
        const float gate = ToFloat(FromFloat<T>(acc[o][t]));
        const float up = ToFloat(FromFloat<T>(acc[o + kOutputs][t]));
        StoreOut(y + t * y_stride + out0 + o, GateActivationOf<kActivation, true>(gate) * up);
      } else {
        StoreOut(y + t * y_stride + out0 + o, acc[o][t]);
      }
    }
  }
}

// acc[r][t] += W row r's unit u . x, for the first m of M tokens, R rows.
// M <= 2: x first (M x 16 floats), then each row decoded and multiplied; Q4_K's min through
// the run's sum of x (sum (s q - mn) x = s sum q x - mn sum x), shared by the R rows.
// M > 2: each row decoded (and dequantized, with a min) first, then x a token at a time.
template <DType kType, typename T, int M, int R>
__device__ __forceinline__ void MultiplyUnit(const typename Quant<kType>::Raw (&raw)[R], int u,
                                             const T* x, int64_t x_stride, int m,
                                             float (&acc)[R][M]) {
  using Q = Quant<kType>;
#pragma unroll
  for (int run = 0; run < Q::kRuns; ++run) {
    const int start = Q::RunStart(u, run);
    if constexpr (M <= 2) {
      float xf[M][16], sum_x[M];
#pragma unroll
      for (int t = 0; t < M; ++t) {
        if (t < m) {
          LoadX16(x + t * x_stride + start, xf[t]);
        } else {
#pragma unroll
          for (int e = 0; e < 16; ++e) xf[t][e] = 0.0f;
        }
        if constexpr (Q::kHasMin) {
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int e = 0; e < 16; e += 2) s0 += xf[t][e], s1 += xf[t][e + 1];
          sum_x[t] = s0 + s1;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float q[16], scale, min;
        Q::Decode(raw[r], u, run, q, scale, min);
#pragma unroll
        for (int t = 0; t < M; ++t) {
          float s0 = 0.0f, s1 = 0.0f;  // two chains: half the dependent latency
#pragma unroll
          for (int e = 0; e < 16; e += 2) {
            s0 = fmaf(q[e], xf[t][e], s0);
            s1 = fmaf(q[e + 1], xf[t][e + 1], s1);
          }
          acc[r][t] = fmaf(scale, s0 + s1, acc[r][t]);
          if constexpr (Q::kHasMin) acc[r][t] = fmaf(-min, sum_x[t], acc[r][t]);
        }
      }
    } else {
      float w[R][16], scale[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float min;
        Q::Decode(raw[r], u, run, w[r], scale[r], min);
        if constexpr (Q::kHasMin) {
#pragma unroll
          for (int e = 0; e < 16; ++e) w[r][e] = fmaf(scale[r], w[r][e], -min);
        }
      }
#pragma unroll
      for (int t = 0; t < M; ++t) {
        if (t >= m) break;
        float xf[16];
        LoadX16(x + t * x_stride + start, xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
          for (int e = 0; e < 16; e += 2) {
            s0 = fmaf(w[r][e], xf[e], s0);
            s1 = fmaf(w[r][e + 1], xf[e + 1], s1);
          }
          acc[r][t] = Q::kHasMin ? acc[r][t] + (s0 + s1) : fmaf(scale[r], s0 + s1, acc[r][t]);
        }
      }
    }
  }
}

// A warp takes R rows of W (with silu_and_mul: R / 2 gate rows and their up rows) and walks
// their units, U of each in flight per lane, the next step's loads issued before the current
// step's products. grid: ceil(outputs / (kWarps * outputs a warp)).
template <DType kType, typename T, typename OutT, int M, int R, int U, bool kSiluAndMul,
          GateActivation kActivation>
__global__ void __launch_bounds__(kThreads)
    QuantSkinnyGemmKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                          OutT* __restrict__ y, int m, int n, int k, int64_t x_stride,
                          int64_t y_stride, bool late_dependents) {
  using Q = Quant<kType>;
  constexpr int kOutputs = kSiluAndMul ? R / 2 : R;  // outputs a warp
  const int lane = threadIdx.x % 32;
  const int warp_index = blockIdx.x * kWarps + threadIdx.x / 32;
  const int out0 = warp_index * kOutputs;
  const int num_outputs = kSiluAndMul ? n / 2 : n;
  if (out0 >= num_outputs) {
    WaitForPriorKernels();
    return;
  }
  typename Q::Row row_places[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row_places[r] = Q::RowOf(w, n, k, RowOfSlot<R, kSiluAndMul>(out0, r, n));
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
  }
  const int units = k / Q::kUnitElements;
  typename Q::Raw raw[U][R];
  auto load = [&](int u0, typename Q::Raw (&into)[U][R]) {
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int u = u0 + 32 * i;
      if (u >= units) break;
#pragma unroll
      for (int r = 0; r < R; ++r) Q::Load(row_places[r], u, into[i][r]);
    }
  };
  load(lane, raw);  // weights before the wait (skinny_gemm.cu says why)
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  for (int u0 = lane; u0 < units; u0 += 32 * U) {
    typename Q::Raw next[U][R];
    if (u0 + 32 * U < units) load(u0 + 32 * U, next);  // in flight during the products
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int u = u0 + 32 * i;
      if (u >= units) break;
      MultiplyUnit<kType, T, M, R>(raw[i], u, x, x_stride, m, acc);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
#pragma unroll
      for (int r = 0; r < R; ++r) raw[i][r] = next[i][r];
    }
  }
  if (late_dependents) AllowDependentLaunch();
  StoreWarpSums<T, OutT, M, R, kSiluAndMul, kActivation>(acc, y, y_stride, m, out0,
                                                         num_outputs);
}

// ---- Q4_K, Q8_0 and Q6_K at a few tokens (QuantSkinnyRoundsX): the products in integers.
//
// Decoding every weight to a float costs several instructions a weight, more than the memory
// system leaves at 4.5 bits a weight. Here each block first writes x into shared memory as
// integers, per token and 256-element super-block: xq = x * 2^(14 - E), E the exponent of the
// largest |x| of the 256, so |xq| < 2^15; exact for every element within 2^7 of the largest (bf16
// holds 8 significant bits), within half of 2^(E - 14) for the rest (a relative L2 of about 5e-6
// on a product of Gaussian x). xq is kept as two byte digits, hi = xq >> 8 (signed) and
// lo = xq & 255 (unsigned), beside each 16 elements' sum of xq. Then
// sum q * xq = 256 * dp4a(q, hi) + dp4a(q, lo) exactly in int32, and only the blocks' scales
// (Q4_K's 6-bit ones in int32 too) and x's power of two in float: about one instruction a
// weight. The decoders below bound their sums within int32.
//
// Shared memory, per token: the hi digits [k], the lo digits [k], in 16-byte chunks placed so that
// a warp's lanes read consecutive chunks (chunk i of unit u at i * units + u; a unit is 64
// weights); after every token's digits, the sums of 16 elements [m, k / 16] (int) and the powers
// of two [m, k / 256] (float).
constexpr int IntegerSmemBytes(int m, int k) { return m * (2 * k + 4 * (k / 256) + 4 * (k / 16)); }

// Blocks a multiprocessor the integer kernels are compiled for: two of 8 warps or one of 16 (128
// registers a thread) at one or two tokens; one beyond (four tokens' sums take more).
constexpr int IntegerMinBlocks(int m, int block_warps) { return m <= 2 ? 16 / block_warps : 1; }

// Four bytes packed, lowest first.
__device__ __forceinline__ uint32_t PackBytes(int b0, int b1, int b2, int b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// x [m, k] into shared memory as above: a warp per (token, super-block), 8 elements a lane, the
// loads of up to four of a warp's super-blocks issued before any is used (x comes from L2, one
// round trip each otherwise: seven for a row of 14336).
// Tokens from `valid` up to m are written as zeros (a launch for M tokens with fewer).
// kAddNorm (one token): x is the add + RMSNorm's addend; the digits are those of
// (fold_residual + x) * fold_weight rounded to T (residual_fold.cuh's AddNormRow), and the
// function returns this warp's share of the sum of the squares of residual + x, summed over its
// lanes (else 0). The norm's scale is the caller's to apply to the sums: a block's digits are
// relative to its largest element, so they need not see it.
template <int kBlockWarps, typename T, bool kAddNorm = false>
__device__ __forceinline__ float QuantizeXDigits(const T* __restrict__ x, int64_t x_stride, int m,
                                                 int valid, int k, uint8_t* smem,
                                                 const float* __restrict__ fold_residual = nullptr,
                                                 const T* __restrict__ fold_weight = nullptr) {
  // The fold's loads are three times x's (its residual in fp32 and its weight): two in flight
  // (every super-block of a warp at k 4096, the hidden sizes the fold sees; Q4_K's one-token
  // form then spills one value in its main loop, two iterations at that k, where one in flight
  // spills none but waits twice).
  constexpr int kBatch = kAddNorm ? 2 : 4;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int blocks = k / 256, units = k / 64, items = m * blocks;
  int* sums = reinterpret_cast<int*>(smem + 2 * m * k);
  auto* dx = reinterpret_cast<float*>(sums + m * (k / 16));
  [[maybe_unused]] float squares = 0.0f;
  for (int first = warp; first < items; first += kBlockWarps * kBatch) {
    uint4 loaded[kBatch];
    [[maybe_unused]] uint4 weight[kBatch];
    [[maybe_unused]] float4 residual[kBatch][2];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int item = first + i * kBlockWarps;
      if (item < items) {
        const int t = item / blocks, b = item % blocks;
        loaded[i] = t < valid ? __ldg(reinterpret_cast<const uint4*>(x + t * x_stride +
                                                                     b * 256 + lane * 8))
                              : make_uint4(0, 0, 0, 0);
        if constexpr (kAddNorm) {       // t is 0: one token
          const int v = b * 32 + lane;  // the lane's 8 elements, as uint4s of T
          weight[i] = __ldg(reinterpret_cast<const uint4*>(fold_weight) + v);
          const float4* res = reinterpret_cast<const float4*>(fold_residual) + 2 * v;
          residual[i][0] = __ldg(res);
          residual[i][1] = __ldg(res + 1);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int item = first + i * kBlockWarps;
      if (item >= items) break;
      const int t = item / blocks, b = item % blocks;
      float f[8];
      Unpack8<T>(loaded[i], f);
      if constexpr (kAddNorm) {  // AddNormRow's arithmetic, its rounding to T
        AddNormEight<T>(f, residual[i][0], residual[i][1], weight[i], squares);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = ToFloat(FromFloat<T>(f[j]));
      }
      uint32_t e = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) e = max(e, (__float_as_uint(f[j]) >> 23) & 0xFFu);
      // E at least -112: both powers of two stay normal floats (a block whose largest |x| is
      // below 2^-112 is rounded to multiples of 2^-126).
      e = max(__reduce_max_sync(0xffffffffu, e), 15u);
      const float to_int = __uint_as_float((268u - e) << 23);  // 2^(14 - E), E = e - 127
      int q[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        q[j] = __float2int_rn(f[j] * to_int);
        sum += q[j];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the lane's 16 elements: 2 lanes
      // The low byte of each is its lo digit; one byte up, its hi digit.
      const uint2 lo =
          make_uint2(PackBytes(q[0], q[1], q[2], q[3]), PackBytes(q[4], q[5], q[6], q[7]));
      const uint2 hi = make_uint2(PackBytes(q[0] >> 8, q[1] >> 8, q[2] >> 8, q[3] >> 8),
                                  PackBytes(q[4] >> 8, q[5] >> 8, q[6] >> 8, q[7] >> 8));
      // Element b * 256 + 8 lane is in unit 4 b + lane / 8, chunk (lane % 8) / 2, half lane % 2.
      const int place = (((lane % 8) / 2) * units + b * 4 + lane / 8) * 16 + (lane % 2) * 8;
      *reinterpret_cast<uint2*>(smem + 2 * t * k + place) = hi;
      *reinterpret_cast<uint2*>(smem + 2 * t * k + k + place) = lo;
      if (lane % 2 == 0) sums[t * (k / 16) + b * 16 + lane / 2] = sum;
      if (lane == 0) dx[t * blocks + b] = __uint_as_float((e - 14u) << 23);  // 2^(E - 14)
    }
  }
  if constexpr (kAddNorm) return WarpSum(squares);
  return 0.0f;
}

// dp4a of signed bytes a and unsigned bytes b (the lo digits), added to c.
__device__ __forceinline__ int Dp4aSignedUnsigned(int a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The integer kernels' decoders: a unit is 64 weights of a row, which lane l takes at
// units l + 32 i. Row() finds a row's places once, Load() brings a unit's bytes, Multiply() adds
// the unit's products with the x digits in shared memory (the layout above) to acc[R][M].

// x's digits for chunk i (0-3) of unit u of token t: hi and lo, 16 of each.
__device__ __forceinline__ void LoadDigits(const uint8_t* smem, int k, int t, int i, int u,
                                           uint4& hi, uint4& lo) {
  const int offset = (i * (k / 64) + u) * 16;
  hi = *reinterpret_cast<const uint4*>(smem + 2 * t * k + offset);
  lo = *reinterpret_cast<const uint4*>(smem + 2 * t * k + k + offset);
}
__device__ __forceinline__ const int* DigitSums(const uint8_t* smem, int m, int k) {
  return reinterpret_cast<const int*>(smem + 2 * m * k);
}
__device__ __forceinline__ const float* DigitPowers(const uint8_t* smem, int m, int k) {
  return reinterpret_cast<const float*>(DigitSums(smem, m, k) + m * (k / 16));
}

// Q4_K: a unit is a pair of sub-blocks (32 quant bytes: the first's low nibbles, the second's
// high ones) with its block's header. Sums q * xq in int32 (|.| < 32 * 15 * 2^15 a sub-block),
// the 6-bit scales and mins in int32 too (times 63, twice: below 2^31), d, dmin and x's power of
// two in float.
struct Q4kIntegerDecoder {
  struct Row {
    const uint8_t* blocks;  // 144 bytes each
  };
  struct Raw {
    uint4 header, qa, qb;  // d, dmin and the 6-bit scales; the pair's 32 quant bytes
  };
  __device__ static Row RowOf(const uint8_t* w, int /*n*/, int k, int row) {
    return {w + int64_t{row} * (k / 256) * 144};
  }
  // A unit's bytes are three 16-byte pieces: the header, qa, qb. 32 units (a pass of
  // IntegerStreamKernel) are 8 blocks, contiguous in the row.
  static constexpr int kPieces = 3;
  static constexpr int kPassBytes = 8 * 144;
  __device__ static const uint8_t* PieceOf(const Row& row, int u, int i) {
    const uint8_t* block = row.blocks + (u >> 2) * 144;
    return i == 0 ? block : block + 16 * i + (u & 3) * 32;
  }
  __device__ static void FromPieces(const uint4 (&pieces)[kPieces], Raw& raw) {
    raw = {pieces[0], pieces[1], pieces[2]};
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    uint4 pieces[kPieces];
#pragma unroll
    for (int i = 0; i < kPieces; ++i) pieces[i] = LoadStream16(PieceOf(row, u, i));
    FromPieces(pieces, raw);
  }
  template <int M, int R>
  __device__ static void Multiply(const Raw (&raw)[R], int u, const uint8_t* smem, int k,
                                  float (&acc)[R][M]) {
    // The pair p = u % 4 (the lane's, always): sub-blocks 2p and 2p + 1, whose scale and min
    // bytes (ScaleMinK4 of kernels/cpu/dequant.cc) sit at bytes jb, jb + 1 of the header's words
    // y, z (p < 2) or w with the top bits of y, z (p >= 2).
    const int jb = (2 * u) & 3;
    const bool high_pair = (u & 3) >= 2;
    const uint32_t select = jb | (jb + 1) << 4 | (jb + 4) << 8 | (jb + 5) << 12;
    const int b = u >> 2;
    // Per row and token, sum q * xq of sub-blocks a (the low nibbles) and b (the high ones) as
    // hi (signed) and lo (unsigned) digit sums: qa's bytes against x chunks 0 and 2, then qb's
    // against 1 and 3.
    int dots[R][M][4] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 xh[M][2], xl[M][2];
#pragma unroll
      for (int t = 0; t < M; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) LoadDigits(smem, k, t, half + 2 * i, u, xh[t][i], xl[t][i]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 v = half == 0 ? raw[r].qa : raw[r].qb;
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int t = 0; t < M; ++t) {
          const uint32_t xs[4][4] = {{xh[t][0].x, xh[t][0].y, xh[t][0].z, xh[t][0].w},
                                     {xl[t][0].x, xl[t][0].y, xl[t][0].z, xl[t][0].w},
                                     {xh[t][1].x, xh[t][1].y, xh[t][1].z, xh[t][1].w},
                                     {xl[t][1].x, xl[t][1].y, xl[t][1].z, xl[t][1].w}};
          int (&dot)[4] = dots[r][t];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int low = static_cast<int>(words[j] & 0x0F0F0F0Fu);
            const int high = static_cast<int>((words[j] >> 4) & 0x0F0F0F0Fu);
            dot[0] = __dp4a(low, static_cast<int>(xs[0][j]), dot[0]);
            dot[1] = static_cast<int>(__dp4a(static_cast<uint32_t>(low), xs[1][j],
                                             static_cast<uint32_t>(dot[1])));
            dot[2] = __dp4a(high, static_cast<int>(xs[2][j]), dot[2]);
            dot[3] = static_cast<int>(__dp4a(static_cast<uint32_t>(high), xs[3][j],
                                             static_cast<uint32_t>(dot[3])));
          }
        }
      }
    }
    const int* sums = DigitSums(smem, M, k);
    const float* powers = DigitPowers(smem, M, k);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const Raw& q = raw[r];
      // Bytes [sc_a, sc_b, mn_a, mn_b] of the pair's two sub-blocks.
      const uint32_t yz = __byte_perm(q.header.y, q.header.z, select);
      const uint32_t low_w = __byte_perm(q.header.w, q.header.w >> 4, select);
      const uint32_t scale_min = high_pair
                                     ? (low_w & 0x0F0F0F0Fu) | ((yz >> 2) & 0x30303030u)
                                     : yz & 0x3F3F3F3Fu;
      const int sc_a = scale_min & 0xFF, sc_b = (scale_min >> 8) & 0xFF;
      const int mn_a = (scale_min >> 16) & 0xFF, mn_b = scale_min >> 24;
      const float2 d_dmin = __half22float2(*reinterpret_cast<const __half2*>(&q.header.x));
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const int (&dot)[4] = dots[r][t];
        // The pair's four 16-element sums: sub-block a's two, b's two.
        const int4 sum = *reinterpret_cast<const int4*>(sums + t * (k / 16) + 16 * b + 4 * (u & 3));
        const int scaled = sc_a * (dot[0] * 256 + dot[1]) + sc_b * (dot[2] * 256 + dot[3]);
        const int mins = mn_a * (sum.x + sum.y) + mn_b * (sum.z + sum.w);
        acc[r][t] = fmaf(powers[t * (k / 256) + b],
                         fmaf(d_dmin.x, static_cast<float>(scaled),
                              -d_dmin.y * static_cast<float>(mins)),
                         acc[r][t]);
      }
    }
  }
};

// Q8_0: a unit is two blocks (64 int8 quants and two fp16 d), whose quants meet x's digits chunk
// for chunk; per block, sum q * xq (|.| < 32 * 128 * 2^15, within int32), then d and x's power
// of two in float.
struct Q80IntegerDecoder {
  struct Row {
    const uint8_t* quants;  // k bytes
    const uint8_t* d;       // fp16, one a block
  };
  struct Raw {
    uint4 q[4];  // 64 quants
    uint32_t d;  // the two blocks' fp16 scales
  };
  __device__ static Row RowOf(const uint8_t* w, int n, int k, int row) {
    return {w + int64_t{row} * k, w + AlignUp256(int64_t{n} * k) + int64_t{row} * (k / 32) * 2};
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
#pragma unroll
    for (int i = 0; i < 4; ++i) raw.q[i] = LoadStream16(row.quants + u * 64 + 16 * i);
    raw.d = __ldcs(reinterpret_cast<const unsigned int*>(row.d + u * 4));
  }
  template <int M, int R>
  __device__ static void Multiply(const Raw (&raw)[R], int u, const uint8_t* smem, int k,
                                  float (&acc)[R][M]) {
    // Per row and token: block 0's hi and lo digit sums (x chunks 0, 1), block 1's (2, 3).
    int dots[R][M][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint4 xh[M], xl[M];
#pragma unroll
      for (int t = 0; t < M; ++t) LoadDigits(smem, k, t, i, u, xh[t], xl[t]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 v = raw[r].q[i];
        const int words[4] = {static_cast<int>(v.x), static_cast<int>(v.y),
                              static_cast<int>(v.z), static_cast<int>(v.w)};
#pragma unroll
        for (int t = 0; t < M; ++t) {
          const uint32_t hi[4] = {xh[t].x, xh[t].y, xh[t].z, xh[t].w};
          const uint32_t lo[4] = {xl[t].x, xl[t].y, xl[t].z, xl[t].w};
          int (&dot)[4] = dots[r][t];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            dot[2 * (i / 2)] = __dp4a(words[j], static_cast<int>(hi[j]), dot[2 * (i / 2)]);
            dot[2 * (i / 2) + 1] = Dp4aSignedUnsigned(words[j], lo[j], dot[2 * (i / 2) + 1]);
          }
        }
      }
    }
    const float* powers = DigitPowers(smem, M, k);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&raw[r].d));
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const int (&dot)[4] = dots[r][t];
        acc[r][t] = fmaf(powers[t * (k / 256) + (u >> 2)],
                         fmaf(d.x, static_cast<float>(dot[0] * 256 + dot[1]),
                              d.y * static_cast<float>(dot[2] * 256 + dot[3])),
                         acc[r][t]);
      }
    }
  }
};

// Q6_K: a unit is Quant<kQ6_K>'s (16 bytes of ql from each quarter's pair, 16 of qh), four runs
// of 16 weights with an int8 scale each; a run's 6-bit quants q (ql's nibble, qh's two bits
// above it) meet its x chunk, sum (q - 32) xq = sum q xq - 32 sum xq (|.| < 16 * 32 * 2^15), and
// the scales, d and x's power of two apply in float.
struct Q6kIntegerDecoder {
  using Row = Quant<DType::kQ6_K>::Row;
  struct Raw {
    uint4 ql0, ql1, qh;
    uint2 scales;  // the unit's half of its block's 16 int8 scales
    uint32_t d;    // fp16, low half
  };
  __device__ static Row RowOf(const uint8_t* w, int n, int k, int row) {
    return Quant<DType::kQ6_K>::RowOf(w, n, k, row);
  }
  __device__ static void Load(const Row& row, int u, Raw& raw) {
    const int b = u >> 2, half = (u & 3) >> 1;
    Quant<DType::kQ6_K>::LoadQuants(row, u, raw.ql0, raw.ql1, raw.qh);
    raw.scales = __ldcs(reinterpret_cast<const uint2*>(row.scales + b * 16 + 8 * half));
    raw.d = __ldcs(reinterpret_cast<const unsigned short*>(row.d + b * 2));
  }
  template <int M, int R>
  __device__ static void Multiply(const Raw (&raw)[R], int u, const uint8_t* smem, int k,
                                  float (&acc)[R][M]) {
    const int b = u >> 2, j = u & 3;
    const int* sums = DigitSums(smem, M, k);
    float part[R][M] = {};
#pragma unroll
    for (int run = 0; run < 4; ++run) {
      // Elements 256 b + 128 half + 32 run + l ...+16: x's unit and chunk, and its 16-sum.
      const int e0 = b * 256 + (j >> 1) * 128 + run * 32 + (j & 1) * 16;
      uint4 xh[M], xl[M];
      int sum[M];
#pragma unroll
      for (int t = 0; t < M; ++t) {
        LoadDigits(smem, k, t, (e0 % 64) / 16, e0 / 64, xh[t], xl[t]);
        sum[t] = sums[t * (k / 16) + e0 / 16];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Runs 0..3: ql0's low, ql1's low, ql0's high, ql1's high nibbles; qh's bits 2 run.
        const uint4& ql = run % 2 == 0 ? raw[r].ql0 : raw[r].ql1;
        const uint32_t low[4] = {ql.x, ql.y, ql.z, ql.w};
        const uint32_t high[4] = {raw[r].qh.x, raw[r].qh.y, raw[r].qh.z, raw[r].qh.w};
        // Scale 8 half + (j % 2) + 2 run: byte (j % 2) + 2 run of the unit's half.
        const int byte = (j & 1) + 2 * run;
        const uint32_t word = byte < 4 ? raw[r].scales.x : raw[r].scales.y;
        const int sc = static_cast<int32_t>(word << (24 - 8 * (byte & 3))) >> 24;
#pragma unroll
        for (int t = 0; t < M; ++t) {
          const uint32_t hi[4] = {xh[t].x, xh[t].y, xh[t].z, xh[t].w};
          const uint32_t lo[4] = {xl[t].x, xl[t].y, xl[t].z, xl[t].w};
          int dot_hi = 0, dot_lo = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t q = ((low[i] >> (4 * (run / 2))) & 0x0F0F0F0Fu) |
                               (((high[i] >> (2 * run)) & 0x03030303u) << 4);
            dot_hi = __dp4a(static_cast<int>(q), static_cast<int>(hi[i]), dot_hi);
            dot_lo = static_cast<int>(__dp4a(q, lo[i], static_cast<uint32_t>(dot_lo)));
          }
          part[r][t] = fmaf(static_cast<float>(sc),
                            static_cast<float>(dot_hi * 256 + dot_lo - 32 * sum[t]),
                            part[r][t]);
        }
      }
    }
    const float* powers = DigitPowers(smem, M, k);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float d = HalfBits(raw[r].d);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        acc[r][t] = fmaf(powers[t * (k / 256) + b] * d, part[r][t], acc[r][t]);
      }
    }
  }
};

// A warp takes R rows of W (with silu_and_mul: R / 2 gate rows and their up rows); lane l takes
// the units l + 32 i, the next step's loads in flight during its products. grid: ceil(outputs /
// (kBlockWarps * outputs a warp)); dynamic shared memory IntegerSmemBytes(M, k). (Warps sharing a
// matrix of few rows, each taking a slice of k and adding up in shared memory, made more blocks
// and so more quantizations of x: slower, 2.70 against 2.62 ms a Q4_K batch-1 step of
// Llama-3-8B's shapes.)
// kAddNorm (M 1): the add + RMSNorm folded in (QuantSkinnyGemmParams::add_norm_residual): the
// digits are the normed row's before its scale, which the sums then take. fold.settle_residual
// (not with silu_and_mul): the residual's add settled before the wait, as the other skinny
// kernels do (residual_fold.cuh).
// kAhead: units a lane has in flight beyond the one it multiplies (all of them requested before
// the wait): 2 for grids of at most one block a multiprocessor, which then has the registers
// (compiled for one block: up to 255) and no second block to hide its loads' latency.
template <typename D, typename T, typename OutT, int M, int R, int kBlockWarps, bool kSiluAndMul,
          GateActivation kActivation, bool kAddNorm = false, int kAhead = 1>
__global__ void __launch_bounds__(kBlockWarps * 32,
                                  kAhead > 1 ? 1 : IntegerMinBlocks(M, kBlockWarps))
    IntegerGemmKernel(const T* __restrict__ x, const uint8_t* __restrict__ w, OutT* __restrict__ y,
                      int m, int n, int k, int64_t x_stride, int64_t y_stride, bool late_dependents,
                      ResidualFoldArgs fold) {
  static_assert(!kAddNorm || M == 1, "the folded add + RMSNorm takes one row");
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kOutputs = kSiluAndMul ? R / 2 : R;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int out0 = (blockIdx.x * kBlockWarps + warp) * kOutputs;
  const int num_outputs = kSiluAndMul ? n / 2 : n;
  const int units = k / 64;
  typename D::Row rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = D::RowOf(w, n, k, RowOfSlot<R, kSiluAndMul>(out0, r, n));
  auto load = [&](int u, typename D::Raw (&into)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) D::Load(rows[r], u, into[r]);
  };
  static_assert(kAhead == 1 || kAhead == 2);
  typename D::Raw raw[R];
  [[maybe_unused]] typename D::Raw ahead[R];
  if (lane < units) load(lane, raw);  // weights before the wait (skinny_gemm.cu says why)
  if constexpr (kAhead == 2) {
    if (lane + 32 < units) load(lane + 32, ahead);
  }
  // The settle after W's first units are requested (residual_fold.cuh says why).
  if constexpr (!kSiluAndMul && !kAddNorm) {  // Validate(): never both
    if (fold.settle_residual != nullptr) {
      SettleResidualRows<OutT, R>(fold.settle_residual, y, out0, n, lane);
    }
  }
  if constexpr (kAddNorm) {
    if (threadIdx.x == 0) PrefetchAddNormWeight<T>(fold, k);
  }
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  [[maybe_unused]] const float squares =
      QuantizeXDigits<kBlockWarps, T, kAddNorm>(x, x_stride, M, m, k, smem, fold.add_norm_residual,
                                                static_cast<const T*>(fold.add_norm_weight));
  [[maybe_unused]] __shared__ float warp_squares[kAddNorm ? kBlockWarps : 1];
  if constexpr (kAddNorm) {
    if (lane == 0) warp_squares[warp] = squares;
  }
  __syncthreads();
  if (out0 >= num_outputs) return;
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
  }
  for (int u = lane; u < units; u += 32) {
    typename D::Raw next[R];
    if (u + 32 * kAhead < units) load(u + 32 * kAhead, next);  // in flight during the products
    D::template Multiply<M, R>(raw, u, smem, k, acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kAhead == 2) {
        raw[r] = ahead[r];
        ahead[r] = next[r];
      } else {
        raw[r] = next[r];
      }
    }
  }
  if (late_dependents) AllowDependentLaunch();
  if constexpr (kAddNorm) {
    // The sums are linear in x: the norm's scale on each lane's share (taken here, not held in a
    // register through the products: Q4_K's one-token form uses all 128).
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlockWarps; ++i) sum += warp_squares[i];
    const float add_norm_scale = AddNormScaleOf(fold, sum);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] *= add_norm_scale;
  }
  StoreWarpSums<T, OutT, M, R, kSiluAndMul, kActivation>(acc, y, y_stride, m, out0,
                                                         num_outputs);
}

// The one-token products streamed through shared memory (QuantSkinnyStreams, quant_gemm.h): a
// block of kStreamWarps warps a multiprocessor, whose warps take R rows at a time (a group; with
// silu_and_mul a gate row and its up row), groups first + i * (warps in the grid), each in passes
// of 32 units (lane l: unit 32 p + l). A warp copies each pass's bytes of its rows (contiguous in
// the row: D::kPassBytes) into one of its kStreamStages stages (cp.async, 16 bytes a lane in
// turn, so every byte is fetched once), up to kStreamStages - 1 passes ahead of the one it
// multiplies, across groups; the first ones requested before the wait. No registers are held
// while they are in flight, and x's digits (and a folded add + RMSNorm) are made once a block,
// not once every 16 outputs as IntegerGemmKernel's grids of several waves do. Measured on an
// H200 (bench/results section 37), Llama-3-8B's Q4_K step at batch 1: 1.84-1.85 ms against
// IntegerGemmKernel's 2.09-2.12. 16 warps and 3 stages, one block a multiprocessor; 8 warps a
// block (one, two or three blocks a multiprocessor) were no faster than IntegerGemmKernel. The
// next pass's places are followed from pass to pass: finding them from the pass's index (two
// divisions, the rows' offsets) took as many instructions as the products, and the step 4%
// longer. (Each lane copying its own units' pieces, 16 bytes of each 32-byte sector a copy so
// that every sector was read twice, made the step 39% slower at 8 warps.)
constexpr int kStreamWarps = 16;
constexpr int kStreamStages = 3;
constexpr int StreamStagesOffset(int k) { return (IntegerSmemBytes(1, k) + 15) / 16 * 16; }
template <typename D, int R>
constexpr int StreamSmemBytes(int k) {  // at k 16384: 148 KB
  return StreamStagesOffset(k) + kStreamWarps * kStreamStages * R * D::kPassBytes;
}

template <typename D, typename T, typename OutT, int R, bool kSiluAndMul,
          GateActivation kActivation, bool kAddNorm>
__global__ void __launch_bounds__(kStreamWarps * 32, 1)
    IntegerStreamKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                        OutT* __restrict__ y, int n, int k, bool late_dependents,
                        ResidualFoldArgs fold) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kOutputs = kSiluAndMul ? R / 2 : R;
  constexpr int kStageBytes = R * D::kPassBytes;  // a warp's
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_outputs = kSiluAndMul ? n / 2 : n;
  const int units = k / 64, passes = (units + 31) / 32;
  const int groups = (num_outputs + kOutputs - 1) / kOutputs;
  const int warps = gridDim.x * kStreamWarps, first = blockIdx.x * kStreamWarps + warp;
  const int my_groups = first < groups ? (groups - 1 - first) / warps + 1 : 0;
  const int items = my_groups * passes;  // (group, pass), passes innermost
  uint8_t* stages = smem + StreamStagesOffset(k) + warp * kStreamStages * kStageBytes;
  // The next pass to copy, followed from pass to pass (its rows' first bytes, its pass and
  // stage) rather than found from its index. A group's rows are the next group's less
  // warps * kOutputs rows (n even: no group of two rows runs past the end).
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] =
        D::PieceOf(D::RowOf(w, n, k, RowOfSlot<R, kSiluAndMul>(first * kOutputs, r, n)), 0, 0);
  }
  const int64_t group_stride =
      int64_t{warps} * kOutputs *
      (D::PieceOf(D::RowOf(w, n, k, 1), 0, 0) - D::PieceOf(D::RowOf(w, n, k, 0), 0, 0));
  constexpr int kChunks = D::kPassBytes / 16;  // 16-byte copies a row a pass
  // A last pass of fewer than 32 units copies their bytes only.
  const int last_chunks = (units - (passes - 1) * 32) * (D::kPassBytes / 32) / 16;
  int issue_pass = 0, issue_stage = 0;
  auto issue = [&]() {
    const int chunks = issue_pass == passes - 1 ? last_chunks : kChunks;
    uint8_t* stage = stages + issue_stage * kStageBytes;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* from = rows[r] + issue_pass * D::kPassBytes;
#pragma unroll
      for (int j = 0; j < (kChunks + 31) / 32; ++j) {
        const int c = lane + 32 * j;
        if (c < chunks) CpAsync16(stage + r * D::kPassBytes + 16 * c, from + 16 * c, true);
      }
    }
    if (++issue_pass == passes) {
      issue_pass = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) rows[r] += group_stride;
    }
    issue_stage = issue_stage == kStreamStages - 1 ? 0 : issue_stage + 1;
  };
  for (int s = 0; s < kStreamStages - 1; ++s) {
    if (s < items) issue();
    CpAsyncCommit();
  }
  if constexpr (!kSiluAndMul && !kAddNorm) {  // Validate(): never both
    if (fold.settle_residual != nullptr) {
      for (int g = 0; g < my_groups; ++g) {
        SettleResidualRows<OutT, R>(fold.settle_residual, y, (first + g * warps) * kOutputs, n,
                                    lane);
      }
    }
  }
  if constexpr (kAddNorm) {
    if (threadIdx.x == 0) PrefetchAddNormWeight<T>(fold, k);
  }
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  [[maybe_unused]] const float squares = QuantizeXDigits<kStreamWarps, T, kAddNorm>(
      x, k, 1, 1, k, smem, fold.add_norm_residual, static_cast<const T*>(fold.add_norm_weight));
  [[maybe_unused]] __shared__ float warp_squares[kAddNorm ? kStreamWarps : 1];
  if constexpr (kAddNorm) {
    if (lane == 0) warp_squares[warp] = squares;
  }
  __syncthreads();
  [[maybe_unused]] float add_norm_scale = 1.0f;
  if constexpr (kAddNorm) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kStreamWarps; ++i) sum += warp_squares[i];
    add_norm_scale = AddNormScaleOf(fold, sum);
  }
  float acc[R][1] = {};
  int pass = 0, stage_index = 0, group = first;
  for (int item = 0; item < items; ++item) {
    __syncwarp();  // every lane's reads of the stage refilled below are done
    if (item + kStreamStages - 1 < items) issue();
    CpAsyncCommit();
    CpAsyncWait<kStreamStages - 1>();  // this lane's copies of `item` have landed
    __syncwarp();                      // and every lane's
    const int u = pass * 32 + lane;
    if (u < units) {
      const uint8_t* stage = stages + stage_index * kStageBytes;
      typename D::Raw raw[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // The stage holds the pass's bytes as the row does: lane l's unit is unit l of it.
        const typename D::Row copy{stage + r * D::kPassBytes};
        uint4 pieces[D::kPieces];
#pragma unroll
        for (int i = 0; i < D::kPieces; ++i) {
          pieces[i] = *reinterpret_cast<const uint4*>(D::PieceOf(copy, lane, i));
        }
        D::FromPieces(pieces, raw[r]);
      }
      D::template Multiply<1, R>(raw, u, smem, k, acc);
    }
    stage_index = stage_index == kStreamStages - 1 ? 0 : stage_index + 1;
    if (++pass == passes) {
      if constexpr (kAddNorm) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] *= add_norm_scale;
      }
      StoreWarpSums<T, OutT, 1, R, kSiluAndMul, kActivation>(acc, y, 0, 1, group * kOutputs,
                                                             num_outputs);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
      pass = 0;
      group += warps;
    }
  }
  if (late_dependents) AllowDependentLaunch();
}

template <typename D, typename T, typename OutT, bool kSiluAndMul, GateActivation kActivation>
cudaError_t LaunchStream(const QuantSkinnyGemmParams& p, const ResidualFoldArgs& fold,
                         cudaStream_t stream) {
  constexpr int R = 2;
  auto* kernel = IntegerStreamKernel<D, T, OutT, R, kSiluAndMul, kActivation, false>;
  if constexpr (std::is_same_v<OutT, T>) {
    if (p.add_norm_residual != nullptr) {  // Validate(): one row, y in the input type
      kernel = IntegerStreamKernel<D, T, OutT, R, kSiluAndMul, kActivation, true>;
    }
  }
  const int k = static_cast<int>(p.k);
  const int smem = StreamSmemBytes<D, R>(k);
  if (const cudaError_t e = SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), smem);
      e != cudaSuccess) {
    return e;
  }
  const int64_t groups = kSiluAndMul ? p.n / 2 : CeilDiv(p.n, R);
  const int64_t blocks =
      std::min<int64_t>(CeilDiv(groups, kStreamWarps), CurrentMultiprocessorCount());
  return LaunchKernel(kernel, static_cast<unsigned>(blocks), kStreamWarps * 32,
                      static_cast<size_t>(smem), stream, static_cast<const T*>(p.x),
                      static_cast<const uint8_t*>(p.w), static_cast<OutT*>(p.y),
                      static_cast<int>(p.n), k, p.late_dependents, fold);
}

template <DType kType, typename T, typename OutT, int M, bool kSiluAndMul,
          GateActivation kActivation>
cudaError_t LaunchInteger(const QuantSkinnyGemmParams& p, int64_t x_stride, int64_t y_stride,
                          cudaStream_t stream) {
  // Q4_K at one token, where it does not stream (QuantSkinnyStreams: less shared memory): 4
  // rows a warp, 8 warps a block, two blocks a multiprocessor (128 registers); else 2 rows a warp
  // (the registers of Q8_0's and Q6_K's larger units, of a second token's sums), 16 warps a block
  // at two tokens and 8 (up to 255 registers) at four. Measured on an H100, Q4_K steps of
  // Llama-3-8B's shapes: at one token, 4 rows and 16 warps took 2.63-2.66 ms and 2 rows and 16
  // warps 2.66-2.67 against 2.60-2.62; at two tokens, 2 rows and 8 warps 3.16-3.17
  // against 2.98-3.00.
  constexpr bool kWide = kType == DType::kQ4_K && M == 1;
  constexpr int R = kWide ? 4 : 2;
  constexpr int kBlockWarps = kWide || M > 2 ? 8 : 16;
  static_assert(kType == DType::kQ4_K || kType == DType::kQ8_0 || kType == DType::kQ6_K);
  using Decoder = std::conditional_t<
      kType == DType::kQ4_K, Q4kIntegerDecoder,
      std::conditional_t<kType == DType::kQ8_0, Q80IntegerDecoder, Q6kIntegerDecoder>>;
  const ResidualFoldArgs fold = ResidualFoldArgsOf(p);
  if constexpr (kWide) {
    if (QuantSkinnyStreams(kType, p.m, p.k)) {
      return LaunchStream<Decoder, T, OutT, kSiluAndMul, kActivation>(p, fold, stream);
    }
  }
  const int64_t outputs = kSiluAndMul ? p.n / 2 : p.n;
  const int64_t blocks = CeilDiv(outputs, int64_t{kBlockWarps} * (kSiluAndMul ? R / 2 : R));
  auto* kernel =
      IntegerGemmKernel<Decoder, T, OutT, M, R, kBlockWarps, kSiluAndMul, kActivation>;
  if constexpr (M == 1 && std::is_same_v<OutT, T>) {
    if (p.add_norm_residual != nullptr) {  // Validate(): one row
      kernel =
          IntegerGemmKernel<Decoder, T, OutT, M, R, kBlockWarps, kSiluAndMul, kActivation, true>;
    }
  }
  // Q4_K's one-token products of few rows (Llama-3-8B's o and down: 128 blocks), where a grid
  // leaves multiprocessors a block at most: two units ahead (IntegerGemmKernel's kAhead; 206
  // registers). On an H200, Llama-3-8B's Q4_K step at batch 1: 2.09-2.10 ms against 2.16-2.18
  // (o 6.4 -> 3.2 us a layer, down 16.2 -> 14.1; bench/results section 36).
  if constexpr (kWide && !kSiluAndMul) {
    if (blocks <= CurrentMultiprocessorCount()) {
      kernel = p.add_norm_residual != nullptr
                   ? IntegerGemmKernel<Decoder, T, OutT, M, R, kBlockWarps, kSiluAndMul,
                                       kActivation, std::is_same_v<OutT, T>, 2>
                   : IntegerGemmKernel<Decoder, T, OutT, M, R, kBlockWarps, kSiluAndMul,
                                       kActivation, false, 2>;
    }
  }
  const int k = static_cast<int>(p.k);
  const int smem = IntegerSmemBytes(M, k);
  if (const cudaError_t e = SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), smem);
      e != cudaSuccess) {
    return e;
  }
  return LaunchKernel(
      kernel, static_cast<unsigned>(blocks), kBlockWarps * 32, static_cast<size_t>(smem), stream,
      static_cast<const T*>(p.x), static_cast<const uint8_t*>(p.w), static_cast<OutT*>(p.y),
      static_cast<int>(p.m), static_cast<int>(p.n), k, x_stride, y_stride, p.late_dependents, fold);
}

template <DType kType, typename T, typename OutT, bool kSiluAndMul, GateActivation kActivation>
cudaError_t LaunchSkinny(const QuantSkinnyGemmParams& p, cudaStream_t stream) {
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : p.k;
  const int64_t y_stride = p.y_stride != 0 ? p.y_stride : (kSiluAndMul ? p.n / 2 : p.n);
  const int64_t outputs = kSiluAndMul ? p.n / 2 : p.n;
  const T* x = static_cast<const T*>(p.x);
  const auto* w = static_cast<const uint8_t*>(p.w);
  OutT* y = static_cast<OutT*>(p.y);
  const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  // One or two tokens: 4 rows a warp (x read once for four; Q6_K's larger units: 2); more: 2
  // rows (registers for M tokens' sums). One unit of each row a step, the next step's loads in
  // flight during its products. (Registers, sm_90: 100-160 a thread, Q6_K's up to 255.)
  constexpr int kRowsFew = kType == DType::kQ6_K ? 2 : 4;
  if constexpr (kType == DType::kQ4_K || kType == DType::kQ8_0 || kType == DType::kQ6_K) {
    // A few tokens: the integer products (QuantSkinnyRoundsX, quant_gemm.h).
    if (QuantSkinnyRoundsX(kType, m, k)) {
      if (m == 1) {
        return LaunchInteger<kType, T, OutT, 1, kSiluAndMul, kActivation>(p, x_stride, y_stride,
                                                                          stream);
      }
      if (m == 2) {
        return LaunchInteger<kType, T, OutT, 2, kSiluAndMul, kActivation>(p, x_stride, y_stride,
                                                                          stream);
      }
      if constexpr (kType != DType::kQ6_K) {  // three or four tokens
        return LaunchInteger<kType, T, OutT, 4, kSiluAndMul, kActivation>(p, x_stride, y_stride,
                                                                          stream);
      }
    }
  }
#define LMSERVE_QUANT_SKINNY(M, R, U)                                                           \
  return LaunchKernel(QuantSkinnyGemmKernel<kType, T, OutT, M, R, U, kSiluAndMul, kActivation>, \
                      static_cast<unsigned>(                                                    \
                          CeilDiv(outputs, int64_t{kWarps} * (kSiluAndMul ? R / 2 : R))),       \
                      kThreads, 0, stream, x, w, y, m, n, k, x_stride, y_stride,                \
                      p.late_dependents)
  if (m == 1) LMSERVE_QUANT_SKINNY(1, kRowsFew, 1);
  if (m == 2) LMSERVE_QUANT_SKINNY(2, kRowsFew, 1);
  if (m <= 4) LMSERVE_QUANT_SKINNY(4, 2, 1);
  LMSERVE_QUANT_SKINNY(8, 2, 1);
#undef LMSERVE_QUANT_SKINNY
}

template <DType kType>
cudaError_t LaunchSkinnyOf(const QuantSkinnyGemmParams& p, cudaStream_t stream) {
  using T = __nv_bfloat16;
  if (p.output_dtype == DType::kF32) {
    return LaunchSkinny<kType, T, float, false, GateActivation::kSilu>(p, stream);
  }
  if (p.silu_and_mul && p.activation == GateActivation::kGeluTanh) {
    return LaunchSkinny<kType, T, T, true, GateActivation::kGeluTanh>(p, stream);
  }
  if (p.silu_and_mul) return LaunchSkinny<kType, T, T, true, GateActivation::kSilu>(p, stream);
  return LaunchSkinny<kType, T, T, false, GateActivation::kSilu>(p, stream);
}

// ---- QuantDequantize: a thread per unit, the CPU's arithmetic (no contraction).

template <DType kType>
__global__ void __launch_bounds__(kThreads)
    QuantDequantizeKernel(const uint8_t* __restrict__ w, __nv_bfloat16* __restrict__ dst,
                          int64_t rows, int64_t cols) {
  using Q = Quant<kType>;
  BeginDependentKernel();
  const int64_t units = cols / Q::kUnitElements;
  const int64_t index = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (index >= rows * units) return;
  const int64_t row = index / units;
  const int u = static_cast<int>(index % units);
  typename Q::Raw raw;
  Q::Load(Q::RowOf(w, rows, cols, row), u, raw);
#pragma unroll
  for (int run = 0; run < Q::kRuns; ++run) {
    float q[16], scale, min;
    Q::Decode(raw, u, run, q, scale, min);
    float v[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = Q::kHasMin ? __fsub_rn(__fmul_rn(scale, q[e]), min) : __fmul_rn(q[e], scale);
    }
    __nv_bfloat16* out = dst + row * cols + Q::RunStart(u, run);
    float (&lo)[8] = *reinterpret_cast<float(*)[8]>(v);
    float (&hi)[8] = *reinterpret_cast<float(*)[8]>(v + 8);
    Store8(out, lo);
    Store8(out + 8, hi);
  }
}

// ---- QuantRepack and QuantDummyFill: a thread per block of a row.

// Where block b (of the matrix's rows * nb) goes in the layout.
struct BlockPlaces {
  uint8_t* quants;  // Q8_0 32, Q4_0 16, Q6_K 192 bytes; Q4_K the whole block (144)
  uint8_t* d;       // fp16 (not Q4_K)
  uint8_t* scales;  // Q6_K: 16 bytes
};
__device__ BlockPlaces PlaceBlock(uint8_t* dst, DType dtype, int64_t matrix_rows, int64_t cols,
                                  int64_t b) {
  BlockPlaces p{};
  if (dtype == DType::kQ8_0) {
    p.quants = dst + b * 32;
    p.d = dst + AlignUp256(matrix_rows * cols) + b * 2;
  } else if (dtype == DType::kQ4_0) {
    p.quants = dst + b * 16;
    p.d = dst + AlignUp256(matrix_rows * cols / 2) + b * 2;
  } else if (dtype == DType::kQ4_K) {
    p.quants = dst + b * 144;
  } else {  // kQ6_K
    const int64_t blocks = matrix_rows * (cols / 256);
    p.quants = dst + b * 192;
    p.scales = dst + AlignUp256(blocks * 192) + b * 16;
    p.d = dst + AlignUp256(blocks * 192) + AlignUp256(blocks * 16) + b * 2;
  }
  return p;
}

__global__ void __launch_bounds__(kThreads)
    QuantRepackKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, DType dtype,
                      int64_t matrix_rows, int64_t cols, int64_t first_block, int64_t num_blocks,
                      int block_bytes) {
  const int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (i >= num_blocks) return;
  const uint8_t* in = src + i * block_bytes;
  const BlockPlaces p = PlaceBlock(dst, dtype, matrix_rows, cols, first_block + i);
  if (dtype == DType::kQ8_0 || dtype == DType::kQ4_0) {  // d, then the quants
    p.d[0] = in[0], p.d[1] = in[1];
    for (int j = 0; j < block_bytes - 2; ++j) p.quants[j] = in[2 + j];
  } else if (dtype == DType::kQ4_K) {
    for (int j = 0; j < 144; ++j) p.quants[j] = in[j];
  } else {  // Q6_K: ql, qh (192), scales (16), d
    for (int j = 0; j < 192; ++j) p.quants[j] = in[j];
    for (int j = 0; j < 16; ++j) p.scales[j] = in[192 + j];
    p.d[0] = in[208], p.d[1] = in[209];
  }
}

__device__ __forceinline__ uint32_t HashWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}
__device__ __forceinline__ void StoreHalf(uint8_t* p, float v) {
  const unsigned short bits = __half_as_ushort(__float2half_rn(v));
  p[0] = static_cast<uint8_t>(bits & 0xff), p[1] = static_cast<uint8_t>(bits >> 8);
}

__global__ void __launch_bounds__(kThreads)
    QuantDummyFillKernel(uint8_t* __restrict__ dst, DType dtype, int64_t matrix_rows, int64_t cols,
                         int64_t first_block, int64_t num_blocks, float high, uint64_t seed) {
  const int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  if (i >= num_blocks) return;
  const int64_t b = first_block + i;
  const BlockPlaces p = PlaceBlock(dst, dtype, matrix_rows, cols, b);
  auto fill = [&](uint8_t* out, int bytes) {  // 4-byte aligned runs of random bytes
    for (int j = 0; j < bytes; j += 4) {
      *reinterpret_cast<uint32_t*>(out + j) = HashWord(seed, static_cast<uint64_t>(b) * 64 + j / 4);
    }
  };
  if (dtype == DType::kQ8_0) {
    fill(p.quants, 32);
    StoreHalf(p.d, high / 127.0f);
  } else if (dtype == DType::kQ4_0) {
    fill(p.quants, 16);
    StoreHalf(p.d, high / 8.0f);
  } else if (dtype == DType::kQ4_K) {
    // Every sub-block's scale and min 32 (the first four) or 15 (the last four) with min = 7.5
    // steps: values d * sc * (q - 7.5) within +-high.
    const float d = high / (32.0f * 7.5f);
    fill(p.quants + 16, 128);
    StoreHalf(p.quants, d);
    StoreHalf(p.quants + 2, d * 7.5f);
    for (int j = 0; j < 8; ++j) p.quants[4 + j] = 32;
    for (int j = 8; j < 12; ++j) p.quants[4 + j] = 0xFF;
  } else {  // Q6_K: scales 16, values d * 16 * (q - 32)
    fill(p.quants, 192);
    for (int j = 0; j < 16; ++j) p.scales[j] = 16;
    StoreHalf(p.d, high / (16.0f * 32.0f));
  }
}

// SetQuantSkinnyStreaming's setting.
std::atomic<bool> streaming_allowed{true};

}  // namespace

void SetQuantSkinnyStreaming(bool allowed) { streaming_allowed.store(allowed); }

bool QuantSkinnyStreams(DType w_dtype, int64_t m, int64_t k) {
  if (w_dtype != DType::kQ4_K || m != 1 || !QuantSkinnyRoundsX(w_dtype, m, k) ||
      !streaming_allowed.load()) {
    return false;
  }
  return StreamSmemBytes<Q4kIntegerDecoder, 2>(static_cast<int>(k)) <=
         CurrentMaxSharedMemoryPerBlock();
}

cudaError_t Launch(const QuantSkinnyGemmParams& p, cudaStream_t stream) {
  if (!p.Validate().ok() || p.input_dtype != DType::kBF16) return cudaErrorInvalidValue;
  switch (p.w_dtype) {
    case DType::kQ8_0:
      return LaunchSkinnyOf<DType::kQ8_0>(p, stream);
    case DType::kQ4_0:
      return LaunchSkinnyOf<DType::kQ4_0>(p, stream);
    case DType::kQ4_K:
      return LaunchSkinnyOf<DType::kQ4_K>(p, stream);
    case DType::kQ6_K:
      return LaunchSkinnyOf<DType::kQ6_K>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t Launch(const QuantDequantizeParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  const auto* w = static_cast<const uint8_t*>(p.w);
  auto* dst = static_cast<__nv_bfloat16*>(p.dst);
  auto launch = [&](auto kernel, int unit_elements) {
    const int64_t threads = p.rows * (p.cols / unit_elements);
    return LaunchKernel(kernel, static_cast<unsigned>(CeilDiv(threads, kThreads)), kThreads, 0,
                        stream, w, dst, p.rows, p.cols);
  };
  switch (p.dtype) {
    case DType::kQ8_0:
      return launch(QuantDequantizeKernel<DType::kQ8_0>, 32);
    case DType::kQ4_0:
      return launch(QuantDequantizeKernel<DType::kQ4_0>, 32);
    case DType::kQ4_K:
      return launch(QuantDequantizeKernel<DType::kQ4_K>, 32);
    case DType::kQ6_K:
      return launch(QuantDequantizeKernel<DType::kQ6_K>, 64);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t Launch(const QuantRepackParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const BlockLayout layout = GetBlockLayout(p.dtype);
  const int64_t per_row = p.cols / layout.elements_per_block;
  const int64_t blocks = p.rows * per_row;
  QuantRepackKernel<<<static_cast<unsigned>(CeilDiv(blocks, kThreads)), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(p.src), static_cast<uint8_t*>(p.dst), p.dtype, p.matrix_rows,
      p.cols, p.first_row * per_row, blocks, static_cast<int>(layout.bytes_per_block));
  return cudaGetLastError();
}

cudaError_t Launch(const QuantDummyFillParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const int64_t per_row = p.cols / GetBlockLayout(p.dtype).elements_per_block;
  const int64_t blocks = p.rows * per_row;
  QuantDummyFillKernel<<<static_cast<unsigned>(CeilDiv(blocks, kThreads)), kThreads, 0, stream>>>(
      static_cast<uint8_t*>(p.dst), p.dtype, p.matrix_rows, p.cols, p.first_row * per_row, blocks,
      p.high, p.seed);
  return cudaGetLastError();
}

}  // namespace lmserve::kernels::cuda
