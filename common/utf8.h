// UTF-8: encoding one code point (the tokenizers, the chat-template interpreter) and the one
// validity check (the tokenizers, the server's request checks).

#ifndef LMSERVE_COMMON_UTF8_H_
#define LMSERVE_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

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

// The length of the well-formed UTF-8 sequence at `bytes[pos]` (1..4), or, when it is ill-formed,
// minus the length of its maximal ill-formed subpart (-1..-3), as Unicode's Table 3-7 defines
// well-formed sequences: no overlong forms, no surrogates (U+D800..U+DFFF), nothing past U+10FFFF,
// no truncated sequence. REQUIRES: pos < bytes.size().
inline int ScanUtf8(std::string_view bytes, size_t pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = at(pos);
  if (lead < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;  // below: overlong
    if (lead == 0xED) hi = 0x9F;  // above: surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;  // below: overlong
    if (lead == 0xF4) hi = 0x8F;  // above: past U+10FFFF
  } else {
    return -1;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
  }
  for (int k = 1; k <= need; ++k) {
    const size_t i = pos + k;
    if (i >= bytes.size()) return -k;
    const uint8_t b = at(i);
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return -k;
  }
  return need + 1;
}

// True when `text` is well-formed UTF-8 (see ScanUtf8). NUL bytes are well-formed.
inline bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    const int n = ScanUtf8(text, pos);
    if (n < 0) return false;
    pos += n;
  }
  return true;
}

}  // namespace lmserve

#endif  // LMSERVE_COMMON_UTF8_H_
