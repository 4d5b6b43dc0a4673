#include "engine/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/tokenizer_pipeline.h"

namespace lmserve::engine {
namespace {

using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::BpeModel;
using tokenizer_internal::BpeOptions;
using tokenizer_internal::Pattern;
using tokenizer_internal::Pipeline;

// llama.cpp's regexes (src/llama-vocab.cpp, llm_tokenizer_bpe), spelled as it spells them.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr std::string_view kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerEntry {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;
  bool ignore_merges;
  bool add_bos;
};

const std::vector<PreTokenizerEntry>& PreTokenizerTable() {
  static const std::vector<PreTokenizerEntry> kTable = {
      // LLAMA_VOCAB_PRE_TYPE_DEFAULT (also an absent tokenizer.ggml.pre).
      {{"", "default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"},
       false,
       false},
      {{"gpt2", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"},
       {kGpt2Regex},
       false,
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Regex}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3Regex}, false, false},
      {{"qwen2", "stablelm2", "deepseek-r1-qwen"}, {kQwen2Regex}, false, false},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2Regex},
       false,
       false},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Regex, "[0-9][0-9][0-9]"}, false, false},
  };
  return kTable;
}

const PreTokenizerEntry* FindPreTokenizer(std::string_view pre) {
  for (const PreTokenizerEntry& entry : PreTokenizerTable()) {
    if (std::find(entry.names.begin(), entry.names.end(), pre) != entry.names.end()) return &entry;
  }
  return nullptr;
}

std::string SupportedPreNames() {
  std::vector<std::string_view> names;
  for (const PreTokenizerEntry& entry : PreTokenizerTable()) {
    for (const std::string_view name : entry.names) {
      if (!name.empty()) names.push_back(name);
    }
  }
  return StrJoin(names, ", ");
}

GgufTokenType TypeOf(const GgufTokenizerData& data, size_t id) {
  return id < data.token_types.size() ? static_cast<GgufTokenType>(data.token_types[id])
                                      : GgufTokenType::kNormal;
}

// CONTROL, UNKNOWN and USER_DEFINED tokens are matched in raw text ahead of the model.
AddedVocabulary AddedTokensOf(const GgufTokenizerData& data) {
  std::vector<AddedToken> added;
  for (size_t id = 0; id < data.tokens.size(); ++id) {
    const GgufTokenType type = TypeOf(data, id);
    if (type != GgufTokenType::kControl && type != GgufTokenType::kUnknown &&
        type != GgufTokenType::kUserDefined) {
      continue;
    }
    AddedToken token;
    token.id = static_cast<int32_t>(id);
    token.content = data.tokens[id];
    token.special = type != GgufTokenType::kUserDefined;
    added.push_back(std::move(token));
  }
  return AddedVocabulary(std::move(added), nullptr);
}

absl::Status CheckId(const GgufTokenizerData& data, const std::optional<int32_t>& id,
                     std::string_view key) {
  if (id.has_value() && (*id < 0 || static_cast<size_t>(*id) >= data.tokens.size())) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.", key, " ", *id,
                                             " is outside the vocabulary of ", data.tokens.size()));
  }
  return absl::OkStatus();
}

absl::Status BuildGpt2(const GgufTokenizerData& data, Pipeline* pipeline) {
  const PreTokenizerEntry* entry = FindPreTokenizer(data.pre);
  if (entry == nullptr) {
    return absl::UnimplementedError(StrCat("unsupported tokenizer.ggml.pre \"", data.pre,
                                           "\" (supported: ", SupportedPreNames(), ")"));
  }
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(data.tokens.size());
  for (size_t id = 0; id < data.tokens.size(); ++id) {
    // A repeated string maps to its last id, as in llama.cpp.
    vocab.emplace_back(data.tokens[id], static_cast<int32_t>(id));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(data.merges.size());
  for (const std::string& merge : data.merges) {
    // llama.cpp looks for the separator from the second byte on: the left part may be a space.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(
          StrCat("tokenizer.ggml.merges: \"", merge, "\" is not two tokens"));
    }
    merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  BpeOptions options;
  options.ignore_merges = entry->ignore_merges;
  absl::StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::CreateRanked(std::move(vocab), merges, std::move(options));
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        StrCat("tokenizer.ggml: ", model.status().message()));
  }
  pipeline->model = *std::move(model);

  std::vector<std::unique_ptr<tokenizer_internal::PreTokenizer>> stages;
  for (const std::string_view regex_text : entry->regexes) {
    LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer_internal::Regex> regex,
                             tokenizer_internal::Regex::Compile(regex_text));
    Pattern pattern;
    pattern.regex = std::move(regex);
    stages.push_back(tokenizer_internal::MakeSplitPreTokenizer(
        std::move(pattern), tokenizer_internal::SplitBehavior::kIsolated, /*invert=*/false));
  }
  stages.push_back(tokenizer_internal::MakeByteLevelPreTokenizer(/*add_prefix_space=*/false,
                                                                 /*use_regex=*/false));
  pipeline->pre_tokenizer = tokenizer_internal::MakeSequencePreTokenizer(std::move(stages));
  pipeline->decoder = tokenizer_internal::MakeByteLevelDecoder();
  return absl::OkStatus();
}

