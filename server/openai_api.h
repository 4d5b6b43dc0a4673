// The OpenAI-compatible API's bodies, without I/O (openai_routes.cc serves them over HTTP):
// - requests: the JSON of /v1/completions and /v1/chat/completions into the API's own requests
//   (lmserve.v1.CompleteRequest, ChatRequest), which request_convert.h checks and converts for
//   both front ends. Here only what JSON adds is checked: types, shapes, the fields this server
//   refuses. Errors are InvalidArgument "FIELD: ..." with OpenAI's field names;
// - responses: engine outputs into OpenAI's JSON (choices, logprobs, usage), SSE framing;
// - errors: an absl::Status into OpenAI's error object {"error": {message, type, param, code}} and
//   its HTTP status.
//
// Fields served: model, prompt (a string, strings, token ids, lists of token ids), messages
// (string content or text parts), max_tokens / max_completion_tokens, temperature, top_p, top_k,
// min_p, n, stop, seed, presence/frequency/repetition penalties, logit_bias, logprobs /
// top_logprobs, echo, user, stream and stream_options.include_usage, and vLLM's extensions
// ignore_eos, min_tokens, stop_token_ids, return_token_ids, add_special_tokens,
// add_generation_prompt, chat_template_kwargs, priority, request_id. Refused with 400 naming the
// field: response_format (other than text), tools and tool_choice, functions, guided decoding,
// suffix, best_of other than n, tool messages and assistant tool calls (structured output and tool
// calling are not served yet). Other unknown fields are ignored, as OpenAI's servers do.

#ifndef LMSERVE_SERVER_OPENAI_API_H_
#define LMSERVE_SERVER_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/request.h"
#include "lmserve/v1/lmserve.pb.h"
#include "nlohmann/json.hpp"
#include "server/model_text.h"

namespace lmserve::server {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// JSON nested deeper than this is refused (the parser and the values stay shallow).
inline constexpr int kMaxJsonDepth = 64;
// Prompts in one /v1/completions request at most.
inline constexpr int kMaxPromptsPerRequest = 64;

// A /v1/completions or /v1/chat/completions request, its JSON checked.
struct GenerationRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;  // "" when not given: the served model
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_token_ids = false;
  bool echo = false;  // completions: the prompt's text before each choice's
  // The most likely tokens to list per position when logprobs are asked for (completions:
  // "logprobs": N; chat: "logprobs": true with "top_logprobs": N, 0 when not given).
  std::optional<int32_t> logprobs;
  // Chat: the client named max_completion_tokens (errors then name it).
  bool uses_max_completion_tokens = false;
  // The field that asked for structured output (response_format, guided_json, ...; errors name
  // it), "" for none.
  std::string structured_field;
  std::vector<v1::CompleteRequest> prompts;  // completions: one per prompt
  v1::ChatRequest chat;                      // chat completions
};

// Parses and checks a request body. InvalidArgument "FIELD: ..." (FIELD in OpenAI's names, e.g.
// "temperature", "messages[2].content[0].type", "prompt") for malformed JSON, wrong types and
// refused fields.
absl::StatusOr<GenerationRequest> ParseGenerationRequest(OpenAiEndpoint endpoint,
                                                         std::string_view body);

// Rewrites the field name that starts a request_convert error ("sampling.top_p: ...") into the
// request's OpenAI name ("top_p: ..."). `prompt_index` names the prompt of a request with several.
absl::Status ToOpenAiFieldNames(const absl::Status& status, const GenerationRequest& request,
                                int prompt_index);

// /tokenize (vLLM's): {"prompt": TEXT, "add_special_tokens"} or {"messages": [...],
// "add_generation_prompt", "chat_template_kwargs"}.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;  // else chat
  bool add_special_tokens = true;
  v1::ChatRequest chat;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body);

// /detokenize (vLLM's): {"tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body);

// Parses a JSON object body: InvalidArgument "body: ..." when it is not JSON, nests deeper than
// kMaxJsonDepth or is not an object.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view body);

// ---- Responses
// -------------------------------------------------------------------------------------

// JSON text; invalid UTF-8 (never expected) is replaced rather than thrown.
std::string DumpJson(const nlohmann::json& value);
// One server-sent event: "data: JSON\n\n".
std::string SseEvent(const nlohmann::json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// "stop", "length" or "abort" (vLLM's name for an aborted choice).
std::string_view OpenAiFinishReason(engine::FinishReason reason);
// vLLM's stop_reason: the stop string, the stop token id, or null.
nlohmann::json OpenAiStopReason(engine::FinishReason reason, const std::string& stop_string,
                                std::optional<int32_t> stop_token_id);

// The text of a token for logprobs: its text, or "token_id:ID" when the model has no tokenizer
// (vLLM's form).
std::string LogprobTokenText(const ModelText& text, int32_t token_id);

// Appends positions to a completions "logprobs" object ({tokens, token_logprobs, top_logprobs,
// text_offset}), `*text_offset` advanced by each token's text. A position without logprobs (the
// echoed prompt's first token) is given as nullptr.
void AppendCompletionLogprobs(std::span<const engine::PositionLogprobs* const> positions,
                              const ModelText& text, int32_t top_n, int64_t* text_offset,
                              nlohmann::json* logprobs);
// Appends positions to a chat "logprobs" object's "content" list.
void AppendChatLogprobs(std::span<const engine::PositionLogprobs> positions, const ModelText& text,
                        int32_t top_n, nlohmann::json* logprobs);

// ---- Errors
// ----------------------------------------------------------------------------------------

struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // "invalid_request_error", "rate_limit_error", "server_error", ...
  std::string param;  // the field at fault; "" for null
  std::string code;   // "" for null
};

// The HTTP status and OpenAI error of a status: InvalidArgument, FailedPrecondition and
// OutOfRange 400 (param: the field that starts the message), Unauthenticated 401, NotFound 404,
// ResourceExhausted 429, Unavailable 503, Cancelled 499, others 500.
ApiError ToApiError(const absl::Status& status);
// An error of the HTTP layer itself (404 route, 405, 413, 431, ...).
ApiError HttpError(int http_status, std::string message);
// {"error": {"message", "type", "param", "code"}}.
nlohmann::json ErrorJson(const ApiError& error);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_OPENAI_API_H_
