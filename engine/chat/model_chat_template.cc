#include "engine/chat/model_chat_template.h"

#include <filesystem>

#include "absl/status/status.h"
#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/gguf.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

absl::StatusOr<Json> ParseJsonObject(std::string_view text, std::string_view what) {
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(StrCat(what, ": not valid JSON"));
  if (!json.is_object()) return absl::InvalidArgumentError(StrCat(what, ": not a JSON object"));
  return json;
}

// A special token in tokenizer_config.json: a string, an AddedToken {"content": ...}, or null.
absl::StatusOr<std::optional<std::string>> SpecialToken(const Json& config, const char* key) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return std::optional<std::string>();
  if (found->is_string()) return std::optional<std::string>(found->get<std::string>());
  if (found->is_object()) {
    const auto content = found->find("content");
    if (content != found->end() && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return absl::InvalidArgumentError(
      StrCat("tokenizer_config.json: \"", key, "\" is neither a string nor {\"content\": ...}"));
}

// "chat_template": a string, or [{"name": ..., "template": ...}, ...] of which "default" is used.
absl::StatusOr<std::string> ChatTemplateField(const Json& config, std::string_view what) {
  const auto found = config.find("chat_template");
  if (found == config.end() || found->is_null()) return std::string();
  if (found->is_string()) return found->get<std::string>();
  if (found->is_array()) {
    for (const Json& entry : *found) {
      if (!entry.is_object()) continue;
      const auto name = entry.find("name");
      const auto source = entry.find("template");
      if (name != entry.end() && name->is_string() && name->get<std::string>() == "default" &&
          source != entry.end() && source->is_string()) {
        return source->get<std::string>();
      }
    }
    return absl::InvalidArgumentError(
        StrCat(what, ": \"chat_template\" is a list without a template named \"default\""));
  }
  return absl::InvalidArgumentError(
      StrCat(what, ": \"chat_template\" is neither a string nor a list of named templates"));
}

absl::StatusOr<ModelChatTemplate> LoadHfDirectory(const fs::path& directory) {
  ModelChatTemplate result;
  const fs::path config_path = directory / "tokenizer_config.json";
  std::error_code error;
  if (fs::is_regular_file(config_path, error)) {
    LMSERVE_ASSIGN_OR_RETURN(std::string text, lmserve::ReadFile(config_path.string()));
    absl::StatusOr<ModelChatTemplate> parsed = ParseTokenizerConfig(text);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          StrCat(config_path.string(), ": ", parsed.status().message()));
    }
    result = *std::move(parsed);
  }
  // Newer transformers save the template beside the config; it then takes precedence.
  const fs::path jinja_path = directory / "chat_template.jinja";
  const fs::path json_path = directory / "chat_template.json";
  if (fs::is_regular_file(jinja_path, error)) {
    LMSERVE_ASSIGN_OR_RETURN(std::string text, lmserve::ReadFile(jinja_path.string()));
    result.chat_template = std::move(text);
  } else if (fs::is_regular_file(json_path, error)) {
    LMSERVE_ASSIGN_OR_RETURN(std::string text, lmserve::ReadFile(json_path.string()));
    LMSERVE_ASSIGN_OR_RETURN(Json json, ParseJsonObject(text, json_path.string()));
    LMSERVE_ASSIGN_OR_RETURN(std::string source, ChatTemplateField(json, json_path.string()));
    if (!source.empty()) result.chat_template = std::move(source);
  }
  return result;
}

}  // namespace

absl::StatusOr<ModelChatTemplate> ParseTokenizerConfig(std::string_view json_text) {
  LMSERVE_ASSIGN_OR_RETURN(Json config, ParseJsonObject(json_text, "tokenizer_config.json"));
  ModelChatTemplate result;
  LMSERVE_ASSIGN_OR_RETURN(std::string source, ChatTemplateField(config, "tokenizer_config.json"));
  result.chat_template = std::move(source);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> bos, SpecialToken(config, "bos_token"));
  result.bos_token = std::move(bos);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> eos, SpecialToken(config, "eos_token"));
  result.eos_token = std::move(eos);
  return result;
}

absl::StatusOr<ModelChatTemplate> LoadGgufChatTemplate(const std::string& gguf_path) {
  LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(gguf_path));
  return GgufChatTemplate(*file);
}

absl::StatusOr<ModelChatTemplate> GgufChatTemplate(const GgufFile& gguf) {
  ModelChatTemplate result;
  if (const GgufValue* source = gguf.Find("tokenizer.chat_template"); source != nullptr) {
    if (source->type != GgufType::kString) {
      return absl::InvalidArgumentError(StrCat(gguf.path(), ": tokenizer.chat_template is a ",
                                               GgufTypeName(source->type), ", not a string"));
    }
    result.chat_template = source->string_value;
  }
  // The special tokens are the vocabulary's strings at their ids (when both are present).
  const GgufValue* tokens = gguf.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != GgufType::kArray ||
      tokens->element_type != GgufType::kString) {
    return result;
  }
  const auto token_at = [&](const char* key) -> absl::StatusOr<std::optional<std::string>> {
    const std::optional<int64_t> id = gguf.GetInt(key);
    if (!id.has_value()) return std::optional<std::string>();
    if (*id < 0 || *id >= static_cast<int64_t>(tokens->elements.size())) {
      return absl::InvalidArgumentError(StrCat(gguf.path(), ": ", key, " = ", *id,
                                               " is outside the vocabulary of ",
                                               tokens->elements.size(), " tokens"));
    }
    return std::optional<std::string>(tokens->elements[static_cast<size_t>(*id)].string_value);
  };
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> bos, token_at("tokenizer.ggml.bos_token_id"));
  result.bos_token = std::move(bos);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> eos, token_at("tokenizer.ggml.eos_token_id"));
  result.eos_token = std::move(eos);
  return result;
}

absl::StatusOr<ModelChatTemplate> LoadModelChatTemplate(const std::string& path) {
  std::error_code error;
  const fs::path model_path(path);
  if (!fs::exists(model_path, error)) return absl::NotFoundError(StrCat(path, ": no such file"));
  if (fs::is_directory(model_path, error)) return LoadHfDirectory(model_path);
  if (model_path.extension() == ".gguf") return LoadGgufChatTemplate(path);
  if (model_path.extension() == ".json") {
    // tokenizer.json or tokenizer_config.json: the model directory is where it lies.
    return LoadHfDirectory(model_path.has_parent_path() ? model_path.parent_path() : fs::path("."));
  }
  return absl::InvalidArgumentError(
      StrCat(path, ": expected a model directory, a tokenizer.json or a .gguf file"));
}

}  // namespace lmserve::engine
