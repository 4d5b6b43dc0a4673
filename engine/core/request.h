// What a caller submits to the engine and what comes back on a request's output stream.

#ifndef LMSERVE_ENGINE_CORE_REQUEST_H_
#define LMSERVE_ENGINE_CORE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace lmserve::engine {

namespace structured {
class CompiledGrammar;
}  // namespace structured

using RequestId = uint64_t;

// How to pick each next token. Plain data: a runner that samples on the device could take it as is.
// Processing order, applied to the fp32 logits of the last position:
//   logit_bias -> min_tokens suppression of EOS / stop tokens -> repetition penalty (prompt and
//   output tokens) -> presence and frequency penalties (output tokens) -> temperature (0: greedy,
//   the lowest id among equal maxima) -> top_k -> top_p (on the top-k renormalized distribution)
//   -> min_p (relative to the most likely token) -> one draw.
struct SamplingParams {
  int32_t n = 1;                    // independent samples of the prompt; they share its KV blocks
  double temperature = 1.0;         // >= 0; 0 means greedy
  int32_t top_k = 0;                // keep the k most likely tokens; 0 or -1: all
  double top_p = 1.0;               // (0, 1]: keep the smallest set reaching this probability
  double min_p = 0.0;               // [0, 1]: drop tokens below min_p * the top probability
  double repetition_penalty = 1.0;  // > 0; 1: off. Divides positive, multiplies negative logits
  double presence_penalty = 0.0;    // [-2, 2]: subtracted once from each generated token's logit
  double frequency_penalty = 0.0;   // [-2, 2]: subtracted per occurrence among generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // The per-request random seed. With a seed, a request's tokens depend only on its prompt, its
  // parameters and the seed, never on what else is in the batch. Without one the engine draws it.
  std::optional<uint64_t> seed;
  std::optional<int32_t> max_tokens;  // >= 1; nullopt: up to the context length
  int32_t min_tokens = 0;   // EOS and stop tokens are suppressed, stop strings ignored, before this
  bool ignore_eos = false;  // generate past the model's EOS tokens
  std::vector<std::string> stop;  // stop strings: generation ends before the first occurrence
  std::vector<int32_t>
      stop_token_ids;  // generation ends on one of these (the id is returned, not its text)
  // With a value N: the sampled token's logprob and the N most likely tokens' (raw model logprobs:
  // log-softmax of the logits before any processing above). nullopt: none.
  std::optional<int32_t> logprobs;
  std::optional<int32_t> prompt_logprobs;  // the same for every prompt token after the first
  // Structured output (engine/structured/constraint.h): the output must match this grammar. Each
  // step's logits are masked to the tokens it allows (EOS only where it may end), after the
  // penalties and before temperature; generation ends (kConstraintEnd) when it allows nothing
  // more. Shared by the requests with the same constraint; null: unconstrained.
  std::shared_ptr<structured::CompiledGrammar> constraint;
};

struct Request {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  int32_t priority = 0;  // lower values are admitted first (vLLM's convention); ties by arrival
};

// Why a sample stopped.
enum class FinishReason : uint8_t {
  kEos,            // the model produced one of its EOS tokens
  kStopToken,      // one of sampling.stop_token_ids
  kStopString,     // one of sampling.stop (not included in the text)
  kMaxTokens,      // sampling.max_tokens generated
  kContextLength,  // prompt + generated tokens reached the engine's context length
  kConstraintEnd,  // sampling.constraint allows nothing more (the output is complete)
  kAborted,        // Engine::Abort, or the engine shut down
  kError,          // the runner failed; RequestOutput::error says why
};
std::string_view FinishReasonName(FinishReason reason);

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// The logprobs at one position.
struct PositionLogprobs {
  int32_t token_id = 0;           // the token at this position (sampled, or the prompt's)
  float logprob = 0.0f;           // its logprob
  int32_t rank = 0;               // 1 + the number of tokens strictly more likely
  std::vector<TokenLogprob> top;  // the N most likely tokens, most likely first (ties: lower id)
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // this sample's generated tokens
  int32_t cached_tokens = 0;      // prompt tokens whose KV was reused at first admission
};

struct RequestTimings {
  double queue_seconds = 0.0;        // arrival to first scheduled
  double first_token_seconds = 0.0;  // arrival to first generated token (TTFT)
  double finish_seconds = 0.0;       // arrival to finish (end to end)
};

// One increment of one sample's output. A stream carries, per sample, zero or more increments and
// then exactly one with `finished` set.
struct RequestOutput {
  RequestId request_id = 0;
  int32_t sample_index = 0;        // which of the n samples, in [0, n)
  std::vector<int32_t> token_ids;  // new tokens (stop-string tokens included; their text is not)
  std::string text;                // new text, held back while it may begin a stop string
  std::vector<PositionLogprobs> logprobs;  // one per new token, when sampling.logprobs is set
  // Prompt positions 1..P-1, in the first output of sample 0, when sampling.prompt_logprobs is set.
  std::vector<PositionLogprobs> prompt_logprobs;
  std::vector<double> token_times_seconds;  // per new token: when it was produced, since arrival
  bool finished = false;
  // Set when finished:
  FinishReason finish_reason = FinishReason::kAborted;
  std::optional<int32_t> stop_token_id;  // the EOS or stop token that ended it
  std::string stop_string;               // the stop string that ended it
  std::string error;                     // kError: what failed
  Usage usage;
  RequestTimings timings;
};

// What Submit checks a request against.
struct RequestLimits {
  int64_t vocab_size = 0;
  int32_t max_context_tokens = 0;  // prompt + max_tokens may not exceed it (the context length)
  int64_t kv_cache_tokens = 0;     // nor this: the whole KV pool, num_blocks * block_size_tokens
  int32_t max_logprobs = 20;       // bound on logprobs and prompt_logprobs
  int32_t max_n = 64;
  bool has_text_decoder = false;  // stop strings need one
};

// Returns InvalidArgument naming the field ("sampling.top_p: ...") for any out-of-range value.
absl::Status ValidateRequest(const Request& request, const RequestLimits& limits);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_REQUEST_H_
