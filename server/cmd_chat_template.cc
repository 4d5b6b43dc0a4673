// lmserve chat-template --model PATH --messages FILE.json [--chat-template NAME|FILE]
//     [--no-generation-prompt]: renders a conversation with a model's chat template and prints
// {"text": "..."}.
//
// --messages holds a JSON array of messages ({"role", "content", ...}), or an object
// {"messages": [...], ...} whose other keys are template variables (tools, date_string, ...).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "common/strings.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/model_chat_template.h"
#include "nlohmann/json.hpp"
#include "server/args.h"
#include "server/cli.h"

namespace lmserve::server {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  std::ostringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
    return text.str();
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(StrCat(path, ": cannot open"));
  text << file.rdbuf();
  return text.str();
}

}  // namespace

int RunChatTemplate(int argc, char** argv) {
  Args args("chat-template",
            "Renders a conversation with a model's chat template, as transformers' "
            "apply_chat_template(tokenize=False) would, and prints {\"text\": \"...\"}.");
  args.Option("model",
              "a Hugging Face model directory, its tokenizer.json, or a .gguf file (required "
              "unless --chat-template is given)")
      .Required("messages",
                "a JSON file (- for stdin): an array of {\"role\", \"content\", ...} messages, or "
                "an object {\"messages\": [...], ...} whose other keys are template variables "
                "(tools, date_string, ...)")
      .Option("chat-template",
              StrCat("a built-in template (", StrJoin(engine::BuiltinChatTemplateNames(), ", "),
                     ") or a template file, instead of the model's"))
      .Flag("no-generation-prompt", "render without the assistant turn's opening")
      .Option("bos-token", "the bos_token string (default: the model's)")
      .Option("eos-token", "the eos_token string (default: the model's)");
  absl::StatusOr<bool> parsed = args.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (!*parsed) return 0;
  if (!args.Has("model") && !args.Has("chat-template")) {
    std::fprintf(stderr, "lmserve chat-template: give --model, --chat-template or both\n");
    return 2;
  }
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lmserve chat-template: %s\n", std::string(status.message()).c_str());
    return 1;
  };

  engine::ModelChatTemplate model;
  if (args.Has("model")) {
    absl::StatusOr<engine::ModelChatTemplate> loaded =
        engine::LoadModelChatTemplate(args.Get("model"));
    if (!loaded.ok()) return fail(loaded.status());
    model = *std::move(loaded);
  }
  absl::StatusOr<std::string> source =
      engine::ResolveChatTemplate(args.Get("chat-template"), model.chat_template);
  if (!source.ok()) return fail(source.status());
  absl::StatusOr<engine::ChatTemplate> chat_template = engine::ChatTemplate::Parse(*source);
  if (!chat_template.ok()) return fail(chat_template.status());

  absl::StatusOr<std::string> input = ReadInput(args.Get("messages"));
  if (!input.ok()) return fail(input.status());
  Json json = Json::parse(*input, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return fail(absl::InvalidArgumentError(StrCat(args.Get("messages"), ": not valid JSON")));
  }
  engine::ChatTemplateOptions options;
  Json messages_json;
  if (json.is_object()) {
    const auto found = json.find("messages");
    if (found == json.end()) {
      return fail(absl::InvalidArgumentError(
          StrCat(args.Get("messages"), ": an object needs a \"messages\" array")));
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
    return fail(absl::InvalidArgumentError(
        StrCat(args.Get("messages"), ": ", messages.status().message())));
  }
  options.add_generation_prompt = !args.GetFlag("no-generation-prompt");
  options.bos_token = model.bos_token;
  options.eos_token = model.eos_token;
  if (args.Has("bos-token")) options.bos_token = args.Get("bos-token");
  if (args.Has("eos-token")) options.eos_token = args.Get("eos-token");

  absl::StatusOr<std::string> text = chat_template->Render(*messages, options);
  if (!text.ok()) return fail(text.status());
  const Json out = {{"text", *text}};
  std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace lmserve::server
