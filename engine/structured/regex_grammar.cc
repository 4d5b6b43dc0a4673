// Regular expressions into grammar elements (frontends.h lists the syntax).

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/structured/frontends.h"

namespace lmserve::engine::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

Ranges Complement(Ranges ranges) {
  std::sort(ranges.begin(), ranges.end());
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

Ranges Digits() { return {{'0', '9'}}; }
Ranges Word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
Ranges Space() { return {{'\t', '\r'}, {' ', ' '}}; }

class RegexCompiler {
 public:
  RegexCompiler(GrammarBuilder* builder, std::string_view pattern, bool json_string)
      : b_(builder), p_(pattern), json_string_(json_string) {}

  absl::StatusOr<Element> Compile() {
    if (static_cast<int64_t>(p_.size()) > b_->limits().max_input_bytes) {
      return Error("the pattern is too long");
    }
    if (!p_.empty() && p_[0] == '^') ++i_;
    LMSERVE_ASSIGN_OR_RETURN(Element element, Alternation(0));
    if (i_ < p_.size()) return Error(StrCat("unexpected '", p_.substr(i_, 1), "'"));
    LMSERVE_RETURN_IF_ERROR(b_->status());
    return element;
  }

 private:
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(
        StrCat("pattern: ", message, " at offset ", i_, " of '", p_.substr(0, 200), "'"));
  }

  bool AtEnd() const { return i_ >= p_.size(); }
  char Peek() const { return p_[i_]; }

  // One character of the output, escaped when inside a JSON string.
  Element Class(Ranges ranges, bool negated) {
    if (!json_string_) return b_->CodepointClass(std::move(ranges), negated);
    if (negated) ranges = Complement(std::move(ranges));
    bool quote = false, backslash = false, newline = false, tab = false, cr = false;
    Ranges plain;
    for (const auto& range : ranges) {
      const uint32_t lo = range.first, hi = range.second;
      const auto has = [lo, hi](uint32_t c) { return lo <= c && c <= hi; };
      quote |= has('"');
      backslash |= has('\\');
      newline |= has('\n');
      tab |= has('\t');
      cr |= has('\r');
      // Split out the characters JSON escapes: control characters, '"' and '\'.
      uint32_t start = std::max<uint32_t>(lo, 0x20);
      for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}}) {
        if (start <= special && special <= hi) {
          if (start < special) plain.emplace_back(start, special - 1);
          start = special + 1;
        }
      }
      if (start <= hi) plain.emplace_back(start, hi);
    }
    std::vector<std::vector<Element>> alternatives;
    if (!plain.empty()) alternatives.push_back({b_->CodepointClass(plain, false)});
    const auto escape = [&](std::string_view text) {
      std::vector<Element> sequence;
      b_->AppendLiteral(text, &sequence);
      alternatives.push_back(std::move(sequence));
    };
    if (quote) escape("\\\"");
    if (backslash) escape("\\\\");
    if (newline) escape("\\n");
    if (tab) escape("\\t");
    if (cr) escape("\\r");
    if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
    return GrammarBuilder::Ref(b_->Choice("pattern_char", std::move(alternatives)));
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    if (i_ + digits > p_.size()) return Error("a truncated hex escape");
    uint32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = p_[i_++];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return Error("a bad hex digit");
      value = value * 16 + static_cast<uint32_t>(digit);
    }
    return value;
  }

  // A code point of the pattern (UTF-8).
  absl::StatusOr<uint32_t> Codepoint() {
    uint32_t value = 0;
    if (DecodeUtf8(p_, &i_, &value) == 0) return Error("invalid UTF-8");
    return value;
  }

  // After a backslash: the ranges of the escape (a class or one character).
  absl::StatusOr<Ranges> Escape() {
    if (AtEnd()) return Error("a trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return Complement(Digits());
      case 'w':
        return Word();
      case 'W':
        return Complement(Word());
      case 's':
        return Space();
      case 'S':
        return Complement(Space());
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        return Ranges{{0, 0}};
      case 'x': {
        LMSERVE_ASSIGN_OR_RETURN(uint32_t value, Hex(2));
        return Ranges{{value, value}};
      }
      case 'u': {
        LMSERVE_ASSIGN_OR_RETURN(uint32_t value, Hex(4));
        return Ranges{{value, value}};
      }
      case 'b':
      case 'B':
        return Error("word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9') return Error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Error(StrCat("the escape \\", std::string(1, c), " is not supported"));
        }
        --i_;
        LMSERVE_ASSIGN_OR_RETURN(uint32_t value, Codepoint());
        return Ranges{{value, value}};
    }
  }

  absl::StatusOr<Element> BracketClass() {
    ++i_;  // '['
    bool negated = false;
    if (!AtEnd() && Peek() == '^') {
      negated = true;
      ++i_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("an unterminated character class");
      if (Peek() == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      Ranges item;
      if (Peek() == '\\') {
        ++i_;
        LMSERVE_ASSIGN_OR_RETURN(item, Escape());
      } else if (Peek() == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        return Error("POSIX classes ([:alpha:]) are not supported");
      } else {
        LMSERVE_ASSIGN_OR_RETURN(uint32_t c, Codepoint());
        item = {{c, c}};
      }
      // A range a-z (not before the closing bracket).
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() &&
          Peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi = 0;
        if (Peek() == '\\') {
          ++i_;
          LMSERVE_ASSIGN_OR_RETURN(Ranges escaped, Escape());
          if (escaped.size() != 1 || escaped[0].first != escaped[0].second) {
            return Error("a class escape cannot end a range");
          }
          hi = escaped[0].first;
        } else {
          LMSERVE_ASSIGN_OR_RETURN(hi, Codepoint());
        }
        if (hi < item[0].first) return Error("a character range out of order");
        item[0].second = hi;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    return Class(std::move(ranges), negated);
  }

  absl::StatusOr<std::optional<Element>> Atom(int depth) {
    const char c = Peek();
    if (c == '(') {
      ++i_;
      if (!AtEnd() && Peek() == '?') {
        ++i_;
        if (AtEnd()) return Error("an unterminated group");
        if (Peek() == ':') {
          ++i_;
        } else if (Peek() == 'P' || (Peek() == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' &&
                                     p_[i_ + 1] != '!')) {
          if (Peek() == 'P') ++i_;
          if (AtEnd() || Peek() != '<') return Error("a bad group name");
          while (!AtEnd() && Peek() != '>') ++i_;
          if (AtEnd()) return Error("an unterminated group name");
          ++i_;
        } else {
          return Error("lookaround and inline flags ((?=, (?!, (?<=, (?i) are not supported");
        }
      }
      LMSERVE_ASSIGN_OR_RETURN(Element inner, Alternation(depth + 1));
      if (AtEnd() || Peek() != ')') return Error("an unterminated group");
      ++i_;
      atom_weight_ = alternation_weight_;
      return std::optional<Element>(inner);
    }
    if (c == '[') {
      LMSERVE_ASSIGN_OR_RETURN(Element element, BracketClass());
      return std::optional<Element>(element);
    }
    if (c == '.') {
      ++i_;
      return std::optional<Element>(Class({{'\n', '\n'}}, true));
    }
    if (c == '\\') {
      ++i_;
      LMSERVE_ASSIGN_OR_RETURN(Ranges ranges, Escape());
      return std::optional<Element>(Class(std::move(ranges), false));
    }
    if (c == '^') return Error("'^' is supported only at the start");
    if (c == '$') {
      if (i_ + 1 == p_.size()) {
        ++i_;
        return std::optional<Element>();
      }
      return Error("'$' is supported only at the end");
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("a quantifier with nothing before it");
    LMSERVE_ASSIGN_OR_RETURN(uint32_t codepoint, Codepoint());
    return std::optional<Element>(Class({{codepoint, codepoint}}, false));
  }

  absl::StatusOr<int32_t> Number() {
    int64_t value = 0;
    const size_t start = i_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      value = value * 10 + (Peek() - '0');
      if (value > b_->limits().max_repeat) return Error("a repetition count too large");
      ++i_;
    }
    if (i_ == start) return Error("a bad repetition count");
    return static_cast<int32_t>(value);
  }

  absl::StatusOr<std::vector<Element>> Sequence(int depth) {
    std::vector<Element> sequence;
    sequence_weight_ = 1;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      atom_weight_ = 1;
      LMSERVE_ASSIGN_OR_RETURN(std::optional<Element> atom, Atom(depth));
      if (!atom.has_value()) continue;
      int32_t min = 1, max = 1;
      if (!AtEnd()) {
        const char q = Peek();
        if (q == '*' || q == '+' || q == '?') {
          ++i_;
          min = q == '+' ? 1 : 0;
          max = q == '?' ? 1 : -1;
        } else if (q == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9') {
          ++i_;
          LMSERVE_ASSIGN_OR_RETURN(min, Number());
          max = min;
          if (!AtEnd() && Peek() == ',') {
            ++i_;
            max = -1;
            if (!AtEnd() && Peek() != '}') {
              LMSERVE_ASSIGN_OR_RETURN(max, Number());
            }
          }
          if (AtEnd() || Peek() != '}') return Error("an unterminated {m,n}");
          ++i_;
          if (max >= 0 && max < min) return Error("{m,n} with n < m");
        }
        if (!AtEnd() && (Peek() == '?' || Peek() == '+') && !(min == 1 && max == 1)) ++i_;
      }
      // Counted repetitions nested in counted repetitions multiply the states a match can be in
      // ((a{1,100}){1,100} after 150 a's: every split of them): their product is bounded.
      const int64_t weight = atom_weight_ * std::max(1, max);
      if (weight > b_->limits().max_repeat) {
        return Error(StrCat("nested counted repetitions multiply to ", weight, ", above ",
                            b_->limits().max_repeat));
      }
      sequence_weight_ = std::max(sequence_weight_, weight);
      if (min == 1 && max == 1) {
        sequence.push_back(*atom);
      } else {
        sequence.push_back(GrammarBuilder::Ref(b_->Repeat("pattern_repeat", {*atom}, min, max)));
      }
      if (!b_->status().ok()) return b_->status();
    }
    return sequence;
  }

  absl::StatusOr<Element> Alternation(int depth) {
    if (depth > b_->limits().max_nesting) {
      return Error(StrCat("groups nested deeper than ", b_->limits().max_nesting));
    }
    std::vector<std::vector<Element>> alternatives;
    int64_t weight = 1;
    while (true) {
      LMSERVE_ASSIGN_OR_RETURN(std::vector<Element> sequence, Sequence(depth));
      weight = std::max(weight, sequence_weight_);
      alternatives.push_back(std::move(sequence));
      if (AtEnd() || Peek() != '|') break;
      ++i_;
    }
    alternation_weight_ = weight;
    if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
    return GrammarBuilder::Ref(b_->Choice("pattern_group", std::move(alternatives)));
  }

  GrammarBuilder* b_;
  std::string_view p_;
  bool json_string_;
  size_t i_ = 0;
  // The product of the counted repetitions around the innermost atom: see Sequence.
  int64_t atom_weight_ = 1;
  int64_t sequence_weight_ = 1;
  int64_t alternation_weight_ = 1;
};

}  // namespace

absl::StatusOr<Element> AddRegex(GrammarBuilder* builder, std::string_view pattern,
                                 bool json_string) {
  return RegexCompiler(builder, pattern, json_string).Compile();
}

absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern, const GrammarLimits& limits) {
  GrammarBuilder builder(limits);
  LMSERVE_ASSIGN_OR_RETURN(Element element, AddRegex(&builder, pattern, false));
  const int32_t root = builder.NewRule("root");
  builder.AddAlternative(root, {element});
  return std::move(builder).Build(root);
}

}  // namespace lmserve::engine::structured
