// The FP8 (E4M3) KV cache's element conversions, shared by the cache write (qkv_postprocess.cu)
// and the attention kernels that read it (decode_attention.cu, prefill_attention.cu); and the
// per-token quantization of an FP8 GEMM's input (F8QuantizeRows in fp8.cu, and the norm and the
// gated activation that quantize their own rows), at the end.
//
// A cache holding E4M3 stores q = E4M3(x * (1 / scale)) (round to nearest even, saturating at
// +-448, as kernels/cpu/fp8.h's F32ToF8E4M3), one scale per layer for the keys and one for the
// values (DecodeAttentionParams::k_scale, v_scale). Readers widen q exactly to the 16-bit type of
// their tensor-core operands and apply the scales outside the products: the keys' in the score
// scale, the values' to the output.
//
// F8x4Widen moves bits and multiplies once, without conversion instructions (four of them a pair
// to reach bf16: cvt e4m3x2 -> f16x2 -> f32 -> bf16x2); prefill attention's tiles take it. Decode
// attention widens in registers to fp16 and takes one instruction a pair where the device has it
// (decode_attention.cu's F8x4ToF16). The byte seeeemmm placed in a bf16 as s 0000eeee mmm0000
// (an fp16: s 0eeee mmm0000000) reads as q * 2^-120 (q * 2^-8), E4M3's subnormals landing on
// subnormals of the same scaled value; one multiply by 2^120 (2^8), exact, gives q. E4M3's NaN
// (0x7f, 0xff) widens to +-480, finite: caches hold no NaN (the write saturates).

#ifndef LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_
#define LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/fp8.h"

namespace lmserve::kernels::cuda {

// The two E4M3 values in the high bytes of `pair`'s halves (its low bytes ignored) as a pair of T
// holding the values times 2^-8 (fp16) or 2^-120 (bf16), exactly (the placement at the top of
// this file): a shift and two logic operations.
template <typename T>
__device__ __forceinline__ uint32_t F8PairScaledBits(uint32_t pair) {
  constexpr int kShift = std::is_same_v<T, __half> ? 1 : 4;
  constexpr uint32_t kMagnitude = 0x7f007f00u >> kShift, kSign = 0x80008000u;
  return ((pair >> kShift) & kMagnitude) | (pair & kSign);
}

// Bytes 0..3 of `word` (four E4M3 values, element 0 in the lowest byte) as two pairs of T
// (element 0 in the low half of `lo`), exactly: a byte permute, a shift, a logic op and a multiply
// a pair.
template <typename T>
__device__ __forceinline__ void F8x4Widen(uint32_t word, uint32_t& lo, uint32_t& hi) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  // 2^8 as fp16 (0x5c00) or 2^120 as bf16 (0x7b80), twice.
  constexpr uint32_t kFactor = kHalf ? 0x5c005c00u : 0x7b807b80u;
  // Bytes 0, 1 (then 2, 3) as the halves' high bytes.
  const uint32_t a_bits = F8PairScaledBits<T>(__byte_perm(word, 0u, 0x1404u));
  const uint32_t b_bits = F8PairScaledBits<T>(__byte_perm(word, 0u, 0x3424u));
  if constexpr (kHalf) {
    const __half2 factor = *reinterpret_cast<const __half2*>(&kFactor);
    const __half2 lo2 = __hmul2(*reinterpret_cast<const __half2*>(&a_bits), factor);
    const __half2 hi2 = __hmul2(*reinterpret_cast<const __half2*>(&b_bits), factor);
    lo = *reinterpret_cast<const uint32_t*>(&lo2);
    hi = *reinterpret_cast<const uint32_t*>(&hi2);
  } else {
    const __nv_bfloat162 factor = *reinterpret_cast<const __nv_bfloat162*>(&kFactor);
    const __nv_bfloat162 lo2 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a_bits), factor);
    const __nv_bfloat162 hi2 = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&b_bits), factor);
    lo = *reinterpret_cast<const uint32_t*>(&lo2);
    hi = *reinterpret_cast<const uint32_t*>(&hi2);
  }
}

// 16 E4M3 values (16 bytes) as 16 values of T in two 16-byte vectors, exactly.
template <typename T>
__device__ __forceinline__ void F8x16Widen(const uint4& in, uint4& out0, uint4& out1) {
  F8x4Widen<T>(in.x, out0.x, out0.y);
  F8x4Widen<T>(in.y, out0.z, out0.w);
  F8x4Widen<T>(in.z, out1.x, out1.y);
  F8x4Widen<T>(in.w, out1.z, out1.w);
}

// Four fp32 values, each times `inv_scale`, as four E4M3 bytes (element 0 lowest), rounded to
// nearest even and saturated at +-448.
__device__ __forceinline__ uint32_t F8x4Quantize(const float* x, float inv_scale) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x[0] * inv_scale, x[1] * inv_scale),
                                               __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x[2] * inv_scale, x[3] * inv_scale),
                                               __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// Eight fp32 values, each times `multiplier`, as eight E4M3 bytes (F8x4Quantize twice).
__device__ __forceinline__ uint2 F8x8Quantize(const float (&x)[8], float multiplier) {
  return make_uint2(F8x4Quantize(x, multiplier), F8x4Quantize(x + 4, multiplier));
}

// The per-token quantization of activations (F8QuantizeRows, fp8.h; the CPU's arithmetic in
// kernels/cpu/fp8.h), once a row's block knows the row's largest magnitude `amax` (the same in
// every thread): thread 0 writes the row's scale to *scale, and the row is stored as
// F8x8Quantize(x, the multiplier returned); one IEEE division each.
__device__ __forceinline__ float F8RowMultiplier(float amax, float* scale) {
  if (threadIdx.x == 0) *scale = amax > 0.0f ? __fdiv_rn(amax, kF8E4M3Max) : 1.0f;
  return amax > 0.0f ? __fdiv_rn(kF8E4M3Max, amax) : 0.0f;
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_
