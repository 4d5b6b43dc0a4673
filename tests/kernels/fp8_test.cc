// FP8 E4M3 on the host (kernels/cpu/fp8.h): the conversions against a brute-force nearest-value
// search over every finite code, the row quantizer, the scale layouts' dequantization and the
// FP8 linear reference.

#include "kernels/cpu/fp8.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lmserve::kernels {
namespace {

TEST(Fp8Test, DecodesKnownCodes) {
  EXPECT_EQ(F8E4M3ToF32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(F8E4M3ToF32(0x80)));
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
}

// The code F32ToF8E4M3 must give: the finite value nearest |v| (ties to the even code), 448 for
// anything beyond, by search over all codes.
uint8_t NearestCode(float v) {
  const float a = std::fabs(v);
  int best = 0;
  for (int code = 1; code <= 0x7e; ++code) {
    const float d = std::fabs(F8E4M3ToF32(static_cast<uint8_t>(code)) - a);
    const float best_d = std::fabs(F8E4M3ToF32(static_cast<uint8_t>(best)) - a);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) | best);
}

TEST(Fp8Test, EncodesToTheNearestCodeTiesToEven) {
  for (int code = 0; code < 256; ++code) {  // every finite value round-trips
    if ((code & 0x7f) == 0x7f) continue;
    EXPECT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(code))), code) << code;
  }
  // Midpoints between neighbours go to the even code: 1.0625 between 1 (0x38) and 1.125 (0x39).
  EXPECT_EQ(F32ToF8E4M3(1.0625f), 0x38);
  EXPECT_EQ(F32ToF8E4M3(1.1875f), 0x3a);
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.5f, -9)), 0x02);  // subnormal midpoint 1.5 -> 2
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(0.5f, -9)), 0x00);  // 0.5 -> 0
  // Saturation, infinities and NaN.
  EXPECT_EQ(F32ToF8E4M3(460.0f), 0x7e);
  EXPECT_EQ(F32ToF8E4M3(1e9f), 0x7e);
  EXPECT_EQ(F32ToF8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(F32ToF8E4M3(std::nanf("")) & 0x7f, 0x7f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float v = (i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    ASSERT_EQ(F32ToF8E4M3(v), NearestCode(v)) << v;
  }
}

TEST(Fp8Test, QuantizesRowsWithTheirOwnScales) {
  const int64_t rows = 3, cols = 37, stride = 40;
  std::vector<float> values(rows * stride, 1e9f);  // the padding must not be read
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) values[r * stride + c] = normal(rng) * (r == 1 ? 100 : 0.01f);
  }
  for (int64_t c = 0; c < cols; ++c) values[2 * stride + c] = 0.0f;  // an all-zero row
  std::vector<uint8_t> q(rows * cols);
  std::vector<float> scales(rows);
  QuantizeRowsF8E4M3(values.data(), rows, cols, stride, q.data(), scales.data());
  for (int64_t r = 0; r < 2; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(values[r * stride + c]));
    EXPECT_FLOAT_EQ(scales[r], amax / 448.0f);
    bool saw_max = false;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = values[r * stride + c];
      const float back = scales[r] * F8E4M3ToF32(q[r * cols + c]);
      // Half a step of E4M3's 3 mantissa bits, relative, or the subnormal step near zero.
      EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16, scales[r] * std::ldexp(1.0f, -10)))
          << r << " " << c;
      saw_max = saw_max || (q[r * cols + c] & 0x7f) == 0x7e;
    }
    EXPECT_TRUE(saw_max) << "row " << r << ": the largest value maps to +-448";
  }
  EXPECT_EQ(scales[2], 1.0f);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(q[2 * cols + c], 0);
}

TEST(Fp8Test, DequantizesEachScaleLayout) {
  const int64_t rows = 5, cols = 7;
  std::vector<uint8_t> q(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) q[i] = static_cast<uint8_t>(0x30 + i % 16);
  std::vector<float> out(rows * cols);
  // Blocks of 2 x 3: scales [3, 3].
  const F8ScaleLayout blocks{2, 3};
  ASSERT_EQ(blocks.ScaleRows(rows), 3);
  ASSERT_EQ(blocks.ScaleCols(cols), 3);
  std::vector<float> scales(9);
  for (int i = 0; i < 9; ++i) scales[i] = static_cast<float>(i + 1);
  DequantizeF8E4M3(q.data(), rows, cols, blocks, scales.data(), out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(out[r * cols + c], scales[(r / 2) * 3 + c / 3] * F8E4M3ToF32(q[r * cols + c]));
    }
  }
  const std::vector<float> per_row = {1, 2, 3, 4, 5};
  DequantizeF8E4M3(q.data(), rows, cols, F8ScaleLayout::PerChannel(cols), per_row.data(),
                   out.data());
  EXPECT_EQ(out[3 * cols + 6], 4 * F8E4M3ToF32(q[3 * cols + 6]));
  const float one = 0.5f;
  DequantizeF8E4M3(q.data(), rows, cols, F8ScaleLayout::PerTensor(rows, cols), &one, out.data());
  EXPECT_EQ(out[4 * cols + 5], 0.5f * F8E4M3ToF32(q[4 * cols + 5]));
}

TEST(Fp8Test, LinearReferenceQuantizesTheInputPerToken) {
  const int64_t m = 2, k = 16, n = 3;
  std::vector<float> x(m * k), w(n * k);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  std::vector<uint8_t> wq(n * k);
  std::vector<float> w_scales(n);
  QuantizeRowsF8E4M3(w.data(), n, k, k, wq.data(), w_scales.data());
  std::vector<float> y16(m * n), y8(m * n);
  F8LinearReference(x.data(), m, k, wq.data(), w_scales.data(), n, /*quantize_x=*/false,
                    y16.data());
  F8LinearReference(x.data(), m, k, wq.data(), w_scales.data(), n, /*quantize_x=*/true, y8.data());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, w8 = 0;
      for (int64_t c = 0; c < k; ++c) {
        exact += double{x[t * k + c]} * w[j * k + c];
        w8 += double{x[t * k + c]} * w_scales[j] * F8E4M3ToF32(wq[j * k + c]);
      }
      EXPECT_NEAR(y16[t * n + j], w8, 1e-5 * (1 + std::fabs(w8)));
      EXPECT_NEAR(y8[t * n + j], exact, 0.15 * std::sqrt(static_cast<double>(k)));
      EXPECT_NE(y8[t * n + j], y16[t * n + j]);  // x was quantized
    }
  }
}

}  // namespace
}  // namespace lmserve::kernels
