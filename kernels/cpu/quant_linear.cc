#include "kernels/cpu/quant_linear.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as the merge operand of their unmasked
// forms, which -W(maybe-)uninitialized reports once they are inlined here: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/parallel.h"

namespace lmserve::kernels {
namespace {

constexpr int64_t kBlock = 32;   // elements per input block and per weight block (or sub-block)
constexpr int64_t kRowTile = 4;  // weight rows a thread's share is a multiple of
// Weight rows unpacked together, then run against every token: more for a prompt's many tokens
// (the input rows are read once per tile; on the demo model 16 gave 1.06x the prefill speed of 4).
constexpr int64_t kMaxRowTile = 16;
int64_t RowTile(int64_t num_tokens) { return num_tokens >= 8 ? kMaxRowTile : kRowTile; }
// Weight rows converted to fp32 together for one sgemm (gemm_min_tokens).
constexpr int64_t kGemmRows = 64;

// What a weight type unpacks to: unsigned 8-bit values w, whose true value is
// ws * (w - offset) (+ wm), with offset = 1 << shift (no offset when shift < 0).
struct Format {
  int shift = -1;
  bool has_min = false;
  bool wide = false;  // w reaches 255 (AVX2's 8-bit multiply-add would saturate)
};

Format FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0:
      return {.shift = 7, .wide = true};
    case DType::kQ4_0:
      return {.shift = 3};
    case DType::kQ6_K:
      return {.shift = 5};
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
      return {.has_min = true};
    default:
      return {};
  }
}

bool IsHalf(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }

// ---------------------------------------------------------------------------------------------
// Unpacking a weight row: `k` elements into w[k], ws[2 per block of 32] (the scale of elements
// 0..15 and of 16..31), wm[1 per block] for types with a min. Shared by every path (compiled into
// each with its instruction set), exact: integer moves, the same fp32 products as dequant.cc.

#define LMSERVE_INLINE inline __attribute__((always_inline))

// fp16 to fp32 without branches (half.h's F16ToF32, exactly): subnormals through an exact
// int-to-float conversion, infinities and NaNs by their bits.
LMSERVE_INLINE float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t special = (em << 13) | 0x7f800000u;
  const uint32_t subnormal = std::bit_cast<uint32_t>(static_cast<float>(em) * 0x1p-24f);
  const uint32_t bits = em < 0x400u ? subnormal : em >= 0x7c00u ? special : normal;
  return std::bit_cast<float>(bits | sign);
}

// The byte loops in 16-byte SSE2 steps (every x86-64 CPU has SSE2; the portable path uses them
// too, the results are the same bytes).
#if defined(__SSE2__)
LMSERVE_INLINE __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
LMSERVE_INLINE void Store16(uint8_t* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
LMSERVE_INLINE __m128i Low4(__m128i v) { return _mm_and_si128(v, _mm_set1_epi8(0x0F)); }
LMSERVE_INLINE __m128i High4(__m128i v) {
  return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
}
// (v >> shift) & 3, shifted to bits 4..5.
LMSERVE_INLINE __m128i TwoBits(__m128i v, int shift) {
  return _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm_set1_epi8(3)),
                        4);
}
// 16 where (v & bit) != 0, else 0.
LMSERVE_INLINE __m128i Bit16(__m128i v, int bit) {
  const __m128i b = _mm_set1_epi8(static_cast<char>(bit));
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, b), b), _mm_set1_epi8(16));
}
#endif

// 16 bytes of nibbles: the low ones to w[0..15], the high ones to w[16..31].
LMSERVE_INLINE void Nibbles32(const uint8_t* qs, uint8_t* w) {
#if defined(__SSE2__)
  const __m128i q = Load16(qs);
  Store16(w, Low4(q));
  Store16(w + 16, High4(q));
#else
  for (int j = 0; j < 16; ++j) {
    w[j] = qs[j] & 0x0F;
    w[j + 16] = qs[j] >> 4;
  }
#endif
}

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (dequant.cc's GetScaleMinK4).
LMSERVE_INLINE void ScaleMinK4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// 32 bytes of K-quant nibbles (ql) to w[0..31] (low) and w[32..63] (high), with a fifth bit from
// qh (Q5_K: bit u1 for the low, u2 for the high) when qh is not null.
LMSERVE_INLINE void NibblesK(const uint8_t* ql, const uint8_t* qh, int u1, int u2, uint8_t* w) {
#if defined(__SSE2__)
  for (int h = 0; h < 32; h += 16) {
    __m128i low = Low4(Load16(ql + h)), high = High4(Load16(ql + h));
    if (qh != nullptr) {
      const __m128i bits = Load16(qh + h);
      low = _mm_or_si128(low, Bit16(bits, u1));
      high = _mm_or_si128(high, Bit16(bits, u2));
    }
    Store16(w + h, low);
    Store16(w + 32 + h, high);
  }
#else
  for (int l = 0; l < 32; ++l) {
    w[l] = ql[l] & 0xF;
    w[l + 32] = ql[l] >> 4;
    if (qh != nullptr) {
      w[l] |= (qh[l] & u1) != 0 ? 16 : 0;
      w[l + 32] |= (qh[l] & u2) != 0 ? 16 : 0;
    }
  }
#endif
}

// One weight row unpacked: `k` values w (unsigned 8-bit), one scale ws per block of 32, a min wm
// per block (types with a min) and, for Q6_K, the integer scale of each lane (c, 8 per block).
// With kScales32 false, the scales (and mins) of Q8_0, Q4_0 and Q4_1 are left to the caller
// (ScalesF16c).
template <bool kScales32>
LMSERVE_INLINE void UnpackRow(DType dtype, const uint8_t* x, int64_t k, uint8_t* w, float* ws,
                              float* wm, int8_t* c) {
  switch (dtype) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < k / 32; ++b, x += 34, w += 32) {
        if (kScales32) ws[b] = Half(x);
#if defined(__SSE2__)
        const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
        Store16(w, _mm_xor_si128(Load16(x + 2), flip));
        Store16(w + 16, _mm_xor_si128(Load16(x + 18), flip));
#else
        for (int j = 0; j < 32; ++j) w[j] = x[2 + j] ^ 0x80;
#endif
      }
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < k / 32; ++b, x += 18, w += 32) {
        if (kScales32) ws[b] = Half(x);
        Nibbles32(x + 2, w);
      }
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < k / 32; ++b, x += 20, w += 32) {
        if (kScales32) {
          ws[b] = Half(x);
          wm[b] = Half(x + 2);
        }
        Nibbles32(x + 4, w);
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      for (int64_t s = 0; s < k / 256; ++s, x += five ? 176 : 144) {
        const float d = Half(x), dmin = Half(x + 2);
        const uint8_t* scales = x + 4;
        const uint8_t* ql = x + (five ? 48 : 16);
        for (int c = 0; c < 4; ++c, ql += 32) {  // 64 elements: sub-blocks 2c and 2c + 1
          for (int h = 0; h < 2; ++h) {
            int scale, min;
            ScaleMinK4(2 * c + h, scales, &scale, &min);
            const int64_t b = 8 * s + 2 * c + h;
            ws[b] = d * static_cast<float>(scale);
            wm[b] = -(dmin * static_cast<float>(min));
          }
          NibblesK(ql, five ? x + 16 : nullptr, 1 << (2 * c), 2 << (2 * c), w + 256 * s + 64 * c);
        }
      }
      return;
    }
    case DType::kQ6_K:
      for (int64_t s = 0; s < k / 256; ++s, x += 210) {
        const float d = Half(x + 208);
        const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
        for (int b = 0; b < 8; ++b) {
          ws[8 * s + b] = d;
          for (int l = 0; l < 8; ++l) c[64 * s + 8 * b + l] = sc[2 * b + l / 4];
        }
        for (int n = 0; n < 2; ++n) {
          const uint8_t* ql = x + 64 * n;
          const uint8_t* qh = x + 128 + 32 * n;
          uint8_t* out = w + 256 * s + 128 * n;
#if defined(__SSE2__)
          for (int h = 0; h < 32; h += 16) {
            const __m128i l0 = Load16(ql + h), l1 = Load16(ql + 32 + h), hb = Load16(qh + h);
            Store16(out + h, _mm_or_si128(Low4(l0), TwoBits(hb, 0)));
            Store16(out + 32 + h, _mm_or_si128(Low4(l1), TwoBits(hb, 2)));
            Store16(out + 64 + h, _mm_or_si128(High4(l0), TwoBits(hb, 4)));
            Store16(out + 96 + h, _mm_or_si128(High4(l1), TwoBits(hb, 6)));
          }
#else
          for (int l = 0; l < 32; ++l) {
            out[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
#endif
        }
      }
      return;
    default:
      return;
  }
}

