#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
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

// ---- F8SkinnyGemm of 2 to 8 tokens on the tensor cores: mma.sync m16n8k16 in fp16 with fp32
// accumulators, 16 rows of W a block as the A operand (E4M3 pairs widened by one cvt each,
// exactly: every E4M3 value is an fp16 one) and the tokens as B's 8 columns. A weight costs a
// cvt for two and a share of an mma whatever the token count, where the kernel above spends a
// multiply-add a weight and token on the CUDA cores. (At one token that kernel is faster: its
// rows stream at the copy rate, and this one's block barriers and shorter runs of each row cost
// more than its instructions save; bench/results section 40.)
//
// A block: 8 warps over 16 rows of W (kSiluAndMul: 8 gate rows and the same 8 up rows, so that a
// thread holds both halves of its outputs), k in chunks of 64 columns; a round of the block takes
// kMmaUnroll chunks a warp, the warps side by side (one run of each row), and the warps' sums are
// added through shared memory at the end. Lane (g, t) = (lane / 4, lane % 4) loads 16 bytes of
// rows g and g + 8 at column 64c + 16t: for the chunk's mma j, bytes 4j .. 4j + 3 of them are
// the k indices {2t, 2t + 1, 2t + 8, 2t + 9} of the A fragment, and the B fragment takes x at
// the same columns, so the sum runs over k in another order. Each chunk's loads for the next
// round are issued as soon as its products are made. x goes to shared memory once a block, in
// fp16 with a power of two a (token, chunk) that puts the chunk's largest magnitude in
// [2^14, 2^15) (bf16 activations reach past fp16's 65,504); each chunk's products are scaled
// back as they are added into the fp32 accumulators.
constexpr int kMmaRows = 16;   // rows of W a block
constexpr int kMmaChunk = 64;  // columns of k a chunk
constexpr int kMmaUnroll = 4;  // chunks of W in flight a warp
// x's bytes a block at most: with the partial sums' 4 KB, under the 48 KB a block takes without
// asking. (64 KB, for down_proj's k of 14,336 at two tokens, made two-token steps 1.5% slower.)
constexpr int kMmaMaxSmem = 40 * 1024;

std::atomic<bool> f8_tensor_cores{true};

// The kernel's dynamic shared memory: x in fp16 ([m][chunks * 64]), then the chunks' scales
// ([m][chunks] fp32).
int64_t MmaSmemBytes(int64_t m, int64_t k) {
  const int64_t chunks = CeilDiv(k, int64_t{kMmaChunk});
  return m * chunks * kMmaChunk * 2 + m * chunks * 4;
}

// Two E4M3 bytes (the low one first) to an fp16 pair.
__device__ __forceinline__ uint32_t F8PairToHalf2(uint32_t pair) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

template <typename T, typename OutT, bool kSiluAndMul,
          GateActivation kActivation = GateActivation::kSilu>
