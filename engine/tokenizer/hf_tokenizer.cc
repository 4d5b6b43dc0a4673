// Hugging Face tokenizer.json (+ tokenizer_config.json) -> Tokenizer.

#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/json_util.h"
#include "engine/tokenizer/tokenizer_pipeline.h"

namespace lmserve::engine {
namespace tokenizer_internal {
namespace {

absl::Status Context(const absl::Status& status, std::string_view where) {
  return absl::Status(status.code(), StrCat(where, ": ", status.message()));
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MergesFromJson(
    const nlohmann::json* j) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (j == nullptr || j->is_null()) return merges;
  if (!j->is_array()) return absl::InvalidArgumentError("\"merges\" is not a list");
  merges.reserve(j->size());
  for (const nlohmann::json& merge : *j) {
    if (merge.is_string()) {
      // The legacy form "left right".
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(StrCat("merge \"", text, "\" is not two tokens"));
      }
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return absl::InvalidArgumentError(StrCat("bad merge ", merge.dump()));
    }
  }
  return merges;
}

absl::StatusOr<std::unique_ptr<Model>> ModelFromJson(const nlohmann::json& j) {
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string type, JsonString(j, "type", "BPE"));
  if (type != "BPE") {
    return absl::UnimplementedError(
        StrCat("unsupported model type \"", type, "\" (supported: BPE)"));
  }
  const nlohmann::json* vocab_json = JsonMember(j, "vocab");
  if (vocab_json == nullptr || !vocab_json->is_object()) {
    return absl::InvalidArgumentError("BPE model without a \"vocab\" object");
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_json->size());
  for (const auto& [token, id] : vocab_json->items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(StrCat("vocab entry \"", token, "\" has no integer id"));
    }
    vocab.emplace_back(token, id.get<int32_t>());
  }
  LMSERVE_TOK_ASSIGN_OR_RETURN(auto merges, MergesFromJson(JsonMember(j, "merges")));
  BpeOptions options;
  LMSERVE_TOK_ASSIGN_OR_RETURN(options.fuse_unk, JsonBool(j, "fuse_unk", false));
  LMSERVE_TOK_ASSIGN_OR_RETURN(options.byte_fallback, JsonBool(j, "byte_fallback", false));
  LMSERVE_TOK_ASSIGN_OR_RETURN(options.ignore_merges, JsonBool(j, "ignore_merges", false));
  LMSERVE_TOK_ASSIGN_OR_RETURN(options.continuing_subword_prefix,
                               JsonString(j, "continuing_subword_prefix", ""));
  LMSERVE_TOK_ASSIGN_OR_RETURN(options.end_of_word_suffix, JsonString(j, "end_of_word_suffix", ""));
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string unk_token, JsonString(j, "unk_token", ""));
  if (const nlohmann::json* dropout = JsonMember(j, "dropout");
      dropout != nullptr && dropout->is_number() && dropout->get<double>() != 0.0) {
    return absl::UnimplementedError("BPE dropout is not supported (encoding is deterministic)");
  }
  if (!unk_token.empty()) {
    for (const auto& [token, id] : vocab) {
      if (token == unk_token) options.unk_id = id;
    }
    if (options.unk_id < 0) {
      return absl::InvalidArgumentError(
          StrCat("unk_token \"", unk_token, "\" is not in the vocabulary"));
    }
  }
  LMSERVE_TOK_ASSIGN_OR_RETURN(
      std::unique_ptr<BpeModel> model,
      BpeModel::CreateRanked(std::move(vocab), merges, std::move(options)));
  return std::unique_ptr<Model>(std::move(model));
}

