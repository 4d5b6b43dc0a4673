// FP8 E4M3 (DType::kF8E4M3) on the host: conversions, the row quantizer that both the weights
// (per output channel) and the activations (per token) go through, the dequantization of the
// scale layouts FP8 checkpoints use, and the CPU twin of the CUDA FP8 GEMMs (kernels/cuda/fp8.h).
//
// E4M3 here is OCP's "fn" variant (PyTorch's float8_e4m3fn, CUDA's __NV_E4M3): 4 exponent bits of
// bias 7, 3 mantissa bits, no infinities, 0x7f/0xff NaN, largest finite value 448. Conversion from
// fp32 rounds to nearest even and saturates to +-448 (CUDA's __NV_SATFINITE), so that the GPU's
// conversion instruction gives the same bytes.
//
// A quantized row r of a matrix holds q[r, c] = E4M3(v[r, c] * (448 / amax_r)) and the scale
// s_r = amax_r / 448 (amax_r = max |v[r, :]|; an all-zero row: q = 0, s = 1), so that
// v ~ s_r * q[r, c]. The same two fp32 operations (one division for the multiplier, one
// product per element) run on the GPU: its quantizer gives these bytes and scales bit for bit.

#ifndef LMSERVE_KERNELS_CPU_FP8_H_
#define LMSERVE_KERNELS_CPU_FP8_H_

#include <cstdint>

namespace lmserve::kernels {

inline constexpr float kF8E4M3Max = 448.0f;

float F8E4M3ToF32(uint8_t bits);
// Round to nearest even, saturating to +-448; NaN becomes 0x7f (with the sign).
uint8_t F32ToF8E4M3(float value);

// Quantizes `rows` rows of `cols` values (row stride src_stride; 0: cols) to E4M3 with one scale
// a row, as above. dst: [rows, cols] bytes; scales: [rows].
void QuantizeRowsF8E4M3(const float* src, int64_t rows, int64_t cols, int64_t src_stride,
                        uint8_t* dst, float* scales);

// How an FP8 checkpoint tensor [rows, cols] is scaled: the scale tensor is [scale_rows,
// scale_cols] fp32 values, one for each block of block_rows x block_cols elements (the last
// blocks of a row or column may be partial). Per tensor: one block of the whole tensor; per
// output channel: blocks of one row; block-wise 128 x 128 (DeepSeek-V3's and Qwen3-*-FP8's).
struct F8ScaleLayout {
  int64_t block_rows = 1;
  int64_t block_cols = 1;

  static F8ScaleLayout PerTensor(int64_t rows, int64_t cols) { return {rows, cols}; }
  static F8ScaleLayout PerChannel(int64_t cols) { return {1, cols}; }
  int64_t ScaleRows(int64_t rows) const { return (rows + block_rows - 1) / block_rows; }
  int64_t ScaleCols(int64_t cols) const { return (cols + block_cols - 1) / block_cols; }
};

// dst[r, c] = scales[r / block_rows, c / block_cols] * F8E4M3ToF32(src[r, c]) (fp32 product).
void DequantizeF8E4M3(const uint8_t* src, int64_t rows, int64_t cols, const F8ScaleLayout& layout,
                      const float* scales, float* dst);

// The FP8 linear layer's twin, y[m, n] = x[m, k] W[n, k]^T with W quantized per output channel
// (w: [n, k] E4M3 bytes, w_scales: [n]). With quantize_x, each row of x is first quantized per
// token as the GPU's large-batch path does (kernels/cuda/fp8.h, Fp8GemmPlan) and the product is
// s_x[t] * s_w[j] * sum q_x q_w; without, x stays as it is (the skinny kernel's W8A16 product:
// s_w[j] * sum x q_w). Sums in double.
void F8LinearReference(const float* x, int64_t m, int64_t k, const uint8_t* w,
                       const float* w_scales, int64_t n, bool quantize_x, float* y);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_FP8_H_
