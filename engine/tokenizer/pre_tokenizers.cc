// Pre-tokenizers: ByteLevel, Split, Digits, Sequence (`tokenizers` semantics).

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/strings.h"
#include "engine/tokenizer/json_util.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {
namespace {

// GPT-2's split regex, as `tokenizers`' ByteLevel pre-tokenizer spells it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A piece of the text being split: [start, end) and whether the pattern matched it.
struct Span {
  size_t start;
  size_t end;
  bool is_match;
};

// Covers [0, size) with the matches and the gaps between them (`tokenizers`' find_matches).
std::vector<Span> SpansFromMatches(size_t size,
                                   const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  }
  if (prev != size) spans.push_back({prev, size, false});
  return spans;
}

// Appends the pieces of `text` that `behavior` makes of `spans` to `out` (empty ones dropped).
void SplitSpans(std::string_view text, const std::vector<Span>& spans, SplitBehavior behavior,
                std::vector<std::string>* out) {
  // (start, end, removed)
  std::vector<Span> pieces;
  pieces.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) pieces.push_back({s.start, s.end, false});
      break;
    case SplitBehavior::kRemoved:
      pieces = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.start, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = s.end;
        } else {
          pieces.push_back({s.start, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().start = it->start;
        } else {
          pieces.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  for (const Span& piece : pieces) {
    // In pieces, is_match marks a removed piece.
    if (piece.is_match || piece.end == piece.start) continue;
    out->emplace_back(text.substr(piece.start, piece.end - piece.start));
  }
}

// Applies `split` to each piece.
template <typename SplitFn>
void SplitEach(std::vector<std::string>* pieces, SplitFn split) {
  std::vector<std::string> out;
  out.reserve(pieces->size() * 2);
  for (const std::string& piece : *pieces) split(piece, &out);
  *pieces = std::move(out);
}

void InvertSpans(std::vector<Span>* spans) {
  for (Span& s : *spans) s.is_match = !s.is_match;
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const override {
    bool first = true;
    SplitEach(pieces, [&](std::string_view piece, std::vector<std::string>* out) {
      std::vector<Span> spans = SpansFromMatches(piece.size(), pattern_.FindAll(piece));
      if (invert_) InvertSpans(&spans);
      if (first && behavior_ == SplitBehavior::kRemoved && !spans.empty() && spans[0].is_match) {
        *starts_text = false;
      }
      first = false;
      SplitSpans(piece, spans, behavior_, out);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const override {
    std::vector<std::string> out;
    out.reserve(pieces->size() * 4);
    std::string prefixed;
    for (const std::string& original : *pieces) {
      std::string_view piece = original;
      if (add_prefix_space_ && (piece.empty() || piece.front() != ' ')) {
        prefixed = StrCat(" ", piece);
        piece = prefixed;
      }
      if (piece.empty()) continue;
      if (regex_ == nullptr) {
        out.push_back(Map(piece));
        continue;
      }
      // Split (Isolated: matches and the gaps between them) and map in one pass.
      size_t prev = 0;
      for (const auto& [start, end] : regex_->FindAll(piece)) {
        if (prev != start) out.push_back(Map(piece.substr(prev, start - prev)));
        out.push_back(Map(piece.substr(start, end - start)));
        prev = end;
      }
      if (prev != piece.size()) out.push_back(Map(piece.substr(prev)));
    }
    *pieces = std::move(out);
  }

 private:
  // The bytes of `text` as GPT-2's byte-to-unicode characters.
  static std::string Map(std::string_view text) {
    // (UTF-8 bytes, length) of each byte's character, built once.
    struct Entry {
      char bytes[2];
      uint8_t length;
    };
    static const std::array<Entry, 256> kTable = [] {
      std::array<Entry, 256> table{};
      for (int b = 0; b < 256; ++b) {
        const std::string& mapped = ByteToUnicode()[b];
        table[b].length = static_cast<uint8_t>(mapped.size());
        for (size_t k = 0; k < mapped.size(); ++k) table[b].bytes[k] = mapped[k];
      }
      return table;
    }();
    std::string mapped(text.size() * 2, '\0');
    char* out = mapped.data();
    for (const char c : text) {
      const Entry& entry = kTable[static_cast<uint8_t>(c)];
      out[0] = entry.bytes[0];
      out[1] = entry.bytes[1];
      out += entry.length;
    }
    mapped.resize(out - mapped.data());
    return mapped;
  }

  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null: no split
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_digits_(individual_digits) {}

  void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const override {
    SplitEach(pieces, [this](std::string_view piece, std::vector<std::string>* out) {
      std::vector<std::pair<size_t, size_t>> matches;
      size_t pos = 0;
      while (pos < piece.size()) {
        const size_t start = pos;
        // ASCII digits are the common case; everything else asks ICU.
        const uint8_t b = static_cast<uint8_t>(piece[pos]);
        bool numeric;
        if (b < 0x80) {
          numeric = b >= '0' && b <= '9';
          ++pos;
        } else {
          numeric = IsNumeric(DecodeUtf8(piece, &pos));
        }
        if (numeric) matches.emplace_back(start, pos);
      }
      if (matches.empty()) {
        if (!piece.empty()) out->emplace_back(piece);
        return;
      }
      SplitSpans(piece, SpansFromMatches(piece.size(), matches),
                 individual_digits_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, out);
    });
  }

 private:
  bool individual_digits_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme prepend_scheme, bool split)
      : replacement_(std::move(replacement)), prepend_scheme_(prepend_scheme), split_(split) {}

  void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const override {
    bool first = true;
    SplitEach(pieces, [&](std::string_view piece, std::vector<std::string>* out) {
      std::string replaced;
      replaced.reserve(piece.size() + replacement_.size());
      for (const char c : piece) {
        if (c == ' ') {
          replaced.append(replacement_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool prepend = prepend_scheme_ == PrependScheme::kAlways ||
                           (prepend_scheme_ == PrependScheme::kFirst && first && *starts_text);
      if (prepend && replaced.rfind(replacement_, 0) != 0) replaced.insert(0, replacement_);
      first = false;
      if (!split_) {
        if (!replaced.empty()) out->push_back(std::move(replaced));
        return;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t pos = replaced.find(replacement_); pos != std::string::npos;
           pos = replaced.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      SplitSpans(replaced, SpansFromMatches(replaced.size(), matches),
                 SplitBehavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;  // one character
  PrependScheme prepend_scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> stages)
      : stages_(std::move(stages)) {}
  void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const override {
    for (const auto& stage : stages_) stage->PreTokenize(pieces, starts_text);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

absl::StatusOr<SplitBehavior> SplitBehaviorFromName(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(StrCat("unknown Split behavior \"", name, "\""));
}

}  // namespace

std::unique_ptr<PreTokenizer> MakeByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) {
  std::unique_ptr<Regex> regex;
  if (use_regex) {
    absl::StatusOr<std::unique_ptr<Regex>> compiled = Regex::Compile(kGpt2Pattern);
    if (!compiled.ok()) {  // a constant pattern: failing to compile it is a bug
      std::fprintf(stderr, "GPT-2 pattern: %s\n", std::string(compiled.status().message()).c_str());
      std::abort();
    }
    regex = *std::move(compiled);
  }
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
}

std::unique_ptr<PreTokenizer> MakeSplitPreTokenizer(Pattern pattern, SplitBehavior behavior,
                                                    bool invert) {
  return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
}

std::unique_ptr<PreTokenizer> MakeDigitsPreTokenizer(bool individual_digits) {
  return std::make_unique<DigitsPreTokenizer>(individual_digits);
}

std::unique_ptr<PreTokenizer> MakeMetaspacePreTokenizer(std::string replacement,
                                                        PrependScheme prepend_scheme, bool split) {
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), prepend_scheme, split);
}

absl::StatusOr<PrependScheme> MetaspaceSchemeFromJson(const nlohmann::json& j) {
  const nlohmann::json* scheme = JsonMember(j, "prepend_scheme");
  if (scheme == nullptr || scheme->is_null()) {
    // Before tokenizers 0.19: add_prefix_space.
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool add_prefix_space,
                                 JsonBool(j, "add_prefix_space", true));
    return add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  if (!scheme->is_string()) return absl::InvalidArgumentError("\"prepend_scheme\" is not a string");
  const std::string name = scheme->get<std::string>();
  if (name == "always") return PrependScheme::kAlways;
  if (name == "never") return PrependScheme::kNever;
  if (name == "first") return PrependScheme::kFirst;
  return absl::InvalidArgumentError(StrCat("unknown prepend_scheme \"", name, "\""));
}

absl::StatusOr<std::string> MetaspaceReplacementFromJson(const nlohmann::json& j) {
  // Spelled out rather than LMSERVE_ASSIGN_OR_RETURN: GCC 12 warns (maybe-uninitialized, a false
  // positive) on the string moved out of the StatusOr.
  absl::StatusOr<std::string> replacement = JsonString(j, "replacement", "\u2581");
  if (!replacement.ok()) return replacement.status();
  const std::string_view text = *replacement;
  if (text.empty() || Utf8SequenceLength(static_cast<uint8_t>(text.front())) != text.size()) {
    return absl::InvalidArgumentError("Metaspace: \"replacement\" must be one character");
  }
  return replacement;
}

std::unique_ptr<PreTokenizer> MakeSequencePreTokenizer(
    std::vector<std::unique_ptr<PreTokenizer>> stages) {
  return std::make_unique<SequencePreTokenizer>(std::move(stages));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string type, JsonString(j, "type"));
  if (type == "ByteLevel") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool add_prefix_space,
                                 JsonBool(j, "add_prefix_space", true));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool use_regex, JsonBool(j, "use_regex", true));
    return MakeByteLevelPreTokenizer(add_prefix_space, use_regex);
  }
  if (type == "Split") {
    const nlohmann::json* pattern_json = JsonMember(j, "pattern");
    if (pattern_json == nullptr) return absl::InvalidArgumentError("Split without \"pattern\"");
    LMSERVE_TOK_ASSIGN_OR_RETURN(Pattern pattern, PatternFromJson(*pattern_json));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const std::string behavior_name, JsonString(j, "behavior"));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const SplitBehavior behavior,
                                 SplitBehaviorFromName(behavior_name));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool invert, JsonBool(j, "invert", false));
    return MakeSplitPreTokenizer(std::move(pattern), behavior, invert);
  }
  if (type == "Digits") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool individual, JsonBool(j, "individual_digits", false));
    return MakeDigitsPreTokenizer(individual);
  }
  if (type == "Metaspace") {
    LMSERVE_TOK_ASSIGN_OR_RETURN(std::string replacement, MetaspaceReplacementFromJson(j));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const PrependScheme scheme, MetaspaceSchemeFromJson(j));
    LMSERVE_TOK_ASSIGN_OR_RETURN(const bool split, JsonBool(j, "split", true));
    return MakeMetaspacePreTokenizer(std::move(replacement), scheme, split);
  }
  if (type == "Sequence") {
    const nlohmann::json* list = JsonMember(j, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError("pre-tokenizer Sequence without a \"pretokenizers\" list");
    }
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (const nlohmann::json& item : *list) {
      LMSERVE_TOK_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> stage, PreTokenizerFromJson(item));
      if (stage != nullptr) stages.push_back(std::move(stage));
    }
    return MakeSequencePreTokenizer(std::move(stages));
  }
  return absl::UnimplementedError(
      StrCat("unsupported pre-tokenizer type \"", type,
             "\" (supported: ByteLevel, Split, Digits, Metaspace, Sequence)"));
}

}  // namespace lmserve::engine::tokenizer_internal
