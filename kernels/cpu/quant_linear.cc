#include "kernels/cpu/quant_linear.h"

// GCC 12's AVX-512 intrinsics pass an undefined vector as the merge operand of their unmasked
// forms, which -Wmaybe-uninitialized reports once they are inlined here: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/parallel.h"

namespace lmserve::kernels {
namespace {

constexpr int64_t kBlock = 32;   // elements per input block and per weight block (or sub-block)
constexpr int64_t kRowTile = 4;  // weight rows unpacked together, then run against every token

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

LMSERVE_INLINE float Half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return F16ToF32(bits);
}

LMSERVE_INLINE void Nibbles32(const uint8_t* qs, uint8_t* w) {
  for (int j = 0; j < 16; ++j) {
    w[j] = qs[j] & 0x0F;
    w[j + 16] = qs[j] >> 4;
  }
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

LMSERVE_INLINE void UnpackRow(DType dtype, const uint8_t* x, int64_t k, uint8_t* w, float* ws,
                              float* wm) {
  switch (dtype) {
    case DType::kQ8_0:
      for (int64_t b = 0; b < k / 32; ++b, x += 34, w += 32) {
        ws[2 * b] = ws[2 * b + 1] = Half(x);
        for (int j = 0; j < 32; ++j) w[j] = x[2 + j] ^ 0x80;
      }
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < k / 32; ++b, x += 18, w += 32) {
        ws[2 * b] = ws[2 * b + 1] = Half(x);
        Nibbles32(x + 2, w);
      }
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < k / 32; ++b, x += 20, w += 32) {
        ws[2 * b] = ws[2 * b + 1] = Half(x);
        wm[b] = Half(x + 2);
        Nibbles32(x + 4, w);
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      for (int64_t s = 0; s < k / 256; ++s, x += five ? 176 : 144) {
        const float d = Half(x), dmin = Half(x + 2);
        const uint8_t* scales = x + 4;
        const uint8_t* qh = x + 16;
        const uint8_t* ql = x + (five ? 48 : 16);
        for (int c = 0; c < 4; ++c, ql += 32) {  // 64 elements: sub-blocks 2c and 2c + 1
          for (int h = 0; h < 2; ++h) {
            int scale, min;
            ScaleMinK4(2 * c + h, scales, &scale, &min);
            const int64_t b = 8 * s + 2 * c + h;
            ws[2 * b] = ws[2 * b + 1] = d * static_cast<float>(scale);
            wm[b] = -(dmin * static_cast<float>(min));
          }
          uint8_t* out = w + 256 * s + 64 * c;
          for (int l = 0; l < 32; ++l) {
            out[l] = ql[l] & 0xF;
            out[l + 32] = ql[l] >> 4;
          }
          if (five) {
            const int u1 = 1 << (2 * c), u2 = 2 << (2 * c);
            for (int l = 0; l < 32; ++l) {
              out[l] |= (qh[l] & u1) != 0 ? 16 : 0;
              out[l + 32] |= (qh[l] & u2) != 0 ? 16 : 0;
            }
          }
        }
      }
      return;
    }
    case DType::kQ6_K:
      for (int64_t s = 0; s < k / 256; ++s, x += 210) {
        const float d = Half(x + 208);
        const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
        for (int b = 0; b < 16; ++b) ws[16 * s + b] = d * static_cast<float>(sc[b]);
        for (int n = 0; n < 2; ++n) {
          const uint8_t* ql = x + 64 * n;
          const uint8_t* qh = x + 128 + 32 * n;
          uint8_t* out = w + 256 * s + 128 * n;
          for (int l = 0; l < 32; ++l) {
            out[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
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

// ---------------------------------------------------------------------------------------------
// The dot products, one per path. Each takes an unpacked row and one quantized input row.

struct Row {
  const uint8_t* w;
  const float* ws;
  const float* wm;  // null without a min
};
struct Input {
  const int8_t* q;
  const float* scale;
  const int32_t* lanes;
};

LMSERVE_INLINE float Reduce16(const float* a) {
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = a[l] + a[8 + l];
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

float DotPortable(const Row& row, const Input& in, int64_t nb, Format f) {
  float acc[16] = {};
  for (int64_t b = 0; b < nb; ++b) {
    float* a = acc + 8 * (b & 1);
    for (int l = 0; l < 8; ++l) {
      const int64_t e = 32 * b + 4 * l;
      int32_t p = 0;
      for (int i = 0; i < 4; ++i) p += int32_t{row.w[e + i]} * int32_t{in.q[e + i]};
      const int32_t lane_sum = in.lanes[8 * b + l];
      if (f.shift >= 0) p -= lane_sum * (1 << f.shift);
      const float s = row.ws[2 * b + l / 4] * in.scale[b];
      a[l] = std::fma(static_cast<float>(p), s, a[l]);
      if (row.wm != nullptr) {
        const float t = row.wm[b] * in.scale[b];
        a[l] = std::fma(static_cast<float>(lane_sum), t, a[l]);
      }
    }
  }
  return Reduce16(acc);
}

float DotHalfPortable(const float* w, const float* x, int64_t k) {
  float acc[16] = {};
  for (int64_t e = 0; e < k; ++e) acc[e % 16] = std::fma(w[e], x[e], acc[e % 16]);
  return Reduce16(acc);
}

#define LMSERVE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LMSERVE_AVX512 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

LMSERVE_AVX2 float DotAvx2(const Row& row, const Input& in, int64_t nb, Format f) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.w + 32 * b));
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.q + 32 * b));
    const __m256i lanes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.lanes + 8 * b));
    __m256i p;
    if (!f.wide) {  // w <= 63: the 16-bit pair sums cannot saturate
      p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
    } else {  // 16-bit products, pairs summed to 32 bits, then pairs of pairs (lanes reordered)
      const __m256i m0 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(w)),
                                           _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a)));
      const __m256i m1 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(w, 1)),
                                           _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1)));
      p = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(m0, m1), order);
    }
    if (f.shift >= 0) p = _mm256_sub_epi32(p, _mm256_slli_epi32(lanes, f.shift));
    const float scale = in.scale[b];
    const __m256 s = _mm256_set_m128(_mm_set1_ps(row.ws[2 * b + 1] * scale),
                                      _mm_set1_ps(row.ws[2 * b] * scale));
    __m256& a8 = acc[b & 1];
    a8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, a8);
    if (row.wm != nullptr) {
      a8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(row.wm[b] * scale), a8);
    }
  }
  alignas(32) float out[16];
  _mm256_store_ps(out, acc[0]);
  _mm256_store_ps(out + 8, acc[1]);
  return Reduce16(out);
}

