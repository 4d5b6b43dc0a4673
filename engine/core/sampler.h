// The sampler: picks a sequence's next token from its fp32 logits row, on the CPU.
//
// Randomness is a pure function of (seed, sample index, position): SampleUniform gives the one
// uniform draw that decides the token at that position, so a seeded request's tokens do not depend
// on batch composition, preemption or the order of anything else.

#ifndef LMSERVE_ENGINE_CORE_SAMPLER_H_
#define LMSERVE_ENGINE_CORE_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/request.h"

namespace lmserve::engine {

// A uniform draw in [0, 1) for the token at `position` (its index in prompt + output) of sample
// `sample_index` of a request seeded `seed`.
double SampleUniform(uint64_t seed, int32_t sample_index, int64_t position);

// The next value of a splitmix64 generator (the engine's source of per-request seeds).
uint64_t SplitMix64(uint64_t* state);

class Sampler {
 public:
  explicit Sampler(int64_t vocab_size);

  // Returns the token chosen from `logits` ([vocab_size]) under `params`, in the order that
  // SamplingParams documents. `prompt` and `output` are the sequence's tokens so far (for
  // penalties and min_tokens); `eos_token_ids` are suppressed before min_tokens unless ignore_eos.
  // `uniform` in [0, 1) decides among the kept tokens (unused when greedy). Engine thread only.
  int32_t Sample(std::span<const float> logits, const SamplingParams& params,
                 std::span<const int32_t> prompt, std::span<const int32_t> output,
                 std::span<const int32_t> eos_token_ids, double uniform);

  // The raw logprob (log-softmax of `logits`) of `token_id`, its rank and the `num_top` most likely
  // tokens.
  PositionLogprobs Logprobs(std::span<const float> logits, int32_t token_id, int32_t num_top);

 private:
  const int64_t vocab_size_;
  std::vector<float> work_;          // [vocab_size] processed logits
  std::vector<int32_t> counts_;      // [vocab_size] occurrences in the output; zero between calls
  std::vector<uint8_t> seen_;        // [vocab_size] in prompt or output; zero between calls
  std::vector<int32_t> candidates_;  // token ids still in play
  std::vector<double> probs_;        // [vocab_size] unnormalized probabilities
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_SAMPLER_H_
