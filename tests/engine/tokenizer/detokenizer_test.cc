// Streaming detokenization: random token sequences (byte-fallback runs, partial multi-byte
// byte-level pieces and special tokens included) streamed one id at a time must give chunks that
// are each valid UTF-8 and concatenate to the one-shot Decode.

#include "engine/tokenizer/detokenizer.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine {
namespace {

// Streams `ids` and checks the chunks; returns the number of non-empty chunks.
int ExpectStreamsLikeDecode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                            bool skip_special) {
  Detokenizer detokenizer(tokenizer, skip_special);
  std::string streamed;
  int chunks = 0;
  for (const int32_t id : ids) {
    const std::string chunk = detokenizer.Add(id);
    EXPECT_TRUE(testing::IsWellFormedUtf8(chunk)) << "chunk after id " << id;
    streamed += chunk;
    chunks += !chunk.empty();
  }
  const std::string rest = detokenizer.Flush();
  EXPECT_TRUE(testing::IsWellFormedUtf8(rest));
  streamed += rest;
  EXPECT_EQ(streamed, tokenizer.Decode(ids, skip_special));
  EXPECT_EQ(detokenizer.ids(), ids);
  return chunks + !rest.empty();
}

class DetokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DetokenizerTest, RandomSequencesStreamLikeOneShotDecode) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  std::mt19937 rng(1234);
  const int32_t vocab_size = tokenizer.vocab_size();
  // Ids of pieces that are parts of multi-byte characters are drawn more often: byte-fallback
  // tokens
  // (<0xXX>, ids 3..258 in the SentencePiece fixture) and byte-level pieces of bytes >= 0x80.
  std::vector<int32_t> partial_ids;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string_view piece = tokenizer.IdToPiece(id);
    if (tokenizer.IsByteFallback(id) || (piece.size() == 2 && piece != "\xC4\xA0")) {
      partial_ids.push_back(id);
    }
  }
  ASSERT_FALSE(partial_ids.empty());
  std::uniform_int_distribution<int32_t> any_id(0, vocab_size - 1);
  std::uniform_int_distribution<size_t> any_partial(0, partial_ids.size() - 1);
  std::uniform_int_distribution<int> length(1, 40);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<int32_t> ids(length(rng));
    for (int32_t& id : ids) id = rng() % 3 == 0 ? any_id(rng) : partial_ids[any_partial(rng)];
    SCOPED_TRACE("trial " + std::to_string(trial));
    ExpectStreamsLikeDecode(tokenizer, ids, /*skip_special=*/trial % 2 == 0);
  }
}

TEST_P(DetokenizerTest, EncodedTextStreamsBackExactly) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  for (const testing::TokenizerCase& c : testing::TokenizerCases().at(GetParam())) {
    SCOPED_TRACE(c.text);
    ExpectStreamsLikeDecode(tokenizer, c.ids_with_special, /*skip_special=*/false);
    ExpectStreamsLikeDecode(tokenizer, c.ids_with_special, /*skip_special=*/true);
  }
}