absl::StatusOr<std::vector<AddedToken>> AddedTokensFromJson(const nlohmann::json* j) {
  std::vector<AddedToken> tokens;
  if (j == nullptr || j->is_null()) return tokens;
  if (!j->is_array()) return absl::InvalidArgumentError("\"added_tokens\" is not a list");
  for (const nlohmann::json& item : *j) {
    AddedToken token;
    LMSERVE_TOK_ASSIGN_OR_RETURN(const int64_t id, JsonInt(item, "id", -1));
    if (id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(StrCat("added token without a valid id: ", item.dump()));
    }
    token.id = static_cast<int32_t>(id);
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.content, JsonString(item, "content"));
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.special, JsonBool(item, "special", false));
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.single_word, JsonBool(item, "single_word", false));
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.lstrip, JsonBool(item, "lstrip", false));
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.rstrip, JsonBool(item, "rstrip", false));
    LMSERVE_TOK_ASSIGN_OR_RETURN(token.normalized, JsonBool(item, "normalized", !token.special));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// A special-token entry of tokenizer_config.json: a string, or an AddedToken object with "content".
std::optional<std::string> ConfigToken(const nlohmann::json& config, std::string_view key) {
  const nlohmann::json* value = JsonMember(config, key);
  if (value == nullptr) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (const nlohmann::json* content = JsonMember(*value, "content");
      content != nullptr && content->is_string()) {
    return content->get<std::string>();
  }
  return std::nullopt;
}

// The leading special token of a TemplateProcessing post-processor, taken as BOS when no
// tokenizer_config.json names one.
std::optional<int32_t> TemplateLeadingToken(const nlohmann::json& post_processor) {
  const nlohmann::json* single = JsonMember(post_processor, "single");
  if (single == nullptr || !single->is_array() || single->empty()) return std::nullopt;
  const nlohmann::json* special = JsonMember((*single)[0], "SpecialToken");
  if (special == nullptr) return std::nullopt;
  const nlohmann::json* name = JsonMember(*special, "id");
  const nlohmann::json* tokens = JsonMember(post_processor, "special_tokens");
  if (name == nullptr || !name->is_string() || tokens == nullptr) return std::nullopt;
  const nlohmann::json* entry = JsonMember(*tokens, name->get<std::string>());
  const nlohmann::json* ids = entry != nullptr ? JsonMember(*entry, "ids") : nullptr;
  if (ids == nullptr || !ids->is_array() || ids->size() != 1 || !(*ids)[0].is_number_integer()) {
    return std::nullopt;
  }
  return (*ids)[0].get<int32_t>();
}

