// Host-side helpers for the Validate() functions of the CUDA kernels.

#ifndef LMSERVE_KERNELS_CUDA_CHECK_H_
#define LMSERVE_KERNELS_CUDA_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// OK if `dtype` is an activation type the 16-bit kernels compile (bf16, f16); else names the
// kernel.
absl::Status CheckActivationDType(const char* kernel, DType dtype);
// As CheckActivationDType, for the kernels built for the 16-bit types only (attention on the
// tensor cores, the skinny GEMM): an fp32 dtype gets an error that names `f32_instead`, the way
// to do it in fp32.
absl::Status CheckHalfDType(const char* kernel, DType dtype, const char* f32_instead);
// OK if `dtype` is a type the element-wise kernels compile (bf16, f16, f32); else names the kernel.
absl::Status CheckElementwiseDType(const char* kernel, DType dtype);
// OK if `dtype` is an element-wise type and `other` (the type of one tensor, named `field`;
// nullopt means dtype) is dtype or F32 (the fp32 residual stream beside 16-bit activations); else
// names the kernel.
absl::Status CheckDTypeOrF32(const char* kernel, const char* field, DType dtype,
                             std::optional<DType> other);

// OK if the attention kernels' `window` (0: none, else positive) and `softcap` (0: none, else
// positive and finite) are valid; else names the kernel.
absl::Status CheckWindowAndSoftcap(const char* kernel, int32_t window, float softcap);

// OK if an FP8 GEMM's output scales, applied by the kernel that reads the product (GemmPlan::Run's
// `unscaled`: value * (rows[t] * cols[j]), rounded to bf16), are both null, or both set beside bf16
// data with `cols` 16-byte aligned; else names the kernel.
absl::Status CheckF8OutputScales(const char* kernel, const float* rows, const float* cols,
                                 DType dtype);

// InvalidArgument "<kernel>: <message>".
absl::Status KernelError(const char* kernel, const std::string& message);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_CHECK_H_