LMSERVE_INLINE void UnpackHalfRow(DType dtype, const uint8_t* x, int64_t k, float* w) {
  const auto* bits = reinterpret_cast<const uint16_t*>(x);
  if (dtype == DType::kBF16) {
    for (int64_t e = 0; e < k; ++e) w[e] = Bf16ToF32(bits[e]);
  } else {
    for (int64_t e = 0; e < k; ++e) w[e] = F16ToF32(bits[e]);
  }
}

// An unpacked row (UnpackRow's output) in fp32: dequant.cc's values bit for bit (the same products
// and sums in the same order; this file is compiled without floating-point contraction).
LMSERVE_INLINE void RowToF32(DType dtype, const uint8_t* w, const float* ws, const float* wm,
                             const int8_t* c, int64_t k, float* out) {
  for (int64_t b = 0; b < k / 32; ++b, w += 32, out += 32) {
    const float d = ws[b];
    switch (dtype) {
      case DType::kQ8_0:
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(int32_t{w[e]} - 128) * d;
        break;
      case DType::kQ4_0:
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(int32_t{w[e]} - 8) * d;
        break;
      case DType::kQ6_K:
        for (int e = 0; e < 32; ++e) {
          out[e] = (d * static_cast<float>(c[8 * b + e / 4])) * static_cast<float>(int32_t{w[e]} - 32);
        }
        break;
      default: {  // Q4_1, Q4_K, Q5_K: scale * w + min
        const float m = wm[b];
        for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(w[e]) * d + m;
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The dot products, one per path: an unpacked weight row against one quantized input row.

struct Row {
  const uint8_t* w;
  const float* ws;  // [blocks, padded to 16 with zeros]
  const float* wm;  // [blocks, padded]; null without a min
  const int8_t* c;  // [blocks * 8]: Q6_K's lane scales; null for the other types
};
struct Input {
  const int8_t* q;
  const int8_t* q_low;  // the precise input's low part (q * 256 + q_low); null for one part
  const float* scale;    // [blocks, padded to 16 with zeros]
  const float* sum;      // [blocks, padded]: scale * (sum of the block's q)
  const int32_t* total;  // [blocks, padded]: the sum of the block's q
  const int32_t* lanes;  // [blocks * 8]: sums of four consecutive q
};

LMSERVE_INLINE float Reduce16(const float* a) {
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = a[l] + a[8 + l];
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

LMSERVE_INLINE float Finish(const float* s, const float* m) {
  return m != nullptr ? Reduce16(s) + Reduce16(m) : Reduce16(s);
}

float DotPortable(const Row& row, const Input& in, int64_t nb, Format f) {
  float s[16] = {}, m[16] = {};
  for (int64_t b = 0; b < nb; ++b) {
    int32_t block = 0;
    for (int l = 0; l < 8; ++l) {
      const int64_t e = 32 * b + 4 * l;
      int32_t p = 0;
      for (int i = 0; i < 4; ++i) {
        const int32_t a = in.q_low != nullptr ? in.q[e + i] * 256 + in.q_low[e + i] : in.q[e + i];
        p += int32_t{row.w[e + i]} * a;
      }
      if (row.c != nullptr) p = row.c[8 * b + l] * (p - in.lanes[8 * b + l] * (1 << f.shift));
      block += p;
    }
    if (row.c == nullptr && f.shift >= 0) block -= in.total[b] * (1 << f.shift);
    s[b % 16] = std::fma(static_cast<float>(block), row.ws[b] * in.scale[b], s[b % 16]);
    if (row.wm != nullptr) m[b % 16] = std::fma(row.wm[b], in.sum[b], m[b % 16]);
  }
  return Finish(s, row.wm != nullptr ? m : nullptr);
}

void DotTilePortable(const Row* rows, int64_t n, const Input& in, int64_t nb, Format f,
                     float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = DotPortable(rows[i], in, nb, f);
}

float DotHalfPortable(const float* w, const float* x, int64_t k) {
  float acc[16] = {};
  for (int64_t e = 0; e < k; ++e) acc[e % 16] = std::fma(w[e], x[e], acc[e % 16]);
  return Reduce16(acc);
}

#define LMSERVE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LMSERVE_AVX512 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// Reduce16 of lanes 0..7 in `low` and 8..15 in `high`, in registers: the same additions.
LMSERVE_AVX2 LMSERVE_INLINE float Reduce16Avx2(__m256 low, __m256 high) {
  const __m256 v = _mm256_add_ps(low, high);                         // v[l] = a[l] + a[8 + l]
  const __m256 w = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));     // w[2i] = v[2i] + v[2i + 1]
  const __m256 x = _mm256_add_ps(w, _mm256_permute_ps(w, 0x4E));     // x[0] = w[0] + w[2], x[4]
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
}

// The scales (and mins) of a Q8_0, Q4_0 or Q4_1 row through F16C, one instruction each.
LMSERVE_AVX2 void ScalesF16c(DType dtype, const uint8_t* x, int64_t nb, float* ws,
                                            float* wm) {
  const int64_t stride = GetBlockLayout(dtype).bytes_per_block;
  if (dtype == DType::kQ4_1) {
    for (int64_t b = 0; b < nb; ++b, x += stride) {
      uint16_t d, m;
      std::memcpy(&d, x, 2);
      std::memcpy(&m, x + 2, 2);
      ws[b] = _cvtsh_ss(d);
      wm[b] = _cvtsh_ss(m);
    }
  } else if (dtype == DType::kQ8_0 || dtype == DType::kQ4_0) {
    for (int64_t b = 0; b < nb; ++b, x += stride) {
      uint16_t d;
      std::memcpy(&d, x, 2);
      ws[b] = _cvtsh_ss(d);
    }
  }
}

// AVX2: eight blocks at a time, one per register, their lanes summed into one register of eight
// block sums.
// Sums of w * a over four consecutive bytes, eight lanes.
LMSERVE_AVX2 LMSERVE_INLINE __m256i LanesAvx2(__m256i w, __m256i a, bool wide) {
  if (!wide) {  // w <= 63: the 16-bit pair sums cannot saturate
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
  }
  // 16-bit products, pairs summed to 32 bits, then pairs of pairs (lanes reordered)
  const __m256i m0 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(w)),
                                       _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a)));
  const __m256i m1 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(w, 1)),
                                       _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1)));
  return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(m0, m1),
                                     _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

