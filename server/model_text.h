// The text side of the served model: tokenization, detokenization, the engine's text decoder and the
// chat template.
//
// The engine takes token ids; the server turns text into ids and gives the engine a TextDecoder for
// the way back. Without a tokenizer (the fixture models have none) the server serves token-id
// prompts only: text prompts, stop strings, Tokenize, Detokenize and Chat fail with
// FAILED_PRECONDITION naming what is missing.
//
// Thread safety: a ModelText is immutable after Load; every method may be called from any thread.

#ifndef LMSERVE_SERVER_MODEL_TEXT_H_
#define LMSERVE_SERVER_MODEL_TEXT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/text.h"
#include "engine/structured/constraint.h"
#include "nlohmann/json.hpp"

namespace lmserve::server {

struct ChatTurn {
  std::string role;
  std::string content;
  // More keys of the message for the template (tool_calls, tool_call_id, name); an object.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ModelText {
 public:
  virtual ~ModelText() = default;

  // The tokenizer of `tokenizer_path` when given (an error when it does not load), otherwise of
  // `model_path` (a model without a usable tokenizer gets one without: `*warning` says why).
  // `vocab_size` is the model's: token ids at or beyond it are rejected; `eos_token_ids` the
  // model's (structured output allows them where a match may end; empty: the tokenizer's EOS and
  // end-of-turn tokens). The chat template is
  // `chat_template` (a built-in name or a file; an error when it does not load or parse), else the
  // model's own; a model without one serves no Chat calls (`*warning` says so).
  static absl::StatusOr<std::unique_ptr<ModelText>> Load(const std::string& model_path,
                                                         const std::string& tokenizer_path,
                                                         const std::string& chat_template,
                                                         int64_t vocab_size, std::string* warning,
                                                         std::vector<int32_t> eos_token_ids = {});
  // No tokenizer, no chat template.
  static std::unique_ptr<ModelText> None();

  virtual bool has_tokenizer() const = 0;
  virtual bool has_chat_template() const = 0;
  // The chat template's source ("" without one): its tool-call format is read from it.
  virtual std::string_view chat_template_source() const = 0;

  // The ids of `text` (valid UTF-8). FailedPrecondition without a tokenizer.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_special) const = 0;
  // The text of `ids` (each in the vocabulary). FailedPrecondition without a tokenizer.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                             bool skip_special) const = 0;
  // The text of one token, for logprobs ("" without a tokenizer).
  virtual std::string TokenText(int32_t id) const = 0;
  // A text decoder for the engine; nullptr without a tokenizer.
  virtual std::unique_ptr<engine::TextDecoder> NewTextDecoder() const = 0;
  // Structured output: `spec` compiled against this tokenizer's vocabulary, shared with earlier
  // requests of the same spec (engine/structured/constraint.h). FailedPrecondition without a
  // tokenizer; InvalidArgument naming the problem.
  virtual absl::StatusOr<std::shared_ptr<engine::structured::CompiledGrammar>> CompileConstraint(
      const engine::structured::ConstraintSpec& spec) const = 0;

  // The prompt text of a conversation under the model's chat template, with `template_kwargs` (a
  // JSON object, e.g. {"enable_thinking": false}) as further template variables. FailedPrecondition
  // without a template; InvalidArgument "messages: ..." when the template rejects the
  // conversation.
  virtual absl::StatusOr<std::string> RenderChat(
      std::span<const ChatTurn> messages, bool add_generation_prompt,
      const nlohmann::ordered_json& template_kwargs) const = 0;
};

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_MODEL_TEXT_H_