absl::Status BuildLlama(const GgufTokenizerData& data, Pipeline* pipeline) {
  std::vector<float> scores = data.scores;
  if (scores.empty()) scores.assign(data.tokens.size(), 0.0f);
  if (scores.size() != data.tokens.size()) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.scores has ", scores.size(),
                                             " entries for ", data.tokens.size(), " tokens"));
  }
  BpeOptions options;
  options.byte_fallback = true;
  options.unk_id = pipeline->unk_id.value_or(-1);
  LMSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<BpeModel> model,
      BpeModel::CreateScored(data.tokens, std::move(scores), std::move(options)));
  pipeline->model = std::move(model);

  const bool add_space_prefix = data.add_space_prefix.value_or(true);
  const auto literal = [](std::string text) {
    Pattern pattern;
    pattern.literal = std::move(text);
    return pattern;
  };
  std::vector<std::unique_ptr<tokenizer_internal::Normalizer>> normalizers;
  if (add_space_prefix) normalizers.push_back(tokenizer_internal::MakePrependNormalizer("\u2581"));
  normalizers.push_back(tokenizer_internal::MakeReplaceNormalizer(literal(" "), "\u2581"));
  pipeline->normalizer = tokenizer_internal::MakeSequenceNormalizer(std::move(normalizers));

  std::vector<std::unique_ptr<tokenizer_internal::Decoder>> decoders;
  decoders.push_back(tokenizer_internal::MakeReplaceDecoder(literal("\u2581"), " "));
  decoders.push_back(tokenizer_internal::MakeByteFallbackDecoder());
  decoders.push_back(tokenizer_internal::MakeFuseDecoder());
  if (add_space_prefix) decoders.push_back(tokenizer_internal::MakeStripDecoder(" ", 1, 0));
  pipeline->decoder = tokenizer_internal::MakeSequenceDecoder(std::move(decoders));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> GgufPreTokenizerRegexes(std::string_view pre) {
  const PreTokenizerEntry* entry = FindPreTokenizer(pre);
  if (entry == nullptr) {
    return absl::UnimplementedError(StrCat("unsupported tokenizer.ggml.pre \"", pre,
                                           "\" (supported: ", SupportedPreNames(), ")"));
  }
  return std::vector<std::string>(entry->regexes.begin(), entry->regexes.end());
}

