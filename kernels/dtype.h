// Element types of weights and activations, and the block layout of the quantized ones.
//
// Quantized types (the GGUF block formats of llama.cpp) pack a fixed number of elements into a block
// of fixed size; a row of a quantized tensor is a whole number of blocks.

#ifndef LMSERVE_KERNELS_DTYPE_H_
#define LMSERVE_KERNELS_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace lmserve::kernels {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // 32 elements: fp16 scale, 32 x int8
  kQ4_0,  // 32 elements: fp16 scale, 16 bytes of 4-bit values (offset 8)
  kQ4_1,  // 32 elements: fp16 scale, fp16 min, 16 bytes of 4-bit values
  kQ4_K,  // 256 elements: super-block with 8 sub-blocks, 6-bit scales and mins
  kQ5_K,  // 256 elements: as Q4_K plus one high bit per element
  kQ6_K,  // 256 elements: 16 sub-blocks, 8-bit scales, 6-bit values
  // FP8 E4M3 (OCP's "fn" variant, PyTorch's float8_e4m3fn: no infinities, max 448), one byte an
  // element. Its values mean something only with their scales (kernels/cpu/fp8.h), which travel
  // beside the tensor: conversions of it alone give the unscaled values.
  kF8E4M3,
};

// The activation of a gated MLP over its fused [gate | up] projection: out = act(gate) * up. One
// enum for the CPU kernels and the CUDA ones.
enum class GateActivation : uint8_t {
  kSilu,      // silu(g) = g / (1 + e^-g)
  kGeluTanh,  // gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), PyTorch's
              // gelu(approximate="tanh")
};

struct BlockLayout {
  int64_t elements_per_block;
  int64_t bytes_per_block;
};

std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);  // inverse of DTypeName
BlockLayout GetBlockLayout(DType dtype);
bool IsQuantized(DType dtype);

// Bytes of a row of `num_elements` elements. REQUIRES: num_elements is a multiple of the block size.
int64_t RowBytes(DType dtype, int64_t num_elements);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_DTYPE_H_
