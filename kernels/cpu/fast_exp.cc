#include "kernels/cpu/fast_exp.h"

#include <immintrin.h>

#include <atomic>

namespace lmserve::kernels {
namespace {

using namespace fast_exp;

// FastExp of eight values: the scalar function's operations in the same order, so the same bits.
__attribute__((target("avx2"))) inline __m256 Exp8(__m256 x) {
  const __m256 max = _mm256_set1_ps(kMax);
  const __m256 min = _mm256_set1_ps(kMin);
  __m256 t = _mm256_max_ps(_mm256_min_ps(x, max), min);  // NaN lanes: restored below
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)), round),
                                 round);
  __m256 r = _mm256_sub_ps(t, _mm256_mul_ps(n, _mm256_set1_ps(kLn2High)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Low)));
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kPoly[i]));
  const __m256 y = _mm256_add_ps(
      _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvttps_epi32(n);
  // a = ni / 2 rounded toward 0: (ni + 1) >> 1 for negative ni, ni >> 1 otherwise.
  const __m256i a = _mm256_srai_epi32(_mm256_sub_epi32(ni, _mm256_srai_epi32(ni, 31)), 1);
  const __m256i b = _mm256_sub_epi32(ni, a);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
  const __m256 scale_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(y, scale_a), scale_b);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                            _mm256_cmp_ps(x, max, _CMP_GT_OQ));
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), _mm256_cmp_ps(x, min, _CMP_LT_OQ));
  return _mm256_blendv_ps(result, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2"))) void ExpShiftedAvx2(float* data, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(data + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(data + i), s)));
  }
  for (; i < n; ++i) data[i] = FastExp(data[i] - shift);
}

__attribute__((target("avx2"))) void SiluMulAvx2(const float* gate, const float* up, float* out,
                                                 int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_xor_ps(g, sign));  // exp(-g)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)),
                                            _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + FastExp(-gate[i])) * up[i];
}

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

std::atomic<bool> force_scalar{false};

bool UseAvx2() {
  static const bool has_avx2 = CpuHasAvx2();
  return has_avx2 && !force_scalar.load(std::memory_order_relaxed);
}

}  // namespace

void ExpShifted(float* data, int64_t n, float shift) {
  if (UseAvx2()) return ExpShiftedAvx2(data, n, shift);
  for (int64_t i = 0; i < n; ++i) data[i] = FastExp(data[i] - shift);
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  if (UseAvx2()) return SiluMulAvx2(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + FastExp(-gate[i])) * up[i];
}

bool FastExpVectorized() { return UseAvx2(); }

void SetFastExpScalarForTesting(bool scalar) {
  force_scalar.store(scalar, std::memory_order_relaxed);
}

}  // namespace lmserve::kernels
