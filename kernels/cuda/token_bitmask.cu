#include <limits>

#include "kernels/cuda/token_bitmask.h"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per logit: the 32 threads of a warp read one mask word (a broadcast) and write 32
// consecutive logits (coalesced). Grid: x over the vocabulary, y over rows.
__global__ void __launch_bounds__(kThreads)
    TokenBitmaskKernel(float* logits, const uint32_t* bitmask, const int32_t* mask_index,
                       int64_t vocab_size, int64_t stride, int64_t words) {
  const int64_t row = blockIdx.y;
  const int32_t mask = mask_index[row];
  if (mask < 0) return;
  const uint32_t* row_mask = bitmask + int64_t{mask} * words;
  float* row_logits = logits + row * stride;
  const int64_t step = int64_t{gridDim.x} * kThreads;
  for (int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x; t < vocab_size; t += step) {
    if (((row_mask[t >> 5] >> (t & 31)) & 1u) == 0u) {
      row_logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

constexpr int kGatedThreads = 512;
// Mask words staged in shared memory at once (16 KB: 131,072 tokens).
constexpr int kGatedStageWords = 4096;

__device__ __forceinline__ uint64_t LoadAcquireSystem(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void StoreRelaxedSystem(uint64_t* address, uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Waits for the release of step `want` (acquire at system scope: the host's stores of the
// masks, made before its release store, are visible after it), at most timeout_ns. Returns
// whether the masks are to be applied; a timeout writes the step's number to *timed_out (the host
// fails the step). `waited`: the ns spent waiting.
__device__ __forceinline__ bool WaitForRelease(uint64_t want, const uint64_t* release,
                                               uint64_t* timed_out, int64_t timeout_ns,
                                               uint64_t* waited) {
  const uint64_t start = GlobalTimerNs();
  uint64_t seen = LoadAcquireSystem(release);
  while ((seen & ~kTokenBitmaskAbandoned) < want &&
         GlobalTimerNs() - start < static_cast<uint64_t>(timeout_ns)) {
    __nanosleep(200);
    seen = LoadAcquireSystem(release);
  }
  *waited = GlobalTimerNs() - start;  // the first read's own latency included
  if ((seen & ~kTokenBitmaskAbandoned) < want) {
    StoreRelaxedSystem(timed_out, want);
    return false;
  }
  return seen != (want | kTokenBitmaskAbandoned);
}

// One thread polls for the whole step and writes the outcome to *gate (device memory): the
// step's number to apply the masks, 0 not to. A launch without masked rows returns at once.
__global__ void GatedTokenBitmaskWaitKernel(const int32_t* mask_index, int64_t num_rows,
                                            const uint64_t* step, const uint64_t* release,
                                            uint64_t* timed_out, uint64_t* gate,
                                            uint64_t* waited_ns, int64_t timeout_ns) {
  bool any = false;
  for (int64_t r = threadIdx.x; r < num_rows; r += 32) any |= mask_index[r] >= 0;
  if (!__any_sync(0xffffffffu, any) || threadIdx.x != 0) return;
  const uint64_t want = *step;
  uint64_t waited = 0;
  *gate = WaitForRelease(want, release, timed_out, timeout_ns, &waited) ? want : 0;
  if (waited_ns != nullptr) StoreRelaxedSystem(waited_ns, waited);
}

// One block a row: a masked row's block (where the gate, written by the wait kernel before it in
// stream order, says so; or, polling per row, once its thread 0 has seen the release) stages the
// row's mask in shared memory, a piece at a time, and clears the logits of the tokens it drops.
template <bool kPollPerRow>
__global__ void __launch_bounds__(kGatedThreads)
    GatedTokenBitmaskKernel(float* logits, const uint32_t* bitmask, const int32_t* mask_index,
                            const uint64_t* step, const uint64_t* gate, const uint64_t* release,
                            uint64_t* timed_out, int64_t vocab_size, int64_t stride,
                            int64_t words, int64_t timeout_ns) {
  __shared__ uint32_t stage[kGatedStageWords];
  __shared__ int apply;
  const int64_t row = blockIdx.x;
  const int32_t mask = mask_index[row];
  if (mask < 0) return;
  if constexpr (kPollPerRow) {
    if (threadIdx.x == 0) {
      uint64_t waited = 0;
      apply = WaitForRelease(*step, release, timed_out, timeout_ns, &waited) ? 1 : 0;
    }
    __syncthreads();
    if (apply == 0) return;
  } else {
    if (*gate != *step) return;
  }
  const uint32_t* row_mask = bitmask + int64_t{mask} * words;
  float* row_logits = logits + row * stride;
  for (int64_t first_word = 0; first_word < words; first_word += kGatedStageWords) {
    const int64_t count =
        words - first_word < kGatedStageWords ? words - first_word : int64_t{kGatedStageWords};
    // ld.global.cv: fetched again, never a line some cache held from before the release.
    for (int64_t w = threadIdx.x; w < count; w += kGatedThreads) {
      stage[w] = __ldcv(row_mask + first_word + w);
    }
    __syncthreads();
    const int64_t first_token = first_word * 32;
    const int64_t end_token =
        (first_word + count) * 32 < vocab_size ? (first_word + count) * 32 : vocab_size;
    for (int64_t t = first_token + threadIdx.x; t < end_token; t += kGatedThreads) {
      const int64_t i = t - first_token;
      if (((stage[i >> 5] >> (i & 31)) & 1u) == 0u) {
        row_logits[t] = -std::numeric_limits<float>::infinity();
      }
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t Launch(const GatedTokenBitmaskParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_rows == 0 || p.vocab_size == 0) return cudaSuccess;
  const int64_t stride = p.logits_stride == 0 ? p.vocab_size : p.logits_stride;
  const int64_t words = (p.vocab_size + 31) / 32;
  const auto blocks = static_cast<unsigned>(p.num_rows);
  if (p.poll_per_row) {
    GatedTokenBitmaskKernel<true><<<blocks, kGatedThreads, 0, stream>>>(
        p.logits, p.bitmask, p.mask_index, p.step, p.gate, p.release, p.timed_out, p.vocab_size,
        stride, words, p.timeout_ns);
    return cudaGetLastError();
  }
  GatedTokenBitmaskWaitKernel<<<1, 32, 0, stream>>>(p.mask_index, p.num_rows, p.step, p.release,
                                                    p.timed_out, p.gate, p.waited_ns,
                                                    p.timeout_ns);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  GatedTokenBitmaskKernel<false><<<blocks, kGatedThreads, 0, stream>>>(
      p.logits, p.bitmask, p.mask_index, p.step, p.gate, p.release, p.timed_out, p.vocab_size,
      stride, words, p.timeout_ns);
  return cudaGetLastError();
}

cudaError_t Launch(const TokenBitmaskParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_rows == 0 || p.vocab_size == 0) return cudaSuccess;
  const int64_t stride = p.logits_stride == 0 ? p.vocab_size : p.logits_stride;
  const int64_t words = (p.vocab_size + 31) / 32;
  const int64_t blocks = std::min<int64_t>((p.vocab_size + kThreads - 1) / kThreads, 128);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.num_rows));
  TokenBitmaskKernel<<<grid, kThreads, 0, stream>>>(p.logits, p.bitmask, p.mask_index,
                                                    p.vocab_size, stride, words);
  return cudaGetLastError();
}

}  // namespace lmserve::kernels::cuda
