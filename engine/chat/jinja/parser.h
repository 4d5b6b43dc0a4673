// The Jinja parser: tokens to a syntax tree, with jinja2's operator precedence.
//
// Supported statements: if/elif/else, for (tuple targets, `if` filter, else), set (expression,
// namespace attribute and block forms), macro, call, filter, break/continue (loopcontrols),
// raw (in the lexer) and transformers' generation block. include/extends/import/block are
// rejected: a chat template is one self-contained source.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_PARSER_H_
#define LMSERVE_ENGINE_CHAT_JINJA_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"
#include "engine/chat/jinja/lexer.h"

namespace lmserve::engine::jinja {

// Parses the whole token stream (ending in kEnd). Syntax errors are InvalidArgument with
// "line L, column C: " and what was expected. Statement and expression nesting deeper than
// `max_nesting` is an error, so that the parser's recursion stays bounded.
absl::StatusOr<Body> Parse(const std::vector<Token>& tokens, int max_nesting);

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_PARSER_H_
