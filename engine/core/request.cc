#include "engine/core/request.h"

#include <cmath>

#include "common/strings.h"

namespace lmserve::engine {
namespace {

absl::Status Invalid(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(StrCat(field, ": ", message));
}

absl::Status CheckTokenId(std::string_view field, int32_t token_id, int64_t vocab_size) {
  if (token_id < 0 || token_id >= vocab_size) {
    return Invalid(
        field, StrCat("token id ", token_id, " is outside the vocabulary [0, ", vocab_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kMaxTokens:
      return "max_tokens";
    case FinishReason::kContextLength:
      return "context_length";
    case FinishReason::kConstraintEnd:
      return "constraint_end";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

absl::Status ValidateRequest(const Request& request, const RequestLimits& limits) {
  const SamplingParams& s = request.sampling;
  const int64_t num_prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  if (num_prompt_tokens == 0) return Invalid("prompt_token_ids", "empty");
  for (int32_t token_id : request.prompt_token_ids) {
    if (auto status = CheckTokenId("prompt_token_ids", token_id, limits.vocab_size); !status.ok()) {
      return status;
    }
  }
  if (num_prompt_tokens >= limits.max_context_tokens) {
    return Invalid("prompt_token_ids",
                   StrCat(num_prompt_tokens, " tokens leave no room to generate within the context",
                          " length of ", limits.max_context_tokens, " tokens"));
  }
  if (num_prompt_tokens >= limits.kv_cache_tokens) {
    return Invalid(
        "prompt_token_ids",
        StrCat(num_prompt_tokens, " tokens leave no room to generate within the whole KV",
               " cache (", limits.kv_cache_tokens, " tokens)"));
  }
  if (s.n < 1 || s.n > limits.max_n) {
    return Invalid("sampling.n", StrCat("must be in [1, ", limits.max_n, "], got ", s.n));
  }
  if (!(s.temperature >= 0.0) || !std::isfinite(s.temperature)) {
    return Invalid("sampling.temperature", StrCat("must be >= 0, got ", s.temperature));
  }
  if (s.top_k < -1) return Invalid("sampling.top_k", StrCat("must be >= -1, got ", s.top_k));
  if (!(s.top_p > 0.0 && s.top_p <= 1.0)) {
    return Invalid("sampling.top_p", StrCat("must be in (0, 1], got ", s.top_p));
  }
  if (!(s.min_p >= 0.0 && s.min_p <= 1.0)) {
    return Invalid("sampling.min_p", StrCat("must be in [0, 1], got ", s.min_p));
  }
  if (!(s.repetition_penalty > 0.0) || !std::isfinite(s.repetition_penalty)) {
    return Invalid("sampling.repetition_penalty",
                   StrCat("must be > 0, got ", s.repetition_penalty));
  }
  if (!(s.presence_penalty >= -2.0 && s.presence_penalty <= 2.0)) {
    return Invalid("sampling.presence_penalty",
                   StrCat("must be in [-2, 2], got ", s.presence_penalty));
  }
  if (!(s.frequency_penalty >= -2.0 && s.frequency_penalty <= 2.0)) {
    return Invalid("sampling.frequency_penalty",
                   StrCat("must be in [-2, 2], got ", s.frequency_penalty));
  }
  for (const auto& [token_id, bias] : s.logit_bias) {
    if (auto status = CheckTokenId("sampling.logit_bias", token_id, limits.vocab_size);
        !status.ok()) {
      return status;
    }
    if (!std::isfinite(bias) && !(std::isinf(bias) && bias < 0)) {
      return Invalid("sampling.logit_bias", StrCat("bias of token ", token_id, " is not finite"));
    }
  }
  if (s.max_tokens.has_value()) {
    if (*s.max_tokens < 1) {
      return Invalid("sampling.max_tokens", StrCat("must be >= 1, got ", *s.max_tokens));
    }
    if (num_prompt_tokens + *s.max_tokens > limits.max_context_tokens) {
      return Invalid(
          "sampling.max_tokens",
          StrCat("the prompt (", num_prompt_tokens, " tokens) + max_tokens (", *s.max_tokens,
                 ") exceeds the context length of ", limits.max_context_tokens, " tokens"));
    }
    if (num_prompt_tokens + *s.max_tokens > limits.kv_cache_tokens) {
      return Invalid(
          "sampling.max_tokens",
          StrCat("the prompt (", num_prompt_tokens, " tokens) + max_tokens (", *s.max_tokens,
                 ") can never fit in the whole KV cache (", limits.kv_cache_tokens, " tokens)"));
    }
  }
  if (s.min_tokens < 0) {
    return Invalid("sampling.min_tokens", StrCat("must be >= 0, got ", s.min_tokens));
  }
  if (s.max_tokens.has_value() && s.min_tokens > *s.max_tokens) {
    return Invalid("sampling.min_tokens",
                   StrCat("(", s.min_tokens, ") exceeds max_tokens (", *s.max_tokens, ")"));
  }
  for (const std::string& stop : s.stop) {
    if (stop.empty()) return Invalid("sampling.stop", "empty stop string");
  }
  if (!s.stop.empty() && !limits.has_text_decoder) {
    return Invalid("sampling.stop", "stop strings need a tokenizer, and the engine has none");
  }
  for (int32_t token_id : s.stop_token_ids) {
    if (auto status = CheckTokenId("sampling.stop_token_ids", token_id, limits.vocab_size);
        !status.ok()) {
      return status;
    }
  }
  if (s.logprobs.has_value() && (*s.logprobs < 0 || *s.logprobs > limits.max_logprobs)) {
    return Invalid("sampling.logprobs",
                   StrCat("must be in [0, ", limits.max_logprobs, "], got ", *s.logprobs));
  }
  if (s.prompt_logprobs.has_value() &&
      (*s.prompt_logprobs < 0 || *s.prompt_logprobs > limits.max_logprobs)) {
    return Invalid("sampling.prompt_logprobs",
                   StrCat("must be in [0, ", limits.max_logprobs, "], got ", *s.prompt_logprobs));
  }
  if (s.constraint != nullptr && s.ignore_eos) {
    // A complete output allows only EOS, which ignore_eos would generate past.
    return Invalid("sampling.ignore_eos", "cannot be combined with structured output");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::engine
