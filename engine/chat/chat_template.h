// Chat templates: turning a conversation into the prompt text a model was trained on.
//
// A model ships its chat template as Jinja source (tokenizer_config.json's "chat_template", the
// GGUF key tokenizer.chat_template). ChatTemplate parses that source once and renders it as
// transformers' apply_chat_template(tokenize=False) does: the template sees
//   messages               a list of dicts {"role", "content", ...ChatMessage::extra}
//   add_generation_prompt  bool
//   bos_token, eos_token   strings (undefined when the options leave them unset)
//   tools, documents       none (as transformers passes them), unless extra_variables sets them
//   ...extra_variables     every key of ChatTemplateOptions::extra_variables
// plus the globals raise_exception, strftime_now, range, namespace and dict. The output matches
// jinja2 byte for byte on the templates real models publish (tests/engine/chat compares with
// renders made by Python's jinja2 configured as transformers configures it).
//
// Rendering is bounded (ChatTemplateLimits), so an untrusted template (one a client or a model
// repository supplies) cannot hang or crash the server: it gets ResourceExhausted instead.
// A ChatTemplate is immutable; Render may be called from many threads at once.

#ifndef LMSERVE_ENGINE_CHAT_CHAT_TEMPLATE_H_
#define LMSERVE_ENGINE_CHAT_CHAT_TEMPLATE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;
  std::string content;
  // Further fields of the message (tool_calls, tool_call_id, name, ...) as a JSON object; the
  // template sees them as keys of the message. A key "role" or "content" here replaces the field
  // above (content that is not a string: null, or a list of parts).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

struct ChatTemplateLimits {
  int64_t max_output_bytes = 16 << 20;  // the prompt, and any one string or list built
  int64_t max_steps = 2'000'000;        // expressions evaluated + statements executed
  int max_call_depth = 64;              // nested macro calls
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // More template variables (a JSON object): tools, documents, date_string, enable_thinking...
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();
  ChatTemplateLimits limits;
  // The clock strftime_now() reads, in local time as Python's datetime.now(); unset: the system
  // clock. Tests inject a fixed time.
  std::function<std::chrono::system_clock::time_point()> now;
};

class ChatTemplate {
 public:
  // Parses Jinja source. Syntax errors are InvalidArgument "chat template: line L, column C: ...".
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders the prompt. Errors are InvalidArgument: when the template calls
  // raise_exception(message) (it rejects the conversation, e.g. roles that do not alternate), the
  // status message is exactly `message` and IsRaisedByChatTemplate() is true; other errors read
  // "chat template: line L, column C: ...". Passing a limit is ResourceExhausted.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatTemplateOptions& options) const;

  const std::string& source() const { return *source_; }

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> compiled,
               std::shared_ptr<const std::string> source)
      : compiled_(std::move(compiled)), source_(std::move(source)) {}

  std::shared_ptr<const jinja::Template> compiled_;
  std::shared_ptr<const std::string> source_;
};

// Whether a Render error is the template's own raise_exception() (the conversation does not fit
// the template: a client error), rather than a broken template or a limit.
bool IsRaisedByChatTemplate(const absl::Status& status);

// Messages in the OpenAI chat format: a JSON array of objects with a string "role" and a
// "content" (a string, null or a list of parts); other keys go to ChatMessage::extra. A message
// without "content" gets "" (transformers would leave message.content undefined).
absl::StatusOr<std::vector<ChatMessage>> ChatMessagesFromJson(
    const nlohmann::ordered_json& messages);

// The built-in templates, by name: "chatml", "llama2", "llama3", "mistral", "zephyr" (the texts
// these models publish; see builtin_templates.cc). nullopt for other names.
std::optional<std::string_view> BuiltinChatTemplate(std::string_view name);
std::vector<std::string_view> BuiltinChatTemplateNames();

// The template for `--chat-template NAME|FILE`: empty `name_or_file` selects `model_template`
// (FailedPrecondition when that is empty too); a built-in name selects the built-in; anything
// else is read as a file (a .jinja source, or a .json with a "chat_template" key). NotFound when
// it is neither a built-in nor a readable file.
absl::StatusOr<std::string> ResolveChatTemplate(const std::string& name_or_file,
                                                const std::string& model_template);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CHAT_CHAT_TEMPLATE_H_
