// exp(x) in plain float arithmetic, for the loops that exponentiate a value an element (softmax,
// SiLU): std::exp is a libm call per value, which held the CPU's prefill attention and gated
// activations to one value at a time. FastExp is the scalar definition; ExpShifted and SiluMul run
// it over arrays, eight values at a time with AVX2 where the CPU has it, with the same bits.
//
// The method is Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so that r is
// exact), e^r by a degree-7 polynomial, 2^n from exponent bits (in two factors, so that n = 128
// and n = -126 stay normal). Within 2 ulp of the correctly rounded exp on [-87.33, 88.72]; 0 below
// that range (where exp is subnormal or 0), +inf above, NaN for NaN. No fused multiply-adds (the
// project builds without contraction), so a value's result is the same on every x86 path.

#ifndef LMSERVE_KERNELS_CPU_FAST_EXP_H_
#define LMSERVE_KERNELS_CPU_FAST_EXP_H_

#include <bit>
#include <cstdint>
#include <limits>

namespace lmserve::kernels {

// The constants (shared with the vector paths in fast_exp.cc).
namespace fast_exp {
inline constexpr float kMax = 88.7228394f;   // log(FLT_MAX): above, +inf
inline constexpr float kMin = -87.3365479f;  // log(FLT_MIN): below, 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: (v + it) - it rounds v to an integer
inline constexpr float kLn2High = 0.693359375f;  // ln2 = kLn2High + kLn2Low; 9 bits, n * it exact
inline constexpr float kLn2Low = -2.12194440e-4f;
inline constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                   4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace fast_exp

inline float FastExp(float x) {
  using namespace fast_exp;
  float t = x > kMax ? kMax : x;  // NaN passes the clamps and is restored at the end
  t = t < kMin ? kMin : t;
  const float n = (t * kLog2e + kRound) - kRound;  // round(t / ln2), |n| <= 128
  float r = t - n * kLn2High;
  r = r - n * kLn2Low;
  float p = kPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + kPoly[i];
  const float y = (p * (r * r) + r) + 1.0f;
  // 2^n as 2^a * 2^b, a = n / 2 (rounded toward 0) and b = n - a, both in [-63, 64].
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t a = ni / 2;
  const int32_t b = ni - a;
  const float scale_a = std::bit_cast<float>(static_cast<uint32_t>(a + 127) << 23);
  const float scale_b = std::bit_cast<float>(static_cast<uint32_t>(b + 127) << 23);
  float result = (y * scale_a) * scale_b;
  result = x > kMax ? std::numeric_limits<float>::infinity() : result;
  result = x < kMin ? 0.0f : result;
  return x != x ? x : result;
}

// data[i] = FastExp(data[i] - shift) for i in [0, n).
void ExpShifted(float* data, int64_t n, float shift);

// out[i] = gate[i] / (1 + FastExp(-gate[i])) * up[i] for i in [0, n): SiLU(gate) * up. `out` may
// be `gate` or `up`.
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

// Whether ExpShifted and SiluMul take the AVX2 path on this CPU (tests compare it with the scalar
// one); `force_scalar` makes them take the scalar one from now on.
bool FastExpVectorized();
void SetFastExpScalarForTesting(bool force_scalar);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_FAST_EXP_H_
