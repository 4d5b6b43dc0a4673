#include "engine/tokenizer/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include "common/strings.h"

namespace lmserve::engine::tokenizer_internal {

char32_t DecodeUtf8(std::string_view text, size_t* pos) {
  const auto at = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = at(*pos);
  if (lead < 0x80) {
    ++*pos;
    return lead;
  }
  const size_t length = Utf8SequenceLength(lead);
  char32_t c = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (at(*pos + k) & 0x3F);
  *pos += length;
  return c;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int n = ScanUtf8(bytes, pos);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += -n;
    }
  }
  return out;
}

size_t IncompleteUtf8SuffixLength(std::string_view text) {
  // An incomplete sequence is at most 3 bytes long: look for its lead byte among the last 3.
  const size_t lookback = std::min<size_t>(3, text.size());
  for (size_t k = 1; k <= lookback; ++k) {
    const size_t pos = text.size() - k;
    const uint8_t b = static_cast<uint8_t>(text[pos]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    const int n = ScanUtf8(text, pos);
    // Ill-formed only because the text ends: the subpart reaches the end.
    if (n < 0 && pos + static_cast<size_t>(-n) == text.size() && Utf8SequenceLength(b) > k) {
      return k;
    }
    return 0;
  }
  return 0;
}

bool IsNumeric(char32_t c) {
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool IsWhitespace(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsAlphanumeric(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) || IsNumeric(c);
}

absl::StatusOr<std::string> NormalizeUnicode(std::string_view text, NormalizationForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalizationForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalizationForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalizationForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalizationForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || normalizer == nullptr) {
    return absl::InternalError(StrCat("ICU normalizer unavailable: ", u_errorName(status)));
  }
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  normalizer->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
                            sink, nullptr, status);
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(
        StrCat("Unicode normalization failed: ", u_errorName(status)));
  }
  return out;
}

const std::array<std::string, 256>& ByteToUnicode() {
  static const std::array<std::string, 256> kTable = [] {
    std::array<std::string, 256> table;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      AppendUtf8(printable ? static_cast<char32_t>(b) : next++, &table[b]);
    }
    return table;
  }();
  return kTable;
}

int UnicodeToByte(char32_t c) {
  static const std::array<int16_t, 324> kInverse = [] {
    std::array<int16_t, 324> inverse;
    inverse.fill(-1);
    const std::array<std::string, 256>& table = ByteToUnicode();
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      inverse[DecodeUtf8(table[b], &pos)] = static_cast<int16_t>(b);
    }
    return inverse;
  }();
  return c < kInverse.size() ? kInverse[c] : -1;
}

}  // namespace lmserve::engine::tokenizer_internal
