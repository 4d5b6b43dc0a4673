// The bulk tensor copy engine (TMA) and shared-memory mbarriers (sm_90 PTX). Include only from
// .cu files; every helper here is for sm_90 and newer.

#ifndef LMSERVE_KERNELS_CUDA_TMA_CUH_
#define LMSERVE_KERNELS_CUDA_TMA_CUH_

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace lmserve::kernels::cuda {

// An mbarrier expecting `count` arrivals per phase. Follow the initializations with
// FenceBarrierInit() and a block barrier before any thread or the copy engine uses them.
__device__ __forceinline__ void BarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddress(bar)), "r"(count));
}
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more of transactions (the copies that complete on it).
__device__ __forceinline__ void BarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddress(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddress(bar)) : "memory");
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and
// waiting for parity 1 on it returns at once (the "previous" phase counts as complete).
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = SmemAddress(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

// A 2D tile [box rows][box cols] at element (col, row) of the tensor `map` describes, into shared
// memory at `smem` (aligned as the map's swizzle requires: 1024 bytes for 128-byte swizzle),
// completing `bar`'s transactions. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void TmaLoad2d(void* smem, const CUtensorMap* map, int col, int row,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(SmemAddress(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(SmemAddress(bar))
      : "memory");
}

// Fetches the descriptor into the cache ahead of its first use.
__device__ __forceinline__ void TmaPrefetchDescriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The byte offset of the 16-byte piece `piece` (0..7) of row `row` in a tile of 128-byte rows
// written by the copy engine with CU_TENSOR_MAP_SWIZZLE_128B (pieces permuted within each group
// of 8 rows, so that 8 rows of one piece column fall in 8 different bank groups).
__device__ __forceinline__ uint32_t Swizzle128(int row, int piece) {
  return static_cast<uint32_t>(row * 128 + ((piece ^ (row & 7)) << 4));
}

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_TMA_CUH_