LMSERVE_AVX2 float DotHalfAvx2(const float* w, const float* x, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t e = 0; e < k; e += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + e), _mm256_loadu_ps(x + e), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + e + 8), _mm256_loadu_ps(x + e + 8), acc1);
  }
  alignas(32) float out[16];
  _mm256_store_ps(out, acc0);
  _mm256_store_ps(out + 8, acc1);
  return Reduce16(out);
}

LMSERVE_AVX512 float DotAvx512(const Row& row, const Input& in, int64_t nb, Format f) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i quads = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {  // blocks b (lanes 0..7) and b + 1 (lanes 8..15)
    const __m512i w = _mm512_loadu_si512(row.w + 32 * b);
    const __m512i a = _mm512_loadu_si512(in.q + 32 * b);
    const __m512i lanes = _mm512_loadu_si512(in.lanes + 8 * b);
    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
    if (f.shift >= 0) p = _mm512_sub_epi32(p, _mm512_slli_epi32(lanes, f.shift));
    const __m128 scale2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(in.scale + b)));
    const __m128 s4 = _mm_mul_ps(_mm_loadu_ps(row.ws + 2 * b), _mm_unpacklo_ps(scale2, scale2));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                          _mm512_permutexvar_ps(quads, _mm512_zextps128_ps512(s4)), acc);
    if (row.wm != nullptr) {
      const __m128 t2 = _mm_mul_ps(
          _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(row.wm + b))), scale2);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes),
                            _mm512_permutexvar_ps(halves, _mm512_zextps128_ps512(t2)), acc);
    }
  }
  if (b < nb) {  // an odd last block: the low eight lanes
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row.w + 32 * b));
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.q + 32 * b));
    const __m256i lanes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.lanes + 8 * b));
    __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a);
    if (f.shift >= 0) p = _mm256_sub_epi32(p, _mm256_slli_epi32(lanes, f.shift));
    const float scale = in.scale[b];
    const __m256 s = _mm256_set_m128(_mm_set1_ps(row.ws[2 * b + 1] * scale),
                                      _mm_set1_ps(row.ws[2 * b] * scale));
    __m256 low = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, _mm512_castps512_ps256(acc));
    if (row.wm != nullptr) {
      low = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(row.wm[b] * scale), low);
    }
    acc = _mm512_insertf32x8(acc, low, 0);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, acc);
  return Reduce16(out);
}