absl::Status ApplyConfig(const nlohmann::json& config, Pipeline* pipeline) {
  const auto resolve = [&](std::string_view key, std::optional<int32_t>* out) -> absl::Status {
    const std::optional<std::string> token = ConfigToken(config, key);
    if (!token.has_value()) return absl::OkStatus();
    const std::optional<int32_t> id = PipelineTokenToId(*pipeline, *token);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(
          StrCat("tokenizer_config.json: ", key, " \"", *token, "\" is not in the vocabulary"));
    }
    *out = id;
    return absl::OkStatus();
  };
  for (const auto& [key, out] :
       {std::pair<std::string_view, std::optional<int32_t>*>{"bos_token", &pipeline->bos_id},
        {"eos_token", &pipeline->eos_id},
        {"pad_token", &pipeline->pad_id},
        {"unk_token", &pipeline->unk_id}}) {
    LMSERVE_RETURN_IF_ERROR(resolve(key, out));
  }
  if (const nlohmann::json* chat_template = JsonMember(config, "chat_template");
      chat_template != nullptr) {
    if (chat_template->is_string()) {
      pipeline->chat_template = chat_template->get<std::string>();
    } else if (chat_template->is_array()) {
      // Named templates: [{"name": "default", "template": "..."}, ...]; the default one is used.
      for (const nlohmann::json& named : *chat_template) {
        const nlohmann::json* name = JsonMember(named, "name");
        const nlohmann::json* text = JsonMember(named, "template");
        if (name != nullptr && name->is_string() && name->get<std::string>() == "default" &&
            text != nullptr && text->is_string()) {
          pipeline->chat_template = text->get<std::string>();
        }
      }
    }
  }
  // Without a post-processor, add_bos_token / add_eos_token say what Encode(add_special) adds.
  if (pipeline->post_processor == nullptr) {
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool add_bos, JsonBool(config, "add_bos_token", false));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool add_eos, JsonBool(config, "add_eos_token", false));
    std::vector<int32_t> prefix, suffix;
    if (add_bos && pipeline->bos_id.has_value()) prefix.push_back(*pipeline->bos_id);
    if (add_eos && pipeline->eos_id.has_value()) suffix.push_back(*pipeline->eos_id);
    if (!prefix.empty() || !suffix.empty()) {
      pipeline->post_processor = MakeTemplatePostProcessor(std::move(prefix), std::move(suffix));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Pipeline>> HfPipelineFromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  const nlohmann::json j = nlohmann::json::parse(tokenizer_json.begin(), tokenizer_json.end(),
                                                 nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("not a JSON object (tokenizer.json)");
  }
  auto pipeline = std::make_unique<Pipeline>();
  const nlohmann::json kNull;
  const auto member = [&](std::string_view key) -> const nlohmann::json& {
    const nlohmann::json* m = JsonMember(j, key);
    return m != nullptr ? *m : kNull;
  };
  const nlohmann::json& model_json = member("model");
  if (!model_json.is_object()) return absl::InvalidArgumentError("no \"model\" object");
  {
    absl::StatusOr<std::unique_ptr<Model>> model = ModelFromJson(model_json);
    if (!model.ok()) return Context(model.status(), "model");
    pipeline->model = *std::move(model);
  }
  {
    absl::StatusOr<std::unique_ptr<Normalizer>> normalizer =
        NormalizerFromJson(member("normalizer"));
    if (!normalizer.ok()) return Context(normalizer.status(), "normalizer");
    pipeline->normalizer = *std::move(normalizer);
  }
  {
    absl::StatusOr<std::unique_ptr<PreTokenizer>> pre =
        PreTokenizerFromJson(member("pre_tokenizer"));
    if (!pre.ok()) return Context(pre.status(), "pre_tokenizer");
    pipeline->pre_tokenizer = *std::move(pre);
  }
  {
    absl::StatusOr<std::unique_ptr<PostProcessor>> post =
        PostProcessorFromJson(member("post_processor"));
    if (!post.ok()) return Context(post.status(), "post_processor");
    pipeline->post_processor = *std::move(post);
  }
  {
    absl::StatusOr<std::unique_ptr<Decoder>> decoder = DecoderFromJson(member("decoder"));
    if (!decoder.ok()) return Context(decoder.status(), "decoder");
    pipeline->decoder = *std::move(decoder);
  }
  {
    absl::StatusOr<std::vector<AddedToken>> added =
        AddedTokensFromJson(JsonMember(j, "added_tokens"));
    if (!added.ok()) return Context(added.status(), "added_tokens");
    pipeline->added = AddedVocabulary(*std::move(added), pipeline->normalizer.get());
  }

  // Special tokens: tokenizer_config.json names them; without it they are recognized by their text.
  pipeline->bos_id = TemplateLeadingToken(member("post_processor"));
  pipeline->eos_id = FindSpecialToken(*pipeline, {"</s>", "<|end_of_text|>", "<|endoftext|>",
                                                  "<|im_end|>", "<|eot_id|>", "<end_of_turn>"});
  if (const int32_t unk =
          pipeline->model->TokenToId(JsonString(model_json, "unk_token", "").value_or(""));
      unk >= 0) {
    pipeline->unk_id = unk;
  }
  if (!tokenizer_config_json.empty()) {
    const nlohmann::json config =
        nlohmann::json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr,
                              /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
    }
    LMSERVE_RETURN_IF_ERROR(ApplyConfig(config, pipeline.get()));
  }
  pipeline->eot_id = FindEndOfTurnToken(*pipeline);
  return pipeline;
}

}  // namespace tokenizer_internal

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  LMSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<tokenizer_internal::Pipeline> pipeline,
      tokenizer_internal::HfPipelineFromJson(tokenizer_json, tokenizer_config_json));
  return tokenizer_internal::FinishTokenizer(std::move(pipeline));
}

}  // namespace lmserve::engine