LMSERVE_AVX2 LMSERVE_INLINE __m256i BlockLanesAvx2(const Row& row, const Input& in, int64_t b,
                                                   Format f) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.w + 32 * b));
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.q + 32 * b));
  __m256i p = LanesAvx2(w, a, f.wide);
  if (in.q_low != nullptr) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.q_low + 32 * b));
    p = _mm256_add_epi32(_mm256_slli_epi32(p, 8), LanesAvx2(w, low, f.wide));
  }
  if (row.c != nullptr) {
    const __m256i lanes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.lanes + 8 * b));
    p = _mm256_sub_epi32(p, _mm256_slli_epi32(lanes, f.shift));
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.c + 8 * b));
    p = _mm256_mullo_epi32(p, _mm256_cvtepi8_epi32(c));
  }
  return p;
}

LMSERVE_AVX2 float DotAvx2(const Row& row, const Input& in, int64_t nb, Format f) {
  __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 m[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < nb; g += 8) {
    __m256i p[8];
    for (int i = 0; i < 8; ++i) {
      p[i] = g + i < nb ? BlockLanesAvx2(row, in, g + i, f) : _mm256_setzero_si256();
    }
    const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i q0 = _mm256_hadd_epi32(h01, h23), q1 = _mm256_hadd_epi32(h45, h67);
    __m256i block = _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                                     _mm256_permute2x128_si256(q0, q1, 0x31));
    if (row.c == nullptr && f.shift >= 0) {
      const __m256i total = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.total + g));
      block = _mm256_sub_epi32(block, _mm256_slli_epi32(total, f.shift));
    }
    const int half = static_cast<int>((g / 8) & 1);
    const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(row.ws + g), _mm256_loadu_ps(in.scale + g));
    s[half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block), scale, s[half]);
    if (row.wm != nullptr) {
      m[half] = _mm256_fmadd_ps(_mm256_loadu_ps(row.wm + g), _mm256_loadu_ps(in.sum + g), m[half]);
    }
  }
  const float sum = Reduce16Avx2(s[0], s[1]);
  return row.wm != nullptr ? sum + Reduce16Avx2(m[0], m[1]) : sum;
}

LMSERVE_AVX2 void DotTileAvx2(const Row* rows, int64_t n, const Input& in, int64_t nb, Format f,
                              float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = DotAvx2(rows[i], in, nb, f);
}

LMSERVE_AVX2 float DotHalfAvx2(const float* w, const float* x, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t e = 0; e < k; e += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + e), _mm256_loadu_ps(x + e), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + e + 8), _mm256_loadu_ps(x + e + 8), acc1);
  }
  return Reduce16Avx2(acc0, acc1);
}

// AVX-512: sixteen blocks at a time, two per register, their lanes summed into one register of
// sixteen block sums.
template <bool kTail>
LMSERVE_AVX512 LMSERVE_INLINE __m512i PairLanesAvx512(const Row& row, const Input& in, int64_t b,
                                                      int64_t nb, Format f) {
  __m512i w, a, low = _mm512_setzero_si512();
  __mmask16 lanes_mask = 0xFFFF;
  if (kTail) {
    if (b >= nb) return _mm512_setzero_si512();
    const __mmask64 bytes = b + 1 < nb ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
    lanes_mask = b + 1 < nb ? 0xFFFF : 0x00FF;
    w = _mm512_maskz_loadu_epi8(bytes, row.w + 32 * b);
    a = _mm512_maskz_loadu_epi8(bytes, in.q + 32 * b);
    if (in.q_low != nullptr) low = _mm512_maskz_loadu_epi8(bytes, in.q_low + 32 * b);
  } else {
    w = _mm512_loadu_si512(row.w + 32 * b);
    a = _mm512_loadu_si512(in.q + 32 * b);
    if (in.q_low != nullptr) low = _mm512_loadu_si512(in.q_low + 32 * b);
  }
  __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
  if (in.q_low != nullptr) p = _mm512_dpbusd_epi32(_mm512_slli_epi32(p, 8), w, low);
  if (row.c != nullptr) {
    const __m512i lanes = _mm512_maskz_loadu_epi32(lanes_mask, in.lanes + 8 * b);
    p = _mm512_sub_epi32(p, _mm512_slli_epi32(lanes, f.shift));
    const __m128i c = _mm_maskz_loadu_epi8(lanes_mask, row.c + 8 * b);
    p = _mm512_mullo_epi32(p, _mm512_cvtepi8_epi32(c));
  }
  return p;
}

// The sums of blocks g..g+15 (zero past nb), in order.
// The sums of 16 blocks from their lanes: v[i] holds blocks 2i (lanes 0..7) and 2i + 1 (8..15).
LMSERVE_AVX512 LMSERVE_INLINE __m512i ReducePairs(const __m512i* v) {
  // The reduction leaves the blocks in the order 0 2 4 6 1 3 5 7 8 10 12 14 9 11 13 15.
  const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  __m512i t[4];
  for (int i = 0; i < 4; ++i) {  // pairs of pairs: per 128-bit chunk, [v0 v1 v0 v1] partials
    t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  }
  // Per chunk c: [sum of chunk c of v0, v1, v2, v3] (u0: pairs 0..3, u1: pairs 4..7).
  const __m512i u0 =
      _mm512_add_epi32(_mm512_unpacklo_epi64(t[0], t[1]), _mm512_unpackhi_epi64(t[0], t[1]));
  const __m512i u1 =
      _mm512_add_epi32(_mm512_unpacklo_epi64(t[2], t[3]), _mm512_unpackhi_epi64(t[2], t[3]));
  // Chunks 0 and 1 of a pair are its first block's lanes, chunks 2 and 3 its second's.
  const __m512i block = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                                         _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_epi32(order, block);
}

