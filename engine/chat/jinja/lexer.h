// The Jinja lexer: template source to tokens, with Jinja's whitespace control applied.
//
// Whitespace control follows jinja2's lexer exactly, for the environment transformers renders chat
// templates with (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//   - newlines are normalized to "\n" and one trailing newline of the source is dropped;
//   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" all after it;
//   - trim_blocks: the first "\n" after a block or comment tag is removed ("+%}" keeps it);
//   - lstrip_blocks: spaces and tabs from the start of a line up to a block or comment tag are
//     removed ("{%+" keeps them); never before "{{";
//   - "{% raw %}...{% endraw %}" is text, untouched.
// Inside tags, "}}" and "%}" end the tag only outside brackets, as in jinja2.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_LEXER_H_
#define LMSERVE_ENGINE_CHAT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::engine::jinja {

struct SourcePos {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in bytes
};

enum class TokenKind : uint8_t {
  kText,           // template data between tags, `text` is its final form
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifiers and keywords (if, in, not, true, ...)
  kString,         // `text` is the decoded literal
  kInteger,        // `integer`
  kFloat,          // `number`
  kOperator,       // `text`: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
  kEnd,            // end of the source
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  SourcePos pos;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Tokenizes `source`. Errors (unterminated tags, strings or comments, unbalanced brackets, bad
// characters) are InvalidArgument with "line L, column C: " and what was expected.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source, const LexerOptions& options);

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_LEXER_H_
