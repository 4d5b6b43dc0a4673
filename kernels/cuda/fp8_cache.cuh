// The FP8 (E4M3) KV cache's element conversions, shared by the cache write (qkv_postprocess.cu)
// and the attention kernels that read it (decode_attention.cu, prefill_attention.cu).
//
// A cache holding E4M3 stores q = E4M3(x * (1 / scale)) (round to nearest even, saturating at
// +-448, as kernels/cpu/fp8.h's F32ToF8E4M3), one scale per layer for the keys and one for the
// values (DecodeAttentionParams::k_scale, v_scale). Readers widen q exactly to the 16-bit type of
// their tensor-core operands (cvt.rn.f16x2.e4m3x2 on compute capability 8.9+, then through fp32
// for bf16: E4M3's values, subnormals included, are all bf16 and fp16 values) and apply the
// scales outside the products: the keys' in the score scale, the values' to the output.
// (Placing an E4M3 byte's bits in a bf16 directly reads as q * 2^-120, and fp32 sums of such
// values times softmax weights fall below fp32's normal range, where the tensor cores may flush
// them: not done.)

#ifndef LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_
#define LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace lmserve::kernels::cuda {

// Bytes 0..3 of `word` (four E4M3 values, element 0 in the lowest byte) as two pairs of T
// (element 0 in the low half of `lo`), exactly.
template <typename T>
__device__ __forceinline__ void F8x4Widen(uint32_t word, uint32_t& lo, uint32_t& hi) {
  const __half2_raw h_lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word & 0xffffu), __NV_E4M3);
  const __half2_raw h_hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(word >> 16), __NV_E4M3);
  if constexpr (std::is_same_v<T, __half>) {
    lo = static_cast<uint32_t>(h_lo.x) | (static_cast<uint32_t>(h_lo.y) << 16);
    hi = static_cast<uint32_t>(h_hi.x) | (static_cast<uint32_t>(h_hi.y) << 16);
  } else {
    const __nv_bfloat162 b_lo = __float22bfloat162_rn(__half22float2(__half2(h_lo)));
    const __nv_bfloat162 b_hi = __float22bfloat162_rn(__half22float2(__half2(h_hi)));
    lo = *reinterpret_cast<const uint32_t*>(&b_lo);
    hi = *reinterpret_cast<const uint32_t*>(&b_hi);
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

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_FP8_CACHE_CUH_
