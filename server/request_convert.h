// Between the API's messages (proto/lmserve/v1/lmserve.proto) and the engine's requests and
// outputs: validation with errors that name the field, tokenization, and the response pieces.
// No gRPC here: the service (service.cc) turns the absl::Status into a grpc::Status.

#ifndef LMSERVE_SERVER_REQUEST_CONVERT_H_
#define LMSERVE_SERVER_REQUEST_CONVERT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/request.h"
#include "lmserve/v1/lmserve.pb.h"
#include "nlohmann/json.hpp"
#include "server/model_text.h"
#include "server/tool_calls.h"

namespace lmserve::server {

// Bounds the API puts on requests, beyond the engine's RequestLimits.
inline constexpr std::array<std::string_view, 4> kDefaultChatRoles = {"system", "user", "assistant",
                                                                      "tool"};

// OK when `role` may be added by --extra-chat-roles: 1 to 32 ASCII letters, digits, '_' or '-' (so
// no template or special-token syntax can hide in it).
absl::Status CheckChatRoleName(std::string_view role);

struct ApiLimits {
  int32_t max_n = 16;
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 1024;
  int32_t max_stop_token_ids = 1024;
  int32_t max_logit_bias = 1024;
  int32_t max_logprobs = 20;
  int32_t max_request_id_chars = 128;
  int32_t max_chat_messages = 4096;
  // The roles a chat message may have (kDefaultChatRoles, plus --extra-chat-roles). Anything else,
  // such as a role that carries a template's special-token text to forge a turn, is refused.
  std::vector<std::string> chat_roles = {kDefaultChatRoles.begin(), kDefaultChatRoles.end()};
  int32_t default_max_tokens = 16;  // when a request gives none; 0: up to the context length
};

// A request ready for Engine::Submit, and what the response needs besides the engine's outputs.
struct PreparedRequest {
  engine::Request request;
  std::string request_id;   // the client's; "" when it gave none
  bool echo = false;
  std::string echo_text;    // the prompt's text, when echo
  std::string log_text;     // the prompt text, for --debug-log-text
  // Chat with tools (tool_choice other than none): the format to parse tool calls in.
  std::optional<ToolCallFormat> tool_call_format;
};

// Checks and converts. InvalidArgument names the field ("sampling.top_p: must be in (0, 1], got
// 0"); FailedPrecondition when the request needs what the model lacks (a tokenizer for text).
absl::StatusOr<PreparedRequest> PrepareCompleteRequest(const v1::CompleteRequest& request,
                                                       const ModelText& text,
                                                       const engine::RequestLimits& limits,
                                                       const ApiLimits& api);
// The same for chat: the messages go through the model's chat template.
absl::StatusOr<PreparedRequest> PrepareChatRequest(const v1::ChatRequest& request,
                                                   const ModelText& text,
                                                   const engine::RequestLimits& limits,
                                                   const ApiLimits& api);

// The prompt's ids of a chat request: its messages through the model's chat template, encoded
// without added special tokens (the template writes them). No length check. InvalidArgument names
// the message at fault; FailedPrecondition without a template or tokenizer.
absl::StatusOr<std::vector<int32_t>> RenderChatPrompt(const v1::ChatRequest& request,
                                                      const ModelText& text, const ApiLimits& api,
                                                      std::string* rendered = nullptr);

// Tokenize's checks and work: InvalidArgument "<field>: ..." for empty text or text that is not
// UTF-8; FailedPrecondition without a tokenizer.
absl::StatusOr<std::vector<int32_t>> TokenizeText(std::string_view field, std::string_view text,
                                                  bool add_special, const ModelText& model_text);
// Detokenize's: InvalidArgument "<field>: token id X at index I is outside the vocabulary ...";
// FailedPrecondition without a tokenizer.
absl::StatusOr<std::string> DetokenizeIds(std::string_view field, std::span<const int32_t> ids,
                                          bool skip_special, const ModelText& model_text,
                                          int64_t vocab_size);

// ChatRequest.chat_template_kwargs as the template's extra variables (a JSON object, keys sorted).
// InvalidArgument naming "chat_template_kwargs.KEY" for a reserved name or a number JSON cannot
// hold (exposed for tests).
absl::StatusOr<nlohmann::ordered_json> ChatTemplateKwargsToJson(
    const google::protobuf::Struct& kwargs);

// The sampling parameters alone (exposed for tests).
absl::StatusOr<engine::SamplingParams> ConvertSampling(const v1::SamplingParams& sampling,
                                                       const engine::RequestLimits& limits,
                                                       const ApiLimits& api);

v1::FinishReason ToProtoFinishReason(engine::FinishReason reason);
// The stop string or token id that ended a choice ("" when none did).
std::string StopReason(const engine::RequestOutput& output);
void ToProtoLogprobs(const engine::PositionLogprobs& logprobs, const ModelText& text,
                     v1::PositionLogprobs* out);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_REQUEST_CONVERT_H_
