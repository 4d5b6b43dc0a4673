#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lmserve::kernels {

float F8E4M3ToF32(uint8_t bits) {
  const float sign = (bits & 0x80u) != 0 ? -1.0f : 1.0f;
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 0x7;
  if ((bits & 0x7fu) == 0x7fu) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

uint8_t F32ToF8E4M3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80u : 0x00u;
  if (std::isnan(value)) return sign | 0x7fu;
  const float a = std::fabs(value);
  if (a >= kF8E4M3Max) return sign | 0x7eu;  // saturate (infinity included)
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormal: multiples of 2^-9; 8 of them is the smallest normal, whose code is also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, [0.5, 1)
  --exponent;                                       // a = (2 fraction) * 2^exponent, [1, 2)
  int mantissa = static_cast<int>(std::nearbyint((2.0f * fraction - 1.0f) * 8.0f));
  if (mantissa == 8) mantissa = 0, ++exponent;
  const int code = ((exponent + 7) << 3) | mantissa;
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

void QuantizeRowsF8E4M3(const float* src, int64_t rows, int64_t cols, int64_t src_stride,
                        uint8_t* dst, float* scales) {
  if (src_stride == 0) src_stride = cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * src_stride;
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float multiplier = amax > 0.0f ? kF8E4M3Max / amax : 0.0f;
    scales[r] = amax > 0.0f ? amax / kF8E4M3Max : 1.0f;
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = F32ToF8E4M3(row[c] * multiplier);
  }
}

void DequantizeF8E4M3(const uint8_t* src, int64_t rows, int64_t cols, const F8ScaleLayout& layout,
                      const float* scales, float* dst) {
  const int64_t scale_cols = layout.ScaleCols(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = scales + (r / layout.block_rows) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) {
      dst[r * cols + c] = scale_row[c / layout.block_cols] * F8E4M3ToF32(src[r * cols + c]);
    }
  }
}

void F8LinearReference(const float* x, int64_t m, int64_t k, const uint8_t* w,
                       const float* w_scales, int64_t n, bool quantize_x, float* y) {
  std::vector<float> xv(static_cast<size_t>(m * k)), x_scales(static_cast<size_t>(m), 1.0f);
  if (quantize_x) {
    std::vector<uint8_t> xq(static_cast<size_t>(m * k));
    QuantizeRowsF8E4M3(x, m, k, k, xq.data(), x_scales.data());
    for (size_t i = 0; i < xq.size(); ++i) xv[i] = F8E4M3ToF32(xq[i]);
  } else {
    std::copy_n(x, m * k, xv.data());
  }
  std::vector<float> wv(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; ++c) wv[c] = F8E4M3ToF32(w[j * k + c]);
    for (int64_t t = 0; t < m; ++t) {
      double sum = 0.0;
      for (int64_t c = 0; c < k; ++c) sum += double{xv[t * k + c]} * double{wv[c]};
      y[t * n + j] = static_cast<float>(sum * double{x_scales[t]} * double{w_scales[j]});
    }
  }
}

}  // namespace lmserve::kernels