template <bool kTail>
LMSERVE_AVX512 LMSERVE_INLINE __m512i BlockSumsAvx512(const Row& row, const Input& in, int64_t g,
                                                      int64_t nb, Format f) {
  __m512i v[8];
  for (int i = 0; i < 8; ++i) v[i] = PairLanesAvx512<kTail>(row, in, g + 2 * i, nb, f);
  return ReducePairs(v);
}

// One unpacked row against one input.
LMSERVE_AVX512 float DotAvx512(const Row& row, const Input& in, int64_t nb, Format f) {
  __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
  const bool offset = row.c == nullptr && f.shift >= 0;
  for (int64_t g = 0; g < nb; g += 16) {
    __m512i block = g + 16 <= nb ? BlockSumsAvx512<false>(row, in, g, nb, f)
                                 : BlockSumsAvx512<true>(row, in, g, nb, f);
    if (offset) {
      block = _mm512_sub_epi32(block, _mm512_slli_epi32(_mm512_loadu_si512(in.total + g), f.shift));
    }
    const __m512 scale = _mm512_mul_ps(_mm512_loadu_ps(row.ws + g), _mm512_loadu_ps(in.scale + g));
    s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block), scale, s);
    if (row.wm != nullptr) {
      m = _mm512_fmadd_ps(_mm512_loadu_ps(row.wm + g), _mm512_loadu_ps(in.sum + g), m);
    }
  }
  const float sum = Reduce16Avx2(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  return row.wm != nullptr
             ? sum + Reduce16Avx2(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1))
             : sum;
}

LMSERVE_AVX512 void DotTileAvx512(const Row* rows, int64_t n, const Input& in, int64_t nb,
                                  Format f, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = DotAvx512(rows[i], in, nb, f);
}

// Q8_0, Q4_0 and Q4_1 rows read in place, for steps of up to kMaxInPlaceTokens tokens (decode,
// small decode batches): the blocks' bytes go straight into registers, without the unpacking
// pass, and each group of sixteen blocks is extracted once and multiplied by every token's input.
// The same integer sums and fp32 operations as DotAvx512 on the unpacked row.
constexpr int64_t kMaxInPlaceTokens = 8;
constexpr int kInPlaceTokenChunk = 4;  // tokens whose accumulators stay in registers together

// Whether DotsInPlaceAvx512 takes `dtype`.
bool InPlaceType(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

constexpr int InPlaceStride(DType dtype) {
  return dtype == DType::kQ8_0 ? 34 : dtype == DType::kQ4_0 ? 18 : 20;
}

// Where each of sixteen consecutive blocks' first four bytes (its fp16 scale, and Q4_1's min)
// lies in the group's bytes loaded as 64-byte registers: output dword i (words 2i, 2i + 1) is taken
// by the two-register permutation of registers k and k + 1 whose mask holds it, k the register of
// its first byte. Replaces a gather (on AMD Zen 4, a gather of sixteen was a sixth of a token).
template <int kStride>
struct HeadTable {
  static constexpr int kRegs = (16 * kStride + 63) / 64;
  int16_t index[kRegs][32] = {};
  uint32_t mask[kRegs] = {};
  constexpr HeadTable() {
    for (int i = 0; i < 16; ++i) {
      const int k = kStride * i / 64;
      const int word = kStride * i / 2 - 32 * k;  // strides are even: blocks start on words
      index[k][2 * i] = static_cast<int16_t>(word);
      index[k][2 * i + 1] = static_cast<int16_t>(word + 1);
      mask[k] |= 3u << (2 * i);
    }
  }
};

// The first four bytes of blocks g..g+15 of a row (zero for those at or past nb), one per dword.
// Reads no byte past block nb - 1. kTail: the row's last group, of fewer than sixteen blocks.
template <DType kType, bool kTail>
LMSERVE_AVX512 LMSERVE_INLINE __m512i BlockHeadsAvx512(const uint8_t* x, int64_t g, int64_t nb) {
  constexpr int kStride = InPlaceStride(kType);
  const uint8_t* base = x + g * kStride;
  if (kTail && nb - g <= 2) {  // one or two blocks: two loads
    uint32_t first, second = 0;
    std::memcpy(&first, base, 4);
    if (nb - g == 2) std::memcpy(&second, base + kStride, 4);
    return _mm512_zextsi128_si512(_mm_setr_epi32(static_cast<int32_t>(first),
                                                 static_cast<int32_t>(second), 0, 0));
  }
  static constexpr HeadTable<kStride> kTable;
  constexpr int kRegs = HeadTable<kStride>::kRegs;
  // The group's bytes in the row.
  const int64_t bytes = kTail ? (nb - g) * kStride : 16 * kStride;
  __m512i regs[kRegs + 1];
  for (int k = 0; k < kRegs; ++k) {
    const int64_t left = bytes - 64 * k;
    if (!kTail && left >= 64) {
      regs[k] = _mm512_loadu_si512(base + 64 * k);
    } else {
      const __mmask64 mask = left >= 64 ? ~__mmask64{0}
                             : left <= 0 ? __mmask64{0}
                                         : (__mmask64{1} << left) - 1;
      regs[k] = _mm512_maskz_loadu_epi8(mask, base + 64 * k);
    }
  }
  regs[kRegs] = _mm512_setzero_si512();
  __m512i heads = _mm512_setzero_si512();
  for (int k = 0; k < kRegs; ++k) {
    const __m512i index = _mm512_loadu_si512(kTable.index[k]);
    heads = _mm512_mask_blend_epi16(kTable.mask[k], heads,
                                    _mm512_permutex2var_epi16(regs[k], index, regs[k + 1]));
  }
  // Blocks past nb: their words came from zeroed bytes.
  return heads;
}

// The words of two consecutive blocks' 16 nibble bytes (kStride apart), each block's twice:
// [b, b, b + 1, b + 1] in the four 128-bit chunks.
template <int kStride>
struct NibbleCopies {
  int16_t index[32] = {};
  constexpr NibbleCopies() {
    for (int i = 0; i < 8; ++i) {
      index[i] = index[8 + i] = static_cast<int16_t>(i);
      index[16 + i] = index[24 + i] = static_cast<int16_t>(kStride / 2 + i);
    }
  }
};

// The weights of blocks b and b + 1 as unsigned bytes (block b in bytes 0..31): zero past nb.
template <DType kType, bool kTail>
LMSERVE_AVX512 LMSERVE_INLINE __m512i PairWeightsInPlace(const uint8_t* x, int64_t b, int64_t nb) {
  if (kTail && b >= nb) return _mm512_setzero_si512();
  const bool two = !kTail || b + 1 < nb;  // a second block (never read past the row's end)
  constexpr int64_t kStride = InPlaceStride(kType);
  __m512i w;
  if constexpr (kType == DType::kQ8_0) {
    const uint8_t* q = x + kStride * b + 2;
    __m512i v = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    if (two) {
      v = _mm512_inserti64x4(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + kStride)),
                             1);
    }
    w = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    // One load of both blocks' nibbles (16 bytes each, kStride apart: an even stride, so block
    // b + 1's start at word kStride / 2), only their bytes (a masked load reads nothing past them).
    const uint8_t* q = x + kStride * b + (kType == DType::kQ4_1 ? 4 : 2);
    const __mmask64 bytes = two ? (__mmask64{1} << (kStride + 16)) - 1 : __mmask64{0xFFFF};
    const __m512i v = _mm512_maskz_loadu_epi8(bytes, q);
    // [nibbles of b, of b, of b + 1, of b + 1], the second copy of each shifted down by 4.
    static constexpr NibbleCopies<kStride> kCopies;
    const __m512i copies = _mm512_permutexvar_epi16(_mm512_loadu_si512(kCopies.index), v);
    w = _mm512_and_si512(_mm512_srlv_epi64(copies, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                         _mm512_set1_epi8(0x0F));
  }
  if (kTail && !two) w = _mm512_maskz_mov_epi8(__mmask64{0xFFFFFFFF}, w);
  return w;
}

