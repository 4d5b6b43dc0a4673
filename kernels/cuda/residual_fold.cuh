// The add + RMSNorm folded into a one-row product, and the residual's add it leaves for later
// (skinny_gemm.h and fp8.h: add_norm_residual, settle_residual): the device side both skinny
// kernels share.
#ifndef LMSERVE_KERNELS_CUDA_RESIDUAL_FOLD_CUH_
#define LMSERVE_KERNELS_CUDA_RESIDUAL_FOLD_CUH_

#include "kernels/cuda/common.cuh"

namespace lmserve::kernels::cuda {

// Asks L2 for `bytes` (a multiple of 16) from p (16-byte aligned); nothing before sm_90.
__device__ __forceinline__ void PrefetchL2(const void* p, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// The row's shared memory: the kernel's dynamic shared memory, k elements of the input type.
__device__ __forceinline__ uint4* AddNormRowMemory() {
  extern __shared__ uint4 add_norm_row[];
  return add_norm_row;
}

// What a skinny kernel folds in, from its params (SkinnyGemmParams or F8SkinnyGemmParams: the
// same fields); all null where nothing.
struct ResidualFoldArgs {
  const float* add_norm_residual = nullptr;  // [k], fp32
  const void* add_norm_weight = nullptr;     // [k] of the input type
  float inv_width = 0.0f;                    // 1 / k
  float epsilon = 0.0f;
  float* settle_residual = nullptr;          // [n], fp32
};
template <typename Params>
ResidualFoldArgs ResidualFoldArgsOf(const Params& p) {
  ResidualFoldArgs f{.settle_residual = p.settle_residual};
  if (p.add_norm_residual != nullptr) {
    f.add_norm_residual = p.add_norm_residual;
    f.add_norm_weight = p.add_norm_weight;
    f.inv_width = 1.0f / static_cast<float>(p.k);
    f.epsilon = p.add_norm_epsilon;
  }
  return f;
}

// Before the wait, by one thread of a block: the norm's weight (constant, not in L2 after a
// step's other layers) asked of L2.
template <typename T>
__device__ __forceinline__ void PrefetchAddNormWeight(const ResidualFoldArgs& f, int k) {
  PrefetchL2(f.add_norm_weight, k * static_cast<int>(sizeof(T)));
}

// Eight elements of the folded row: h (x on entry) becomes (residual + x) * weight, and the
// squares of residual + x are added to `squares`. residual: the eight fp32 values as two
// float4s; weight: eight values of T.
template <typename T>
__device__ __forceinline__ void AddNormEight(float (&h)[8], const float4& r0, const float4& r1,
                                             uint4 weight, float& squares) {
  float wn[8];
  Unpack8<T>(weight, wn);
  const float rv[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    h[e] += rv[e];
    squares = fmaf(h[e], h[e], squares);
    h[e] *= wn[e];
  }
}

// The norm's scale rsqrt(mean of the squares + epsilon), from the row's sum of squares.
__device__ __forceinline__ float AddNormScaleOf(const ResidualFoldArgs& f, float squares) {
  return rsqrtf(squares * f.inv_width + f.epsilon);
}

// After the wait for the previous kernel: the block's kThreads threads write (residual + x) *
// weight into `row` (shared memory, k elements of T, 8 to a uint4) and return the sum of the
// squares of residual + x, the same in every thread. x and weight: [k] of T; residual: [k] fp32,
// all 16-byte aligned, k a multiple of 8. Ends with a block barrier: every thread calls it.
template <typename T, int kThreads>
__device__ __forceinline__ float AddNormRow(const T* x, const float* residual, const T* weight,
                                            int k, uint4* row) {
  __shared__ float warp_squares[kThreads / 32];
  float squares = 0.0f;
  for (int v = threadIdx.x; v < k / 8; v += kThreads) {
    float h[8];
    Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(x) + v), h);
    const float4* res = reinterpret_cast<const float4*>(residual) + 2 * v;
    AddNormEight<T>(h, __ldg(res), __ldg(res + 1),
                    __ldg(reinterpret_cast<const uint4*>(weight) + v), squares);
    row[v] = Pack8<T>(h);
  }
  squares = WarpSum(squares);
  if (threadIdx.x % 32 == 0) warp_squares[threadIdx.x / 32] = squares;
  __syncthreads();
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) sum += warp_squares[i];
  return sum;
}

// AddNormRow into AddNormRowMemory() with f's residual and weight, and the norm's scale
// rsqrt(mean of the squares + epsilon), the same in every thread. Every thread calls it.
template <typename T, int kThreads>
__device__ __forceinline__ float AddNormScale(const T* x, const ResidualFoldArgs& f, int k) {
  const float squares = AddNormRow<T, kThreads>(
      x, f.add_norm_residual, static_cast<const T*>(f.add_norm_weight), k, AddNormRowMemory());
  return AddNormScaleOf(f, squares);
}

// Before the wait for the previous kernel, by every lane of the warp that writes y's rows
// [row0, row0 + kRows) (those below n) after it: lane r adds row r's value as it is (what a
// folded add + RMSNorm left unadded) into the fp32 residual, all rows in one round trip. (Lane 0
// taking the rows in turn cost GGUF Q4_K's o and down projections 1.9 and 3.2 us a layer at
// batch 1 on an H200.) Where in the prologue is the kernel's choice, measured: the 16-bit and
// FP8 kernels before requesting their first weights, the integer products after. Every kernel
// that read the residual before has completed by then (common.cuh: the previous kernel lets this
// one launch only after its wait).
template <typename OutT, int kRows>
__device__ __forceinline__ void SettleResidualRows(float* residual, const OutT* y, int row0, int n,
                                                   int lane) {
  if (lane < kRows && row0 + lane < n) residual[row0 + lane] += ToFloat(y[row0 + lane]);
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_RESIDUAL_FOLD_CUH_
