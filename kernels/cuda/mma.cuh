// Tensor-core and asynchronous-copy primitives: mma.sync m16n8k16 with fp32 accumulation,
// ldmatrix, cp.async (sm_80+); mbarriers and bulk copies (sm_90). Include only from .cu files.
//
// The sm_90 ones compile to their instructions only where __CUDA_ARCH__ >= 900, and trap
// elsewhere: a build for compute_80 (PTX the driver compiles for whatever GPU it meets) must not
// hold them, and the code that calls them runs only where UseHopperKernels() (device.h) holds,
// which asks the driver what code it loaded.

#ifndef LMSERVE_KERNELS_CUDA_MMA_CUH_
#define LMSERVE_KERNELS_CUDA_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lmserve::kernels::cuda {

// c += a (16x16, row) * b (16x8, col), 16-bit inputs of type T, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem_row)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem_row)));
}

// 16-byte global -> shared copy; when !valid the destination is zero-filled and nothing is read.
__device__ __forceinline__ void CpAsync16(void* smem, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(smem)),
               "l"(global), "r"(valid ? 16 : 0));
}
// 4-byte global -> shared copy (cp.async.ca: sizes under 16 bytes go through L1).
__device__ __forceinline__ void CpAsync4(void* smem, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(SmemAddress(smem)),
               "l"(global));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Shared-memory mbarriers and bulk copies (sm_90): a bulk copy moves `bytes` contiguous bytes
// from global to shared memory and counts them off the barrier's transactions; a phase completes
// when its arrivals are in and every byte announced with ArriveExpectTx has landed.
// (Each body: the instruction where __CUDA_ARCH__ >= 900 or on the host pass, else __trap().)
__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t arrivals) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddress(bar)), "r"(arrivals));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddress(bar)),
               "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddress(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  __trap();
#endif
}
// REQUIRES: 16-byte aligned addresses, bytes a multiple of 16.
__device__ __forceinline__ void BulkCopy(void* smem, const void* global, uint32_t bytes,
                                         uint64_t* bar) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SmemAddress(smem)),
      "l"(global), "r"(bytes), "r"(SmemAddress(bar))
      : "memory");
#else
  __trap();
#endif
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_MMA_CUH_
