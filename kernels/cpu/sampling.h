// Token sampling from logits: greedy, or temperature with top-k, top-p and min-p filtering, seeded
// per request. The CPU twin of the CUDA sampler (kernels/cuda/sampling.h); both implement exactly
// this definition, for each row:
//
//   temperature <= 0: the argmax (as Argmax in kernels/cpu/argmax.h).
//   Otherwise z_i = logit_i * (1 / temperature) (fp32; NaN logits are never chosen), M = max z
//   (no finite M, every logit NaN or -inf: token 0), w_i = exp(z_i - M). Filters, in this order,
//   each keeping ties at its boundary:
//     top-k (0 < k < vocab):  keep i if fewer than k tokens have a larger z;
//     top-p (0 < p < 1):      keep i (of the top-k set) if the weight of the kept tokens with a
//                             larger z is below p * (weight of the top-k set); p <= 0 keeps only
//                             the maximum;
//     min-p (0 < min_p):      keep i if w_i >= min_p (its probability over the maximum's).
//   u = UniformFromSeed(seed, step) (kernels/cpu/philox.h); the token is the first kept index, in
//   vocabulary order, whose cumulative kept weight exceeds u * (total kept weight).
//
// The engine's sampler (engine/core/sampler.h) selects with this function too, after the
// processing only it does (logit bias, min_tokens masking, penalties): one definition of what a
// seed draws, on the CPU and on the GPU.
//
// The CPU twin sums in double; the GPU in fp32 with a different order, so on rare draws that fall
// within rounding of a boundary the two pick neighbouring kept tokens (or, at a top-p boundary,
// keep a group more or less).
//
// Cost on the CPU, for a row of V tokens: one pass for z and the maximum, exp in double for the
// top-k set only; top-k and top-p by selection (expected O(V): partitions around medians, no
// sort), so a nucleus of any size costs about as much as a small one.

#ifndef LMSERVE_KERNELS_CPU_SAMPLING_H_
#define LMSERVE_KERNELS_CPU_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace lmserve::kernels {

// Scratch buffers for Sample, grown to the largest vocabulary seen and reused, so that sampling row
// after row allocates nothing. Its contents are Sample's business. Not thread-safe: one a thread.
struct SamplingWorkspace {
  std::vector<float> z;             // [vocab]: logits / temperature
  std::vector<float> selection;     // top-k's selection buffer
  std::vector<double> weights;      // [vocab]: exp(z - max z), valid for the candidates
  std::vector<int32_t> candidates;  // the top-k set, in vocabulary order
  std::vector<int32_t> order;       // top-p's partitioned copy of the candidates
  std::vector<uint8_t> flags;       // [vocab]: top-p's kept marks
};

struct SamplingParams {
  const float* logits = nullptr;       // [num_rows, vocab_size], row stride logits_stride
  int32_t* output = nullptr;           // [num_rows]: chosen token ids
  const float* temperature = nullptr;  // [num_rows]; <= 0: greedy
  const int32_t* top_k = nullptr;      // [num_rows]; <= 0 or >= vocab_size: off. Null: off
  const float* top_p = nullptr;        // [num_rows]; >= 1: off. Null: off
  const float* min_p = nullptr;        // [num_rows]; <= 0: off. Null: off
  const uint64_t* seeds = nullptr;     // [num_rows]: each request's seed
  const uint64_t* steps = nullptr;     // [num_rows]: each request's draw counter
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // 0 means vocab_size
  // Optional scratch, reused across calls; null: each call allocates its own.
  SamplingWorkspace* workspace = nullptr;

  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void Sample(const SamplingParams& params);

// Structured output: sets logits[t] to -inf for every token t whose bit (bit t % 32 of
// bitmask[t / 32]) is clear; the CPU twin of kernels/cuda/token_bitmask.h.
void ApplyTokenBitmask(float* logits, const uint32_t* bitmask, int64_t vocab_size);

// The decision for one row (temperature > 0), for tests: which tokens are kept, their weights
// w_i (0 for the others), the target u * total kept weight, and the token (Sample's for the same
// row and u).
struct SamplingDecision {
  std::vector<bool> kept;
  std::vector<double> weights;
  double target = 0;
  int32_t token = 0;
};
SamplingDecision SampleRow(const float* logits, int64_t vocab_size, float temperature,
                           int32_t top_k, float top_p, float min_p, float uniform);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_SAMPLING_H_
