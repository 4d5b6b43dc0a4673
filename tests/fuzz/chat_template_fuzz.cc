// libFuzzer: arbitrary bytes as a chat template. Parses it and renders a small conversation with
// tight limits: any input must end in text or an error status, never a crash, a hang or a leak.
// Good seeds: tests/engine/chat/testdata/templates/*.jinja.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lmserve::engine::ChatMessage;
  using lmserve::engine::ChatTemplate;
  using lmserve::engine::ChatTemplateOptions;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(source);
  if (!chat_template.ok()) return 0;
  static const std::vector<ChatMessage> kMessages = {
      {"system", "Be brief."},
      {"user", "Hi \xc3\xa9 {{ x }}"},
      {"assistant", "<think>t</think>Hello", {{"tool_calls", {{{"id", "abcdefghi"},
                                                               {"type", "function"},
                                                               {"function",
                                                                {{"name", "f"},
                                                                 {"arguments", {{"a", 1}}}}}}}}}},
      {"tool", "42", {{"tool_call_id", "abcdefghi"}}},
      {"user", "Bye"},
  };
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.extra_variables = {
      {"tools",
       {{{"type", "function"},
         {"function",
          {{"name", "f"},
           {"description", "d"},
           {"parameters",
            {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}}}}}}}};
  options.limits.max_steps = 20000;
  options.limits.max_output_bytes = 1 << 16;
  options.now = [] { return std::chrono::system_clock::time_point(); };
  (void)chat_template->Render(kMessages, options);
  return 0;
}
