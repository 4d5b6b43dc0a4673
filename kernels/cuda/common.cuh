// Device helpers shared by the CUDA kernels: 16-byte vector loads and stores of 8 bf16/fp16
// elements converted to fp32 (and of 8 fp32 elements, for the element-wise kernels' fp32 path),
// warp and block reductions. Include only from .cu files.

#ifndef LMSERVE_KERNELS_CUDA_COMMON_CUH_
#define LMSERVE_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/device.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

#define LMSERVE_CUDA_RETURN_IF_ERROR(expr)    \
  do {                                        \
    const cudaError_t lmserve_err_ = (expr);  \
    if (lmserve_err_ != cudaSuccess) return lmserve_err_; \
  } while (0)

__host__ __device__ constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(float x) { return x; }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}

// Two fp32 values from one 32-bit word holding two 16-bit elements (low half first).
template <typename T>
__device__ __forceinline__ float2 Unpack2(uint32_t word);
template <>
__device__ __forceinline__ float2 Unpack2<__nv_bfloat16>(uint32_t word) {
  return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 Unpack2<__half>(uint32_t word) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = word;
  return __half22float2(h);
}

// One 32-bit word holding two 16-bit elements, each rounded to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 8 consecutive elements (16 bytes) <-> 8 fp32 values.
template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& v, float (&out)[8]) {
  const float2 a = Unpack2<T>(v.x), b = Unpack2<T>(v.y), c = Unpack2<T>(v.z), d = Unpack2<T>(v.w);
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
  out[4] = c.x, out[5] = c.y, out[6] = d.x, out[7] = d.y;
}
template <typename T>
__device__ __forceinline__ uint4 Pack8(const float (&in)[8]) {
  return make_uint4(Pack2<T>(in[0], in[1]), Pack2<T>(in[2], in[3]), Pack2<T>(in[4], in[5]),
                    Pack2<T>(in[6], in[7]));
}

// 16-byte global loads and stores. REQUIRES: 16-byte aligned addresses.
__device__ __forceinline__ uint4 Load16(const void* p) { return *static_cast<const uint4*>(p); }
// Streaming load: data read once, not kept in L1.
__device__ __forceinline__ uint4 LoadStream16(const void* p) {
  return __ldcs(static_cast<const uint4*>(p));
}
__device__ __forceinline__ void Store16(void* p, const uint4& v) { *static_cast<uint4*>(p) = v; }

// 8 fp32 values from two float4 (Load8's fp32 path).
__device__ __forceinline__ void Unpack8(const float4& a, const float4& b, float (&out)[8]) {
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
// 8 consecutive elements of T (bf16, fp16 or fp32) <-> 8 fp32 values: one 16-byte access for the
// 16-bit types, two for fp32. REQUIRES: 16-byte aligned addresses.
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float (&out)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    const auto* v = reinterpret_cast<const float4*>(p);
    Unpack8(v[0], v[1], out);
  } else {
    Unpack8<T>(Load16(p), out);
  }
}
// As Load8, streaming (data read once, not kept in L1).
template <typename T>
__device__ __forceinline__ void LoadStream8(const T* p, float (&out)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    const auto* v = reinterpret_cast<const float4*>(p);
    Unpack8(__ldcs(v), __ldcs(v + 1), out);
  } else {
    Unpack8<T>(LoadStream16(p), out);
  }
}
// Stores 8 values rounded to T (nearest even; exact for fp32).
template <typename T>
__device__ __forceinline__ void Store8(T* p, const float (&in)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(in[4], in[5], in[6], in[7]);
  } else {
    Store16(p, Pack8<T>(in));
  }
}

// An FP8 GEMM's output scales applied to 8 consecutive values of one row (a token) as a kernel
// reads them: v * (row_scale * col_scales[j]), rounded to bf16 as F8ScaleOutput (fp8.cu) stores
// it, so that a fused consumer sees exactly what it would read after that kernel. `cols`: the 8
// columns' scales, 16-byte aligned.
// The columns' scales are weights (constant): a kernel may load them before its wait.
__device__ __forceinline__ void ApplyF8OutputScales(float (&v)[8], float row_scale,
                                                    const float (&cols)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = __bfloat162float(__float2bfloat16_rn(v[j] * (row_scale * cols[j])));
  }
}
__device__ __forceinline__ void LoadAndApplyF8OutputScales(float (&v)[8], float row_scale,
                                                           const float* cols) {
  float c[8];
  Load8<float>(cols, c);
  ApplyF8OutputScales(v, row_scale, c);
}

