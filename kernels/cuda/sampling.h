// Token selection on the GPU: greedy argmax, and sampling with temperature, top-k, top-p and min-p,
// seeded per request. CPU twins: kernels/cpu/argmax.h and kernels/cpu/sampling.h, whose header
// gives the exact definition both implement.
//
// The sampler never sorts the vocabulary. One thread block of 1024 threads per row:
//   1. one pass for the maximum and the softmax normalizer; with a filter (and a vocabulary of at
//      most 32 x 65,536), the same pass also collects the candidates, warp by warp: each of the
//      32 warps reads its own contiguous part of the row (coalesced float4 segments, the next
//      batch's loads in flight) and keeps the tokens within 10.5 nats of max(its own running
//      maximum, the block's maximum shared at a barrier after each of its first 8 batches) in its
//      own region of shared memory (a key and a 16-bit offset), with no other block barrier; a
//      warp whose region would overflow raises a floor under its tokens a nat at a time until it
//      is half full. Both maxima are at most the row's, so a region holds every token of its
//      part within 10.5 nats of the row's maximum and at or above its floor, and what it holds
//      depends on the row alone. Then the smallest of five windows (4, 6, 8, 9, 10 nats below the
//      maximum) whose tokens hold the kept set (top-k's k tokens, top-p's mass, min-p's range),
//      above every warp's floor, is gathered, in vocabulary order, and step 4 runs on it: the row
//      is read once (typical logits; the truncation first, as Qrita's sigma-truncation and
//      FlashInfer's pivots avoid a sort, but exact). Otherwise (flat rows, or a window past a
//      floor or past the gathered arrays' capacity):
//   2. one pass for a count histogram of the distance from the maximum,
//      d = max z - z in [0, 16) in 2048 bins, which bounds the kept set from below (top-k by count,
//      top-p by a lower bound on each bin's weight, min-p directly);
//   3. one pass that compacts the tokens above that bound, in vocabulary order, into shared memory
//      (up to kSamplingCandidates on the Hopper path, 220 KB of shared memory with the histogram;
//      up to kSamplingCandidatesPortable on the portable path, 76 KB, which fits every sm_80+
//      GPU: 163 KB a block on A100, 99 KB on sm_86/sm_89; when more, or when the bound falls past
//      the histogram's range, the next steps read global memory instead: the same tokens);
//   4. exact top-k and top-p thresholds by radix selection over the candidates (digits of 11
//      bits or fewer of the order-preserving key of z minus the lower bound, from the highest bit
//      of the candidates' key span down), then an ordered prefix-sum search for the token that
//      u * (kept weight) falls on.
// Every per-row setting is read from device memory, so one launch serves any mix of requests.
//
// Greedy rows of a launch with few rows (at most kSamplingSplitRows) and a workspace split their
// argmax over up to kSamplingMaxSplits blocks: each block takes a slice of the row and the last
// to finish (a counter in the workspace) picks among the slices' winners. On an H200, Llama-3's
// 128256 entries: 14 -> 6.7 us at one row, 16 -> 10.6 us at 8; at 64 rows (4 blocks a row) it
// took 18.8 us against 16.8 with a block a row, hence the row limit.

#ifndef LMSERVE_KERNELS_CUDA_SAMPLING_H_
#define LMSERVE_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels::cuda {

inline constexpr int kSamplingCandidates = 16384;
inline constexpr int kSamplingCandidatesPortable = 4096;
inline constexpr int64_t kSamplingSplitRows = 16;
inline constexpr int kSamplingMaxSplits = 32;
// The workspace of a split argmax: a counter a row, then each row's slice winners.
inline constexpr int64_t kSamplingWorkspaceBytes =
    kSamplingSplitRows * (4 + kSamplingMaxSplits * 8);
inline constexpr int kSamplingProfileStamps = 7;

struct ArgmaxParams {
  const float* logits = nullptr;  // [num_rows, vocab_size], row stride logits_stride; device
  int32_t* output = nullptr;      // [num_rows]; device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;     // multiple of 4
  int64_t logits_stride = 0;  // multiple of 4; 0 means vocab_size

  absl::Status Validate() const;
};

struct SamplingParams {
  const float* logits = nullptr;       // [num_rows, vocab_size], row stride logits_stride; device
  int32_t* output = nullptr;           // [num_rows]: token ids; device
  const float* temperature = nullptr;  // [num_rows]; <= 0: greedy; device
  const int32_t* top_k = nullptr;      // [num_rows]; <= 0 or >= vocab_size: off; device; null: off
  const float* top_p = nullptr;        // [num_rows]; >= 1: off; device; null: off
  const float* min_p = nullptr;        // [num_rows]; <= 0: off; device; null: off
  const uint64_t* seeds = nullptr;     // [num_rows]: each request's seed; device
  const uint64_t* steps = nullptr;     // [num_rows]: each request's draw counter; device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;     // multiple of 4
  int64_t logits_stride = 0;  // multiple of 4; 0 means vocab_size
  // Optional: kSamplingWorkspaceBytes of device memory, zero before its first launch (a launch
  // leaves it zero), used by one launch at a time. Null: one block a row.
  void* workspace = nullptr;
  // Diagnostics (lmserve-kernels-bench): when set, [num_rows, kSamplingProfileStamps] device
  // memory that each sampled row's block fills with SM clock stamps (clock64, thread 0) at the
  // ends of its steps: its start, pass 1, the window and its gathering, the histogram path, the
  // thresholds, the kept weight, the token. Greedy rows write nothing; rows with no finite logit
  // only the first two.
  long long* profile = nullptr;

  absl::Status Validate() const;
};

// Async scheduling: a step's input tokens that the step before it drew, taken from that step's
// draws on the device: ids[pairs[2i]] = sampled[pairs[2i + 1]] for i < count.
struct PendingTokensParams {
  int32_t* ids = nullptr;            // the step's token ids; device
  const int32_t* pairs = nullptr;    // [count, 2]: (token index, row of `sampled`); device
  const int32_t* sampled = nullptr;  // the step before's drawn tokens, by logits row; device
  int64_t count = 0;

  absl::Status Validate() const;
};

cudaError_t Launch(const ArgmaxParams& params, cudaStream_t stream);
cudaError_t Launch(const SamplingParams& params, cudaStream_t stream);
cudaError_t Launch(const PendingTokensParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_SAMPLING_H_
