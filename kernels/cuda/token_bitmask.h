// Structured output on the GPU: masks logits rows to -inf where a packed vocabulary bitmask has a
// clear bit, before sampling. The CPU twin is kernels::ApplyTokenBitmask (kernels/cpu/sampling.h).
//
// Row r is masked by bitmask[mask_index[r] * words, ...) with words = ceil(vocab_size / 32): bit
// t % 32 of word t / 32 keeps token t. A row whose mask_index is negative is left alone, so one
// launch serves a batch that mixes constrained and free rows (and an all-free batch costs one
// launch that writes nothing).
//
// GatedTokenBitmaskParams: the same masking where the masks come after the launch. The host
// writes them (into device memory by a copy it has waited for, or into pinned, host-mapped
// memory) while the kernels before this one run, then releases the step by storing its number
// into a host-mapped word (ReleaseTokenBitmasks). One thread on the device waits until the
// release reaches the step's number and passes the outcome on through device memory; then each
// masked row's block reads its mask (ld.global.cv: never a stale cached line) and applies it. A
// row without a mask neither waits nor reads, so a step with no masked row costs two launches
// that return at once. That lets a CUDA graph hold the draw of every decode step, masked or not.
// The wait is bounded: after timeout_ns without the release the wait gives up, the rows are left
// unmasked and the step's number is written to *timed_out (host-mapped), which the host checks
// after the step to fail it. A release with kTokenBitmaskAbandoned set ends the wait without
// masking (the host has given the step up).

#ifndef LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_
#define LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels::cuda {

struct TokenBitmaskParams {
  float* logits = nullptr;             // [num_rows, logits_stride] fp32, masked in place; device
  const uint32_t* bitmask = nullptr;   // [masks, ceil(vocab_size / 32)]; device
  const int32_t* mask_index = nullptr; // [num_rows]: each row's mask, < 0: none; device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // 0 means vocab_size

  absl::Status Validate() const;
};

cudaError_t Launch(const TokenBitmaskParams& params, cudaStream_t stream);

// Or'ed into a release: the step is given up, its masks are not to be read.
constexpr uint64_t kTokenBitmaskAbandoned = uint64_t{1} << 63;

struct GatedTokenBitmaskParams {
  float* logits = nullptr;                 // [num_rows, logits_stride] fp32, masked in place; device
  // [masks, ceil(vocab_size / 32)]: device memory, or pinned host memory by its device address
  // (cudaHostGetDevicePointer); complete before the release, read only after it.
  const uint32_t* bitmask = nullptr;
  const int32_t* mask_index = nullptr;     // [num_rows]: each row's mask, < 0: none; device
  const uint64_t* step = nullptr;          // [1]: the step number the masked rows wait for; device
  const uint64_t* release = nullptr;       // [1]: the last released step (| kTokenBitmaskAbandoned);
                                           // host-mapped, written by the host only
  uint64_t* timed_out = nullptr;           // [1]: set to the step number when a wait times out;
                                           // host-mapped
  uint64_t* gate = nullptr;                // [1]: the wait's outcome for the masking; device
  // Optional ([1], host-mapped, or null): a masked step's wait writes how long it waited for the
  // release, in ns of the GPU's clock, from its first read of the release word (whose latency is
  // included) to the read that saw the step.
  uint64_t* waited_ns = nullptr;
  // Every masked row's block polls the release itself (the former design; for measurements):
  // one launch, no gate; waited_ns is not written.
  bool poll_per_row = false;
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // 0 means vocab_size
  int64_t timeout_ns = 0;     // > 0: how long a masked row waits for the release

  absl::Status Validate() const;
};

// Two plain launches (no programmatic dependent launch: each starts after the kernels before it
// have completed): one thread polls the release for the whole step and writes the outcome to
// *gate (every masked row's block polling the host-mapped word at once made the masking take
// ~70 us on an H100: reads of one host line completing one after another); then one block a row
// (at most 2^31 - 1 rows) masks where the gate says so. A step without masked rows neither polls
// nor writes.
cudaError_t Launch(const GatedTokenBitmaskParams& params, cudaStream_t stream);

// The host's side: stores `step` (| kTokenBitmaskAbandoned when `abandoned`) into `release` (the
// host address of GatedTokenBitmaskParams::release) with release semantics, after every store
// this thread made before it (the masks) — what the device's acquire load pairs with.
void ReleaseTokenBitmasks(uint64_t* release, uint64_t step, bool abandoned);
// The host's read of GatedTokenBitmaskParams::timed_out (its host address), after the step.
uint64_t TokenBitmaskTimedOutStep(const uint64_t* timed_out);
// The host's read of GatedTokenBitmaskParams::waited_ns (its host address), after the step.
uint64_t TokenBitmaskWaitedNs(const uint64_t* waited_ns);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_TOKEN_BITMASK_H_
