// The sampler: picks a sequence's next token from its fp32 logits row, on the CPU.
//
// Two halves. First what only the engine does to a row (SamplingParams' logit_bias, min_tokens
// masking of EOS and stop tokens, repetition/presence/frequency penalties). Then the selection
// (temperature, top-k, top-p, min-p and the seeded draw), which is kernels::Sample itself
// (kernels/cpu/sampling.h): the CPU twin of the CUDA runner's sampler, so a row the engine samples
// and a row the runner samples (LogitsMode::kSample) pick the same token from the same logits.
//
// Randomness: the token at `position` of sample `sample_index` of a request seeded `seed` is drawn
// with Philox key kernels::SampleStreamKey(seed, sample_index) and counter `position`
// (kernels/cpu/philox.h): a pure function of those three and the logits. Whether the logits
// themselves depend on the batch is the runner's business (see lmserve.proto's `seed`).

#ifndef LMSERVE_ENGINE_CORE_SAMPLER_H_
#define LMSERVE_ENGINE_CORE_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/request.h"
#include "kernels/cpu/sampling.h"

namespace lmserve::engine {

// The uniform draw in [0, 1) (24 random bits) that decides the token at `position` (its index in
// prompt + output) of sample `sample_index` of a request seeded `seed`:
// kernels::UniformFromSeed(kernels::SampleStreamKey(seed, sample_index), position).
float SampleUniform(uint64_t seed, int32_t sample_index, int64_t position);

class Sampler {
 public:
  explicit Sampler(int64_t vocab_size);

  // Returns the token chosen from `logits` ([vocab_size]) under `params`, in the order that
  // SamplingParams documents. `prompt` and `output` are the sequence's tokens so far (for
  // penalties and min_tokens); `eos_token_ids` are suppressed before min_tokens unless ignore_eos.
  // The processed row (fp32) then goes to kernels::Sample with the temperature, top-p and min-p
  // as fp32 (as RunnerSampling carries them), the Philox key `stream_key`
  // (kernels::SampleStreamKey(seed, sample_index)) and counter `position`. Greedy (temperature 0)
  // is the argmax, lowest id among equal maxima; a row with every token masked to -inf gives
  // token 0 either way. Engine thread only.
  // `allowed_tokens` (empty: all) is a structured-output bitmask: bit t of word t / 32 keeps
  // token t; the others are masked to -inf after the penalties (kernels::ApplyTokenBitmask).
  int32_t Sample(std::span<const float> logits, const SamplingParams& params,
                 std::span<const int32_t> prompt, std::span<const int32_t> output,
                 std::span<const int32_t> eos_token_ids, uint64_t stream_key, int64_t position,
                 std::span<const uint32_t> allowed_tokens = {});

  // The raw logprob (log-softmax of `logits`) of `token_id`, its rank and the `num_top` most likely
  // tokens.
  PositionLogprobs Logprobs(std::span<const float> logits, int32_t token_id, int32_t num_top);

 private:
  const int64_t vocab_size_;
  std::vector<float> work_;          // [vocab_size] processed logits
  std::vector<int32_t> counts_;      // [vocab_size] occurrences in the output; zero between calls
  std::vector<uint8_t> seen_;        // [vocab_size] in prompt or output; zero between calls
  std::vector<int32_t> candidates_;  // Logprobs' top-n selection
  kernels::SamplingWorkspace selection_;  // kernels::Sample's scratch
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_SAMPLER_H_