// The lane sums of a pair of blocks' weights w against one input (blocks b and b + 1).
template <bool kTail>
LMSERVE_AVX512 LMSERVE_INLINE __m512i PairLanesAgainst(__m512i w, const Input& in, int64_t b,
                                                       int64_t nb) {
  if (kTail && b >= nb) return _mm512_setzero_si512();
  const __mmask64 bytes = !kTail || b + 1 < nb ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
  const __m512i a = kTail ? _mm512_maskz_loadu_epi8(bytes, in.q + 32 * b)
                          : _mm512_loadu_si512(in.q + 32 * b);
  __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
  if (in.q_low != nullptr) {
    const __m512i low = kTail ? _mm512_maskz_loadu_epi8(bytes, in.q_low + 32 * b)
                              : _mm512_loadu_si512(in.q_low + 32 * b);
    p = _mm512_dpbusd_epi32(_mm512_slli_epi32(p, 8), w, low);
  }
  return p;
}

// The sums of blocks g and g + 1 (the last one or two of a row, zero past it) in lanes 0 and 1
// from their pair's lanes p: the 16-block reduction for a group that has only one pair.
LMSERVE_AVX512 LMSERVE_INLINE __m512i LastPairSums(__m512i p) {
  const __m256i low = _mm512_castsi512_si256(p), high = _mm512_extracti64x4_epi64(p, 1);
  const __m256i h = _mm256_hadd_epi32(low, high);  // per 128 bits: pairs of block g's, g + 1's
  const __m256i hh = _mm256_hadd_epi32(h, h);      // [g, g + 1, g, g + 1] per 128 bits
  const __m128i sums =
      _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
  return _mm512_zextsi128_si512(_mm_move_epi64(sums));  // [g, g + 1, 0, ...]
}

// Reduce16 of the sixteen lanes of a and of b, side by side: Reduce16Avx2's additions.
LMSERVE_AVX512 LMSERVE_INLINE void Reduce16Pair(__m512 a, __m512 b, float* sums) {
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  const __m512 x = _mm512_add_ps(w, _mm512_permute_ps(w, 0x4E));
  // x[0] + x[4] and x[8] + x[12]
  const __m512 y = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  sums[0] = _mm512_cvtss_f32(y);
  sums[1] = _mm_cvtss_f32(_mm512_extractf32x4_ps(y, 2));
}

// One row of kType read in place against kTokens inputs: out[t] = row . in[t].
template <DType kType, int kTokens>
LMSERVE_AVX512 LMSERVE_INLINE void DotsInPlaceAvx512(const uint8_t* x, const Input* in,
                                                     int64_t nb, float* out) {
  constexpr bool kHasMin = kType == DType::kQ4_1;
  constexpr int kShift = kType == DType::kQ8_0 ? 7 : kType == DType::kQ4_0 ? 3 : -1;
  __m512 s[kTokens], m[kTokens];
  for (int t = 0; t < kTokens; ++t) s[t] = m[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < nb; g += 16) {
    const __m512i words = g + 16 <= nb ? BlockHeadsAvx512<kType, false>(x, g, nb)
                                       : BlockHeadsAvx512<kType, true>(x, g, nb);
    const __m512 ws = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
    __m512 wm = _mm512_setzero_ps();
    if constexpr (kHasMin) wm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
    __m512i block[kTokens];
    if (g + 16 <= nb) {
      __m512i w[8];
      for (int i = 0; i < 8; ++i) w[i] = PairWeightsInPlace<kType, false>(x, g + 2 * i, nb);
      for (int t = 0; t < kTokens; ++t) {
        __m512i v[8];
        for (int i = 0; i < 8; ++i) v[i] = PairLanesAgainst<false>(w[i], in[t], g + 2 * i, nb);
        block[t] = ReducePairs(v);
      }
    } else if (g + 2 >= nb) {
      const __m512i w = PairWeightsInPlace<kType, true>(x, g, nb);
      for (int t = 0; t < kTokens; ++t) {
        block[t] = LastPairSums(PairLanesAgainst<true>(w, in[t], g, nb));
      }
    } else {
      __m512i w[8];
      for (int i = 0; i < 8; ++i) w[i] = PairWeightsInPlace<kType, true>(x, g + 2 * i, nb);
      for (int t = 0; t < kTokens; ++t) {
        __m512i v[8];
        for (int i = 0; i < 8; ++i) v[i] = PairLanesAgainst<true>(w[i], in[t], g + 2 * i, nb);
        block[t] = ReducePairs(v);
      }
    }
    for (int t = 0; t < kTokens; ++t) {
      __m512i b = block[t];
      if constexpr (kShift >= 0) {
        b = _mm512_sub_epi32(b, _mm512_slli_epi32(_mm512_loadu_si512(in[t].total + g), kShift));
      }
      s[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_mul_ps(ws, _mm512_loadu_ps(in[t].scale + g)),
                             s[t]);
      if constexpr (kHasMin) m[t] = _mm512_fmadd_ps(wm, _mm512_loadu_ps(in[t].sum + g), m[t]);
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    if constexpr (kHasMin) {
      float sums[2];
      Reduce16Pair(s[t], m[t], sums);
      out[t] = sums[0] + sums[1];
    } else {
      out[t] = Reduce16Avx2(_mm512_castps512_ps256(s[t]), _mm512_extractf32x8_ps(s[t], 1));
    }
  }
}

// QuantizeInputRow's rounding of v * (1 / step) in sixteen lanes: (v < 127 ? v : 127), then
// (that > -127 ? that : -127) (std::max(-127, std::min(127, v)), a NaN going to 127 as there), then
// to the nearest integer through 1.5 * 2^23.
LMSERVE_AVX512 LMSERVE_INLINE __m512i RoundToInt8Avx512(__m512 v) {
  const __m512 round = _mm512_set1_ps(12582912.0f);
  v = _mm512_max_ps(_mm512_min_ps(v, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-127.0f));
  return _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, round), round));
}