__global__ void __launch_bounds__(kThreads, 3)
    F8MmaSkinnyKernel(const T* __restrict__ x, const uint8_t* __restrict__ w,
                      const float* __restrict__ w_scales, OutT* __restrict__ y, int m, int n, int k,
                      int64_t x_stride, int64_t y_stride, bool late_dependents) {
  extern __shared__ uint4 mma_smem[];
  __shared__ float partial[kWarps][32][4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int chunks = (k + kMmaChunk - 1) / kMmaChunk;
  // Rows g and g + 8 of the block's W (clamped: a row past the end reads a neighbour, unused).
  int row_lo, row_hi;
  if constexpr (kSiluAndMul) {
    const int out = min(static_cast<int>(blockIdx.x) * 8 + g, n / 2 - 1);
    row_lo = out, row_hi = n / 2 + out;
  } else {
    row_lo = min(static_cast<int>(blockIdx.x) * kMmaRows + g, n - 1);
    row_hi = min(static_cast<int>(blockIdx.x) * kMmaRows + g + 8, n - 1);
  }
  const uint8_t* w_lo = w + int64_t{row_lo} * k + 16 * t;
  const uint8_t* w_hi = w + int64_t{row_hi} * k + 16 * t;
  constexpr int kRound = kWarps * kMmaUnroll;  // chunks a round of the block
  uint4 wv[kMmaUnroll][2];
  // Chunk c into slot u (zeros past k).
  auto load_chunk = [&](int u, int c) {
    if (c < chunks && c * kMmaChunk + 16 * t < k) {
      wv[u][0] = LoadStream16(w_lo + c * kMmaChunk);
      wv[u][1] = LoadStream16(w_hi + c * kMmaChunk);
    } else {
      wv[u][0] = wv[u][1] = make_uint4(0, 0, 0, 0);
    }
  };
  const int first = warp * kMmaUnroll;
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) load_chunk(u, first + u);  // before the wait
  const float scale_lo = __ldg(w_scales + row_lo), scale_hi = __ldg(w_scales + row_hi);
  WaitForPriorKernels();
  if (!late_dependents) AllowDependentLaunch();
  // x into shared memory as fp16, a power of two a (token, chunk); four threads a chunk.
  const int kpad = chunks * kMmaChunk;
  __half* xs = reinterpret_cast<__half*>(mma_smem);
  float* chunk_scales = reinterpret_cast<float*>(xs + int64_t{m} * kpad);
  const int pieces = m * chunks * 4;  // a multiple of 4: a chunk's four threads share a warp
  for (int base = 0; base < pieces; base += kThreads) {
    const int i = base + threadIdx.x;
    const bool valid = i < pieces;
    const int token = valid ? i / (chunks * 4) : 0, col = (valid ? i % (chunks * 4) : 0) * 16;
    float v[16];
    float amax = 0.0f;
    if (valid && col < k) {
      const uint4* p = reinterpret_cast<const uint4*>(x + token * x_stride + col);
      Unpack8<T>(__ldg(p), *reinterpret_cast<float(*)[8]>(v));
      Unpack8<T>(__ldg(p + 1), *reinterpret_cast<float(*)[8]>(v + 8));
#pragma unroll
      for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(v[e]));
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = 0.0f;
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int exponent = 0;  // amax = f * 2^exponent, f in [0.5, 1)
    if (amax > 0.0f) frexpf(amax, &exponent);
    const int shift = min(15 - exponent, 100);
    const float up = ldexpf(1.0f, shift);
    if (valid) {
      uint4 packed[2];
      uint32_t* words = reinterpret_cast<uint32_t*>(packed);
#pragma unroll
      for (int e = 0; e < 8; ++e) words[e] = Pack2<__half>(v[2 * e] * up, v[2 * e + 1] * up);
      uint4* dst = reinterpret_cast<uint4*>(xs + int64_t{token} * kpad + col);
      dst[0] = packed[0];
      dst[1] = packed[1];
      if (i % 4 == 0) chunk_scales[token * chunks + col / kMmaChunk] = ldexpf(1.0f, -shift);
    }
  }
  __syncthreads();
  // The products. Columns 2t and 2t + 1 of the mma are tokens: past m their x is 0, and their
  // scales (those of the last token) unused.
  const bool has_token = g < m;
  const __half* x_row = xs + int64_t{min(g, m - 1)} * kpad + 16 * t;
  const float* scales0 = chunk_scales + min(2 * t, m - 1) * chunks;
  const float* scales1 = chunk_scales + min(2 * t + 1, m - 1) * chunks;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c0 = first; c0 < chunks; c0 += kRound) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int c = c0 + u;
      if (c >= chunks) break;
      const uint2* xp = reinterpret_cast<const uint2*>(x_row + c * kMmaChunk);
      const uint32_t* lo = reinterpret_cast<const uint32_t*>(&wv[u][0]);
      const uint32_t* hi = reinterpret_cast<const uint32_t*>(&wv[u][1]);
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint2 xb = has_token ? xp[j] : make_uint2(0, 0);
        const uint32_t a[4] = {F8PairToHalf2(lo[j] & 0xffffu), F8PairToHalf2(hi[j] & 0xffffu),
                               F8PairToHalf2(lo[j] >> 16), F8PairToHalf2(hi[j] >> 16)};
        Mma16816<__half>(part, a, xb.x, xb.y);
      }
      const float s0 = scales0[c], s1 = scales1[c];
      acc[0] = fmaf(part[0], s0, acc[0]);
      acc[1] = fmaf(part[1], s1, acc[1]);
      acc[2] = fmaf(part[2], s0, acc[2]);
      acc[3] = fmaf(part[3], s1, acc[3]);
      if (c + kRound < chunks) load_chunk(u, c + kRound);  // the slot's next round
    }
  }
  if (late_dependents) AllowDependentLaunch();
