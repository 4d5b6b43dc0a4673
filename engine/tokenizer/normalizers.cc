// Normalizers (Prepend, Replace, NFC/NFD/NFKC/NFKD, Sequence) and the shared Pattern helpers.

#include <utility>

#include "common/strings.h"
#include "engine/tokenizer/json_util.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {

std::vector<std::pair<size_t, size_t>> Pattern::FindAll(std::string_view text) const {
  if (regex != nullptr) return regex->FindAll(text);
  std::vector<std::pair<size_t, size_t>> matches;
  if (literal.empty()) return matches;
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    matches.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return matches;
}

absl::StatusOr<Pattern> PatternFromJson(const nlohmann::json& j) {
  Pattern pattern;
  if (const nlohmann::json* literal = JsonMember(j, "String"); literal != nullptr) {
    if (!literal->is_string())
      return absl::InvalidArgumentError("pattern \"String\" is not a string");
    pattern.literal = literal->get<std::string>();
    return pattern;
  }
  if (const nlohmann::json* regex = JsonMember(j, "Regex"); regex != nullptr) {
    if (!regex->is_string()) return absl::InvalidArgumentError("pattern \"Regex\" is not a string");
    LMSERVE_TOK_ASSIGN_OR_RETURN(pattern.regex, Regex::Compile(regex->get<std::string>()));
    return pattern;
  }
  return absl::InvalidArgumentError(
      StrCat("a pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", j.dump()));
}

int ByteFallbackValue(std::string_view token) {
  // `tokenizers`: a 6-byte token "<0x" XX ">" where u8::from_str_radix(XX, 16) succeeds (which
  // also accepts a leading '+').
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token.back() != '>') return -1;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int high = hex(token[3]);
  const int low = hex(token[4]);
  if (low < 0) return -1;
  if (token[3] == '+') return low;
  if (high < 0) return -1;
  return high * 16 + low;
}

namespace {

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    const std::vector<std::pair<size_t, size_t>> matches = pattern_.FindAll(*text);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text->size() + matches.size() * content_.size());
    size_t pos = 0;
    for (const auto& [start, end] : matches) {
      out.append(*text, pos, start - pos);
      out.append(content_);
      pos = end;
    }
    out.append(*text, pos, std::string::npos);
    *text = std::move(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalizationForm form) : form_(form) {}
  void Normalize(std::string* text) const override {
    // Valid UTF-8 in: ICU cannot fail but for allocation, in which case the text stays as it was.
    absl::StatusOr<std::string> normalized = NormalizeUnicode(*text, form_);
    if (normalized.ok()) *text = *std::move(normalized);
  }

 private:
  NormalizationForm form_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> stages)
      : stages_(std::move(stages)) {}
  void Normalize(std::string* text) const override {
    for (const auto& stage : stages_) stage->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> stages_;
};

}  // namespace

std::unique_ptr<Normalizer> MakePrependNormalizer(std::string prefix) {
  return std::make_unique<PrependNormalizer>(std::move(prefix));
}
std::unique_ptr<Normalizer> MakeReplaceNormalizer(Pattern pattern, std::string content) {
  return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
}
std::unique_ptr<Normalizer> MakeSequenceNormalizer(
    std::vector<std::unique_ptr<Normalizer>> stages) {
  return std::make_unique<SequenceNormalizer>(std::move(stages));
}

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string type, JsonString(j, "type"));
  if (type == "Prepend") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string prefix, JsonString(j, "prepend"));
    return MakePrependNormalizer(std::move(prefix));
  }
  if (type == "Replace") {
    const nlohmann::json* pattern_json = JsonMember(j, "pattern");
    if (pattern_json == nullptr) return absl::InvalidArgumentError("Replace without \"pattern\"");
    LMSERVE_TOK_ASSIGN_OR_RETURN(Pattern pattern, PatternFromJson(*pattern_json));
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string content, JsonString(j, "content"));
    return MakeReplaceNormalizer(std::move(pattern), std::move(content));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::kNfkd);
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(j, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("normalizer Sequence without a \"normalizers\" list");
    }
    std::vector<std::unique_ptr<Normalizer>> stages;
    for (const nlohmann::json& item : *list) {
      LMSERVE_TOK_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> stage, NormalizerFromJson(item));
      if (stage != nullptr) stages.push_back(std::move(stage));
    }
    return MakeSequenceNormalizer(std::move(stages));
  }
  return absl::UnimplementedError(
      StrCat("unsupported normalizer type \"", type,
             "\" (supported: Prepend, Replace, NFC, NFD, NFKC, NFKD, Sequence)"));
}

}  // namespace lmserve::engine::tokenizer_internal
