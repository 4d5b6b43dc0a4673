#include "server/model_text.h"

#include <utility>

#include "absl/status/status.h"
#include "common/strings.h"

#if LMSERVE_HAVE_TOKENIZER
#include "absl/types/span.h"
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
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override {
    return absl::FailedPreconditionError(kNoTokenizer);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t>, bool) const override {
    return absl::FailedPreconditionError(kNoTokenizer);
  }
  std::string TokenText(int32_t) const override { return ""; }
  std::unique_ptr<engine::TextDecoder> NewTextDecoder() const override { return nullptr; }
  absl::StatusOr<std::string> RenderChat(std::span<const ChatTurn>, bool) const override {
    return absl::FailedPreconditionError(kNoChatTemplate);
  }
};

#if LMSERVE_HAVE_TOKENIZER

// Over engine::Tokenizer. The engine's text decoder is FunctionTextDecoder over Tokenizer::Decode:
// its window starts a few prompt tokens back, so that a first generated token keeps the leading
// space a SentencePiece decoder would strip at the start of a text.
class TokenizerText final : public ModelText {
 public:
  explicit TokenizerText(std::unique_ptr<engine::Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)) {}

  bool has_tokenizer() const override { return true; }
  // TODO(server): render tokenizer_->chat_template() once engine/chat/ (Jinja) lands.
  bool has_chat_template() const override { return false; }

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
    const engine::Tokenizer* tokenizer = tokenizer_.get();
    return std::make_unique<engine::FunctionTextDecoder>(
        [tokenizer](std::span<const int32_t> ids) {
          return tokenizer->Decode(absl::MakeConstSpan(ids.data(), ids.size()),
                                   /*skip_special=*/true);
        });
  }
  absl::StatusOr<std::string> RenderChat(std::span<const ChatTurn>, bool) const override {
    return absl::FailedPreconditionError(
        StrCat(kNoChatTemplate, " (chat templates are not supported by this build)"));
  }

 private:
  std::unique_ptr<engine::Tokenizer> tokenizer_;
};

#endif  // LMSERVE_HAVE_TOKENIZER

}  // namespace

std::unique_ptr<ModelText> ModelText::None() { return std::make_unique<NoText>(); }

absl::StatusOr<std::unique_ptr<ModelText>> ModelText::Load(const std::string& model_path,
                                                           const std::string& tokenizer_path,
                                                           int64_t vocab_size,
                                                           std::string* warning) {
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
  return std::unique_ptr<ModelText>(std::make_unique<TokenizerText>(*std::move(tokenizer)));
#else
  if (!tokenizer_path.empty()) {
    return absl::UnimplementedError("--tokenizer: this build has no tokenizer (engine/tokenizer/)");
  }
  *warning = "this build has no tokenizer: serving token-id prompts only";
  return None();
#endif
}

}  // namespace lmserve::server
