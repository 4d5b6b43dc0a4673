// UTF-8 encoding of one code point, shared by the tokenizers and the chat-template interpreter.

#ifndef LMSERVE_COMMON_UTF8_H_
#define LMSERVE_COMMON_UTF8_H_

#include <string>

namespace lmserve {

// Appends the UTF-8 encoding of `c` to `out`. REQUIRES: c <= U+10FFFF.
inline void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace lmserve

#endif  // LMSERVE_COMMON_UTF8_H_
