// UTF-8 and Unicode helpers for the tokenizers: decoding, validation, the lossy conversion that
// Hugging Face (Rust's String::from_utf8_lossy) applies, character classes and normalization forms
// (ICU), and GPT-2's byte-to-unicode table. The UTF-8 check itself (IsValidUtf8, ScanUtf8) is
// common/utf8.h's.
//
// Internal to engine/tokenizer. Everything here is stateless and thread-safe.

#ifndef LMSERVE_ENGINE_TOKENIZER_UNICODE_H_
#define LMSERVE_ENGINE_TOKENIZER_UNICODE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/utf8.h"

namespace lmserve::engine::tokenizer_internal {

// The length in bytes of the UTF-8 sequence that `lead` starts (1..4), 1 for a stray byte.
inline size_t Utf8SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the character at `*pos` and advances `*pos` past it.
// REQUIRES: `text` is valid UTF-8 and *pos < text.size() lies on a character boundary.
char32_t DecodeUtf8(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `c` (a Unicode scalar value).
using ::lmserve::AppendUtf8;  // common/utf8.h

// Returns `bytes` with each maximal ill-formed subpart replaced by U+FFFD (Unicode's recommended
// practice, which is what Rust's String::from_utf8_lossy, and so Hugging Face, does).
std::string Utf8Lossy(std::string_view bytes);

// The number of bytes at the end of `text` that form an incomplete but so far well-formed UTF-8
// sequence (a lead byte and fewer continuation bytes than it needs): 0 to 3.
size_t IncompleteUtf8SuffixLength(std::string_view text);

// Character classes, as Rust's char methods define them (Hugging Face uses those).
bool IsNumeric(char32_t c);       // general category Nd, Nl or No
bool IsWhitespace(char32_t c);    // the White_Space property
bool IsAlphanumeric(char32_t c);  // the Alphabetic property, or numeric

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };
// Normalizes valid UTF-8 `text` (ICU).
absl::StatusOr<std::string> NormalizeUnicode(std::string_view text, NormalizationForm form);

// GPT-2's reversible map from bytes to printable characters: byte b is written as the UTF-8 text
// ByteToUnicode()[b] by byte-level pre-tokenizers, and read back by byte-level decoders.
const std::array<std::string, 256>& ByteToUnicode();
// The byte that character `c` stands for in that map, or -1 when `c` is not one of its 256
// characters.
int UnicodeToByte(char32_t c);

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_UNICODE_H_
