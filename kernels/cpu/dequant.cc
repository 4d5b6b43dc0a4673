// Dequantization of the GGUF block formats, transcribed from llama.cpp's ggml-quants.c
// (dequantize_row_* and quantize_row_q8_0_ref). The arithmetic is kept in the reference's order,
// (d * scale) * q - dmin * min in fp32, so results are bit-identical with llama.cpp's scalar path.
// Blocks are read with memcpy: `src` needs no alignment.

#include "kernels/cpu/dequant.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"

namespace lmserve::kernels {
namespace {

constexpr int kQK = 32;    // elements of a Q8_0 / Q4_0 / Q4_1 block
constexpr int kQKK = 256;  // elements of a K-quant super-block

// Byte offsets inside the blocks (ggml's block_* structs, packed, little-endian).
struct BlockQ8_0 {
  static constexpr int kD = 0, kQs = 2, kBytes = 34;
};
struct BlockQ4_0 {
  static constexpr int kD = 0, kQs = 2, kBytes = 18;
};
struct BlockQ4_1 {
  static constexpr int kD = 0, kM = 2, kQs = 4, kBytes = 20;
};
struct BlockQ4K {
  static constexpr int kD = 0, kDmin = 2, kScales = 4, kQs = 16, kBytes = 144;
};
struct BlockQ5K {
  static constexpr int kD = 0, kDmin = 2, kScales = 4, kQh = 16, kQs = 48, kBytes = 176;
};
struct BlockQ6K {
  static constexpr int kQl = 0, kQh = 128, kScales = 192, kD = 208, kBytes = 210;
};

float LoadHalf(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block: sub-blocks 0..3 use
// the low 6 bits of bytes j and j + 4; sub-blocks 4..7 take their low 4 bits from byte j + 4 and
// their high 2 bits from the top bits of bytes j - 4 (scale) and j (min).
void GetScaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

void DequantizeQ8_0(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ8_0::kBytes, y += kQK) {
    const float d = LoadHalf(x + BlockQ8_0::kD);
    for (int j = 0; j < kQK; ++j) {
      y[j] = static_cast<int8_t>(x[BlockQ8_0::kQs + j]) * d;
    }
  }
}

void DequantizeQ4_0(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ4_0::kBytes, y += kQK) {
    const float d = LoadHalf(x + BlockQ4_0::kD);
    const uint8_t* qs = x + BlockQ4_0::kQs;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

void DequantizeQ4_1(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ4_1::kBytes, y += kQK) {
    const float d = LoadHalf(x + BlockQ4_1::kD);
    const float m = LoadHalf(x + BlockQ4_1::kM);
    const uint8_t* qs = x + BlockQ4_1::kQs;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = qs[j] & 0x0F;
      const int x1 = qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

void DequantizeQ4K(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ4K::kBytes) {
    const float d = LoadHalf(x + BlockQ4K::kD);
    const float min = LoadHalf(x + BlockQ4K::kDmin);
    const uint8_t* scales = x + BlockQ4K::kScales;
    const uint8_t* q = x + BlockQ4K::kQs;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQKK; j += 64) {
      GetScaleMinK4(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      GetScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void DequantizeQ5K(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ5K::kBytes) {
    const float d = LoadHalf(x + BlockQ5K::kD);
    const float min = LoadHalf(x + BlockQ5K::kDmin);
    const uint8_t* scales = x + BlockQ5K::kScales;
    const uint8_t* ql = x + BlockQ5K::kQs;
    const uint8_t* qh = x + BlockQ5K::kQh;
    int is = 0;
    uint8_t sc, m;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQKK; j += 64) {
      GetScaleMinK4(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      GetScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DequantizeQ6K(const uint8_t* x, float* y, int64_t num_blocks) {
  for (int64_t i = 0; i < num_blocks; ++i, x += BlockQ6K::kBytes) {
    const float d = LoadHalf(x + BlockQ6K::kD);
    const uint8_t* ql = x + BlockQ6K::kQl;
    const uint8_t* qh = x + BlockQ6K::kQh;
    const auto* sc = reinterpret_cast<const int8_t*>(x + BlockQ6K::kScales);
    for (int n = 0; n < kQKK; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

[[noreturn]] void DieNotMultiple(DType dtype, int64_t num_elements, int64_t block) {
  std::fprintf(stderr, "DequantizeToF32: %lld elements of %.*s is not a multiple of %lld\n",
               static_cast<long long>(num_elements), static_cast<int>(DTypeName(dtype).size()),
               DTypeName(dtype).data(), static_cast<long long>(block));
  std::abort();
}

}  // namespace

void DequantizeToF32(DType dtype, const void* src, float* dst, int64_t num_elements) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const int64_t block = GetBlockLayout(dtype).elements_per_block;
  if (num_elements % block != 0) DieNotMultiple(dtype, num_elements, block);
  const int64_t num_blocks = num_elements / block;
  switch (dtype) {
    case DType::kF32:
      if (num_elements > 0) std::memcpy(dst, src, static_cast<size_t>(num_elements) * 4);
      return;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < num_elements; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        dst[i] = dtype == DType::kF16 ? F16ToF32(bits) : Bf16ToF32(bits);
      }
      return;
    case DType::kQ8_0:
      return DequantizeQ8_0(bytes, dst, num_blocks);
    case DType::kQ4_0:
      return DequantizeQ4_0(bytes, dst, num_blocks);
    case DType::kQ4_1:
      return DequantizeQ4_1(bytes, dst, num_blocks);
    case DType::kQ4_K:
      return DequantizeQ4K(bytes, dst, num_blocks);
    case DType::kQ5_K:
      return DequantizeQ5K(bytes, dst, num_blocks);
    case DType::kQ6_K:
      return DequantizeQ6K(bytes, dst, num_blocks);
    case DType::kF8E4M3:  // the unscaled values (fp8.h applies the scales)
      for (int64_t i = 0; i < num_elements; ++i) dst[i] = F8E4M3ToF32(bytes[i]);
      return;
  }
  std::fprintf(stderr, "DequantizeToF32: unknown dtype %d\n", static_cast<int>(dtype));
  std::abort();
}

void QuantizeQ8_0(const float* src, void* dst, int64_t num_elements) {
  if (num_elements % kQK != 0) DieNotMultiple(DType::kQ8_0, num_elements, kQK);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < num_elements / kQK; ++i, src += kQK, out += BlockQ8_0::kBytes) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float v = std::fabs(src[j]);
      amax = amax > v ? amax : v;  // ggml's MAX(amax, v), NaN handling included
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d_bits = F32ToF16(d);
    std::memcpy(out + BlockQ8_0::kD, &d_bits, 2);
    for (int j = 0; j < kQK; ++j) {
      // roundf, as the reference. Finite inputs give |x0| <= 127; the reference converts a NaN or
      // infinite x0 with undefined behaviour, here it becomes 0 or saturates.
      const float x0 = std::round(src[j] * id);
      const float clamped = std::isnan(x0) ? 0.0f : std::fmin(std::fmax(x0, -128.0f), 127.0f);
      out[BlockQ8_0::kQs + j] = static_cast<uint8_t>(static_cast<int8_t>(clamped));
    }
  }
}

void QuantizeQ4_0(const float* src, void* dst, int64_t num_elements) {
  if (num_elements % kQK != 0) DieNotMultiple(DType::kQ4_0, num_elements, kQK);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < num_elements / kQK; ++i, src += kQK, out += BlockQ4_0::kBytes) {
    float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(src[j])) amax = std::fabs(src[j]), max = src[j];
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d_bits = F32ToF16(d);
    std::memcpy(out + BlockQ4_0::kD, &d_bits, 2);
    for (int j = 0; j < kQK / 2; ++j) {
      const auto q0 = static_cast<uint8_t>(std::fmin(15.0f, std::fmax(0.0f, src[j] * id + 8.5f)));
      const auto q1 =
          static_cast<uint8_t>(std::fmin(15.0f, std::fmax(0.0f, src[j + kQK / 2] * id + 8.5f)));
      out[BlockQ4_0::kQs + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

namespace {

// Rounds v / step to an integer in [lo, hi] (0 where step is 0).
int RoundTo(float v, float step, int lo, int hi) {
  if (!(step != 0.0f)) return 0;
  const float q = std::nearbyint(v / step);
  return static_cast<int>(std::fmin(std::fmax(q, static_cast<float>(lo)), static_cast<float>(hi)));
}

}  // namespace

void QuantizeQ4_K(const float* src, void* dst, int64_t num_elements) {
  if (num_elements % kQKK != 0) DieNotMultiple(DType::kQ4_K, num_elements, kQKK);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < num_elements / kQKK; ++i, src += kQKK, out += BlockQ4K::kBytes) {
    // Each sub-block of 32: x ~ scale * q - min, q in [0, 15], min >= 0 (the range includes 0).
    float scales[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
      float lo = 0.0f, hi = 0.0f;
      for (int l = 0; l < 32; ++l)
        lo = std::fmin(lo, src[32 * j + l]), hi = std::fmax(hi, src[32 * j + l]);
      scales[j] = (hi - lo) / 15.0f;
      mins[j] = -lo;
      max_scale = std::fmax(max_scale, scales[j]);
      max_min = std::fmax(max_min, mins[j]);
    }
    const float d = F16ToF32(F32ToF16(max_scale / 63.0f));
    const float dmin = F16ToF32(F32ToF16(max_min / 63.0f));
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(RoundTo(scales[j], d, 0, 63));
      lm[j] = static_cast<uint8_t>(RoundTo(mins[j], dmin, 0, 63));
    }
    const uint16_t d_bits = F32ToF16(d), dmin_bits = F32ToF16(dmin);
    std::memcpy(out + BlockQ4K::kD, &d_bits, 2);
    std::memcpy(out + BlockQ4K::kDmin, &dmin_bits, 2);
    uint8_t* sc = out + BlockQ4K::kScales;
    for (int j = 0; j < 4; ++j) sc[j] = ls[j], sc[j + 4] = lm[j];
    for (int j = 4; j < 8; ++j) {
      sc[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      sc[j - 4] = static_cast<uint8_t>(sc[j - 4] | ((ls[j] >> 4) << 6));
      sc[j] = static_cast<uint8_t>(sc[j] | ((lm[j] >> 4) << 6));
    }
    uint8_t q[kQKK];
    for (int j = 0; j < 8; ++j) {
      const float step = d * static_cast<float>(ls[j]), offset = dmin * static_cast<float>(lm[j]);
      for (int l = 0; l < 32; ++l) {
        q[32 * j + l] = static_cast<uint8_t>(RoundTo(src[32 * j + l] + offset, step, 0, 15));
      }
    }
    uint8_t* qs = out + BlockQ4K::kQs;
    for (int p = 0; p < 4; ++p) {
      for (int l = 0; l < 32; ++l) {
        qs[32 * p + l] = static_cast<uint8_t>(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
      }
    }
  }
}

void QuantizeQ6_K(const float* src, void* dst, int64_t num_elements) {
  if (num_elements % kQKK != 0) DieNotMultiple(DType::kQ6_K, num_elements, kQKK);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < num_elements / kQKK; ++i, src += kQKK, out += BlockQ6K::kBytes) {
    // Each sub-block of 16: x ~ d * scale * q, q in [-32, 31], scale an int8.
    float scales[16], max_scale = 0.0f;
    for (int s = 0; s < 16; ++s) {
      float amax = 0.0f;
      for (int l = 0; l < 16; ++l) amax = std::fmax(amax, std::fabs(src[16 * s + l]));
      scales[s] = amax / 31.0f;
      max_scale = std::fmax(max_scale, scales[s]);
    }
    const float d = F16ToF32(F32ToF16(max_scale / 127.0f));
    auto* sc = reinterpret_cast<int8_t*>(out + BlockQ6K::kScales);
    uint8_t q[kQKK];
    for (int s = 0; s < 16; ++s) {
      sc[s] = static_cast<int8_t>(RoundTo(scales[s], d, -128, 127));
      const float step = d * static_cast<float>(sc[s]);
      for (int l = 0; l < 16; ++l) {
        q[16 * s + l] = static_cast<uint8_t>(RoundTo(src[16 * s + l], step, -32, 31) + 32);
      }
    }
    const uint16_t d_bits = F32ToF16(d);
    std::memcpy(out + BlockQ6K::kD, &d_bits, 2);
    uint8_t* ql = out + BlockQ6K::kQl;
    uint8_t* qh = out + BlockQ6K::kQh;
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = q[128 * n + l], q2 = q[128 * n + l + 32], q3 = q[128 * n + l + 64],
                  q4 = q[128 * n + l + 96];
        ql[64 * n + l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[64 * n + l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[32 * n + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                              ((q4 >> 4) << 6));
      }
    }
  }
}

void QuantizeBlocks(DType dtype, const float* src, void* dst, int64_t num_elements) {
  switch (dtype) {
    case DType::kQ8_0:
      return QuantizeQ8_0(src, dst, num_elements);
    case DType::kQ4_0:
      return QuantizeQ4_0(src, dst, num_elements);
    case DType::kQ4_K:
      return QuantizeQ4_K(src, dst, num_elements);
    case DType::kQ6_K:
      return QuantizeQ6_K(src, dst, num_elements);
    default:
      std::fprintf(stderr, "QuantizeBlocks: %s is not a type it writes\n",
                   std::string(DTypeName(dtype)).c_str());
      std::abort();
  }
}

}  // namespace lmserve::kernels
