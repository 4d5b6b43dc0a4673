#include "engine/core/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "engine/core/check.h"
#include "kernels/cpu/philox.h"

namespace lmserve::engine {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

}  // namespace

float SampleUniform(uint64_t seed, int32_t sample_index, int64_t position) {
  return kernels::UniformFromSeed(
      kernels::SampleStreamKey(seed, static_cast<uint64_t>(sample_index)),
      static_cast<uint64_t>(position));
}

Sampler::Sampler(int64_t vocab_size)
    : vocab_size_(vocab_size),
      work_(static_cast<size_t>(vocab_size)),
      counts_(static_cast<size_t>(vocab_size), 0),
      seen_(static_cast<size_t>(vocab_size), 0) {}

int32_t Sampler::Sample(std::span<const float> logits, const SamplingParams& params,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        std::span<const int32_t> eos_token_ids, uint64_t stream_key,
                        int64_t position, std::span<const uint32_t> allowed_tokens) {
  LMSERVE_CORE_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "logits row has ",
                     logits.size(), " entries for a vocabulary of ", vocab_size_);
  work_.assign(logits.begin(), logits.end());
  for (const auto& [token_id, bias] : params.logit_bias) work_[token_id] += bias;

  if (static_cast<int64_t>(output.size()) < params.min_tokens) {
    if (!params.ignore_eos) {
      for (int32_t token_id : eos_token_ids) work_[token_id] = kNegativeInfinity;
    }
    for (int32_t token_id : params.stop_token_ids) work_[token_id] = kNegativeInfinity;
  }

  if (params.repetition_penalty != 1.0) {
    const float penalty = static_cast<float>(params.repetition_penalty);
    auto penalize = [&](int32_t token_id) {
      if (seen_[token_id] != 0) return;
      seen_[token_id] = 1;
      float& logit = work_[token_id];
      logit = logit > 0.0f ? logit / penalty : logit * penalty;
    };
    for (int32_t token_id : prompt) penalize(token_id);
    for (int32_t token_id : output) penalize(token_id);
    for (int32_t token_id : prompt) seen_[token_id] = 0;
    for (int32_t token_id : output) seen_[token_id] = 0;
  }

  if (params.presence_penalty != 0.0 || params.frequency_penalty != 0.0) {
    for (int32_t token_id : output) ++counts_[token_id];
    for (int32_t token_id : output) {
      if (counts_[token_id] == 0) continue;  // already applied
      work_[token_id] -= static_cast<float>(params.frequency_penalty * counts_[token_id] +
                                            params.presence_penalty);
      counts_[token_id] = 0;
    }
  }

  if (!allowed_tokens.empty()) {
    LMSERVE_CORE_CHECK(static_cast<int64_t>(allowed_tokens.size()) == (vocab_size_ + 31) / 32,
                       "a token bitmask of ", allowed_tokens.size(), " words for a vocabulary of ",
                       vocab_size_);
    kernels::ApplyTokenBitmask(work_.data(), allowed_tokens.data(), vocab_size_);
  }

  // The selection: the device sampler's definition, with the values RunnerSampling would carry.
  const float temperature = static_cast<float>(params.temperature);
  const int32_t top_k = params.top_k;
  const float top_p = static_cast<float>(params.top_p);
  const float min_p = static_cast<float>(params.min_p);
  const auto step = static_cast<uint64_t>(position);
  int32_t token = -1;
  kernels::Sample({.logits = work_.data(),
                   .output = &token,
                   .temperature = &temperature,
                   .top_k = &top_k,
                   .top_p = &top_p,
                   .min_p = &min_p,
                   .seeds = &stream_key,
                   .steps = &step,
                   .num_rows = 1,
                   .vocab_size = vocab_size_,
                   .workspace = &selection_});
  return token;
}

PositionLogprobs Sampler::Logprobs(std::span<const float> logits, int32_t token_id,
                                   int32_t num_top) {
  LMSERVE_CORE_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "logits row has ",
                     logits.size(), " entries for a vocabulary of ", vocab_size_);
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(static_cast<double>(logit) - max_logit);
  const double log_normalizer = max_logit + std::log(sum);

  PositionLogprobs result;
  result.token_id = token_id;
  result.logprob = static_cast<float>(logits[token_id] - log_normalizer);
  result.rank = 1;
  for (float logit : logits) {
    if (logit > logits[token_id]) ++result.rank;
  }
  const int32_t count = std::min<int32_t>(num_top, static_cast<int32_t>(vocab_size_));
  if (count > 0) {
    candidates_.resize(static_cast<size_t>(vocab_size_));
    for (int32_t i = 0; i < vocab_size_; ++i) candidates_[i] = i;
    std::partial_sort(candidates_.begin(), candidates_.begin() + count, candidates_.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (int32_t i = 0; i < count; ++i) {
      const int32_t id = candidates_[i];
      result.top.push_back({id, static_cast<float>(logits[id] - log_normalizer)});
    }
  }
  return result;
}

}  // namespace lmserve::engine