// QuantizeInputRow and the blocks' totals and scale * total (QuantLinear's input quantization),
// sixteen elements at a time: the same fp32 operations on each element (no contraction), the same
// integer sums, so the same bytes. q_low null: one part.
LMSERVE_AVX512 void QuantizeRowAvx512(const float* x, int64_t cols, int8_t* q, int8_t* q_low,
                                      float* scale, int32_t* lanes, int32_t* total, float* sum) {
  const __m512 magnitude = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i first_of_four = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0,
                                                  0, 0);
  for (int64_t b = 0; b < cols / kBlock; ++b, x += kBlock) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    // max(|x|) over the block: a NaN never passes (max_ps returns its second operand then).
    const __m512 m = _mm512_max_ps(_mm512_and_ps(x1, magnitude),
                                   _mm512_max_ps(_mm512_and_ps(x0, magnitude),
                                                 _mm512_setzero_ps()));
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    __m512i q0 = RoundToInt8Avx512(_mm512_mul_ps(x0, vid)), q1 = RoundToInt8Avx512(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    if (q_low != nullptr) {  // the residual, in steps of d / 256
      const __m512 vd = _mm512_set1_ps(d), steps = _mm512_set1_ps(256.0f);
      const __m512i l0 = RoundToInt8Avx512(_mm512_mul_ps(
          _mm512_mul_ps(_mm512_sub_ps(x0, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(q0))), vid), steps));
      const __m512i l1 = RoundToInt8Avx512(_mm512_mul_ps(
          _mm512_mul_ps(_mm512_sub_ps(x1, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(q1))), vid), steps));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q_low + 32 * b), _mm512_cvtepi32_epi8(l0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q_low + 32 * b + 16), _mm512_cvtepi32_epi8(l1));
      q0 = _mm512_add_epi32(_mm512_slli_epi32(q0, 8), l0);
      q1 = _mm512_add_epi32(_mm512_slli_epi32(q1, 8), l1);
    }
    scale[b] = q_low != nullptr ? d / 256.0f : d;
    // Sums of four consecutive values (exact integers): lane 4i of each holds elements 4i..4i+3.
    const __m512i p0 = _mm512_add_epi32(q0, _mm512_shuffle_epi32(q0, _MM_PERM_CDAB));
    const __m512i p1 = _mm512_add_epi32(q1, _mm512_shuffle_epi32(q1, _MM_PERM_CDAB));
    const __m512i s0 = _mm512_add_epi32(p0, _mm512_shuffle_epi32(p0, _MM_PERM_BADC));
    const __m512i s1 = _mm512_add_epi32(p1, _mm512_shuffle_epi32(p1, _MM_PERM_BADC));
    const __m256i four = _mm512_castsi512_si256(_mm512_permutex2var_epi32(s0, first_of_four, s1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes + 8 * b), four);
    total[b] = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(four));
    sum[b] = scale[b] * static_cast<float>(total[b]);
  }
}

// Rows [row_begin, row_end) of kType read in place against `num_tokens` (<= kMaxInPlaceTokens)
// inputs, at most kInPlaceTokenChunk at a time: out[t * ldo + r - row_begin].
template <DType kType>
LMSERVE_AVX512 void RowsInPlaceAvx512(const uint8_t* weight, int64_t row_bytes, int64_t row_begin,
                                      int64_t row_end, const Input* in, int64_t num_tokens,
                                      int64_t nb, float* out, int64_t ldo) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* x = weight + r * row_bytes;
    float dots[kMaxInPlaceTokens];
    for (int64_t t = 0; t < num_tokens; t += kInPlaceTokenChunk) {
      switch (std::min<int64_t>(kInPlaceTokenChunk, num_tokens - t)) {
        case 1:
          DotsInPlaceAvx512<kType, 1>(x, in + t, nb, dots + t);
          break;
        case 2:
          DotsInPlaceAvx512<kType, 2>(x, in + t, nb, dots + t);
          break;
        case 3:
          DotsInPlaceAvx512<kType, 3>(x, in + t, nb, dots + t);
          break;
        default:
          DotsInPlaceAvx512<kType, 4>(x, in + t, nb, dots + t);
          break;
      }
    }
    for (int64_t t = 0; t < num_tokens; ++t) out[t * ldo + (r - row_begin)] = dots[t];
  }
}

LMSERVE_AVX512 void InPlaceAvx512(DType dtype, const uint8_t* weight, int64_t row_bytes,
                                  int64_t row_begin, int64_t row_end, const Input* in,
                                  int64_t num_tokens, int64_t nb, float* out, int64_t ldo) {
  switch (dtype) {
    case DType::kQ8_0:
      return RowsInPlaceAvx512<DType::kQ8_0>(weight, row_bytes, row_begin, row_end, in,
                                             num_tokens, nb, out, ldo);
    case DType::kQ4_0:
      return RowsInPlaceAvx512<DType::kQ4_0>(weight, row_bytes, row_begin, row_end, in,
                                             num_tokens, nb, out, ldo);
    default:
      return RowsInPlaceAvx512<DType::kQ4_1>(weight, row_bytes, row_begin, row_end, in,
                                             num_tokens, nb, out, ldo);
  }
}

LMSERVE_AVX512 float DotHalfAvx512(const float* w, const float* x, int64_t k) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t e = 0; e < k; e += 16) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + e), _mm512_loadu_ps(x + e), acc);
  }
  return Reduce16Avx2(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
}

// ---------------------------------------------------------------------------------------------
// The row loop: unpack RowTile rows, run every token against them.

struct Job {
  const QuantLinearParams* p;
  Format format;
  int64_t k, nb, padded_nb, ldx, ldy, row_bytes;
  const QuantLinearWorkspace* input;
  bool precise;  // the input in two parts (QuantLinearParams::precise_input; never for Q6_K)
  bool gemm;     // fp32 tiles and sgemm (QuantLinearParams::gemm_min_tokens)
};

// Token t's quantized input row.
Input TokenInput(const Job& job, int64_t t) {
  const QuantLinearWorkspace& x = *job.input;
  const int64_t k = job.k, pnb = job.padded_nb;
  return {x.q.data() + t * k,       job.precise ? x.q_low.data() + t * k : nullptr,
          x.scale.data() + t * pnb, x.sum.data() + t * pnb,
          x.total.data() + t * pnb, x.lanes.data() + t * (k / 4)};
}

LMSERVE_INLINE void Store(const Job& job, int64_t t, int64_t o, float v) {
  const QuantLinearParams& p = *job.p;
  float* y = p.output + t * job.ldy + o;
  if (p.bias != nullptr) v = v + p.bias[o];
  if (p.accumulate) v = *y + v;
  *y = v;
}

template <void (*kDotTile)(const Row*, int64_t, const Input&, int64_t, Format, float*),
          float (*kDotHalf)(const float*, const float*, int64_t),
          void (*kScales)(DType, const uint8_t*, int64_t, float*, float*),
          void (*kInPlace)(DType, const uint8_t*, int64_t, int64_t, int64_t, const Input*,
                           int64_t, int64_t, float*, int64_t)>
