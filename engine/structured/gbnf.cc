// GBNF (llama.cpp's grammar syntax) into a grammar (frontends.h lists what is supported).

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/structured/frontends.h"

namespace lmserve::engine::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, GrammarBuilder* builder) : s_(text), b_(builder) {}

  absl::StatusOr<int32_t> Parse() {
    if (static_cast<int64_t>(s_.size()) > b_->limits().max_input_bytes) {
      return absl::InvalidArgumentError("grammar: the grammar is too long");
    }
    SkipSpace(true);
    while (i_ < s_.size()) {
      LMSERVE_ASSIGN_OR_RETURN(std::string name, Name());
      SkipSpace(false);
      if (s_.substr(i_, 3) != "::=") return Error("expected '::='");
      i_ += 3;
      SkipSpace(true);
      const int32_t rule = RuleId(name);
      if (defined_.contains(name)) return Error(StrCat("rule '", name, "' is defined twice"));
      defined_.insert({name, true});
      LMSERVE_RETURN_IF_ERROR(Alternatives(rule, 0));
      // A rule ends at a newline.
      SkipSpace(false);
      if (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') return Error("unexpected text");
      SkipSpace(true);
      LMSERVE_RETURN_IF_ERROR(b_->status());
    }
    auto root = rules_.find("root");
    if (root == rules_.end() || !defined_.contains("root")) {
      return absl::InvalidArgumentError("grammar: there is no 'root' rule");
    }
    for (const auto& [name, rule] : rules_) {
      if (!defined_.contains(name)) {
        return absl::InvalidArgumentError(StrCat("grammar: rule '", name, "' is not defined"));
      }
    }
    return root->second;
  }

 private:
  absl::Status Error(std::string_view message) const {
    size_t line = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) line += s_[k] == '\n';
    return absl::InvalidArgumentError(StrCat("grammar: line ", line, ": ", message));
  }

  // Skips spaces and comments; newlines too when `newlines` (inside parentheses, or between rules).
  void SkipSpace(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines)) {
        ++i_;
      } else {
        break;
      }
    }
  }

  int32_t RuleId(const std::string& name) {
    auto [it, inserted] = rules_.try_emplace(name, 0);
    if (inserted) it->second = b_->NewRule(name);
    return it->second;
  }

  absl::StatusOr<std::string> Name() {
    const size_t start = i_;
    while (i_ < s_.size() && IsNameChar(s_[i_])) ++i_;
    if (i_ == start) return Error("expected a rule name");
    return std::string(s_.substr(start, i_ - start));
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    uint32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= s_.size()) return Error("a truncated escape");
      const char c = s_[i_++];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return Error("a bad hex digit");
      value = value * 16 + static_cast<uint32_t>(digit);
    }
    return value;
  }

  // One (possibly escaped) character of a literal or class.
  absl::StatusOr<uint32_t> Char() {
    if (i_ >= s_.size()) return Error("unexpected end");
    if (s_[i_] == '\\') {
      ++i_;
      if (i_ >= s_.size()) return Error("a trailing backslash");
      const char c = s_[i_++];
      switch (c) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case 'x':
          return Hex(2);
        case 'u':
          return Hex(4);
        case 'U': {
          LMSERVE_ASSIGN_OR_RETURN(uint32_t value, Hex(8));
          if (value > 0x10FFFF) return Error("\\U beyond U+10FFFF");
          return value;
        }
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
          return static_cast<uint32_t>(static_cast<uint8_t>(c));
        default:
          return Error(StrCat("unknown escape \\", std::string(1, c)));
      }
    }
    uint32_t value = 0;
    if (DecodeUtf8(s_, &i_, &value) == 0) return Error("invalid UTF-8");
    return value;
  }

  absl::StatusOr<int32_t> Count() {
    int64_t value = 0;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      value = value * 10 + (s_[i_++] - '0');
      if (value > b_->limits().max_repeat) return Error("a repetition count too large");
    }
    if (i_ == start) return Error("expected a repetition count");
    return static_cast<int32_t>(value);
  }

  absl::Status Alternatives(int32_t rule, int depth) {
    if (depth > b_->limits().max_nesting) {
      return Error(StrCat("groups nested deeper than ", b_->limits().max_nesting));
    }
    while (true) {
      std::vector<Element> sequence;
      LMSERVE_RETURN_IF_ERROR(Sequence(&sequence, depth));
      b_->AddAlternative(rule, std::move(sequence));
      // `|` may also start the next line.
      const size_t save = i_;
      SkipSpace(true);
      if (i_ < s_.size() && s_[i_] == '|') {
        ++i_;
        SkipSpace(true);
        continue;
      }
      i_ = save;
      return absl::OkStatus();
    }
  }

  absl::Status Sequence(std::vector<Element>* sequence, int depth) {
    while (i_ < s_.size()) {
      SkipSpace(depth > 0);
      if (i_ >= s_.size()) break;
      const char c = s_[i_];
      // A newline followed by a new rule ends the sequence; one inside parentheses does not.
      if (c == '\n' || c == '\r' || c == '|' || c == ')') break;
      std::vector<Element> atom;
      if (c == '"') {
        ++i_;
        std::string bytes;
        while (i_ < s_.size() && s_[i_] != '"') {
          LMSERVE_ASSIGN_OR_RETURN(uint32_t cp, Char());
          AppendUtf8(cp, &bytes);
        }
        if (i_ >= s_.size()) return Error("an unterminated literal");
        ++i_;
        b_->AppendLiteral(bytes, &atom);
        if (atom.empty()) continue;  // "" matches nothing: no element
      } else if (c == '[') {
        ++i_;
        bool negated = false;
        if (i_ < s_.size() && s_[i_] == '^') {
          negated = true;
          ++i_;
        }
        Ranges ranges;
        while (i_ < s_.size() && s_[i_] != ']') {
          LMSERVE_ASSIGN_OR_RETURN(uint32_t lo, Char());
          uint32_t hi = lo;
          if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
            ++i_;
            LMSERVE_ASSIGN_OR_RETURN(hi, Char());
            if (hi < lo) return Error("a character range out of order");
          }
          ranges.emplace_back(lo, hi);
        }
        if (i_ >= s_.size()) return Error("an unterminated character class");
        ++i_;
        atom.push_back(b_->CodepointClass(std::move(ranges), negated));
      } else if (c == '.') {
        ++i_;
        atom.push_back(b_->CodepointClass({}, true));
      } else if (c == '(') {
        ++i_;
        SkipSpace(true);
        const int32_t group = b_->NewRule("group");
        LMSERVE_RETURN_IF_ERROR(Alternatives(group, depth + 1));
        SkipSpace(true);
        if (i_ >= s_.size() || s_[i_] != ')') return Error("an unterminated group");
        ++i_;
        atom.push_back(GrammarBuilder::Ref(group));
      } else if (IsNameChar(c)) {
        const size_t start = i_;
        LMSERVE_ASSIGN_OR_RETURN(std::string name, Name());
        // `name ::=` starts the next rule: the sequence ended at the previous newline.
        size_t k = i_;
        while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
        if (s_.substr(k, 3) == "::=") {
          i_ = start;
          return Error("a rule must start on its own line");
        }
        atom.push_back(GrammarBuilder::Ref(RuleId(name)));
      } else {
        return Error(StrCat("unexpected '", std::string(1, c), "'"));
      }
      // A quantifier applies to the atom.
      int32_t min = 1, max = 1;
      if (i_ < s_.size()) {
        const char q = s_[i_];
        if (q == '*' || q == '+' || q == '?') {
          ++i_;
          min = q == '+' ? 1 : 0;
          max = q == '?' ? 1 : -1;
        } else if (q == '{') {
          ++i_;
          SkipSpace(false);
          LMSERVE_ASSIGN_OR_RETURN(min, Count());
          max = min;
          SkipSpace(false);
          if (i_ < s_.size() && s_[i_] == ',') {
            ++i_;
            SkipSpace(false);
            max = -1;
            if (i_ < s_.size() && s_[i_] != '}') {
              LMSERVE_ASSIGN_OR_RETURN(max, Count());
            }
          }
          SkipSpace(false);
          if (i_ >= s_.size() || s_[i_] != '}') return Error("an unterminated {m,n}");
          ++i_;
          if (max >= 0 && max < min) return Error("{m,n} with n < m");
        }
      }
      if (min == 1 && max == 1) {
        sequence->insert(sequence->end(), atom.begin(), atom.end());
      } else {
        sequence->push_back(GrammarBuilder::Ref(b_->Repeat("repeat", std::move(atom), min, max)));
      }
      LMSERVE_RETURN_IF_ERROR(b_->status());
    }
    return absl::OkStatus();
  }

  std::string_view s_;
  GrammarBuilder* b_;
  size_t i_ = 0;
  absl::flat_hash_map<std::string, int32_t> rules_;
  absl::flat_hash_map<std::string, bool> defined_;
};

}  // namespace

absl::StatusOr<Grammar> GbnfGrammar(std::string_view text, const GrammarLimits& limits) {
  GrammarBuilder builder(limits);
  GbnfParser parser(text, &builder);
  LMSERVE_ASSIGN_OR_RETURN(int32_t root, parser.Parse());
  absl::StatusOr<Grammar> grammar = std::move(builder).Build(root);
  if (!grammar.ok()) {
    return absl::InvalidArgumentError(StrCat("grammar: ", std::string(grammar.status().message())));
  }
  return grammar;
}

}  // namespace lmserve::engine::structured
