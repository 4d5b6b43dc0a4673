// common/utf8.h: the one UTF-8 check. It is the tokenizer's scan (Unicode's Table 3-7) with an
// ASCII fast path; these tests hold it to a plain decode-then-check-the-code-point reference (the
// server's former check) over every sequence of up to three bytes and a sweep of four-byte ones,
// and to the fast path's word boundaries.

#include "common/utf8.h"

#include <cstdint>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace lmserve {
namespace {

// Decodes each sequence by its lead byte's length and rejects overlong forms, surrogates, code
// points past U+10FFFF, bad continuation bytes and truncation.
bool ReferenceIsValidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length;
    uint32_t min_code_point;
    uint32_t code_point;
    if ((c & 0xE0) == 0xC0) {
      length = 2, min_code_point = 0x80, code_point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, min_code_point = 0x800, code_point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, min_code_point = 0x10000, code_point = c & 0x07;
    } else {
      return false;
    }
    if (i + length > n) return false;
    for (int k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (s[i + k] & 0x3F);
    }
    if (code_point < min_code_point || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

TEST(IsValidUtf8Test, AcceptsWellFormedAndRejectsTheRest) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8(std::string("nul\0inside", 10)));
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));   // U+10FFFF, the last code point
  EXPECT_TRUE(IsValidUtf8("\xEE\x80\x80"));       // U+E000, just past the surrogates
  EXPECT_FALSE(IsValidUtf8("\x80"));              // a lone continuation byte
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));      // truncated, 4 bytes
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong, 3 bytes
  EXPECT_FALSE(IsValidUtf8("\xF0\x80\x80\xAF"));  // overlong, 4 bytes
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xED\xBF\xBF"));      // the last surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xF5\x80\x80\x80"));  // a lead byte past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("ok \xE2\x82 then"));  // a broken sequence mid-text
}

// The fast path skips 8 ASCII bytes at a time: a bad byte at any offset, before, at and after a
// word boundary, is still found.
TEST(IsValidUtf8Test, FindsBadBytesAtEveryOffsetOfTheAsciiFastPath) {
  for (size_t length = 1; length <= 40; ++length) {
    for (size_t at = 0; at < length; ++at) {
      std::string text(length, 'a');
      text[at] = '\xC0';
      EXPECT_FALSE(IsValidUtf8(text)) << "length " << length << ", bad byte at " << at;
      text[at] = '\xC3';
      if (at + 1 < length) {
        text[at + 1] = '\xA9';  // é: well-formed
        EXPECT_TRUE(IsValidUtf8(text)) << "length " << length << ", é at " << at;
      } else {
        EXPECT_FALSE(IsValidUtf8(text)) << "length " << length << ", truncated at the end";
      }
    }
  }
}

TEST(IsValidUtf8Test, AgreesWithTheReferenceOnEverySequenceOfUpToThreeBytes) {
  std::string text;
  for (uint32_t a = 0; a < 256; ++a) {
    text.assign(1, static_cast<char>(a));
    ASSERT_EQ(IsValidUtf8(text), ReferenceIsValidUtf8(text)) << a;
    for (uint32_t b = 0; b < 256; ++b) {
      text.assign({static_cast<char>(a), static_cast<char>(b)});
      ASSERT_EQ(IsValidUtf8(text), ReferenceIsValidUtf8(text)) << a << " " << b;
      for (uint32_t c = 0; c < 256; ++c) {
        text.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
        ASSERT_EQ(IsValidUtf8(text), ReferenceIsValidUtf8(text)) << a << " " << b << " " << c;
      }
    }
  }
}

// Four-byte sequences: every lead byte from F0 up, every second byte, and third and fourth bytes
// at the edges of the continuation range and outside it.
TEST(IsValidUtf8Test, AgreesWithTheReferenceOnFourByteSequences) {
  constexpr uint8_t kTails[] = {0x00, 0x41, 0x7F, 0x80, 0x81, 0xA0, 0xBF, 0xC0, 0xC3, 0xFF};
  std::string text;
  for (uint32_t a = 0xF0; a < 256; ++a) {
    for (uint32_t b = 0; b < 256; ++b) {
      for (uint8_t c : kTails) {
        for (uint8_t d : kTails) {
          text.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c),
                       static_cast<char>(d)});
          ASSERT_EQ(IsValidUtf8(text), ReferenceIsValidUtf8(text))
              << a << " " << b << " " << int{c} << " " << int{d};
        }
      }
    }
  }
}

// ScanUtf8 gives the length of a well-formed sequence, and minus the length of the maximal
// ill-formed subpart (what Utf8Lossy replaces with one U+FFFD).
TEST(ScanUtf8Test, LengthsAndMaximalSubparts) {
  EXPECT_EQ(ScanUtf8("a", 0), 1);
  EXPECT_EQ(ScanUtf8("\xC3\xA9", 0), 2);
  EXPECT_EQ(ScanUtf8("\xE2\x82\xAC", 0), 3);
  EXPECT_EQ(ScanUtf8("\xF0\x9F\x98\x80", 0), 4);
  EXPECT_EQ(ScanUtf8("\x80", 0), -1);
  EXPECT_EQ(ScanUtf8("\xC0\xAF", 0), -1);
  EXPECT_EQ(ScanUtf8("\xE2\x82", 0), -2);
  EXPECT_EQ(ScanUtf8("\xE2\x82x", 0), -2);
  EXPECT_EQ(ScanUtf8("\xF0\x9F\x98", 0), -3);
  EXPECT_EQ(ScanUtf8("\xED\xA0\x80", 0), -1);
}

}  // namespace
}  // namespace lmserve
