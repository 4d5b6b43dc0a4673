#include "engine/core/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "engine/core/check.h"

namespace lmserve::engine {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// The lowest id among the largest values.
int32_t ArgMax(std::span<const float> values) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(values.size()); ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

}  // namespace

double SampleUniform(uint64_t seed, int32_t sample_index, int64_t position) {
  uint64_t x = Mix(seed + kGolden);
  x = Mix(x ^ (static_cast<uint64_t>(static_cast<uint32_t>(sample_index)) + 2 * kGolden));
  x = Mix(x ^ (static_cast<uint64_t>(position) + 3 * kGolden));
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

uint64_t SplitMix64(uint64_t* state) {
  *state += kGolden;
  return Mix(*state);
}

Sampler::Sampler(int64_t vocab_size)
    : vocab_size_(vocab_size),
      work_(static_cast<size_t>(vocab_size)),
      counts_(static_cast<size_t>(vocab_size), 0),
      seen_(static_cast<size_t>(vocab_size), 0),
      probs_(static_cast<size_t>(vocab_size)) {
  candidates_.reserve(static_cast<size_t>(vocab_size));
}

int32_t Sampler::Sample(std::span<const float> logits, const SamplingParams& params,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        std::span<const int32_t> eos_token_ids, double uniform) {
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

  if (params.temperature == 0.0) return ArgMax(work_);

  const float max_logit = *std::max_element(work_.begin(), work_.end());
  if (max_logit == kNegativeInfinity) return ArgMax(work_);
  const double inverse_temperature = 1.0 / params.temperature;
  candidates_.clear();
  for (int32_t token_id = 0; token_id < vocab_size_; ++token_id) {
    const double probability =
        std::exp((static_cast<double>(work_[token_id]) - max_logit) * inverse_temperature);
    if (probability > 0.0) {
      probs_[token_id] = probability;
      candidates_.push_back(token_id);
    }
  }
  if (candidates_.empty()) return ArgMax(work_);  // non-finite logits: nothing to draw from
  // Most likely first; equal probabilities by lower id.
  auto more_likely = [this](int32_t a, int32_t b) {
    return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
  };
  bool sorted = false;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params.top_k, candidates_.end(),
                      more_likely);
    candidates_.resize(static_cast<size_t>(params.top_k));
    sorted = true;
  }
  if (params.top_p < 1.0) {
    double total = 0.0;
    for (int32_t token_id : candidates_) total += probs_[token_id];
    const double threshold = params.top_p * total;
    // The nucleus is a prefix of the sorted candidates: sort a growing prefix (usually the first
    // few dozen tokens hold it) rather than the whole vocabulary. Same result as a full sort.
    size_t num_sorted = sorted ? candidates_.size() : std::min<size_t>(64, candidates_.size());
    size_t keep = 0;
    double cumulative = 0.0;
    while (true) {
      if (!sorted) {
        std::partial_sort(candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                          candidates_.begin() + static_cast<std::ptrdiff_t>(num_sorted),
                          candidates_.end(), more_likely);
      }
      while (keep < num_sorted && cumulative < threshold) {
        cumulative += probs_[candidates_[keep++]];
      }
      if (cumulative >= threshold || num_sorted == candidates_.size()) break;
      num_sorted = std::min(candidates_.size(), num_sorted * 4);
    }
    candidates_.resize(keep);
  }
  if (params.min_p > 0.0) {
    double top_probability = 0.0;
    for (int32_t token_id : candidates_) {
      top_probability = std::max(top_probability, probs_[token_id]);
    }
    const double floor = params.min_p * top_probability;
    std::erase_if(candidates_, [&](int32_t token_id) { return probs_[token_id] < floor; });
  }

  double total = 0.0;
  for (int32_t token_id : candidates_) total += probs_[token_id];
  const double target = uniform * total;
  double cumulative = 0.0;
  for (int32_t token_id : candidates_) {
    cumulative += probs_[token_id];
    if (target < cumulative) return token_id;
  }
  return candidates_.back();
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
