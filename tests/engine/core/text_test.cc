#include "engine/core/text.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

// Pushes `pieces` one at a time; returns the released text, pieces joined by '|', and the match.
std::string PushAll(StopStringMatcher& matcher, const std::vector<std::string>& pieces,
                    std::optional<std::string>* matched) {
  std::string released;
  for (const std::string& piece : pieces) {
    released += matcher.Push(piece, /*can_stop=*/true, matched);
    released += "|";
    if (matched->has_value()) break;
  }
  return released;
}

TEST(StopStringMatcherTest, HoldsBackAPossibleStartAndReleasesItWhenItIsNot) {
  StopStringMatcher matcher({"STOP"});
  std::optional<std::string> matched;
  EXPECT_EQ(PushAll(matcher, {"ab", "cS", "T", "x", "yz"}, &matched), "ab|c||STx|yz|");
  EXPECT_FALSE(matched.has_value());
}

TEST(StopStringMatcherTest, MatchesAcrossTokenBoundariesAndNeverReleasesTheStopString) {
  StopStringMatcher matcher({"STOP"});
  std::optional<std::string> matched;
  EXPECT_EQ(PushAll(matcher, {"abS", "T", "OPtail"}, &matched), "ab|||");
  EXPECT_EQ(matched, "STOP");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.Push("more", true, &matched), "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopStringMatcherTest, TheEarliestOccurrenceOfAnyStopStringWins) {
  StopStringMatcher matcher({"cd", "bc"});
  std::optional<std::string> matched;
  EXPECT_EQ(PushAll(matcher, {"a", "bcd"}, &matched), "a||");
  EXPECT_EQ(matched, "bc");
}

TEST(StopStringMatcherTest, OverlappingPrefixesAreHeldBackLongestFirst) {
  StopStringMatcher matcher({"aab"});
  std::optional<std::string> matched;
  // "aaa" may still become "...aab": only the last two a's are held back.
  EXPECT_EQ(PushAll(matcher, {"a", "a", "a", "b"}, &matched), "||a||");
  EXPECT_EQ(matched, "aab");
}

TEST(StopStringMatcherTest, BeforeMinTokensAStopStringIsPlainText) {
  StopStringMatcher matcher({"xy"});
  std::optional<std::string> matched;
  EXPECT_EQ(matcher.Push("axy", /*can_stop=*/false, &matched), "axy");
  EXPECT_EQ(matcher.Push("bx", /*can_stop=*/false, &matched), "b");
  EXPECT_EQ(matcher.Push("y", /*can_stop=*/true, &matched), "");
  EXPECT_EQ(matched, "xy");
}

TEST(StopStringMatcherTest, FlushReleasesHeldText) {
  StopStringMatcher matcher({"STOP"});
  std::optional<std::string> matched;
  EXPECT_EQ(matcher.Push("okST", true, &matched), "ok");
  EXPECT_EQ(matcher.Flush(), "ST");
  StopStringMatcher none({});
  EXPECT_EQ(none.Push("anything", true, &matched), "anything");
}

// A byte-level vocabulary: ids 0..255 are bytes; decode is concatenation, with U+FFFD for a
// trailing incomplete UTF-8 sequence.
std::string DecodeBytes(std::span<const int32_t> ids) {
  std::string bytes;
  for (int32_t id : ids) bytes.push_back(static_cast<char>(id));
  // Find an incomplete trailing sequence.
  size_t i = bytes.size();
  int continuation = 0;
  while (i > 0 && (static_cast<uint8_t>(bytes[i - 1]) & 0xC0) == 0x80 && continuation < 3) {
    --i;
    ++continuation;
  }
  if (i > 0) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i - 1]);
    const int needed = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (needed > continuation) {
      bytes.resize(i - 1);
      bytes += "\xEF\xBF\xBD";
    }
  }
  return bytes;
}

TEST(FunctionTextDecoderTest, ReleasesWholeCharactersOnly) {
  FunctionTextDecoder decoder(DecodeBytes);
  auto stream = decoder.NewSequence(std::vector<int32_t>{'h', 'i'});
  EXPECT_EQ(stream->Append(' '), " ");
  // "é" is C3 A9; "€" is E2 82 AC.
  EXPECT_EQ(stream->Append(0xC3), "");
  EXPECT_EQ(stream->Append(0xA9), "\xC3\xA9");
  EXPECT_EQ(stream->Append(0xE2), "");
  EXPECT_EQ(stream->Append(0x82), "");
  EXPECT_EQ(stream->Append(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(stream->Append('!'), "!");
  EXPECT_EQ(stream->Append(0xE2), "");
  EXPECT_EQ(stream->Finish(), "\xEF\xBF\xBD");  // the incomplete tail, as the decoder renders it
}

// SentencePiece-like: a piece's leading space shows only after another piece.
std::string DecodeSpaced(std::span<const int32_t> ids) {
  static const std::map<int32_t, std::string> kPieces = {{1, "Hello"}, {2, "world"}, {3, "!"}};
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (i > 0 && id != 3) text += " ";
    text += kPieces.at(id);
  }
  return text;
}

TEST(FunctionTextDecoderTest, UsesThePromptAsContext) {
  FunctionTextDecoder decoder(DecodeSpaced);
  auto stream = decoder.NewSequence(std::vector<int32_t>{1});
  EXPECT_EQ(stream->Append(2), " world");  // not "world": the prompt gives the context
  EXPECT_EQ(stream->Append(3), "!");
  EXPECT_EQ(stream->Finish(), "");
}

}  // namespace
}  // namespace lmserve::engine
