// Tool calling: the format a model writes its tool calls in (chosen by its chat template), the
// constraint that forces a call (tool_choice "required" or a named function), and the parser that
// finds the calls in a finished output.
//
// Formats:
//   kHermes  (Hermes, Qwen2/2.5/3 and ChatML templates): <tool_call>\n{"name": N, "arguments": {...}}
//            \n</tool_call>, one block per call; text before the first block is content. Also the
//            default for templates that know no tool format (the demo model's).
//   kLlama3  (Llama 3.1-3.3, a template that mentions <|python_tag|> or ipython): the whole output
//            a JSON object {"name": N, "parameters": {...}} (or "arguments"), several separated by
//            ";", optionally after <|python_tag|>.
//   kMistral (a template that mentions [TOOL_CALLS]): [TOOL_CALLS] then a JSON array of
//            {"name": N, "arguments": {...}}. [TOOL_CALLS] is a special token, which a constraint
//            cannot write: a forced call is the array alone, which the parser also accepts.

#ifndef LMSERVE_SERVER_TOOL_CALLS_H_
#define LMSERVE_SERVER_TOOL_CALLS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/structured/constraint.h"

namespace lmserve::server {

enum class ToolCallFormat { kHermes, kLlama3, kMistral };
std::string_view ToolCallFormatName(ToolCallFormat format);

// The format of a chat template's source (see the top of this file).
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);

struct ToolSpec {
  std::string name;
  std::string description;
  std::string parameters;  // a JSON Schema as JSON text; "" for none (any object)
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object as compact JSON text
};

// The constraint of a forced call: one call of `only` (a tool's name), or of any tool when "".
// InvalidArgument when a tool's parameters are not a JSON object.
absl::StatusOr<engine::structured::ConstraintSpec> ForcedToolCallSpec(
    const std::vector<ToolSpec>& tools, std::string_view only, ToolCallFormat format);

// The tool calls in `text`, or nullopt when it holds none (or one that does not parse: then the
// whole text is content). `*content` is the text outside the calls (trimmed; "" for none).
std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text,
                                                          ToolCallFormat format,
                                                          std::string* content);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_TOOL_CALLS_H_
