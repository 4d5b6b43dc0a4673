// lmserve chat-template --model PATH --messages FILE.json [--chat-template NAME|FILE]
//     [--no-generation-prompt]: renders a conversation with a model's chat template and prints
// {"text": "..."}.
//
// --messages holds a JSON array of messages ({"role", "content", ...}), or an object
// {"messages": [...], ...} whose other keys are template variables (tools, date_string, ...).

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "common/file.h"
#include "common/strings.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/model_chat_template.h"
#include "nlohmann/json.hpp"
#include "server/cli.h"

namespace lmserve::server {
namespace {

using Json = nlohmann::ordered_json;

// The bytes of --messages: a file, or stdin for "-".
absl::StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    std::ostringstream text;
    text << std::cin.rdbuf();
    return text.str();
  }
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        StrCat("--messages: ", contents.status().message()));
  }
  return contents;
}

struct ChatTemplateOptions {
  std::optional<std::string> model;
  std::string messages;
  std::optional<std::string> chat_template;
  bool no_generation_prompt = false;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

int Run(const ChatTemplateOptions& args) {
  if (!args.model.has_value() && !args.chat_template.has_value()) {
    std::fprintf(stderr, "lmserve chat-template: give --model, --chat-template or both\n");
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lmserve chat-template: %s\n", std::string(status.message()).c_str());
    return 1;
  };

  engine::ModelChatTemplate model;
  if (args.model.has_value()) {
    absl::StatusOr<engine::ModelChatTemplate> loaded = engine::LoadModelChatTemplate(*args.model);
    if (!loaded.ok()) return fail(loaded.status());
    model = *std::move(loaded);
  }
  absl::StatusOr<std::string> source =
      engine::ResolveChatTemplate(args.chat_template.value_or(""), model.chat_template);
  if (!source.ok()) return fail(source.status());
  absl::StatusOr<engine::ChatTemplate> chat_template = engine::ChatTemplate::Parse(*source);
  if (!chat_template.ok()) return fail(chat_template.status());

  absl::StatusOr<std::string> input = ReadInput(args.messages);
  if (!input.ok()) return fail(input.status());
  Json json = Json::parse(*input, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return fail(absl::InvalidArgumentError(StrCat(args.messages, ": not valid JSON")));
  }
  engine::ChatTemplateOptions options;
  Json messages_json;
  if (json.is_object()) {
    const auto found = json.find("messages");
    if (found == json.end()) {
      return fail(absl::InvalidArgumentError(
          StrCat(args.messages, ": an object needs a \"messages\" array")));
    }
    messages_json = *found;
    json.erase("messages");
    options.extra_variables = std::move(json);
  } else {
    messages_json = std::move(json);
  }
  absl::StatusOr<std::vector<engine::ChatMessage>> messages =
      engine::ChatMessagesFromJson(messages_json);
  if (!messages.ok()) {
    return fail(
        absl::InvalidArgumentError(StrCat(args.messages, ": ", messages.status().message())));
  }
  options.add_generation_prompt = !args.no_generation_prompt;
  options.bos_token = model.bos_token;
  options.eos_token = model.eos_token;
  if (args.bos_token.has_value()) options.bos_token = *args.bos_token;
  if (args.eos_token.has_value()) options.eos_token = *args.eos_token;

  absl::StatusOr<std::string> text = chat_template->Render(*messages, options);
  if (!text.ok()) return fail(text.status());
  const Json out = {{"text", *text}};
  std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace

CommandRunner DeclareChatTemplate(CLI::App* command) {
  command->footer(
      "Renders a conversation with a model's chat template, as transformers' "
      "apply_chat_template(tokenize=False) would, and prints {\"text\": \"...\"}.");
  auto options = std::make_shared<ChatTemplateOptions>();
  AddStringFlag(command, "--model", &options->model,
                "a Hugging Face model directory, its tokenizer.json, or a .gguf file (required "
                "unless --chat-template is given)");
  AddStringFlag(command, "--messages", &options->messages,
                "a JSON file (- for stdin): an array of {\"role\", \"content\", ...} messages, or "
                "an object {\"messages\": [...], ...} whose other keys are template variables "
                "(tools, date_string, ...)")
      ->required();
  AddStringFlag(command, "--chat-template", &options->chat_template,
                StrCat("a built-in template (", StrJoin(engine::BuiltinChatTemplateNames(), ", "),
                       ") or a template file, instead of the model's"));
  AddBoolFlag(command, "--no-generation-prompt", &options->no_generation_prompt,
              "render without the assistant turn's opening");
  AddStringFlag(command, "--bos-token", &options->bos_token,
                "the bos_token string (default: the model's)");
  AddStringFlag(command, "--eos-token", &options->eos_token,
                "the eos_token string (default: the model's)");
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