absl::StatusOr<GgufTokenizerData> GgufTokenizerDataFromFile(const GgufFile& file) {
  GgufTokenizerData data;
  absl::Status status;
  const auto wrong_type = [&](std::string_view key) {
    status = absl::InvalidArgumentError(
        StrCat(file.path(), ": ", key, " has type ", GgufTypeName(file.Find(key)->type)));
  };
  const auto read_string = [&](std::string_view key, std::string* out) {
    if (!status.ok() || file.Find(key) == nullptr) return;
    std::optional<std::string> value = file.GetString(key);
    if (!value.has_value()) return wrong_type(key);
    *out = *std::move(value);
  };
  const auto read_id = [&](std::string_view key, std::optional<int32_t>* out) {
    if (!status.ok() || file.Find(key) == nullptr) return;
    const std::optional<int64_t> value = file.GetInt(key);
    if (!value.has_value()) return wrong_type(key);
    if (*value < 0 || *value > INT32_MAX) {
      status = absl::InvalidArgumentError(StrCat(file.path(), ": ", key, " = ", *value));
      return;
    }
    *out = static_cast<int32_t>(*value);
  };
  const auto read_bool = [&](std::string_view key, std::optional<bool>* out) {
    if (!status.ok() || file.Find(key) == nullptr) return;
    const std::optional<bool> value = file.GetBool(key);
    if (!value.has_value()) return wrong_type(key);
    *out = *value;
  };
  const auto read_strings = [&](std::string_view key, std::vector<std::string>* out) {
    if (!status.ok() || file.Find(key) == nullptr) return;
    std::optional<std::vector<std::string>> value = file.GetStringArray(key);
    if (!value.has_value()) return wrong_type(key);
    *out = *std::move(value);
  };
  if (file.Find("tokenizer.ggml.model") == nullptr ||
      file.Find("tokenizer.ggml.tokens") == nullptr) {
    return absl::InvalidArgumentError(
        StrCat(file.path(), ": no tokenizer (tokenizer.ggml.model and tokenizer.ggml.tokens)"));
  }
  read_string("tokenizer.ggml.model", &data.model);
  read_string("tokenizer.ggml.pre", &data.pre);
  read_string("tokenizer.chat_template", &data.chat_template);
  read_strings("tokenizer.ggml.tokens", &data.tokens);
  read_strings("tokenizer.ggml.merges", &data.merges);
  read_id("tokenizer.ggml.bos_token_id", &data.bos_id);
  read_id("tokenizer.ggml.eos_token_id", &data.eos_id);
  read_id("tokenizer.ggml.eot_token_id", &data.eot_id);
  read_id("tokenizer.ggml.padding_token_id", &data.pad_id);
  read_id("tokenizer.ggml.unknown_token_id", &data.unk_id);
  read_bool("tokenizer.ggml.add_bos_token", &data.add_bos);
  read_bool("tokenizer.ggml.add_eos_token", &data.add_eos);
  read_bool("tokenizer.ggml.add_space_prefix", &data.add_space_prefix);
  if (status.ok() && file.Find("tokenizer.ggml.scores") != nullptr) {
    std::optional<std::vector<double>> scores = file.GetFloatArray("tokenizer.ggml.scores");
    if (!scores.has_value()) {
      wrong_type("tokenizer.ggml.scores");
    } else {
      data.scores.assign(scores->begin(), scores->end());
    }
  }
  if (status.ok() && file.Find("tokenizer.ggml.token_type") != nullptr) {
    std::optional<std::vector<int64_t>> types = file.GetIntArray("tokenizer.ggml.token_type");
    if (!types.has_value()) {
      wrong_type("tokenizer.ggml.token_type");
    } else {
      data.token_types.assign(types->begin(), types->end());
    }
  }
  if (!status.ok()) return status;
  return data;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufTokenizerData& data) {
  if (data.tokens.empty()) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (!data.token_types.empty() && data.token_types.size() != data.tokens.size()) {
    return absl::InvalidArgumentError(StrCat("tokenizer.ggml.token_type has ",
                                             data.token_types.size(), " entries for ",
                                             data.tokens.size(), " tokens"));
  }
  auto pipeline = std::make_unique<Pipeline>();
  const bool is_llama = data.model == "llama";
  // llama.cpp's defaults for SentencePiece vocabularies, where the metadata says nothing.
  pipeline->bos_id =
      data.bos_id.has_value() ? data.bos_id : (is_llama ? 1 : std::optional<int32_t>());
  pipeline->eos_id =
      data.eos_id.has_value() ? data.eos_id : (is_llama ? 2 : std::optional<int32_t>());
  pipeline->unk_id =
      data.unk_id.has_value() ? data.unk_id : (is_llama ? 0 : std::optional<int32_t>());
  pipeline->pad_id = data.pad_id;
  pipeline->eot_id = data.eot_id;
  for (const auto& [id, key] : {std::pair{&pipeline->bos_id, "bos_token_id"},
                                {&pipeline->eos_id, "eos_token_id"},
                                {&pipeline->eot_id, "eot_token_id"},
                                {&pipeline->pad_id, "padding_token_id"},
                                {&pipeline->unk_id, "unknown_token_id"}}) {
    LMSERVE_RETURN_IF_ERROR(CheckId(data, *id, key));
  }
  pipeline->chat_template = data.chat_template;

  bool add_bos_default;
  if (data.model == "gpt2") {
    LMSERVE_RETURN_IF_ERROR(BuildGpt2(data, pipeline.get()));
    const PreTokenizerEntry* entry = FindPreTokenizer(data.pre);
    add_bos_default = entry != nullptr && entry->add_bos;
  } else if (is_llama) {
    LMSERVE_RETURN_IF_ERROR(BuildLlama(data, pipeline.get()));
    add_bos_default = true;
  } else {
    return absl::UnimplementedError(
        StrCat("unsupported tokenizer.ggml.model \"", data.model, "\" (supported: gpt2, llama)"));
  }
  pipeline->added = AddedTokensOf(data);
  if (!pipeline->eot_id.has_value())
    pipeline->eot_id = tokenizer_internal::FindEndOfTurnToken(*pipeline);

  std::vector<int32_t> prefix, suffix;
  if (data.add_bos.value_or(add_bos_default) && pipeline->bos_id.has_value()) {
    prefix.push_back(*pipeline->bos_id);
  }
  if (data.add_eos.value_or(false) && pipeline->eos_id.has_value()) {
    suffix.push_back(*pipeline->eos_id);
  }
  if (!prefix.empty() || !suffix.empty()) {
    pipeline->post_processor =
        tokenizer_internal::MakeTemplatePostProcessor(std::move(prefix), std::move(suffix));
  }
  return tokenizer_internal::FinishTokenizer(std::move(pipeline));
}

}  // namespace lmserve::engine
