// Python's str methods on UTF-8 strings, as Jinja templates call them ('x'.strip(), |trim, |title).
//
// Python strings are sequences of code points; these functions decode UTF-8 where that matters
// (whitespace, slicing, length). A byte that is not valid UTF-8 counts as one code point of its own
// and is kept as it is. Case mapping (upper, lower, title, capitalize) covers ASCII only; other
// characters pass through unchanged.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_PYSTR_H_
#define LMSERVE_ENGINE_CHAT_JINJA_PYSTR_H_

#include "common/utf8.h"
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmserve::engine::jinja {

// Decodes the code point at byte `offset`; sets *length to its byte count (1 for an invalid byte,
// which decodes to 0xFFFFFFFF, matching no character).
char32_t DecodeUtf8At(std::string_view text, size_t offset, size_t* length);
using ::lmserve::AppendUtf8;  // common/utf8.h

// Byte offset of every code point, followed by text.size().
std::vector<size_t> CodePointOffsets(std::string_view text);
int64_t CodePointCount(std::string_view text);

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t code_point);

enum class StripSide { kLeft, kRight, kBoth };
// str.strip() / lstrip() / rstrip(): whitespace, or any code point of `chars` when given.
std::string PyStrip(std::string_view text, std::optional<std::string_view> chars, StripSide side);

// str.split(sep, maxsplit): on runs of whitespace when `separator` is nullopt. REQUIRES: a given
// separator is not empty. maxsplit < 0: no limit.
std::vector<std::string> PySplit(std::string_view text, std::optional<std::string_view> separator,
                                 int64_t max_split);

// str.replace(old, new, count); count < 0: every occurrence. An empty `from` inserts `to` between
// code points, as Python does.
std::string PyReplace(std::string_view text, std::string_view from, std::string_view to,
                      int64_t count);

std::string PyUpper(std::string_view text);
std::string PyLower(std::string_view text);
// str.title(): a letter after a non-letter is upper-cased, the others lower-cased.
std::string PyTitle(std::string_view text);
// Jinja's |title filter: words start after whitespace, '-', '(', '{', '[' or '<'.
std::string JinjaTitle(std::string_view text);
// str.capitalize(): first code point upper-cased, the rest lower-cased.
std::string PyCapitalize(std::string_view text);

// Python's slice semantics over `length` elements: the selected indices, in order.
// REQUIRES: step != 0.
std::vector<int64_t> SliceIndices(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step);

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_PYSTR_H_