#pragma unroll
  for (int e = 0; e < 4; ++e) partial[warp][lane][e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) sum += partial[i][lane][e];
    acc[e] = sum;
  }
  // acc: rows g (0, 1) and g + 8 (2, 3), tokens 2t and 2t + 1.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int token = 2 * t + e;
    if (token >= m) continue;
    OutT* out = y + token * y_stride;
    if constexpr (kSiluAndMul) {
      const int col = static_cast<int>(blockIdx.x) * 8 + g;
      if (col < n / 2) {
        const float gate = ToFloat(FromFloat<T>(acc[e] * scale_lo));
        const float up = ToFloat(FromFloat<T>(acc[2 + e] * scale_hi));
        Store(out + col, GateActivationOf<kActivation, true>(gate) * up);
      }
    } else {
      const int row = static_cast<int>(blockIdx.x) * kMmaRows + g;
      if (row < n) Store(out + row, acc[e] * scale_lo);
      if (row + 8 < n) Store(out + row + 8, acc[2 + e] * scale_hi);
    }
  }
}

// Whether a launch takes the tensor-core kernel: 2 to 8 tokens, no fold or settle (one token's),
// x's fp16 copy within kMmaMaxSmem, and SetF8SkinnyTensorCores's setting.
bool TakesTensorCores(const F8SkinnyGemmParams& p) {
  return f8_tensor_cores.load(std::memory_order_relaxed) && p.m >= 2 &&
         p.add_norm_residual == nullptr && p.settle_residual == nullptr &&
         MmaSmemBytes(p.m, p.k) <= kMmaMaxSmem;
}

template <typename T, typename OutT, bool kSiluAndMul, GateActivation kActivation>
cudaError_t LaunchMmaSkinny(const F8SkinnyGemmParams& p, int64_t x_stride, int64_t y_stride,
                            cudaStream_t stream) {
  const int64_t rows = kSiluAndMul ? p.n / 2 : p.n;
  const unsigned blocks = static_cast<unsigned>(CeilDiv(rows, int64_t{kSiluAndMul ? 8 : kMmaRows}));
  const auto kernel = F8MmaSkinnyKernel<T, OutT, kSiluAndMul, kActivation>;
  return LaunchKernel(kernel, blocks, kThreads, static_cast<size_t>(MmaSmemBytes(p.m, p.k)), stream,
                      static_cast<const T*>(p.x), static_cast<const uint8_t*>(p.w), p.w_scales,
                      static_cast<OutT*>(p.y), static_cast<int>(p.m), static_cast<int>(p.n),
                      static_cast<int>(p.k), x_stride, y_stride, p.late_dependents);
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
  if (TakesTensorCores(p)) {
    return LaunchMmaSkinny<T, OutT, kSiluAndMul, kActivation>(p, x_stride, y_stride, stream);
  }
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

void SetF8SkinnyTensorCores(bool allowed) {
  f8_tensor_cores.store(allowed, std::memory_order_relaxed);
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
