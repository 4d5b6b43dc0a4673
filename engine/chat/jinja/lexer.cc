#include "engine/chat/jinja/lexer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/chat/jinja/pystr.h"

namespace lmserve::engine::jinja {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Whether every code point of `text` is whitespace (Python's \s); false for "".
bool AllSpace(std::string_view text) {
  if (text.empty()) return false;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    if (!IsPySpace(DecodeUtf8At(text, offset, &length))) return false;
    offset += length;
  }
  return true;
}

// Python's str.rstrip().
std::string_view RStripSpace(std::string_view text) {
  const std::vector<size_t> offsets = CodePointOffsets(text);
  size_t end = offsets.size() - 1;
  while (end > 0) {
    size_t length = 0;
    if (!IsPySpace(DecodeUtf8At(text, offsets[end - 1], &length))) break;
    --end;
  }
  return text.substr(0, offsets[end]);
}

// jinja2 reads sources with "\r\n" and "\r" as "\n" and drops one trailing newline.
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : source_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < source_.size()) {
      LMSERVE_RETURN_IF_ERROR(LexData());
    }
    Token end;
    end.kind = TokenKind::kEnd;
    end.pos = Pos(source_.size());
    tokens_.push_back(std::move(end));
    return std::move(tokens_);
  }

 private:
  SourcePos Pos(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return SourcePos{static_cast<int>(it - line_starts_.begin()) + 1,
                     static_cast<int>(offset - *it) + 1};
  }

  absl::Status Error(size_t offset, std::string_view message) const {
    const SourcePos pos = Pos(offset);
    return absl::InvalidArgumentError(
        StrCat("line ", pos.line, ", column ", pos.column, ": ", message));
  }

  void EmitText(std::string_view text, size_t offset) {
    if (text.empty()) return;
    Token token;
    token.kind = TokenKind::kText;
    token.text = std::string(text);
    token.pos = Pos(offset);
    tokens_.push_back(std::move(token));
  }

  void Emit(TokenKind kind, std::string text, size_t offset) {
    Token token;
    token.kind = kind;
    token.text = std::move(text);
    token.pos = Pos(offset);
    tokens_.push_back(std::move(token));
  }

  // Applies a tag's leading whitespace control to the text before it. `sign` is '-', '+' or 0;
  // `is_variable` for "{{", which lstrip_blocks leaves alone.
  std::string_view ControlBefore(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return RStripSpace(text);
    if (sign == '+' || is_variable || !options_.lstrip_blocks) return text;
    const size_t rfind = text.rfind('\n');
    const size_t line_begin = rfind == std::string_view::npos ? 0 : rfind + 1;
    if ((line_begin > 0 || line_starting_) && AllSpace(text.substr(line_begin))) {
      return text.substr(0, line_begin);
    }
    return text;
  }

  // Applies a tag's trailing whitespace control from pos_ (just past the tag). `sign` is the
  // character before the closing delimiter ('-', '+' or 0); `trim` whether trim_blocks applies.
  void ControlAfter(char sign, bool trim) {
    if (sign == '-') {
      // jinja2's "\s*" after "-%}": Python whitespace, newlines included.
      while (pos_ < source_.size()) {
        size_t length = 0;
        if (!IsPySpace(DecodeUtf8At(source_, pos_, &length))) break;
        pos_ += length;
      }
    } else if (sign != '+' && trim && options_.trim_blocks && pos_ < source_.size() &&
               source_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
  }

  // Matches "{%" sign? space* word space* sign? "%}" at `offset`; returns the offset past it, or
  // npos. `inner_sign` receives the sign before "%}" and `outer_sign` the one after "{%".
  size_t MatchSimpleBlock(size_t offset, std::string_view word, char* outer_sign,
                          char* inner_sign) const {
    if (source_.compare(offset, 2, "{%") != 0) return std::string::npos;
    size_t i = offset + 2;
    *outer_sign = 0;
    if (i < source_.size() && (source_[i] == '-' || source_[i] == '+')) *outer_sign = source_[i++];
    while (i < source_.size() && IsAsciiSpace(source_[i])) ++i;
    if (source_.compare(i, word.size(), word) != 0) return std::string::npos;
    i += word.size();
    if (i < source_.size() && IsNameChar(source_[i])) return std::string::npos;
    while (i < source_.size() && IsAsciiSpace(source_[i])) ++i;
    *inner_sign = 0;
    if (i < source_.size() && (source_[i] == '-' || source_[i] == '+')) *inner_sign = source_[i++];
    if (source_.compare(i, 2, "%}") != 0) return std::string::npos;
    return i + 2;
  }

  absl::Status LexData() {
    // The next tag start.
    size_t start = pos_;
    while (true) {
      start = source_.find('{', start);
      if (start == std::string::npos || start + 1 >= source_.size()) {
        EmitText(std::string_view(source_).substr(pos_), pos_);
        pos_ = source_.size();
        return absl::OkStatus();
      }
      const char next = source_[start + 1];
      if (next == '{' || next == '%' || next == '#') break;
      ++start;
    }
    const std::string_view text = std::string_view(source_).substr(pos_, start - pos_);
    const size_t text_offset = pos_;
    const char kind = source_[start + 1];
    char sign = 0;
    if (start + 2 < source_.size() && (source_[start + 2] == '-' || source_[start + 2] == '+')) {
      sign = source_[start + 2];
    }
    EmitText(ControlBefore(text, sign, kind == '{'), text_offset);

    if (kind == '#') return LexComment(start);
    if (kind == '%') {
      char outer_sign = 0;
      char inner_sign = 0;
      const size_t raw_end = MatchSimpleBlock(start, "raw", &outer_sign, &inner_sign);
      if (raw_end != std::string::npos) return LexRaw(start, raw_end, inner_sign);
    }
    return LexTag(start, kind == '{');
  }

  absl::Status LexComment(size_t start) {
    const size_t end = source_.find("#}", start + 2);
    if (end == std::string::npos) return Error(start, "unterminated comment: missing '#}'");
    char sign = 0;
    if (end > start + 2 && (source_[end - 1] == '-' || source_[end - 1] == '+')) {
      sign = source_[end - 1];
    }
    pos_ = end + 2;
    ControlAfter(sign, /*trim=*/true);
    return absl::OkStatus();
  }

  absl::Status LexRaw(size_t start, size_t begin_end, char begin_inner_sign) {
    pos_ = begin_end;
    // "-%}" strips the whitespace after "{% raw -%}"; trim_blocks does not apply here.
    ControlAfter(begin_inner_sign == '-' ? '-' : '+', /*trim=*/false);
    const size_t content_begin = pos_;
    size_t search = pos_;
    while (true) {
      const size_t candidate = source_.find("{%", search);
      if (candidate == std::string::npos) {
        return Error(start, "unterminated raw block: missing '{% endraw %}'");
      }
      char outer_sign = 0;
      char inner_sign = 0;
      const size_t end = MatchSimpleBlock(candidate, "endraw", &outer_sign, &inner_sign);
      if (end == std::string::npos) {
        search = candidate + 2;
        continue;
      }
      const std::string_view content =
          std::string_view(source_).substr(content_begin, candidate - content_begin);
      EmitText(ControlBefore(content, outer_sign, /*is_variable=*/false), content_begin);
      pos_ = end;
      ControlAfter(inner_sign, /*trim=*/true);
      return absl::OkStatus();
    }
  }

  absl::Status LexTag(size_t start, bool is_variable) {
    Emit(is_variable ? TokenKind::kVariableBegin : TokenKind::kBlockBegin,
         is_variable ? "{{" : "{%", start);
    pos_ = start + 2;
    if (pos_ < source_.size() && (source_[pos_] == '-' || source_[pos_] == '+')) ++pos_;
    std::vector<char> closers;  // brackets open inside the tag
    while (true) {
      while (pos_ < source_.size() && IsAsciiSpace(source_[pos_])) ++pos_;
      if (pos_ >= source_.size()) {
        return Error(start, is_variable ? "unterminated '{{': missing '}}'"
                                        : "unterminated '{%': missing '%}'");
      }
      if (closers.empty()) {
        const std::string_view close = is_variable ? "}}" : "%}";
        char sign = 0;
        size_t close_at = std::string::npos;
        if ((source_[pos_] == '-' || source_[pos_] == '+') &&
            source_.compare(pos_ + 1, 2, close) == 0) {
          sign = source_[pos_];
          close_at = pos_ + 1;
        } else if (source_.compare(pos_, 2, close) == 0) {
          close_at = pos_;
        }
        if (close_at != std::string::npos) {
          Emit(is_variable ? TokenKind::kVariableEnd : TokenKind::kBlockEnd, std::string(close),
               pos_);
          pos_ = close_at + 2;
          ControlAfter(sign, /*trim=*/!is_variable);
          return absl::OkStatus();
        }
      }
      LMSERVE_RETURN_IF_ERROR(LexExpressionToken(&closers));
    }
  }

  absl::Status LexExpressionToken(std::vector<char>* closers) {
    const size_t start = pos_;
    const char c = source_[pos_];
    if (IsNameStart(c)) {
      while (pos_ < source_.size() && IsNameChar(source_[pos_])) ++pos_;
      Emit(TokenKind::kName, source_.substr(start, pos_ - start), start);
      return absl::OkStatus();
    }
    if (IsDigit(c)) return LexNumber();
    if (c == '\'' || c == '"') return LexString();
    static constexpr std::string_view kTwoCharOperators[] = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwoCharOperators) {
      if (source_.compare(pos_, 2, op) == 0) {
        pos_ += 2;
        Emit(TokenKind::kOperator, std::string(op), start);
        return absl::OkStatus();
      }
    }
    static constexpr std::string_view kOneCharOperators = "+-*/%~<>=()[]{},.:|";
    if (kOneCharOperators.find(c) == std::string_view::npos) {
      return Error(start, StrCat("unexpected character '", std::string(1, c), "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      closers->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (closers->empty() || closers->back() != c) {
        return Error(start, StrCat("unexpected '", std::string(1, c), "'"));
      }
      closers->pop_back();
    }
    ++pos_;
    Emit(TokenKind::kOperator, std::string(1, c), start);
    return absl::OkStatus();
  }

  // Digits with single underscores between them ("1_000"); returns the digits without them.
  std::string ScanDigits() {
    std::string digits;
    while (pos_ < source_.size()) {
      if (IsDigit(source_[pos_])) {
        digits.push_back(source_[pos_++]);
      } else if (source_[pos_] == '_' && pos_ + 1 < source_.size() && IsDigit(source_[pos_ + 1]) &&
                 !digits.empty()) {
        ++pos_;
      } else {
        break;
      }
    }
    return digits;
  }

  absl::Status LexNumber() {
    const size_t start = pos_;
    std::string text = ScanDigits();
    bool is_float = false;
    // After a '.', digits are an attribute index (messages.0.role), never a float.
    const bool after_dot = !tokens_.empty() && tokens_.back().kind == TokenKind::kOperator &&
                           tokens_.back().text == ".";
    if (!after_dot && pos_ + 1 < source_.size() && source_[pos_] == '.' &&
        IsDigit(source_[pos_ + 1])) {
      ++pos_;
      text += '.';
      text += ScanDigits();
      is_float = true;
    }
    if (!after_dot && pos_ < source_.size() && (source_[pos_] == 'e' || source_[pos_] == 'E')) {
      size_t i = pos_ + 1;
      if (i < source_.size() && (source_[i] == '+' || source_[i] == '-')) ++i;
      if (i < source_.size() && IsDigit(source_[i])) {
        text += 'e';
        text += source_.substr(pos_ + 1, i - pos_ - 1);
        pos_ = i;
        text += ScanDigits();
        is_float = true;
      }
    }
    Token token;
    token.pos = Pos(start);
    token.text = text;
    if (is_float) {
      token.kind = TokenKind::kFloat;
      token.number = std::strtod(text.c_str(), nullptr);
    } else {
      const std::optional<int64_t> value = ParseInt<int64_t>(text);
      if (!value.has_value()) return Error(start, StrCat("integer literal too large: ", text));
      token.kind = TokenKind::kInteger;
      token.integer = *value;
    }
    tokens_.push_back(std::move(token));
    return absl::OkStatus();
  }

  // Reads `count` hex digits at pos_; false when they are not there.
  bool ReadHex(int count, char32_t* value) {
    if (pos_ + count > source_.size()) return false;
    char32_t v = 0;
    for (int i = 0; i < count; ++i) {
      const char h = source_[pos_ + i];
      int digit;
      if (h >= '0' && h <= '9') {
        digit = h - '0';
      } else if (h >= 'a' && h <= 'f') {
        digit = h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        digit = h - 'A' + 10;
      } else {
        return false;
      }
      v = v * 16 + digit;
    }
    pos_ += count;
    *value = v;
    return true;
  }

  // A quoted literal with Python's escapes (what jinja2 decodes with "unicode-escape").
  absl::Status LexString() {
    const size_t start = pos_;
    const char quote = source_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= source_.size()) return Error(start, "unterminated string literal");
      const char c = source_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        value.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= source_.size()) return Error(start, "unterminated string literal");
      const char e = source_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
        case '\'':
        case '"':
          value.push_back(e);
          break;
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int count = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          char32_t code_point = 0;
          if (!ReadHex(count, &code_point) || code_point > 0x10FFFF) {
            return Error(pos_ - 2, StrCat("invalid \\", std::string(1, e), " escape"));
          }
          AppendUtf8(code_point, &value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t code_point = e - '0';
            for (int i = 0;
                 i < 2 && pos_ < source_.size() && source_[pos_] >= '0' && source_[pos_] <= '7';
                 ++i) {
              code_point = code_point * 8 + (source_[pos_++] - '0');
            }
            AppendUtf8(code_point, &value);
          } else {
            // Unknown escapes stay as written, as in Python.
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    Token token;
    token.kind = TokenKind::kString;
    token.text = std::move(value);
    token.pos = Pos(start);
    tokens_.push_back(std::move(token));
    return absl::OkStatus();
  }

  const std::string source_;
  const LexerOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  // Whether the last thing consumed ended a line (jinja2's `line_starting`), for lstrip_blocks.
  bool line_starting_ = true;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(NormalizeNewlines(source), options).Run();
}

}  // namespace lmserve::engine::jinja