LMSERVE_AVX512 float DotHalfAvx512(const float* w, const float* x, int64_t k) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t e = 0; e < k; e += 16) {
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + e), _mm512_loadu_ps(x + e), acc);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, acc);
  return Reduce16(out);
}

// ---------------------------------------------------------------------------------------------
// The row loop: unpack kRowTile rows, run every token against them.

struct Job {
  const QuantLinearParams* p;
  Format format;
  int64_t k, nb, ldx, ldy, row_bytes;
  const int8_t* q;
  const float* scale;
  const int32_t* lanes;
};

LMSERVE_INLINE void Store(const Job& job, int64_t t, int64_t o, float v) {
  const QuantLinearParams& p = *job.p;
  float* y = p.output + t * job.ldy + o;
  if (p.bias != nullptr) v = v + p.bias[o];
  if (p.accumulate) v = *y + v;
  *y = v;
}

template <float (*kDot)(const Row&, const Input&, int64_t, Format),
          float (*kDotHalf)(const float*, const float*, int64_t)>
LMSERVE_INLINE void RunRowsImpl(const Job& job, int64_t row_begin, int64_t row_end) {
  const QuantLinearParams& p = *job.p;
  const auto* weight = static_cast<const uint8_t*>(p.weight);
  thread_local std::vector<uint8_t> w;
  thread_local std::vector<float> ws, wm, wf;
  if (IsHalf(p.dtype)) {
    if (static_cast<int64_t>(wf.size()) < kRowTile * job.k) wf.resize(kRowTile * job.k);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
      const int64_t n = std::min(kRowTile, row_end - r0);
      for (int64_t i = 0; i < n; ++i) {
        UnpackHalfRow(p.dtype, weight + (r0 + i) * job.row_bytes, job.k, wf.data() + i * job.k);
      }
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const float* x = p.input + t * job.ldx;
        for (int64_t i = 0; i < n; ++i) {
          Store(job, t, r0 + i, kDotHalf(wf.data() + i * job.k, x, job.k));
        }
      }
    }
    return;
  }
  if (static_cast<int64_t>(w.size()) < kRowTile * job.k) {
    w.resize(kRowTile * job.k);
    ws.resize(kRowTile * 2 * job.nb);
    wm.resize(kRowTile * job.nb);
  }
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
    const int64_t n = std::min(kRowTile, row_end - r0);
    for (int64_t i = 0; i < n; ++i) {
      UnpackRow(p.dtype, weight + (r0 + i) * job.row_bytes, job.k, w.data() + i * job.k,
                ws.data() + i * 2 * job.nb, wm.data() + i * job.nb);
    }
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const Input in{job.q + t * job.k, job.scale + t * job.nb, job.lanes + t * (job.k / 4)};
      for (int64_t i = 0; i < n; ++i) {
        const Row row{w.data() + i * job.k, ws.data() + i * 2 * job.nb,
                      job.format.has_min ? wm.data() + i * job.nb : nullptr};
        Store(job, t, r0 + i, kDot(row, in, job.nb, job.format));
      }
    }
  }
}

