#include "server/model_text.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"

#if LMSERVE_HAVE_TOKENIZER
#include "absl/types/span.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/model_chat_template.h"
#include "engine/core/tokenizer_text.h"
#include "engine/tokenizer/tokenizer.h"
#endif

namespace lmserve::server {
namespace {

constexpr const char* kNoTokenizer =
    "this model has no tokenizer: send prompt.token_ids (lmserve serve --tokenizer PATH adds one)";
constexpr const char* kNoChatTemplate = "this model has no chat template";

class NoText final : public ModelText {
 public:
  bool has_tokenizer() const override { return false; }
  bool has_chat_template() const override { return false; }
  std::string_view chat_template_source() const override { return ""; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override {
    return absl::FailedPreconditionError(kNoTokenizer);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t>, bool) const override {
    return absl::FailedPreconditionError(kNoTokenizer);
  }
  std::string TokenText(int32_t) const override { return ""; }
  std::unique_ptr<engine::TextDecoder> NewTextDecoder() const override { return nullptr; }
  absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> CompileConstraint(
      const engine::structured::ConstraintSpec&) const override {
    return absl::FailedPreconditionError(
        "structured output needs the model's tokenizer: this model has none");
  }
  absl::StatusOr<std::string> RenderChat(std::span<const ChatTurn>, bool,
                                         const nlohmann::ordered_json&) const override {
    return absl::FailedPreconditionError(kNoChatTemplate);
  }
};

#if LMSERVE_HAVE_TOKENIZER

// Over engine::Tokenizer, with engine::TokenizerTextDecoder (the streaming Detokenizer) for the
// engine's text.
class TokenizerText final : public ModelText {
 public:
  // `chat_template` may be null: no Chat calls.
  TokenizerText(std::unique_ptr<engine::Tokenizer> tokenizer,
                std::optional<engine::ChatTemplate> chat_template,
                engine::ChatTemplateOptions chat_options,
                std::unique_ptr<engine::structured::ConstraintCompiler> constraints,
                std::string chat_template_source)
      : tokenizer_(std::move(tokenizer)),
        chat_template_(std::move(chat_template)),
        chat_template_source_(std::move(chat_template_source)),
        chat_options_(std::move(chat_options)),
        constraints_(std::move(constraints)) {}

  bool has_tokenizer() const override { return true; }
  bool has_chat_template() const override { return chat_template_.has_value(); }
  std::string_view chat_template_source() const override { return chat_template_source_; }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special) const override {
    return tokenizer_->Encode(text, add_special);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special) const override {
    return tokenizer_->Decode(absl::MakeConstSpan(ids.data(), ids.size()), skip_special);
  }
  std::string TokenText(int32_t id) const override {
    return tokenizer_->Decode(absl::MakeConstSpan(&id, 1), /*skip_special=*/false);
  }
  std::unique_ptr<engine::TextDecoder> NewTextDecoder() const override {
    return std::make_unique<engine::TokenizerTextDecoder>(tokenizer_.get());
  }
  absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> CompileConstraint(
      const engine::structured::ConstraintSpec& spec) const override {
    if (constraints_ == nullptr) {
      return absl::FailedPreconditionError(
          StrCat("structured output is not available: ", constraints_error_));
    }
    return constraints_->Compile(spec);
  }
  absl::StatusOr<std::string> RenderChat(
      std::span<const ChatTurn> turns, bool add_generation_prompt,
      const nlohmann::ordered_json& template_kwargs) const override {
    if (!chat_template_.has_value()) return absl::FailedPreconditionError(kNoChatTemplate);
    std::vector<engine::ChatMessage> messages;
    messages.reserve(turns.size());
    for (const ChatTurn& turn : turns) {
      engine::ChatMessage message;
      message.role = turn.role;
      message.content = turn.content;
      message.extra = turn.extra;
      messages.push_back(std::move(message));
    }
    engine::ChatTemplateOptions options = chat_options_;
    options.add_generation_prompt = add_generation_prompt;
    for (const auto& [key, value] : template_kwargs.items()) options.extra_variables[key] = value;
    absl::StatusOr<std::string> text = chat_template_->Render(messages, options);
    // The template's own raise_exception() rejects the conversation: the client's error. Anything
    // else (a broken template, a limit) is the served model's problem, reported as is.
    if (!text.ok() && engine::IsRaisedByChatTemplate(text.status())) {
      return absl::InvalidArgumentError(StrCat("messages: ", text.status().message()));
    }
    return text;
  }

