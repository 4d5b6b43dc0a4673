#include "kernels/cuda/dequant.h"

#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {

absl::Status DequantizeParams::Validate() const {
  if (dtype == DType::kF8E4M3) {  // scaled: kernels/cuda/fp8.h
    return KernelError("Dequantize", "F8_E4M3 tensors are converted with their scales (fp8.h)");
  }
  const int64_t block = IsQuantized(dtype) ? GetBlockLayout(dtype).elements_per_block : 32;
  if (num_elements < 0 || num_elements % block != 0 || num_elements % 32 != 0) {
    return KernelError("Dequantize", StrCat(num_elements, " elements of ", DTypeName(dtype),
                                            " is not a multiple of ", block > 32 ? block : 32));
  }
  if (output_dtype != DType::kBF16 && output_dtype != DType::kF32) {
    return KernelError("Dequantize", StrCat("output dtype ", DTypeName(output_dtype),
                                            " is not supported (supported: bf16, f32)"));
  }
  if (num_elements > 0) {
    if (src == nullptr || dst == nullptr) return KernelError("Dequantize", "null src or dst");
    if (!Aligned16(dst)) return KernelError("Dequantize", "dst must be 16-byte aligned");
    const auto address = reinterpret_cast<uintptr_t>(src);
    if ((dtype == DType::kF32 && address % 4 != 0) ||
        ((dtype == DType::kF16 || dtype == DType::kBF16) && address % 2 != 0)) {
      return KernelError("Dequantize", "src is misaligned for its element type");
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
