// Decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence) and post-processors
// (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence), with
// `tokenizers` semantics.

#include <utility>

#include "common/strings.h"
#include "common/utf8.h"
#include "engine/tokenizer/json_util.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    // Every character of a token maps back to a byte; a token with any other character (an added
    // token such as "<|im_start|>" keeps its characters; one with a space) is taken as it is.
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool all_mapped = true;
      while (pos < token.size()) {
        const int byte = UnicodeToByte(DecodeUtf8(token, &pos));
        if (byte < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(byte));
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes.append(token);
      }
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      const std::vector<std::pair<size_t, size_t>> matches = pattern_.FindAll(token);
      if (matches.empty()) continue;
      std::string out;
      size_t pos = 0;
      for (const auto& [start, end] : matches) {
        out.append(token, pos, start - pos);
        out.append(content_);
        pos = end;
      }
      out.append(token, pos, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;  // bytes of consecutive <0xXX> tokens
    size_t run_length = 0;
    const auto flush = [&] {
      if (run_length == 0) return;
      if (IsValidUtf8(run)) {
        out.push_back(std::move(run));
      } else {
        // `tokenizers` writes one U+FFFD per byte of an invalid run.
        for (size_t k = 0; k < run_length; ++k) out.emplace_back(kReplacementCharacter);
      }
      run.clear();
      run_length = 0;
    };
    for (std::string& token : *tokens) {
      const int byte = ByteFallbackValue(token);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_length;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    tokens->assign(1, StrJoin(*tokens, ""));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}

  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      // Character offsets of `token`.
      std::vector<size_t> offsets;
      for (size_t pos = 0; pos < token.size(); pos += Utf8SequenceLength(token[pos])) {
        offsets.push_back(pos);
      }
      const size_t num_chars = offsets.size();
      const auto char_at = [&](size_t i) {
        const size_t end = i + 1 < num_chars ? offsets[i + 1] : token.size();
        return std::string_view(token).substr(offsets[i], end - offsets[i]);
      };
      size_t start_cut = 0;
      for (size_t i = 0; i < num_chars && i < static_cast<size_t>(start_); ++i) {
        if (char_at(i) != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = num_chars;
      for (size_t i = 0; i < num_chars && i < static_cast<size_t>(stop_); ++i) {
        const size_t index = num_chars - i - 1;
        if (char_at(index) != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        token.clear();
        continue;
      }
      const size_t begin_byte = start_cut < num_chars ? offsets[start_cut] : token.size();
      const size_t end_byte = stop_cut < num_chars ? offsets[stop_cut] : token.size();
      token = token.substr(begin_byte, end_byte - begin_byte);
    }
  }

 private:
  std::string content_;  // one character
  int start_;
  int stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme prepend_scheme)
      : replacement_(std::move(replacement)), prepend_scheme_(prepend_scheme) {}

  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      // `tokenizers` drops every replacement character of the first token when it prepends one.
      const bool drop = i == 0 && prepend_scheme_ != PrependScheme::kNever;
      std::string out;
      out.reserve(token.size());
      size_t pos = 0;
      while (pos < token.size()) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!drop) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(token[pos++]);
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme prepend_scheme_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages)
      : stages_(std::move(stages)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& stage : stages_) stage->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

class TemplatePostProcessor : public PostProcessor {
 public:
  TemplatePostProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), prefix_.begin(), prefix_.end());
    ids->insert(ids->end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> stages)
      : stages_(std::move(stages)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& stage : stages_) stage->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> stages_;
};

// TemplateProcessing's "single" template: the ids before and after the sequence ($A).
absl::StatusOr<std::unique_ptr<PostProcessor>> TemplateFromJson(const nlohmann::json& j) {
  const nlohmann::json* single = JsonMember(j, "single");
  if (single == nullptr || !single->is_array()) {
    return absl::InvalidArgumentError("TemplateProcessing without a \"single\" template");
  }
  const nlohmann::json* special_tokens = JsonMember(j, "special_tokens");
  std::vector<int32_t> prefix, suffix;
  int num_sequences = 0;
  for (const nlohmann::json& piece : *single) {
    if (const nlohmann::json* sequence = JsonMember(piece, "Sequence"); sequence != nullptr) {
      LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string id, JsonString(*sequence, "id"));
      if (id != "A") {
        return absl::InvalidArgumentError(
            StrCat("TemplateProcessing: the single template refers to sequence ", id));
      }
      ++num_sequences;
      continue;
    }
    const nlohmann::json* special = JsonMember(piece, "SpecialToken");
    if (special == nullptr) {
      return absl::InvalidArgumentError(StrCat("TemplateProcessing: bad piece ", piece.dump()));
    }
    LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string name, JsonString(*special, "id"));
    const nlohmann::json* entry =
        special_tokens != nullptr ? JsonMember(*special_tokens, name) : nullptr;
    const nlohmann::json* entry_ids = entry != nullptr ? JsonMember(*entry, "ids") : nullptr;
    if (entry_ids == nullptr || !entry_ids->is_array()) {
      return absl::InvalidArgumentError(
          StrCat("TemplateProcessing: special token ", name, " has no ids"));
    }
    for (const nlohmann::json& id : *entry_ids) {
      if (!id.is_number_integer()) {
        return absl::InvalidArgumentError(
            StrCat("TemplateProcessing: special token ", name, " has a non-integer id"));
      }
      (num_sequences == 0 ? prefix : suffix).push_back(id.get<int32_t>());
    }
  }
  if (num_sequences != 1) {
    return absl::InvalidArgumentError("TemplateProcessing: the single template must hold $A once");
  }
  return MakeTemplatePostProcessor(std::move(prefix), std::move(suffix));
}

