// Conversions between fp32 and the 16-bit float formats, bit-exact with IEEE 754 binary16 and with
// bfloat16 as PyTorch rounds it (round to nearest even; NaN stays NaN).

#ifndef LMSERVE_KERNELS_CPU_HALF_H_
#define LMSERVE_KERNELS_CPU_HALF_H_

#include <bit>
#include <cstdint>
#include <cstring>

namespace lmserve::kernels {

inline float Bf16ToF32(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

inline uint16_t F32ToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 + 1 - shift) << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t F32ToF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs_bits < 0x38800000u) {  // subnormal or zero in fp16
    if (abs_bits < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exponent = abs_bits >> 23;                 // <= 112 here
    const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;  // with the implicit bit
    const uint32_t shift = 126 - exponent;                     // 14..24: to units of 2^-24
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = mantissa >> shift;
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;  // nearest even
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_HALF_H_
