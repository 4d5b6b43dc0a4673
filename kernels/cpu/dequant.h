// Conversion of weight tensors to fp32, bit-exact with llama.cpp's dequantization of its GGUF block
// formats (ggml-quants.c), and quantization to Q8_0, Q4_0, Q4_K and Q6_K for the GGUF writer.

#ifndef LMSERVE_KERNELS_CPU_DEQUANT_H_
#define LMSERVE_KERNELS_CPU_DEQUANT_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace lmserve::kernels {

// Converts `num_elements` elements of `dtype` at `src` to fp32 in `dst`. Handles F32, F16, BF16 and
// every quantized type of DType. REQUIRES: num_elements is a multiple of the type's block size.
void DequantizeToF32(DType dtype, const void* src, float* dst, int64_t num_elements);

// Quantizes fp32 to Q8_0 as llama.cpp's quantize_row_q8_0_ref does.
// REQUIRES: num_elements is a multiple of 32. `dst` holds num_elements / 32 * 34 bytes.
void QuantizeQ8_0(const float* src, void* dst, int64_t num_elements);

// Quantizes fp32 to Q4_0 as llama.cpp's quantize_row_q4_0_ref does. REQUIRES: a multiple of 32.
void QuantizeQ4_0(const float* src, void* dst, int64_t num_elements);
// Quantizes fp32 to Q4_K and Q6_K in their block layouts (what DequantizeToF32 reads), with a plain
// rounding of each sub-block's range (not llama.cpp's searched scales: a valid encoding of about
// its error, which is what files made for tests need). REQUIRES: a multiple of 256.
void QuantizeQ4_K(const float* src, void* dst, int64_t num_elements);
void QuantizeQ6_K(const float* src, void* dst, int64_t num_elements);
// QuantizeQ8_0 / Q4_0 / Q4_K / Q6_K by dtype. REQUIRES: one of those four.
void QuantizeBlocks(DType dtype, const float* src, void* dst, int64_t num_elements);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_DEQUANT_H_