// RobertaProcessing / BertProcessing: {"cls": [token, id], "sep": [token, id]} -> cls $A sep.
absl::StatusOr<std::unique_ptr<PostProcessor>> ClsSepFromJson(const nlohmann::json& j) {
  const auto id_of = [&](std::string_view key) -> absl::StatusOr<int32_t> {
    const nlohmann::json* pair = JsonMember(j, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
        !(*pair)[1].is_number_integer()) {
      return absl::InvalidArgumentError(StrCat("post-processor: bad \"", key, "\""));
    }
    return (*pair)[1].get<int32_t>();
  };
  LMSERVE_TOK_ASSIGN_OR_RETURN(const int32_t cls, id_of("cls"));
  LMSERVE_TOK_ASSIGN_OR_RETURN(const int32_t sep, id_of("sep"));
  return MakeTemplatePostProcessor({cls}, {sep});
}

}  // namespace

std::unique_ptr<Decoder> MakeByteLevelDecoder() { return std::make_unique<ByteLevelDecoder>(); }
std::unique_ptr<Decoder> MakeReplaceDecoder(Pattern pattern, std::string content) {
  return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
}
std::unique_ptr<Decoder> MakeByteFallbackDecoder() {
  return std::make_unique<ByteFallbackDecoder>();
}
std::unique_ptr<Decoder> MakeFuseDecoder() { return std::make_unique<FuseDecoder>(); }
std::unique_ptr<Decoder> MakeStripDecoder(std::string content, int start, int stop) {
  return std::make_unique<StripDecoder>(std::move(content), start, stop);
}
std::unique_ptr<Decoder> MakeMetaspaceDecoder(std::string replacement,
                                              PrependScheme prepend_scheme) {
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), prepend_scheme);
}
std::unique_ptr<Decoder> MakeSequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages) {
  return std::make_unique<SequenceDecoder>(std::move(stages));
}
std::unique_ptr<PostProcessor> MakeTemplatePostProcessor(std::vector<int32_t> prefix,
                                                         std::vector<int32_t> suffix) {
  return std::make_unique<TemplatePostProcessor>(std::move(prefix), std::move(suffix));
}

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string type, JsonString(j, "type"));
  if (type == "ByteLevel") return MakeByteLevelDecoder();
  if (type == "ByteFallback") return MakeByteFallbackDecoder();
  if (type == "Fuse") return MakeFuseDecoder();
  if (type == "Replace") {
    const nlohmann::json* pattern_json = JsonMember(j, "pattern");
    if (pattern_json == nullptr) return absl::InvalidArgumentError("Replace without \"pattern\"");
    LMSERVE_TOK_ASSIGN_OR_RETURN(Pattern pattern, PatternFromJson(*pattern_json));
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string content, JsonString(j, "content"));
    return MakeReplaceDecoder(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string content, JsonString(j, "content"));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const int64_t start, JsonInt(j, "start", 0));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const int64_t stop, JsonInt(j, "stop", 0));
    if (content.empty() || Utf8SequenceLength(content[0]) != content.size() || start < 0 ||
        stop < 0) {
      return absl::InvalidArgumentError("Strip: \"content\" must be one character");
    }
    return MakeStripDecoder(std::move(content), static_cast<int>(start), static_cast<int>(stop));
  }
  if (type == "Metaspace") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string replacement, MetaspaceReplacementFromJson(j));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const PrependScheme scheme, MetaspaceSchemeFromJson(j));
    return MakeMetaspaceDecoder(std::move(replacement), scheme);
  }
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(j, "decoders");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("decoder Sequence without a \"decoders\" list");
    }
    std::vector<std::unique_ptr<Decoder>> stages;
    for (const nlohmann::json& item : *list) {
      LMSERVE_TOK_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> stage, DecoderFromJson(item));
      if (stage != nullptr) stages.push_back(std::move(stage));
    }
    return MakeSequenceDecoder(std::move(stages));
  }
  return absl::UnimplementedError(
      StrCat("unsupported decoder type \"", type,
             "\" (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)"));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string type, JsonString(j, "type"));
  if (type == "TemplateProcessing") return TemplateFromJson(j);
  if (type == "RobertaProcessing" || type == "BertProcessing") return ClsSepFromJson(j);
  // ByteLevel only trims offsets, which are not tracked: no stage.
  if (type == "ByteLevel") return nullptr;
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(j, "processors");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("post-processor Sequence without a \"processors\" list");
    }
    std::vector<std::unique_ptr<PostProcessor>> stages;
    for (const nlohmann::json& item : *list) {
      LMSERVE_TOK_ASSIGN_OR_RETURN(std::unique_ptr<PostProcessor> stage,
                                   PostProcessorFromJson(item));
      if (stage != nullptr) stages.push_back(std::move(stage));
    }
    if (stages.empty()) return nullptr;
    return std::unique_ptr<PostProcessor>(
        std::make_unique<SequencePostProcessor>(std::move(stages)));
  }
  return absl::UnimplementedError(StrCat("unsupported post-processor type \"", type,
                                         "\" (supported: TemplateProcessing, RobertaProcessing, "
                                         "BertProcessing, ByteLevel, Sequence)"));
}

}  // namespace lmserve::engine::tokenizer_internal
