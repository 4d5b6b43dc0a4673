#include "server/request_convert.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "server/tool_calls.h"

namespace lmserve::server {
namespace {

absl::Status Invalid(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(StrCat(field, ": ", message));
}

absl::Status CheckTokenIds(std::string_view field, const google::protobuf::RepeatedField<int32_t>& ids,
                           int64_t vocab_size) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(field, StrCat("token id ", ids[i], " at index ", i,
                                   " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRequestId(const std::string& request_id, const ApiLimits& api) {
  if (static_cast<int64_t>(request_id.size()) > api.max_request_id_chars) {
    return Invalid("request_id", StrCat("longer than ", api.max_request_id_chars, " characters"));
  }
  if (!IsValidUtf8(request_id)) return Invalid("request_id", "not valid UTF-8");
  for (char c : request_id) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return Invalid("request_id", "holds a control character");
    }
  }
  return absl::OkStatus();
}

// The prompt-length checks of the engine, with the API's field name.
absl::Status CheckPromptLength(std::string_view field, int64_t num_tokens,
                               const engine::RequestLimits& limits) {
  if (num_tokens == 0) return Invalid(field, "empty (no tokens)");
  const int64_t room = std::min<int64_t>(limits.max_context_tokens, limits.kv_cache_tokens);
  if (num_tokens >= room) {
    return Invalid(field, StrCat("the prompt is too long: ", num_tokens,
                                 " tokens leave no room to generate within the context length of ",
                                 room, " tokens"));
  }
  return absl::OkStatus();
}

// A chat message's tool fields as template keys (tool_calls, tool_call_id, name).
absl::Status ToolMessageFields(const v1::ChatMessage& message, const std::string& field,
                               nlohmann::ordered_json* extra) {
  using Json = nlohmann::ordered_json;
  if (message.tool_calls_size() > 0) {
    Json calls = Json::array();
    for (int k = 0; k < message.tool_calls_size(); ++k) {
      const v1::ToolCall& call = message.tool_calls(k);
      if (call.name().empty()) {
        return Invalid(StrCat(field, ".tool_calls[", k, "].function.name"), "empty");
      }
      // Templates write arguments with tojson: an object when the text is one.
      Json arguments = Json::parse(call.arguments(), nullptr, /*allow_exceptions=*/false);
      if (arguments.is_discarded()) arguments = call.arguments();
      calls.push_back(Json{{"id", call.id()},
                           {"type", "function"},
                           {"function", {{"name", call.name()}, {"arguments", arguments}}}});
    }
    (*extra)["tool_calls"] = std::move(calls);
  }
  if (!message.tool_call_id().empty()) (*extra)["tool_call_id"] = message.tool_call_id();
  if (!message.name().empty()) (*extra)["name"] = message.name();
  return absl::OkStatus();
}

// ChatRequest.tools in OpenAI's shape for the template's `tools` variable (an empty array for
// none), after checking them and tool_choice.
absl::StatusOr<nlohmann::ordered_json> ToolsJson(const v1::ChatRequest& request) {
  using Json = nlohmann::ordered_json;
  constexpr int kMaxTools = 128;
  if (request.tools_size() > kMaxTools) {
    return Invalid("tools", StrCat("more than ", kMaxTools, " tools"));
  }
  const std::string& choice = request.tool_choice();
  if (choice != "" && choice != "auto" && choice != "none" && choice != "required" &&
      choice != "function") {
    return Invalid("tool_choice", StrCat("must be auto, none, required or a function, got '",
                                         choice.substr(0, 40), "'"));
  }
  if (request.tools_size() == 0 && (choice == "required" || choice == "function")) {
    return Invalid("tool_choice", "needs tools");
  }
  Json tools = Json::array();
  bool found = false;
  for (int k = 0; k < request.tools_size(); ++k) {
    const v1::Tool& tool = request.tools(k);
    const std::string field = StrCat("tools[", k, "]");
    if (tool.name().empty()) return Invalid(StrCat(field, ".function.name"), "empty");
    found |= tool.name() == request.tool_choice_function();
    Json function = {{"name", tool.name()}};
    if (!tool.description().empty()) function["description"] = tool.description();
    if (!tool.parameters().empty()) {
      Json parameters = Json::parse(tool.parameters(), nullptr, /*allow_exceptions=*/false);
      if (!parameters.is_object()) {
        return Invalid(StrCat(field, ".function.parameters"), "must be a JSON object");
      }
      function["parameters"] = std::move(parameters);
    }
    tools.push_back(Json{{"type", "function"}, {"function", std::move(function)}});
  }
  if (choice == "function" && !found) {
    return Invalid("tool_choice", StrCat("no tool named '",
                                         request.tool_choice_function().substr(0, 64), "'"));
  }
  return tools;
}

// SamplingParams.structured compiled for the model's tokenizer (null when unset).
absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> ConvertStructured(
    const v1::SamplingParams& sampling, const ModelText& text) {
  if (!sampling.has_structured()) return nullptr;
  using engine::structured::ConstraintKind;
  const v1::StructuredOutput& structured = sampling.structured();
  engine::structured::ConstraintSpec spec;
  std::string field;
  switch (structured.kind_case()) {
    case v1::StructuredOutput::kJsonSchema:
      spec = {ConstraintKind::kJsonSchema, structured.json_schema()};
      field = "sampling.structured.json_schema";
      break;
    case v1::StructuredOutput::kJsonObject:
      spec = {ConstraintKind::kJsonObject, ""};
      field = "sampling.structured.json_object";
      break;
    case v1::StructuredOutput::kRegex:
      spec = {ConstraintKind::kRegex, structured.regex()};
      field = "sampling.structured.regex";
      break;
    case v1::StructuredOutput::kGrammar:
      spec = {ConstraintKind::kGrammar, structured.grammar()};
      field = "sampling.structured.grammar";
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      return Invalid("sampling.structured", "set one of json_schema, json_object, regex, grammar");
  }
  absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> compiled =
      text.CompileConstraint(spec);
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(),
                        StrCat(field, ": ", std::string(compiled.status().message())));
  }
  return compiled;
}

