#include "engine/chat/chat_template.h"

#include <filesystem>

#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/chat/jinja/interpreter.h"
#include "engine/chat/jinja/value.h"

namespace lmserve::engine {
namespace {

using jinja::Value;

// JSON nesting accepted in messages and extra variables (deeper is an error, not a deep stack).
constexpr int kMaxJsonDepth = 100;

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json, int depth) {
  if (depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        StrCat("chat template input nested deeper than ", kMaxJsonDepth, " levels"));
  }
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t value = json.get<uint64_t>();
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value::Float(static_cast<double>(value));
      }
      return Value::Int(static_cast<int64_t>(value));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::List items;
      items.reserve(json.size());
      for (const auto& item : json) {
        LMSERVE_ASSIGN_OR_RETURN(Value value, FromJson(item, depth + 1));
        items.push_back(std::move(value));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::Dict dict;
      for (const auto& [key, item] : json.items()) {
        LMSERVE_ASSIGN_OR_RETURN(Value value, FromJson(item, depth + 1));
        dict.Set(key, std::move(value));
      }
      return Value::MakeDict(std::move(dict));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  return absl::InvalidArgumentError("chat template input holds binary JSON data");
}

absl::StatusOr<Value> MessageValue(const ChatMessage& message) {
  if (!message.extra.is_object()) {
    return absl::InvalidArgumentError("a chat message's extra fields must be a JSON object");
  }
  jinja::Dict dict;
  dict.Set("role", Value::String(message.role));
  dict.Set("content", Value::String(message.content));
  for (const auto& [key, item] : message.extra.items()) {
    LMSERVE_ASSIGN_OR_RETURN(Value value, FromJson(item, 1));
    dict.Set(key, std::move(value));
  }
  return Value::MakeDict(std::move(dict));
}

std::string WithPrefix(absl::string_view message) { return StrCat("chat template: ", message); }

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<jinja::Template> compiled = jinja::Template::Parse(source);
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(), WithPrefix(compiled.status().message()));
  }
  return ChatTemplate(std::make_shared<const jinja::Template>(*std::move(compiled)),
                      std::make_shared<const std::string>(source));
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const ChatTemplateOptions& options) const {
  jinja::List message_values;
  message_values.reserve(messages.size());
  for (const ChatMessage& message : messages) {
    LMSERVE_ASSIGN_OR_RETURN(Value value, MessageValue(message));
    message_values.push_back(std::move(value));
  }
  jinja::Dict variables;
  variables.Set("messages", Value::MakeList(std::move(message_values)));
  variables.Set("tools", Value::None());
  variables.Set("documents", Value::None());
  variables.Set("add_generation_prompt", Value::Bool(options.add_generation_prompt));
  if (options.bos_token.has_value()) variables.Set("bos_token", Value::String(*options.bos_token));
  if (options.eos_token.has_value()) variables.Set("eos_token", Value::String(*options.eos_token));
  if (!options.extra_variables.is_null()) {
    if (!options.extra_variables.is_object()) {
      return absl::InvalidArgumentError("chat template extra variables must be a JSON object");
    }
    for (const auto& [key, item] : options.extra_variables.items()) {
      LMSERVE_ASSIGN_OR_RETURN(Value value, FromJson(item, 1));
      variables.Set(key, std::move(value));
    }
  }
  jinja::RenderOptions render_options;
  render_options.limits.max_output_bytes = options.limits.max_output_bytes;
  render_options.limits.max_steps = options.limits.max_steps;
  render_options.limits.max_call_depth = options.limits.max_call_depth;
  render_options.now = options.now;
  absl::StatusOr<std::string> text = compiled_->Render(variables, render_options);
  if (!text.ok() && !jinja::IsRaisedByTemplate(text.status())) {
    absl::Status status(text.status().code(), WithPrefix(text.status().message()));
    return status;
  }
  return text;
}

bool IsRaisedByChatTemplate(const absl::Status& status) {
  return jinja::IsRaisedByTemplate(status);
}

absl::StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(
    const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::ordered_json& message = messages[i];
    if (!message.is_object()) {
      return absl::InvalidArgumentError(StrCat("messages[", i, "] is not a JSON object"));
    }
    const auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      return absl::InvalidArgumentError(StrCat("messages[", i, "] has no string \"role\""));
    }
    ChatMessage chat_message;
    chat_message.role = role->get<std::string>();
    for (const auto& [key, value] : message.items()) {
      if (key == "role") continue;
      if (key == "content" && value.is_string()) {
        chat_message.content = value.get<std::string>();
        continue;
      }
      chat_message.extra[key] = value;
    }
    out.push_back(std::move(chat_message));
  }
  return out;
}

absl::StatusOr<std::string> ResolveChatTemplate(const std::string& name_or_file,
                                                const std::string& model_template) {
  if (name_or_file.empty()) {
    if (model_template.empty()) {
      return absl::FailedPreconditionError(
          StrCat("the model has no chat template; choose one with --chat-template (built-in: ",
                 StrJoin(BuiltinChatTemplateNames(), ", "), ", or a file)"));
    }
    return model_template;
  }
  if (std::optional<std::string_view> builtin = BuiltinChatTemplate(name_or_file)) {
    return std::string(*builtin);
  }
  std::error_code error;
  if (!std::filesystem::is_regular_file(name_or_file, error)) {
    return absl::NotFoundError(StrCat("chat template '", name_or_file, "' is neither a built-in (",
                                      StrJoin(BuiltinChatTemplateNames(), ", "), ") nor a file"));
  }
  LMSERVE_ASSIGN_OR_RETURN(std::string text, lmserve::ReadFile(name_or_file));
  if (std::filesystem::path(name_or_file).extension() == ".json") {
    const nlohmann::ordered_json json =
        nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.is_object()) {
      return absl::InvalidArgumentError(StrCat(name_or_file, ": not a JSON object"));
    }
    const auto found = json.find("chat_template");
    if (found == json.end() || !found->is_string()) {
      return absl::InvalidArgumentError(
          StrCat(name_or_file, ": no string \"chat_template\" in this JSON file"));
    }
    return found->get<std::string>();
  }
  return text;
}

}  // namespace lmserve::engine