// Rounds 8 values to T and back, as storing and reloading them would: a no-op for fp32.
template <typename T>
__device__ __forceinline__ void RoundTrip8(float (&x)[8]) {
  if constexpr (!std::is_same_v<T, float>) Unpack8<T>(Pack8<T>(x), x);
}

// act(g) of a gated MLP (GateActivation, kernels/dtype.h) in fp32, in the CPU twin's order
// (kernels/cpu/activation.h). kFastExp: SiLU takes __expf and the fast division (the 16-bit types,
// whose rounding dwarfs their errors of a few ulps; the IEEE division's instructions weighed on the
// FP8 gated activation: bench/results section 33), else expf and the IEEE division. GELU-tanh
// takes tanhf either way.
template <GateActivation kActivation, bool kFastExp>
__device__ __forceinline__ float GateActivationOf(float g) {
  if constexpr (kActivation == GateActivation::kGeluTanh) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    const float inner = kBeta * (g + kKappa * g * g * g);
    return 0.5f * g * (1.0f + tanhf(inner));
  } else if constexpr (kFastExp) {
    // 1 + e^-g past 2^126 (g below -87): __fdividef gives 0, where the quotient is below 2^-119.
    return __fdividef(g, 1.0f + __expf(-g));
  } else {
    return g / (1.0f + expf(-g));
  }
}

// Sum over the warp (float, or double where a sum must be exact to fp32); every lane gets it.
template <typename T>
__device__ __forceinline__ T WarpSum(T x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values of T (float; double
// where the fp32 norms sum their squares, as their CPU twins do). Contains __syncthreads(): every
// thread of the block must call it.
template <typename T>
__device__ __forceinline__ T BlockSum(T x, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = (blockDim.x + 31) / 32;
  x = WarpSum(x);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < num_warps ? scratch[lane] : T{0};
  return WarpSum(x);
}
__device__ __forceinline__ float BlockMax(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = (blockDim.x + 31) / 32;
  x = WarpMax(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < num_warps ? scratch[lane] : -INFINITY;
  return WarpMax(x);
}

// Programmatic dependent launch (sm_90+, where UseHopperKernels(): device.h). The kernels of a
// decoder step run back to back on one stream, most of them short; launched with LaunchKernel
// below, a kernel's blocks may be scheduled while the kernels before it still run, so its launch,
// and any prologue that reads only constant data (weights), overlap them.
//
// The contract, for every kernel launched through LaunchKernel: each thread calls
// WaitForPriorKernels() before it reads or writes any memory an earlier kernel of the stream may
// write or read (weights excepted), and before it returns. The wait returns once the previous
// kernel has completed and its writes are visible; since that kernel waited for its own
// predecessor before completing, every earlier kernel has completed too (a block that returned
// without waiting would break this chain).
// One exception: where the previous kernel calls AllowDependentLaunch() only after its own wait,
// every kernel before that one has completed by the time this one launches, so this one may read
// before its wait what those wrote and the previous kernel does not write, through L2 (__ldcg;
// L1 is not coherent). moe.cu's fused down kernel reads the router's logits so.
// AllowDependentLaunch() lets the next kernel launch once every block of this grid has called it
// (or exited). The kernels call it right after their wait, which keeps at most two kernels
// resident at once; the skinny GEMM may call it later, QKV post-processing sooner (their .cu
// files say why). (Calling it first thing, so that a chain of small kernels could be resident
// ahead of the running one, was measured slower: an H200 took 4.74 instead of 4.34 ms for a
// batch-1 decode step of Llama-3-8B's shapes.) Both are no-ops in a kernel launched without the
// attribute (older GPUs, the portable path, AllowProgrammaticLaunch(false), or plain <<<>>>),
// and compile to nothing below sm_90, so that a launch with the attribute is asked for only where
// the loaded code is sm_90's (ProgrammaticLaunchEnabled): a kernel that never waits must not be
// launched early.
__device__ __forceinline__ void WaitForPriorKernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Both, for kernels with no prologue worth overlapping.
__device__ __forceinline__ void BeginDependentKernel() {
  WaitForPriorKernels();
  AllowDependentLaunch();
}

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) on the current
// device where the kernel's bound there is below `bytes` (it is only ever raised): the attribute is
// a device's, so a process driving several GPUs (tensor parallelism) must set it on each.
cudaError_t SetMaxDynamicSharedMemory(const void* kernel, int bytes);

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch where
// enabled; the kernel must keep the contract above.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = ProgrammaticLaunchEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_COMMON_CUH_
