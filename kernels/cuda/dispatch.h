// Runtime-to-compile-time dispatch for the CUDA kernels: the one place that lists which element
// types, head dimensions and query-group sizes are compiled.
//
// Validate() functions (host .cc files) use the Supports*() predicates and the *List() strings to
// explain what is unsupported; launchers (.cu files) use the Dispatch*() templates, whose default
// branch prints the supported values and returns cudaErrorInvalidValue (reaching it means the
// caller skipped Validate()).

#ifndef LMSERVE_KERNELS_CUDA_DISPATCH_H_
#define LMSERVE_KERNELS_CUDA_DISPATCH_H_

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "kernels/dtype.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace lmserve::kernels::cuda {

// Activations, weights and the KV cache of the 16-bit kernels (math inside is fp32): bf16 or
// fp16. The tensor-core kernels (decode and prefill attention, the skinny GEMM) take only these.
inline bool SupportsActivationDType(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16;
}
inline constexpr const char* kActivationDTypeList = "bf16, f16";

// The element-wise and row-wise kernels (norms, QKV post-processing, SiLU-and-mul, embedding,
// random fill) also take fp32, the runner's float32 mode.
inline bool SupportsElementwiseDType(DType dtype) {
  return SupportsActivationDType(dtype) || dtype == DType::kF32;
}
inline constexpr const char* kElementwiseDTypeList = "bf16, f16, f32";

// Head dimensions of the attention kernels.
inline bool SupportsHeadDim(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}
inline constexpr const char* kHeadDimList = "32, 64, 80, 96, 128, 256";

#ifdef __CUDACC__

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<__nv_bfloat16>{}) or f(TypeTag<__half>{}): never instantiates a kernel for float.
template <typename F>
cudaError_t DispatchActivationDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBF16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kF16:
      return f(TypeTag<__half>{});
    default:
      std::fprintf(stderr, "lmserve CUDA kernels: dtype %d is not supported (supported: %s)\n",
                   static_cast<int>(dtype), kActivationDTypeList);
      return cudaErrorInvalidValue;
  }
}

// Calls f(TypeTag<__nv_bfloat16>{}), f(TypeTag<__half>{}) or f(TypeTag<float>{}).
template <typename F>
cudaError_t DispatchElementwiseDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBF16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kF16:
      return f(TypeTag<__half>{});
    case DType::kF32:
      return f(TypeTag<float>{});
    default:
      std::fprintf(stderr, "lmserve CUDA kernels: dtype %d is not supported (supported: %s)\n",
                   static_cast<int>(dtype), kElementwiseDTypeList);
      return cudaErrorInvalidValue;
  }
}

// Calls f(std::integral_constant<int, head_dim>{}).
template <typename F>
cudaError_t DispatchHeadDim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 80:
      return f(std::integral_constant<int, 80>{});
    case 96:
      return f(std::integral_constant<int, 96>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    default:
      std::fprintf(stderr, "lmserve CUDA kernels: head_dim %lld is not supported (supported: %s)\n",
                   static_cast<long long>(head_dim), kHeadDimList);
      return cudaErrorInvalidValue;
  }
}

#endif  // __CUDACC__

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_DISPATCH_H_