void RunRowsPortable(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotPortable, DotHalfPortable>(job, begin, end);
}
LMSERVE_AVX2 void RunRowsAvx2(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotAvx2, DotHalfAvx2>(job, begin, end);
}
LMSERVE_AVX512 void RunRowsAvx512(const Job& job, int64_t begin, int64_t end) {
  RunRowsImpl<DotAvx512, DotHalfAvx512>(job, begin, end);
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

void QuantizeInputRow(const float* x, int64_t cols, int8_t* q, float* scale, int32_t* lanes) {
  for (int64_t b = 0; b < cols / kBlock; ++b, x += kBlock, q += kBlock) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) {
      // fmin/fmax turn a NaN into a bound; nearbyint rounds to nearest even.
      const float v = std::fmin(std::fmax(x[j] * id, -127.0f), 127.0f);
      q[j] = static_cast<int8_t>(std::nearbyint(v));
    }
    scale[b] = d;
    for (int l = 0; l < 8; ++l) {
      lanes[8 * b + l] = int32_t{q[4 * l]} + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3];
    }
  }
}

void QuantLinear(const QuantLinearParams& p) {
  CheckValid(p.Validate(), "QuantLinear");
  if (p.num_tokens == 0) return;
  Job job{.p = &p,
          .format = FormatOf(p.dtype),
          .k = p.in_features,
          .nb = p.in_features / kBlock,
          .ldx = p.input_stride != 0 ? p.input_stride : p.in_features,
          .ldy = p.output_stride != 0 ? p.output_stride : p.out_features,
          .row_bytes = RowBytes(p.dtype, p.in_features),
          .q = nullptr,
          .scale = nullptr,
          .lanes = nullptr};
  // Below this many multiply-adds per thread, a thread costs more than it saves.
  constexpr int64_t kMinWorkPerThread = int64_t{1} << 16;
  const int64_t work = p.num_tokens * p.out_features * p.in_features;
  const int threads = static_cast<int>(
      std::clamp<int64_t>(work / kMinWorkPerThread, 1,
                          std::min<int64_t>(p.num_threads, (p.out_features + 3) / kRowTile)));
  if (IsQuantized(p.dtype)) {
    QuantLinearWorkspace& ws = *p.workspace;
    const int64_t k = p.in_features;
    if (static_cast<int64_t>(ws.q.size()) < p.num_tokens * k) {
      ws.q.resize(p.num_tokens * k);
      ws.scale.resize(p.num_tokens * (k / kBlock));
      ws.lanes.resize(p.num_tokens * (k / 4));
    }
    ParallelFor(p.num_tokens, p.num_tokens >= 16 ? threads : 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        QuantizeInputRow(p.input + t * job.ldx, k, ws.q.data() + t * k,
                         ws.scale.data() + t * (k / kBlock), ws.lanes.data() + t * (k / 4));
      }
    });
    job.q = ws.q.data();
    job.scale = ws.scale.data();
    job.lanes = ws.lanes.data();
  }
  const SimdPath path = p.path == SimdPath::kAuto ? BestSimdPath() : p.path;
  void (*run)(const Job&, int64_t, int64_t) = path == SimdPath::kAvx512Vnni ? RunRowsAvx512
                                              : path == SimdPath::kAvx2     ? RunRowsAvx2
                                                                            : RunRowsPortable;
  // Whole tiles of rows per thread.
  const int64_t tiles = (p.out_features + kRowTile - 1) / kRowTile;
  ParallelFor(tiles, threads, [&](int64_t begin, int64_t end) {
    run(job, begin * kRowTile, std::min(p.out_features, end * kRowTile));
  });
}

}  // namespace lmserve::kernels
