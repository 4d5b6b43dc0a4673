// Host-side helpers for the Validate() functions of the CUDA kernels.

#ifndef LMSERVE_KERNELS_CUDA_CHECK_H_
#define LMSERVE_KERNELS_CUDA_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// OK if `dtype` is an activation type the kernels compile (bf16, f16); else names the kernel.
absl::Status CheckActivationDType(const char* kernel, DType dtype);

// InvalidArgument "<kernel>: <message>".
absl::Status KernelError(const char* kernel, const std::string& message);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_CHECK_H_