LMSERVE_INLINE void RunRowsImpl(const Job& job, int64_t row_begin, int64_t row_end) {
  const QuantLinearParams& p = *job.p;
  const auto* weight = static_cast<const uint8_t*>(p.weight);
  const int64_t k = job.k, nb = job.nb, pnb = job.padded_nb, tile = RowTile(p.num_tokens);
  thread_local std::vector<uint8_t> w;
  thread_local std::vector<float> ws, wm, wf;
  thread_local std::vector<int8_t> c;
  if (job.gemm) {  // tiles of rows in fp32, each multiplied by one sgemm
    if (static_cast<int64_t>(wf.size()) < kGemmRows * k) {
      wf.resize(kGemmRows * k);
      w.resize(k);
      ws.resize(pnb);
      wm.resize(pnb);
      c.resize(8 * nb);
    }
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kGemmRows) {
      const int64_t n = std::min(kGemmRows, row_end - r0);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* source = weight + (r0 + i) * job.row_bytes;
        if (IsHalf(p.dtype)) {
          UnpackHalfRow(p.dtype, source, k, wf.data() + i * k);
        } else {
          UnpackRow<true>(p.dtype, source, k, w.data(), ws.data(), wm.data(), c.data());
          RowToF32(p.dtype, w.data(), ws.data(), wm.data(), c.data(), k, wf.data() + i * k);
        }
      }
      Linear({.input = p.input,
              .weight = wf.data(),
              .bias = p.bias != nullptr ? p.bias + r0 : nullptr,
              .output = p.output + r0,
              .num_tokens = p.num_tokens,
              .in_features = k,
              .out_features = n,
              .input_stride = job.ldx,
              .output_stride = job.ldy,
              .accumulate = p.accumulate});
    }
    return;
  }
  if (IsHalf(p.dtype)) {
    if (static_cast<int64_t>(wf.size()) < kMaxRowTile * k) wf.resize(kMaxRowTile * k);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += tile) {
      const int64_t n = std::min(tile, row_end - r0);
      for (int64_t i = 0; i < n; ++i) {
        UnpackHalfRow(p.dtype, weight + (r0 + i) * job.row_bytes, k, wf.data() + i * k);
      }
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const float* x = p.input + t * job.ldx;
        for (int64_t i = 0; i < n; ++i) Store(job, t, r0 + i, kDotHalf(wf.data() + i * k, x, k));
      }
    }
    return;
  }
  if (kInPlace != nullptr && p.num_tokens <= kMaxInPlaceTokens && InPlaceType(p.dtype)) {
    Input in[kMaxInPlaceTokens];
    for (int64_t t = 0; t < p.num_tokens; ++t) in[t] = TokenInput(job, t);
    constexpr int64_t kRows = 16;  // rows per call, their dots then stored
    float out[kMaxInPlaceTokens * kRows];
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRows) {
      const int64_t n = std::min(kRows, row_end - r0);
      kInPlace(p.dtype, weight, job.row_bytes, r0, r0 + n, in, p.num_tokens, nb, out, kRows);
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        for (int64_t i = 0; i < n; ++i) Store(job, t, r0 + i, out[t * kRows + i]);
      }
    }
    return;
  }
  if (static_cast<int64_t>(w.size()) < kMaxRowTile * k) w.resize(kMaxRowTile * k);
  if (static_cast<int64_t>(ws.size()) < kMaxRowTile * pnb) {
    ws.resize(kMaxRowTile * pnb);
    wm.resize(kMaxRowTile * pnb);
  }
  if (static_cast<int64_t>(c.size()) < kMaxRowTile * 8 * nb) c.resize(kMaxRowTile * 8 * nb);
  const bool lane_scales = p.dtype == DType::kQ6_K;
  for (int64_t r0 = row_begin; r0 < row_end; r0 += tile) {
    const int64_t n = std::min(tile, row_end - r0);
    for (int64_t i = 0; i < n; ++i) {
      float* row_ws = ws.data() + i * pnb;
      float* row_wm = wm.data() + i * pnb;
      const uint8_t* source = weight + (r0 + i) * job.row_bytes;
      UnpackRow<kScales == nullptr>(p.dtype, source, k, w.data() + i * k, row_ws, row_wm,
                                    c.data() + i * 8 * nb);
      if constexpr (kScales != nullptr) kScales(p.dtype, source, nb, row_ws, row_wm);
      std::fill(row_ws + nb, row_ws + pnb, 0.0f);  // the padding adds nothing
      std::fill(row_wm + nb, row_wm + pnb, 0.0f);
    }
    Row rows[kMaxRowTile];
    for (int64_t i = 0; i < n; ++i) {
      rows[i] = {w.data() + i * k, ws.data() + i * pnb,
                 job.format.has_min ? wm.data() + i * pnb : nullptr,
                 lane_scales ? c.data() + i * 8 * nb : nullptr};
    }
    float out[kMaxRowTile];
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const Input in = TokenInput(job, t);
      kDotTile(rows, n, in, nb, job.format, out);
      for (int64_t i = 0; i < n; ++i) Store(job, t, r0 + i, out[i]);
    }
  }
}

void RunRowsPortable(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotTilePortable, DotHalfPortable, nullptr, nullptr>(job, begin, end);
}
LMSERVE_AVX2 void RunRowsAvx2(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotTileAvx2, DotHalfAvx2, ScalesF16c, nullptr>(job, begin, end);
}
LMSERVE_AVX512 void RunRowsAvx512(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotTileAvx512, DotHalfAvx512, ScalesF16c, InPlaceAvx512>(job, begin, end);
}

SimdPath DetectBestPath() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma")) {
    return SimdPath::kAvx512Vnni;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdPath::kAvx2;
#endif
  return SimdPath::kPortable;
}

}  // namespace

std::string_view SimdPathName(SimdPath path) {
  switch (path) {
    case SimdPath::kAuto:
      return "auto";
    case SimdPath::kPortable:
      return "portable";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512Vnni:
      return "avx512-vnni";
  }
  return "?";
}

SimdPath BestSimdPath() {
  static const SimdPath best = DetectBestPath();
  return best;
}

bool SimdPathSupported(SimdPath path) {
  return path == SimdPath::kAuto || static_cast<int>(path) <= static_cast<int>(BestSimdPath());
}

bool QuantLinearSupports(DType dtype, int64_t cols) {
  if (cols <= 0) return false;
  if (IsHalf(dtype)) return cols % 16 == 0;
  if (!IsQuantized(dtype)) return false;
  return cols % GetBlockLayout(dtype).elements_per_block == 0;
}