// Shared by Complete and Chat once the prompt's ids are known.
absl::Status FinishPrepare(const v1::SamplingParams& sampling, int32_t priority,
                           const std::string& request_id, const engine::RequestLimits& limits,
                           const ApiLimits& api, const ModelText& text,
                           PreparedRequest* prepared) {
  LMSERVE_RETURN_IF_ERROR(CheckRequestId(request_id, api));
  prepared->request_id = request_id;
  LMSERVE_ASSIGN_OR_RETURN(engine::SamplingParams params, ConvertSampling(sampling, limits, api));
  LMSERVE_ASSIGN_OR_RETURN(params.constraint, ConvertStructured(sampling, text));
  prepared->request.sampling = std::move(params);
  prepared->request.priority = priority;
  // Whatever the engine checks beyond the above (it names the field the same way).
  return engine::ValidateRequest(prepared->request, limits);
}

// The keys of a Struct in order: protobuf's map has none, and the template sees (and tojson writes)
// an object's keys in the order given.
std::vector<std::string> SortedKeys(const google::protobuf::Struct& object) {
  std::vector<std::string> keys;
  keys.reserve(object.fields_size());
  for (const auto& [key, value] : object.fields()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

// A google.protobuf.Value as JSON; InvalidArgument naming `field` for NaN and infinities.
absl::StatusOr<nlohmann::ordered_json> ValueToJson(const google::protobuf::Value& value,
                                                   const std::string& field) {
  using Json = nlohmann::ordered_json;
  switch (value.kind_case()) {
    case google::protobuf::Value::kNullValue:
    case google::protobuf::Value::KIND_NOT_SET:
      return Json(nullptr);
    case google::protobuf::Value::kBoolValue:
      return Json(value.bool_value());
    case google::protobuf::Value::kStringValue:
      return Json(value.string_value());
    case google::protobuf::Value::kNumberValue: {
      const double number = value.number_value();
      if (!std::isfinite(number)) return Invalid(field, "not a finite number (JSON has none)");
      // Struct holds every number as a double; a whole one within 2^53 is the integer the client's
      // JSON said (a template renders 3, not 3.0).
      constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
      if (std::trunc(number) == number && std::fabs(number) <= kExactIntegers) {
        return Json(static_cast<int64_t>(number));
      }
      return Json(number);
    }
    case google::protobuf::Value::kStructValue: {
      Json object = Json::object();
      const google::protobuf::Struct& members = value.struct_value();
      for (const std::string& key : SortedKeys(members)) {
        LMSERVE_ASSIGN_OR_RETURN(object[key],
                                 ValueToJson(members.fields().at(key), StrCat(field, ".", key)));
      }
      return object;
    }
    case google::protobuf::Value::kListValue: {
      Json array = Json::array();
      const auto& values = value.list_value().values();
      for (int i = 0; i < values.size(); ++i) {
        LMSERVE_ASSIGN_OR_RETURN(Json element, ValueToJson(values[i], StrCat(field, "[", i, "]")));
        array.push_back(std::move(element));
      }
      return array;
    }
  }
  return Invalid(field, "an unknown kind of value");
}

}  // namespace

absl::StatusOr<engine::SamplingParams> ConvertSampling(const v1::SamplingParams& s,
                                                       const engine::RequestLimits& limits,
                                                       const ApiLimits& api) {
  engine::SamplingParams out;
  if (s.has_max_tokens()) {
    out.max_tokens = s.max_tokens();
  } else if (api.default_max_tokens > 0) {
    out.max_tokens = api.default_max_tokens;
  }
  if (out.max_tokens.has_value() && *out.max_tokens < 1) {
    return Invalid("sampling.max_tokens", StrCat("must be >= 1, got ", *out.max_tokens));
  }
  if (out.max_tokens.has_value() && *out.max_tokens >= limits.max_context_tokens) {
    return Invalid("sampling.max_tokens",
                   StrCat(*out.max_tokens, " does not fit in the context length of ",
                          limits.max_context_tokens, " tokens with a prompt"));
  }
  if (s.has_temperature()) {
    if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
      return Invalid("sampling.temperature", StrCat("must be >= 0, got ", s.temperature()));
    }
    out.temperature = s.temperature();
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", StrCat("must be >= 0, got ", s.top_k()));
  out.top_k = s.top_k();
  if (s.has_top_p()) {
    if (!(s.top_p() > 0.0f && s.top_p() <= 1.0f)) {
      return Invalid("sampling.top_p", StrCat("must be in (0, 1], got ", s.top_p()));
    }
    out.top_p = s.top_p();
  }
  if (!(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return Invalid("sampling.min_p", StrCat("must be in [0, 1], got ", s.min_p()));
  }
  out.min_p = s.min_p();
  if (s.has_repetition_penalty()) {
    if (!(s.repetition_penalty() > 0.0f && s.repetition_penalty() <= 2.0f)) {
      return Invalid("sampling.repetition_penalty",
                     StrCat("must be in (0, 2], got ", s.repetition_penalty()));
    }
    out.repetition_penalty = s.repetition_penalty();
  }
  if (!(s.presence_penalty() >= -2.0f && s.presence_penalty() <= 2.0f)) {
    return Invalid("sampling.presence_penalty",
                   StrCat("must be in [-2, 2], got ", s.presence_penalty()));
  }
  out.presence_penalty = s.presence_penalty();
  if (!(s.frequency_penalty() >= -2.0f && s.frequency_penalty() <= 2.0f)) {
    return Invalid("sampling.frequency_penalty",
                   StrCat("must be in [-2, 2], got ", s.frequency_penalty()));
  }
  out.frequency_penalty = s.frequency_penalty();
  if (s.logit_bias_size() > api.max_logit_bias) {
    return Invalid("sampling.logit_bias", StrCat("more than ", api.max_logit_bias, " entries"));
  }
  for (const auto& [token_id, bias] : s.logit_bias()) {
    if (token_id < 0 || token_id >= limits.vocab_size) {
      return Invalid("sampling.logit_bias", StrCat("token id ", token_id,
                                                   " is outside the vocabulary [0, ",
                                                   limits.vocab_size, ")"));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return Invalid("sampling.logit_bias",
                     StrCat("the bias of token ", token_id, " must be in [-100, 100], got ", bias));
    }
    out.logit_bias.emplace_back(token_id, bias);
  }
  std::sort(out.logit_bias.begin(), out.logit_bias.end());  // a map's order is unspecified
  if (s.has_seed()) out.seed = s.seed();
  if (s.min_tokens() < 0) {
    return Invalid("sampling.min_tokens", StrCat("must be >= 0, got ", s.min_tokens()));
  }
  if (out.max_tokens.has_value() && s.min_tokens() > *out.max_tokens) {
    return Invalid("sampling.min_tokens", StrCat("(", s.min_tokens(), ") exceeds max_tokens (",
                                                 *out.max_tokens, ")"));
  }
  out.min_tokens = s.min_tokens();
  out.ignore_eos = s.ignore_eos();
  if (s.stop_size() > api.max_stop_strings) {
    return Invalid("sampling.stop", StrCat("more than ", api.max_stop_strings, " stop strings (",
                                           s.stop_size(), ")"));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& stop = s.stop(i);
    if (stop.empty()) return Invalid("sampling.stop", StrCat("stop string ", i, " is empty"));
    if (static_cast<int64_t>(stop.size()) > api.max_stop_string_bytes) {
      return Invalid("sampling.stop", StrCat("stop string ", i, " is longer than ",
                                             api.max_stop_string_bytes, " bytes"));
    }
    if (!IsValidUtf8(stop)) {
      return Invalid("sampling.stop", StrCat("stop string ", i, " is not valid UTF-8"));
    }
    out.stop.push_back(stop);
  }
  if (!out.stop.empty() && !limits.has_text_decoder) {
    return absl::FailedPreconditionError(
        "sampling.stop: stop strings need a tokenizer, and this model has none");
  }
  if (s.stop_token_ids_size() > api.max_stop_token_ids) {
    return Invalid("sampling.stop_token_ids", StrCat("more than ", api.max_stop_token_ids, " ids"));
  }
  LMSERVE_RETURN_IF_ERROR(
      CheckTokenIds("sampling.stop_token_ids", s.stop_token_ids(), limits.vocab_size));
  out.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  if (s.logprobs() < 0 || s.logprobs() > api.max_logprobs) {
    return Invalid("sampling.logprobs",
                   StrCat("must be in [0, ", api.max_logprobs, "], got ", s.logprobs()));
  }
  if (s.logprobs() > 0) out.logprobs = s.logprobs();
  if (s.prompt_logprobs() < 0 || s.prompt_logprobs() > api.max_logprobs) {
    return Invalid("sampling.prompt_logprobs",
                   StrCat("must be in [0, ", api.max_logprobs, "], got ", s.prompt_logprobs()));
  }
  if (s.prompt_logprobs() > 0) out.prompt_logprobs = s.prompt_logprobs();
  const int32_t n = s.has_n() ? s.n() : 1;
  const int32_t max_n = std::min(api.max_n, limits.max_n);
  if (n < 1 || n > max_n) {
    return Invalid("sampling.n", StrCat("must be in [1, ", max_n, "], got ", n));
  }
  out.n = n;
  return out;
}

absl::StatusOr<PreparedRequest> PrepareCompleteRequest(const v1::CompleteRequest& request,
                                                       const ModelText& text,
                                                       const engine::RequestLimits& limits,
                                                       const ApiLimits& api) {
  PreparedRequest prepared;
  prepared.echo = request.echo();
  switch (request.prompt_case()) {
    case v1::CompleteRequest::PROMPT_NOT_SET:
      return Invalid("prompt", "missing: set prompt.text or prompt.token_ids");
    case v1::CompleteRequest::kText: {
      const std::string& prompt = request.text();
      if (prompt.empty()) return Invalid("prompt.text", "empty");
      if (!IsValidUtf8(prompt)) return Invalid("prompt.text", "not valid UTF-8");
      if (!text.has_tokenizer()) {
        return absl::FailedPreconditionError(
            "prompt.text: this model has no tokenizer; send prompt.token_ids");
      }
      LMSERVE_ASSIGN_OR_RETURN(
          std::vector<int32_t> ids,
          text.Encode(prompt,
                      request.has_add_special_tokens() ? request.add_special_tokens() : true));
      LMSERVE_RETURN_IF_ERROR(
          CheckPromptLength("prompt.text", static_cast<int64_t>(ids.size()), limits));
      prepared.request.prompt_token_ids = std::move(ids);
      if (prepared.echo) prepared.echo_text = prompt;
      prepared.log_text = prompt;
      break;
    }
    case v1::CompleteRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Invalid("prompt.token_ids", "empty");
      LMSERVE_RETURN_IF_ERROR(CheckTokenIds("prompt.token_ids", ids, limits.vocab_size));
      LMSERVE_RETURN_IF_ERROR(CheckPromptLength("prompt.token_ids", ids.size(), limits));
      prepared.request.prompt_token_ids.assign(ids.begin(), ids.end());
      if (text.has_tokenizer()) {
        absl::StatusOr<std::string> decoded =
            text.Decode(prepared.request.prompt_token_ids, /*skip_special=*/false);
        if (decoded.ok()) {
          if (prepared.echo) prepared.echo_text = *decoded;
          prepared.log_text = *std::move(decoded);
        }
      } else {
        prepared.log_text = StrCat("[", StrJoin(prepared.request.prompt_token_ids, ","), "]");
      }
      break;
    }
  }
  LMSERVE_RETURN_IF_ERROR(FinishPrepare(request.sampling(), request.priority(),
                                        request.request_id(), limits, api, text, &prepared));
  return prepared;
}

absl::StatusOr<nlohmann::ordered_json> ChatTemplateKwargsToJson(
    const google::protobuf::Struct& kwargs) {
  // Set by the server (the request's messages and add_generation_prompt, the model's tokens), or
  // the template's functions: a client's value would silently replace them.
  static constexpr std::string_view kReserved[] = {"messages",
                                                   "add_generation_prompt",
                                                   "bos_token",
                                                   "eos_token",
                                                   "raise_exception",
                                                   "strftime_now",
                                                   "range",
                                                   "namespace",
                                                   "dict"};
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  for (const std::string& key : SortedKeys(kwargs)) {
    const std::string field = StrCat("chat_template_kwargs.", key);
    if (std::find(std::begin(kReserved), std::end(kReserved), key) != std::end(kReserved)) {
      return Invalid(field, "reserved: the server sets this template variable itself");
    }
    if (!IsValidUtf8(key)) return Invalid("chat_template_kwargs", "a key is not valid UTF-8");
    LMSERVE_ASSIGN_OR_RETURN(variables[key], ValueToJson(kwargs.fields().at(key), field));
  }
  return variables;
}

absl::Status CheckChatRoleName(std::string_view role) {
  if (role.empty() || role.size() > 32) {
    return absl::InvalidArgumentError(StrCat("chat role '", role, "': 1 to 32 characters"));
  }
  for (char c : role) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          StrCat("chat role '", role, "': only ASCII letters, digits, '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> RenderChatPrompt(const v1::ChatRequest& request,
                                                      const ModelText& text, const ApiLimits& api,
                                                      std::string* rendered) {
  if (request.messages_size() == 0) return Invalid("messages", "empty: send at least one message");
  if (request.messages_size() > api.max_chat_messages) {
    return Invalid("messages", StrCat("more than ", api.max_chat_messages, " messages"));
  }
  std::vector<ChatTurn> turns;
  turns.reserve(request.messages_size());
  for (int i = 0; i < request.messages_size(); ++i) {
    const v1::ChatMessage& message = request.messages(i);
    if (message.role().empty()) return Invalid(StrCat("messages[", i, "].role"), "empty");
    if (std::find(api.chat_roles.begin(), api.chat_roles.end(), message.role()) ==
        api.chat_roles.end()) {
      return Invalid(StrCat("messages[", i, "].role"),
                     StrCat("not one of the roles served (", StrJoin(api.chat_roles, ", "),
                            "; lmserve serve --extra-chat-roles adds more)"));
    }
    if (!IsValidUtf8(message.content())) {
      return Invalid(StrCat("messages[", i, "].content"), "not valid UTF-8");
    }
    ChatTurn& turn = turns.emplace_back();
    turn.role = message.role();
    turn.content = message.content();
    LMSERVE_RETURN_IF_ERROR(ToolMessageFields(message, StrCat("messages[", i, "]"), &turn.extra));
  }
  LMSERVE_ASSIGN_OR_RETURN(nlohmann::ordered_json template_kwargs,
                           ChatTemplateKwargsToJson(request.chat_template_kwargs()));
  LMSERVE_ASSIGN_OR_RETURN(nlohmann::ordered_json tools, ToolsJson(request));
  if (!tools.empty()) {
    if (template_kwargs.contains("tools")) {
      return Invalid("chat_template_kwargs.tools", "give the tools in `tools`, not both");
    }
    if (request.tool_choice() != "none") template_kwargs["tools"] = std::move(tools);
  }
  if (!text.has_chat_template()) {
    return absl::FailedPreconditionError(
        "messages: this model has no chat template; send a prompt to Complete (HTTP: "
        "/v1/completions) instead");
  }
  LMSERVE_ASSIGN_OR_RETURN(
      std::string prompt,
      text.RenderChat(turns,
                      request.has_add_generation_prompt() ? request.add_generation_prompt() : true,
                      template_kwargs));
  // The template writes the special tokens (BOS included) itself.
  LMSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, text.Encode(prompt, /*add_special=*/false));
  if (rendered != nullptr) *rendered = std::move(prompt);
  return ids;
}

absl::StatusOr<PreparedRequest> PrepareChatRequest(const v1::ChatRequest& request,
                                                   const ModelText& text,
                                                   const engine::RequestLimits& limits,
                                                   const ApiLimits& api) {
  std::string prompt;
  LMSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, RenderChatPrompt(request, text, api, &prompt));
  LMSERVE_RETURN_IF_ERROR(CheckPromptLength("messages", static_cast<int64_t>(ids.size()), limits));
  PreparedRequest prepared;
  prepared.request.prompt_token_ids = std::move(ids);
  prepared.log_text = std::move(prompt);
  LMSERVE_RETURN_IF_ERROR(FinishPrepare(request.sampling(), request.priority(),
                                        request.request_id(), limits, api, text, &prepared));
  // Tools: the format the output is parsed in, and a forced call's constraint.
  if (request.tools_size() > 0 && request.tool_choice() != "none") {
    const ToolCallFormat format = DetectToolCallFormat(text.chat_template_source());
    prepared.tool_call_format = format;
    const bool forced = request.tool_choice() == "required" || request.tool_choice() == "function";
    if (forced) {
      if (request.sampling().has_structured()) {
        return Invalid("tool_choice", "a forced tool call cannot be combined with structured output");
      }
      std::vector<ToolSpec> tools;
      for (const v1::Tool& tool : request.tools()) {
        tools.push_back({tool.name(), tool.description(), tool.parameters()});
      }
      absl::StatusOr<engine::structured::ConstraintSpec> spec = ForcedToolCallSpec(
          tools, request.tool_choice() == "function" ? request.tool_choice_function() : "",
          format);
      if (!spec.ok()) return spec.status();
      absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> compiled =
          text.CompileConstraint(*spec);
      if (!compiled.ok()) {
        return absl::Status(compiled.status().code(),
                            StrCat("tools: ", std::string(compiled.status().message())));
      }
      prepared.request.sampling.constraint = *std::move(compiled);
    }
  }
  return prepared;
}