 private:
  std::unique_ptr<engine::Tokenizer> tokenizer_;
  std::optional<engine::ChatTemplate> chat_template_;
  std::string chat_template_source_;
  engine::ChatTemplateOptions chat_options_;
  // Thread-safe (its cache is locked); null when the vocabulary could not be mapped to bytes.
  std::unique_ptr<engine::structured::ConstraintCompiler> constraints_;
  std::string constraints_error_;
};

// The chat template: `chat_template` (a built-in name or a file) when given, else the model's.
// nullopt, with `*warning` set, when the model has none.
absl::StatusOr<std::optional<engine::ChatTemplate>> LoadChatTemplate(
    const std::string& model_path, const std::string& chat_template,
    engine::ChatTemplateOptions* options, std::string* warning, std::string* source_text) {
  absl::StatusOr<engine::ModelChatTemplate> model = engine::LoadModelChatTemplate(model_path);
  if (!model.ok()) {
    if (!chat_template.empty()) return model.status();
    *warning = StrCat("no chat template (", model.status().message(), "): Chat calls fail");
    return std::optional<engine::ChatTemplate>();
  }
  options->bos_token = model->bos_token;
  options->eos_token = model->eos_token;
  if (chat_template.empty() && model->chat_template.empty()) {
    *warning = "the model has no chat template: Chat calls fail (--chat-template gives one)";
    return std::optional<engine::ChatTemplate>();
  }
  absl::StatusOr<std::string> source =
      engine::ResolveChatTemplate(chat_template, model->chat_template);
  if (!source.ok()) {
    return absl::Status(source.status().code(), StrCat("--chat-template: ", source.status().message()));
  }
  LMSERVE_ASSIGN_OR_RETURN(engine::ChatTemplate parsed, engine::ChatTemplate::Parse(*source));
  *source_text = *source;
  return std::optional<engine::ChatTemplate>(std::move(parsed));
}

#endif  // LMSERVE_HAVE_TOKENIZER

}  // namespace

std::unique_ptr<ModelText> ModelText::None() { return std::make_unique<NoText>(); }

absl::StatusOr<std::unique_ptr<ModelText>> ModelText::Load(const std::string& model_path,
                                                           const std::string& tokenizer_path,
                                                           const std::string& chat_template,
                                                           int64_t vocab_size,
                                                           std::string* warning,
                                                           std::vector<int32_t> eos_token_ids) {
#if LMSERVE_HAVE_TOKENIZER
  const std::string& path = tokenizer_path.empty() ? model_path : tokenizer_path;
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer = engine::Tokenizer::Load(path);
  if (!tokenizer.ok()) {
    if (!tokenizer_path.empty()) {
      return absl::InvalidArgumentError(StrCat("--tokenizer: ", tokenizer.status().message()));
    }
    *warning = StrCat("no tokenizer (", tokenizer.status().message(),
                      "): serving token-id prompts only");
    return None();
  }
  if ((*tokenizer)->vocab_size() > vocab_size) {
    const std::string message =
        StrCat("the tokenizer's vocabulary (", (*tokenizer)->vocab_size(),
               " ids) is larger than the model's (", vocab_size, ")");
    if (!tokenizer_path.empty()) return absl::InvalidArgumentError(StrCat("--tokenizer: ", message));
    *warning = StrCat("no tokenizer (", message, "): serving token-id prompts only");
    return None();
  }
  engine::ChatTemplateOptions chat_options;
  std::string chat_warning;
  std::string chat_source;
  LMSERVE_ASSIGN_OR_RETURN(
      std::optional<engine::ChatTemplate> chat,
      LoadChatTemplate(tokenizer_path.empty() ? model_path : tokenizer_path, chat_template,
                       &chat_options, &chat_warning, &chat_source));
  if (!chat_warning.empty()) *warning = chat_warning;
  // Structured output: the vocabulary as bytes, once (tens of milliseconds for 128K tokens).
  if (eos_token_ids.empty()) {
    for (std::optional<int32_t> id : {(*tokenizer)->eos_id(), (*tokenizer)->eot_id()}) {
      if (id.has_value()) eos_token_ids.push_back(*id);
    }
  }
  std::unique_ptr<engine::structured::ConstraintCompiler> constraints;
  absl::StatusOr<std::unique_ptr<engine::structured::TokenTrie>> trie =
      engine::structured::TokenTrie::FromTokenizer(**tokenizer, vocab_size,
                                                   std::move(eos_token_ids));
  if (trie.ok()) {
    constraints = std::make_unique<engine::structured::ConstraintCompiler>(
        *std::move(trie), engine::structured::GrammarLimits{});
  } else {
    *warning = StrCat("structured output is off: ", trie.status().message());
  }
  auto text = std::make_unique<TokenizerText>(*std::move(tokenizer), std::move(chat),
                                              std::move(chat_options), std::move(constraints),
                                              std::move(chat_source));
  return std::unique_ptr<ModelText>(std::move(text));
#else
  if (!tokenizer_path.empty() || !chat_template.empty()) {
    return absl::UnimplementedError("--tokenizer: this build has no tokenizer (engine/tokenizer/)");
  }
  *warning = "this build has no tokenizer: serving token-id prompts only";
  return None();
#endif
}

}  // namespace lmserve::server