TEST_P(DetokenizerTest, EmitsCompleteCharactersAsSoonAsTheyArrive) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  // Four 3-byte characters and an emoji: byte-level splits them into byte pieces, the SentencePiece
  // fixture into <0xXX> runs. Every chunk is whole characters, and the stream does not lag behind
  // by more than the pieces of one character.
  const std::string text = "ab 你好世界 😀 cd";
  const std::vector<int32_t> ids = tokenizer.Encode(text, false);
  Detokenizer detokenizer(tokenizer, false);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string chunk = detokenizer.Add(id);
    ASSERT_TRUE(testing::IsWellFormedUtf8(chunk));
    streamed += chunk;
  }
  EXPECT_EQ(streamed + detokenizer.Flush(), text);
  EXPECT_GE(streamed.size(), text.size() - 3);  // at most the last word waits for Flush
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DetokenizerTest,
                         ::testing::ValuesIn(testing::FixtureTokenizerNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(DetokenizerSentencePieceTest, HoldsByteFallbackRunsAndKeepsLeadingSpaceRules) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer("sentencepiece-bpe");
  const auto byte = [](int b) { return 3 + b; };  // <0x00> is id 3
  Detokenizer detokenizer(tokenizer, /*skip_special=*/true);
  // BOS, then "▁" + "你" as bytes E4 BD A0: nothing until the run ends with a non-byte token.
  EXPECT_EQ(detokenizer.Add(1), "");
  EXPECT_EQ(detokenizer.Add(tokenizer.PieceToId("\u2581").value()), "");
  EXPECT_EQ(detokenizer.Add(byte(0xE4)), "");
  EXPECT_EQ(detokenizer.Add(byte(0xBD)), "");
  EXPECT_EQ(detokenizer.Add(byte(0xA0)), "");
  // The leading "▁" is stripped as in Decode; the run is emitted whole with the next token.
  const int32_t h = tokenizer.PieceToId("H").value();
  EXPECT_EQ(detokenizer.Add(h), "\xE4\xBD\xA0H");
  // An invalid run (A, then a lone lead byte, then B) decodes as one U+FFFD per byte, as Decode
  // does.
  EXPECT_EQ(detokenizer.Add(byte(0x41)), "");
  EXPECT_EQ(detokenizer.Add(byte(0xE4)), "");
  EXPECT_EQ(detokenizer.Add(byte(0x42)), "");
  EXPECT_EQ(detokenizer.Flush(), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(DetokenizerSentencePieceTest, MetaspaceDecoderStreamsLikeDecode) {
  // The SentencePiece fixture with a Metaspace pre-tokenizer and decoder (which drops the "▁" of the
  // first token, whatever the window): random sequences with byte runs and "▁" pieces.
  nlohmann::json j = nlohmann::json::parse(
      testing::ReadTextFile(testing::FixtureTokenizerPath("sentencepiece-bpe")));
  const nlohmann::json metaspace = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = metaspace;
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", {metaspace, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  auto tokenizer = Tokenizer::FromHfJson(j.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int32_t space = (*tokenizer)->PieceToId("\u2581").value();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 30);
    for (int32_t& id : ids) {
      const unsigned kind = rng() % 4;
      id = kind == 0 ? space : kind == 1 ? 3 + static_cast<int32_t>(rng() % 256)
                                         : static_cast<int32_t>(rng() % 2056);
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    ExpectStreamsLikeDecode(**tokenizer, ids, trial % 2 == 0);
  }
}

TEST(DetokenizerTest, ContextKeepsTheLeadingSpaceOfTheFirstNewToken) {
  for (const std::string& name : testing::FixtureTokenizerNames()) {
    SCOPED_TRACE(name);
    const Tokenizer& tokenizer = testing::FixtureTokenizer(name);
    const std::vector<int32_t> all = tokenizer.Encode("Hello world, 你好 there", true);
    for (size_t split = 1; split < all.size(); ++split) {
      const std::vector<int32_t> prompt(all.begin(), all.begin() + split);
      const std::string prompt_text = tokenizer.Decode(prompt, true);
      const std::string all_text = tokenizer.Decode(all, true);
      if (prompt_text.find("\xEF\xBF\xBD") != std::string::npos) continue;  // mid-character
      Detokenizer detokenizer(tokenizer, /*skip_special=*/true, prompt);
      std::string streamed;
      for (size_t i = split; i < all.size(); ++i) streamed += detokenizer.Add(all[i]);
      streamed += detokenizer.Flush();
      EXPECT_EQ(prompt_text + streamed, all_text) << "split " << split;
    }
  }
}

TEST(DetokenizerSentencePieceTest, SkippedTokensDoNotEndAByteRun) {
  // Found by tokenizer_fuzz: with skip_special, Decode drops <s> and <unk> and the two byte tokens
  // around them form one (invalid) run: two U+FFFD, not ")" and one U+FFFD.
  const Tokenizer& tokenizer = testing::FixtureTokenizer("sentencepiece-bpe");
  const std::vector<int32_t> ids = {1908, 915, 3 + 0x29, 1, 0, 3 + 0xB9, 99999, 3 + 0x41};
  ExpectStreamsLikeDecode(tokenizer, ids, /*skip_special=*/true);
  ExpectStreamsLikeDecode(tokenizer, ids, /*skip_special=*/false);
  // And a valid character split by skipped tokens.
  ExpectStreamsLikeDecode(tokenizer, {3 + 0xE4, 1, 3 + 0xBD, 2, 3 + 0xA0, 445}, true);
}

}  // namespace
}  // namespace lmserve::engine
