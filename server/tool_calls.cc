#include "server/tool_calls.h"

#include <utility>

#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace lmserve::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";

std::string_view Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

// {"name": N, <arguments_key>: {...}} as a call; nullopt for anything else.
std::optional<ParsedToolCall> CallOf(const Json& value) {
  if (!value.is_object()) return std::nullopt;
  auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  const Json* arguments = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (auto it = value.find(key); it != value.end()) arguments = &*it;
  }
  ParsedToolCall call;
  call.name = name->get<std::string>();
  if (arguments == nullptr) {
    call.arguments = "{}";
  } else if (arguments->is_object()) {
    call.arguments = arguments->dump();
  } else if (arguments->is_string()) {
    // Some models write the arguments as a JSON string.
    Json parsed = Json::parse(arguments->get<std::string>(), nullptr, false);
    if (!parsed.is_object()) return std::nullopt;
    call.arguments = parsed.dump();
  } else {
    return std::nullopt;
  }
  return call;
}

// One call or an array of calls.
bool AppendCalls(std::string_view text, std::vector<ParsedToolCall>* calls) {
  Json value = Json::parse(Trim(text), nullptr, false);
  if (value.is_discarded()) return false;
  if (value.is_array()) {
    if (value.empty()) return false;
    for (const Json& element : value) {
      std::optional<ParsedToolCall> call = CallOf(element);
      if (!call.has_value()) return false;
      calls->push_back(*std::move(call));
    }
    return true;
  }
  std::optional<ParsedToolCall> call = CallOf(value);
  if (!call.has_value()) return false;
  calls->push_back(*std::move(call));
  return true;
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "hermes";
}

ToolCallFormat DetectToolCallFormat(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (chat_template.find(kMistralTag) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (chat_template.find(kPythonTag) != std::string_view::npos ||
      chat_template.find("ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kHermes;
}

absl::StatusOr<engine::structured::ConstraintSpec> ForcedToolCallSpec(
    const std::vector<ToolSpec>& tools, std::string_view only, ToolCallFormat format) {
  const std::string arguments_key = format == ToolCallFormat::kLlama3 ? "parameters" : "arguments";
  Json any_of = Json::array();
  for (const ToolSpec& tool : tools) {
    if (!only.empty() && tool.name != only) continue;
    Json parameters = Json{{"type", "object"}};
    if (!tool.parameters.empty()) {
      parameters = Json::parse(tool.parameters, nullptr, false);
      if (!parameters.is_object()) {
        return absl::InvalidArgumentError(
            StrCat("tools: the parameters of '", tool.name, "' are not a JSON object"));
      }
    }
    Json properties = Json::object();
    properties["name"] = Json{{"const", tool.name}};
    properties[arguments_key] = std::move(parameters);
    any_of.push_back(Json{{"type", "object"},
                          {"properties", std::move(properties)},
                          {"required", Json::array({"name", arguments_key})},
                          {"additionalProperties", false}});
  }
  if (any_of.empty()) {
    return absl::InvalidArgumentError(StrCat("tool_choice: no tool named '", only, "'"));
  }
  engine::structured::ConstraintSpec spec;
  spec.kind = engine::structured::ConstraintKind::kJsonSchema;
  spec.text = any_of.size() == 1 ? any_of[0].dump() : Json{{"anyOf", std::move(any_of)}}.dump();
  switch (format) {
    case ToolCallFormat::kHermes:
      spec.prefix = StrCat(kHermesOpen, "\n");
      spec.suffix = StrCat("\n", kHermesClose);
      break;
    case ToolCallFormat::kLlama3:
      break;
    case ToolCallFormat::kMistral:
      spec.prefix = "[";
      spec.suffix = "]";
      break;
  }
  return spec;
}

std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text,
                                                          ToolCallFormat format,
                                                          std::string* content) {
  content->clear();
  std::vector<ParsedToolCall> calls;
  switch (format) {
    case ToolCallFormat::kHermes: {
      const size_t first = text.find(kHermesOpen);
      if (first == std::string_view::npos) return std::nullopt;
      for (size_t at = first; at != std::string_view::npos; at = text.find(kHermesOpen, at)) {
        const size_t body = at + kHermesOpen.size();
        const size_t close = text.find(kHermesClose, body);
        const std::string_view inside =
            text.substr(body, close == std::string_view::npos ? std::string_view::npos
                                                              : close - body);
        if (!AppendCalls(inside, &calls)) return std::nullopt;
        if (close == std::string_view::npos) break;
        at = close + kHermesClose.size();
      }
      *content = std::string(Trim(text.substr(0, first)));
      return calls;
    }
    case ToolCallFormat::kLlama3: {
      std::string_view rest = Trim(text);
      if (rest.substr(0, kPythonTag.size()) == kPythonTag) rest = rest.substr(kPythonTag.size());
      rest = Trim(rest);
      if (rest.empty() || rest[0] != '{') return std::nullopt;
      // Calls separated by ';' (a ';' inside a string would split wrongly: then it fails whole).
      if (AppendCalls(rest, &calls)) return calls;
      calls.clear();
      size_t start = 0;
      while (start < rest.size()) {
        size_t end = rest.find(';', start);
        if (end == std::string_view::npos) end = rest.size();
        if (!AppendCalls(rest.substr(start, end - start), &calls)) return std::nullopt;
        start = end + 1;
      }
      return calls.empty() ? std::nullopt : std::optional(std::move(calls));
    }
    case ToolCallFormat::kMistral: {
      std::string_view rest = text;
      const size_t tag = rest.find(kMistralTag);
      if (tag != std::string_view::npos) {
        *content = std::string(Trim(rest.substr(0, tag)));
        rest = rest.substr(tag + kMistralTag.size());
      }
      rest = Trim(rest);
      if (rest.empty() || rest[0] != '[') {
        content->clear();
        return std::nullopt;
      }
      if (!AppendCalls(rest, &calls)) {
        content->clear();
        return std::nullopt;
      }
      return calls;
    }
  }
  return std::nullopt;
}

}  // namespace lmserve::server