absl::StatusOr<std::vector<int32_t>> TokenizeText(std::string_view field, std::string_view text,
                                                  bool add_special, const ModelText& model_text) {
  if (text.empty()) return Invalid(field, "empty");
  if (!IsValidUtf8(text)) return Invalid(field, "not valid UTF-8");
  return model_text.Encode(text, add_special);
}

absl::StatusOr<std::string> DetokenizeIds(std::string_view field, std::span<const int32_t> ids,
                                          bool skip_special, const ModelText& model_text,
                                          int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(field, StrCat("token id ", ids[i], " at index ", i,
                                   " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return model_text.Decode(ids, skip_special);
}

v1::FinishReason ToProtoFinishReason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kEos:
    case engine::FinishReason::kStopToken:
    case engine::FinishReason::kStopString:
    case engine::FinishReason::kConstraintEnd:
      return v1::FINISH_REASON_STOP;
    case engine::FinishReason::kMaxTokens:
    case engine::FinishReason::kContextLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAborted:
      return v1::FINISH_REASON_ABORT;
    case engine::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

std::string StopReason(const engine::RequestOutput& output) {
  if (output.finish_reason == engine::FinishReason::kStopString) return output.stop_string;
  if (output.stop_token_id.has_value() &&
      (output.finish_reason == engine::FinishReason::kEos ||
       output.finish_reason == engine::FinishReason::kStopToken)) {
    return StrCat(*output.stop_token_id);
  }
  return "";
}

void ToProtoLogprobs(const engine::PositionLogprobs& logprobs, const ModelText& text,
                     v1::PositionLogprobs* out) {
  v1::TokenLogprob* chosen = out->mutable_chosen();
  chosen->set_token_id(logprobs.token_id);
  chosen->set_token(text.TokenText(logprobs.token_id));
  chosen->set_logprob(logprobs.logprob);
  chosen->set_rank(logprobs.rank);
  for (const engine::TokenLogprob& top : logprobs.top) {
    v1::TokenLogprob* entry = out->add_top();
    entry->set_token_id(top.token_id);
    entry->set_token(text.TokenText(top.token_id));
    entry->set_logprob(top.logprob);
  }
}

}  // namespace lmserve::server