absl::Status QuantLinearParams::Validate() const {
  if (num_tokens < 0 || in_features <= 0 || out_features <= 0) {
    return absl::InvalidArgumentError(StrCat("QuantLinear: bad shape (tokens ", num_tokens,
                                             ", in ", in_features, ", out ", out_features, ")"));
  }
  if (!QuantLinearSupports(dtype, in_features)) {
    return absl::InvalidArgumentError(StrCat("QuantLinear: ", DTypeName(dtype), " rows of ",
                                             in_features, " elements are not supported"));
  }
  if (num_tokens > 0 && (input == nullptr || weight == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("QuantLinear: null input, weight or output");
  }
  if (IsQuantized(dtype) && num_tokens > 0 && workspace == nullptr) {
    return absl::InvalidArgumentError("QuantLinear: a quantized weight needs a workspace");
  }
  if ((input_stride != 0 && input_stride < in_features) ||
      (output_stride != 0 && output_stride < out_features)) {
    return absl::InvalidArgumentError(StrCat("QuantLinear: row strides (", input_stride, ", ",
                                             output_stride, ") smaller than the rows (",
                                             in_features, ", ", out_features, ")"));
  }
  if (num_threads < 1) return absl::InvalidArgumentError("QuantLinear: num_threads < 1");
  if (!SimdPathSupported(path)) {
    return absl::InvalidArgumentError(
        StrCat("QuantLinear: this CPU cannot run the ", SimdPathName(path), " path"));
  }
  return absl::OkStatus();
}

void QuantizeInputRow(const float* x, int64_t cols, int8_t* q, float* scale, int32_t* lanes,
                      int8_t* q_low) {
  // 1.5 * 2^23: adding and subtracting it rounds a float below 2^22 in magnitude to the nearest
  // integer, ties to even (the current rounding mode), without a call to nearbyint.
  constexpr float kRound = 12582912.0f;
  auto round = [](float v) {  // std::min / std::max also turn a NaN into a bound
    v = std::max(-127.0f, std::min(127.0f, v));
    return static_cast<int8_t>(static_cast<int32_t>((v + kRound) - kRound));
  };
  for (int64_t b = 0; b < cols / kBlock; ++b, x += kBlock, q += kBlock) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) q[j] = round(x[j] * id);
    int32_t low[kBlock] = {};
    if (q_low != nullptr) {  // the residual, in steps of d / 256
      for (int64_t j = 0; j < kBlock; ++j) {
        const float residual = x[j] - d * static_cast<float>(q[j]);
        q_low[j] = round((residual * id) * 256.0f);
        low[j] = q_low[j];
      }
      q_low += kBlock;
    }
    scale[b] = q_low != nullptr ? d / 256.0f : d;
    const int32_t high = q_low != nullptr ? 256 : 1;
    for (int l = 0; l < 8; ++l) {
      int32_t sum = 0;
      for (int i = 4 * l; i < 4 * l + 4; ++i) sum += q[i] * high + low[i];
      lanes[8 * b + l] = sum;
    }
  }
}

void QuantLinear(const QuantLinearParams& p) {
  CheckValid(p.Validate(), "QuantLinear");
  if (p.num_tokens == 0) return;
  const int64_t k = p.in_features, nb = k / kBlock, pnb = (nb + 15) / 16 * 16;
  const Job job{.p = &p,
                .format = FormatOf(p.dtype),
                .k = k,
                .nb = nb,
                .padded_nb = pnb,
                .ldx = p.input_stride != 0 ? p.input_stride : k,
                .ldy = p.output_stride != 0 ? p.output_stride : p.out_features,
                .row_bytes = RowBytes(p.dtype, k),
                .input = p.workspace,
                // Q6_K's lane scales times two-part sums could overflow int32: one part.
                .precise = p.precise_input && p.dtype != DType::kQ6_K,
                .gemm = p.gemm_min_tokens > 0 && p.num_tokens >= p.gemm_min_tokens};
  // Below this many multiply-adds per thread, a thread costs more than it saves.
  constexpr int64_t kMinWorkPerThread = int64_t{1} << 16;
  const int64_t work = p.num_tokens * p.out_features * k;
  const int threads = ThreadsForWork(
      work, kMinWorkPerThread,
      static_cast<int>(std::min<int64_t>(p.num_threads, (p.out_features + 3) / kRowTile)));
  const SimdPath path = p.path == SimdPath::kAuto ? BestSimdPath() : p.path;
  if (IsQuantized(p.dtype) && !job.gemm) {
    QuantLinearWorkspace& x = *p.workspace;
    const int64_t t_count = p.num_tokens;
    if (static_cast<int64_t>(x.q.size()) < t_count * k) x.q.resize(t_count * k);
    if (job.precise && static_cast<int64_t>(x.q_low.size()) < t_count * k) {
      x.q_low.resize(t_count * k);
    }
    if (static_cast<int64_t>(x.lanes.size()) < t_count * (k / 4)) x.lanes.resize(t_count * (k / 4));
    if (static_cast<int64_t>(x.scale.size()) < t_count * pnb) {
      x.scale.resize(t_count * pnb);
      x.sum.resize(t_count * pnb);
      x.total.resize(t_count * pnb);
    }
    ParallelFor(t_count, t_count >= 16 ? threads : 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* scale = x.scale.data() + t * pnb;
        float* sum = x.sum.data() + t * pnb;
        int32_t* total = x.total.data() + t * pnb;
        int32_t* lanes = x.lanes.data() + t * (k / 4);
        int8_t* q_low = job.precise ? x.q_low.data() + t * k : nullptr;
        if (path == SimdPath::kAvx512Vnni) {
          QuantizeRowAvx512(p.input + t * job.ldx, k, x.q.data() + t * k, q_low, scale, lanes,
                            total, sum);
        } else {
          QuantizeInputRow(p.input + t * job.ldx, k, x.q.data() + t * k, scale, lanes, q_low);
          for (int64_t b = 0; b < nb; ++b) {
            total[b] = 0;
            for (int l = 0; l < 8; ++l) total[b] += lanes[8 * b + l];
            sum[b] = scale[b] * static_cast<float>(total[b]);
          }
        }
        std::fill(scale + nb, scale + pnb, 0.0f);  // the padding adds nothing
        std::fill(sum + nb, sum + pnb, 0.0f);
        std::fill(total + nb, total + pnb, 0);
      }
    });
  }
  void (*run)(const Job&, int64_t, int64_t) = path == SimdPath::kAvx512Vnni ? RunRowsAvx512
                                              : path == SimdPath::kAvx2     ? RunRowsAvx2
                                                                            : RunRowsPortable;
  // Whole tiles of rows, in about eight chunks per thread taken by whichever thread is free (on a
  // shared machine a thread may start late), at least a fp32 tile's rows on the sgemm path.
  const int64_t tiles = (p.out_features + kRowTile - 1) / kRowTile;
  const int64_t chunk = std::max(job.gemm ? kGemmRows / kRowTile : 4, tiles / (8 * threads));
  ParallelForChunks(tiles, threads, chunk, [&](int64_t begin, int64_t end) {
    run(job, begin * kRowTile, std::min(p.out_features, end * kRowTile));
  });
}

}  // namespace lmserve::kernels
