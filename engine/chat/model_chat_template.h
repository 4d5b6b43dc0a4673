// Where a model keeps its chat template and special tokens, and reading them.
//
//   Hugging Face directory   chat_template.jinja, else chat_template.json {"chat_template": ...},
//                            else tokenizer_config.json "chat_template" (a string, or a list of
//                            {"name", "template"} from which "default" is taken);
//                            bos_token / eos_token from tokenizer_config.json (a string, or an
//                            AddedToken object {"content": ...}).
//   tokenizer.json or tokenizer_config.json file: the directory it is in, as above.
//   GGUF file                tokenizer.chat_template, and the strings of tokenizer.ggml.tokens at
//                            tokenizer.ggml.bos_token_id / eos_token_id.

#ifndef LMSERVE_ENGINE_CHAT_MODEL_CHAT_TEMPLATE_H_
#define LMSERVE_ENGINE_CHAT_MODEL_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace lmserve::engine {

class GgufFile;

struct ModelChatTemplate {
  std::string chat_template;  // empty when the model has none
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

// Reads the template and special tokens of the model at `path` (see above). NotFound when the
// path does not exist; InvalidArgument for malformed files. A model without a template is not an
// error: chat_template is empty.
absl::StatusOr<ModelChatTemplate> LoadModelChatTemplate(const std::string& path);

// The template and tokens of tokenizer_config.json's text.
absl::StatusOr<ModelChatTemplate> ParseTokenizerConfig(std::string_view json_text);

// The template and special tokens of a GGUF file (LoadModelChatTemplate calls this for .gguf).
absl::StatusOr<ModelChatTemplate> LoadGgufChatTemplate(const std::string& gguf_path);
absl::StatusOr<ModelChatTemplate> GgufChatTemplate(const GgufFile& gguf);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CHAT_MODEL_CHAT_TEMPLATE_H_
