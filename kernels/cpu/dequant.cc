// Interim: the 16- and 32-bit float types. The GGUF block formats land with the GGUF reader.
#include "kernels/cpu/dequant.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/half.h"

namespace lmserve::kernels {

void DequantizeToF32(DType dtype, const void* src, float* dst, int64_t num_elements) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(num_elements) * 4);
      return;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < num_elements; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        dst[i] = dtype == DType::kF16 ? F16ToF32(bits) : Bf16ToF32(bits);
      }
      return;
    default:
      std::fprintf(stderr, "DequantizeToF32: %s not implemented yet\n",
                   std::string(DTypeName(dtype)).c_str());
      std::abort();
  }
}

void QuantizeQ8_0(const float* src, void* dst, int64_t num_elements) {
  std::fprintf(stderr, "QuantizeQ8_0: not implemented yet\n");
  std::abort();
}

}  // namespace lmserve::kernels
