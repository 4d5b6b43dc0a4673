// Conversion of weight tensors to bf16 or fp32 on the GPU: the GGUF block formats (Q8_0, Q4_0,
// Q4_1, Q4_K, Q5_K, Q6_K) and F32, F16, BF16. Each element is computed in fp32 with the
// arithmetic, in the order, of llama.cpp's dequantize_row_* (the CPU twin, kernels/cpu/dequant.h,
// is bit-exact with it; no fused multiply-adds here either), then stored as fp32 or rounded to
// bf16 (nearest even): the result equals DequantizeToF32(...), or F32ToBf16 of it, bit for bit.

#ifndef LMSERVE_KERNELS_CUDA_DEQUANT_H_
#define LMSERVE_KERNELS_CUDA_DEQUANT_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct DequantizeParams {
  const void* src = nullptr;  // num_elements of `dtype` in its GGUF block layout; device; any
                              // alignment (F16/BF16: 2 bytes, F32: 4 bytes)
  void* dst = nullptr;        // [num_elements] of output_dtype; device; 16-byte aligned
  int64_t num_elements = 0;   // a multiple of 32 (256 for the K-quants)
  DType dtype = DType::kQ8_0;         // of src
  DType output_dtype = DType::kBF16;  // of dst: kBF16 or kF32

  absl::Status Validate() const;
};

cudaError_t Launch(const DequantizeParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_DEQUANT_H_
