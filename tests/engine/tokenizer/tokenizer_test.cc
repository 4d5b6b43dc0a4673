// The Tokenizer interface: loading (files, directories, configs, errors), round trips on varied
// text, invalid input, accessors and concurrent use.

#include "engine/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

// Deterministic varied text: words, code, numbers, whitespace runs, CJK, emoji, combining marks,
// special-token strings and random code points from every plane.
std::string VariedText(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {"the",
                                                   "Quick",
                                                   "brown",
                                                   "fox's",
                                                   "THEY'LL",
                                                   "we've",
                                                   "def f(x):\n    return x ** 2\n",
                                                   "{ a[i] += 1; }",
                                                   "1234567",
                                                   "3.14159",
                                                   "1,000",
                                                   "２０２４",
                                                   "٣٤",
                                                   "½",
                                                   "你好世界",
                                                   "こんにちは",
                                                   "Привет",
                                                   "😀",
                                                   "👍🏽",
                                                   "👨‍👩‍👧",
                                                   "e\u0301",
                                                   "\u00a0",
                                                   "\u3000",
                                                   "\u2028",
                                                   "\t",
                                                   "\n\n",
                                                   "\r\n",
                                                   "   ",
                                                   " ",
                                                   "<|im_start|>",
                                                   "<|endoftext|>",
                                                   "<|eot_id|>",
                                                   "'s",
                                                   "'S",
                                                   "https://example.org/?a=b",
                                                   "--",
                                                   "...",
                                                   "\uFFFD"};
  std::string text;
  const int parts = 1 + static_cast<int>(rng() % 16);
  for (int i = 0; i < parts; ++i) {
    if (rng() % 4 == 0) {
      // A random scalar value.
      uint32_t c;
      do {
        const uint32_t plane = rng() % 4;
        c = plane == 0   ? 0x20 + rng() % 0x60
            : plane == 1 ? 0x80 + rng() % 0xF780
                         : rng() % 0x110000;
      } while ((c >= 0xD800 && c <= 0xDFFF) || c == 0);
      if (c < 0x80) {
        text += static_cast<char>(c);
      } else if (c < 0x800) {
        text += static_cast<char>(0xC0 | (c >> 6));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        text += static_cast<char>(0xE0 | (c >> 12));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      } else {
        text += static_cast<char>(0xF0 | (c >> 18));
        text += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        text += static_cast<char>(0x80 | (c & 0x3F));
      }
    } else {
      text += kPieces[rng() % kPieces.size()];
    }
    if (rng() % 2 == 0) text += ' ';
  }
  return text;
}

TEST(TokenizerTest, ByteLevelRoundTripsVariedText) {
  std::mt19937 rng(42);
  std::vector<std::string> texts;
  for (int i = 0; i < 500; ++i) texts.push_back(VariedText(rng));
  for (const std::string& name : testing::FixtureTokenizerNames()) {
    if (!testing::IsByteLevelFixture(name)) continue;
    const Tokenizer& tokenizer = testing::FixtureTokenizer(name);
    for (const std::string& text : texts) {
      ASSERT_EQ(tokenizer.Decode(tokenizer.Encode(text, false), false), text) << name;
      // Special tokens written in the text decode back too, unless skipped.
      ASSERT_EQ(
          tokenizer.Decode(tokenizer.Encode(text, true), false).find(text) != std::string::npos,
          true)
          << name;
    }
  }
}

TEST(TokenizerTest, SentencePieceRoundTripsTextWithoutLeadingSpace) {
  // The SentencePiece layout strips the one leading space it adds; text not starting with a space
  // (and without special-token strings it does not know) comes back exactly.
  const Tokenizer& tokenizer = testing::FixtureTokenizer("sentencepiece-bpe");
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string text = "x" + VariedText(rng);
    ASSERT_EQ(tokenizer.Decode(tokenizer.Encode(text, true), true), text);
  }
}

TEST(TokenizerTest, InvalidUtf8IsReplacedNotTrusted) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer("gpt2-bytelevel");
  const std::string bad =
      "a\xFF"
      "b\xE4\xBD"
      "c\xED\xA0\x80";
  const std::string decoded = tokenizer.Decode(tokenizer.Encode(bad, false), false);
  EXPECT_EQ(decoded,
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(testing::IsWellFormedUtf8(tokenizer.Decode({130}, false)));  // half a character
}

TEST(TokenizerTest, AccessorsOfTheFixtures) {
  const Tokenizer& gpt2 = testing::FixtureTokenizer("gpt2-bytelevel");
  EXPECT_EQ(gpt2.vocab_size(), 2048);
  EXPECT_EQ(gpt2.IdToPiece(1), "<|im_start|>");
  EXPECT_EQ(gpt2.IdToPiece(-1), "");
  EXPECT_EQ(gpt2.IdToPiece(2048), "");
  EXPECT_EQ(gpt2.PieceToId("<|im_end|>"), 2);
  EXPECT_EQ(gpt2.PieceToId("no such piece"), std::nullopt);
  EXPECT_TRUE(gpt2.IsSpecial(0));
  EXPECT_FALSE(gpt2.IsSpecial(100));
  EXPECT_FALSE(gpt2.IsSpecial(5000));
  EXPECT_EQ(gpt2.eos_id(), 0);  // <|endoftext|>
  EXPECT_EQ(gpt2.eot_id(), 2);  // <|im_end|>
  EXPECT_EQ(gpt2.bos_id(), std::nullopt);
  EXPECT_FALSE(gpt2.add_bos());
  EXPECT_EQ(gpt2.Decode({1, 99999, -5, 2}, false), "<|im_start|><|im_end|>");

  const Tokenizer& llama3 = testing::FixtureTokenizer("llama3-regex");
  EXPECT_EQ(llama3.bos_id(), 0);
  EXPECT_EQ(llama3.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama3.eos_token(), "<|end_of_text|>");
  EXPECT_EQ(llama3.eot_id(), 2);
  EXPECT_TRUE(llama3.add_bos());
  EXPECT_THAT(llama3.Encode("", true), ElementsAre(0));
  EXPECT_TRUE(llama3.Encode("", false).empty());

  const Tokenizer& sp = testing::FixtureTokenizer("sentencepiece-bpe");
  EXPECT_EQ(sp.bos_id(), 1);
  EXPECT_EQ(sp.eos_id(), 2);
  EXPECT_EQ(sp.unk_id(), 0);
  EXPECT_TRUE(sp.add_bos());
  EXPECT_FALSE(sp.add_eos());
  EXPECT_TRUE(sp.IsByteFallback(3));
  EXPECT_EQ(sp.chat_template(), "");
}

TEST(TokenizerTest, LoadsAHuggingFaceDirectoryWithItsConfig) {
  const fs::path dir = fs::path(testing::TempDir()) / "hf-dir";
  fs::create_directories(dir);
  fs::copy_file(testing::FixtureTokenizerPath("sentencepiece-bpe"), dir / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  WriteFile(dir / "tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>"},
    "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>",
    "add_bos_token": true, "add_eos_token": false,
    "chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"})");
  auto tokenizer = Tokenizer::Load(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->bos_token(), "<s>");
  EXPECT_EQ((*tokenizer)->eos_token(), "</s>");
  EXPECT_EQ((*tokenizer)->pad_id(), 2);
  EXPECT_THAT((*tokenizer)->chat_template(), HasSubstr("messages"));
  // The template file, where present, wins over the config's template.
  WriteFile(dir / "chat_template.jinja", "{{ bos_token }}jinja file");
  auto with_file = Tokenizer::Load(dir.string());
  ASSERT_TRUE(with_file.ok()) << with_file.status();
  EXPECT_EQ((*with_file)->chat_template(), "{{ bos_token }}jinja file");
  // tokenizer.json given directly: the config beside it is read too.
  auto direct = Tokenizer::Load((dir / "tokenizer.json").string());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ((*direct)->pad_id(), 2);
}

TEST(TokenizerTest, ConfigFlagsAddSpecialTokensWhenThereIsNoPostProcessor) {
  nlohmann::json j =
      nlohmann::json::parse(testing::ReadTextFile(testing::FixtureTokenizerPath("gpt2-bytelevel")));
  auto tokenizer =
      Tokenizer::FromHfJson(j.dump(), R"({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                    "add_bos_token": true, "add_eos_token": true})");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT((*tokenizer)->Encode("", true), ElementsAre(1, 2));
  EXPECT_TRUE((*tokenizer)->add_bos());
  EXPECT_TRUE((*tokenizer)->add_eos());
}

TEST(TokenizerTest, ErrorsNameTheProblem) {
  EXPECT_EQ(Tokenizer::Load("/no/such/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  const fs::path empty_dir = fs::path(testing::TempDir()) / "empty-dir";
  fs::create_directories(empty_dir);
  EXPECT_THAT(Tokenizer::Load(empty_dir.string()).status().message(), HasSubstr("tokenizer.json"));
  EXPECT_FALSE(Tokenizer::FromHfJson("{not json").ok());
  EXPECT_FALSE(Tokenizer::FromHfJson("[]").ok());
  EXPECT_FALSE(Tokenizer::FromHfJson(R"({"model": {"type": "BPE", "vocab": 3}})").ok());

  const nlohmann::json base =
      nlohmann::json::parse(testing::ReadTextFile(testing::FixtureTokenizerPath("gpt2-bytelevel")));
  const auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = base;
    j[key] = std::move(value);
    return Tokenizer::FromHfJson(j.dump()).status();
  };
  const absl::Status unigram =
      with("model", {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}});
  EXPECT_EQ(unigram.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(unigram.message(), HasSubstr("Unigram"));
  EXPECT_THAT(with("normalizer", {{"type", "BertNormalizer"}}).message(),
              HasSubstr("BertNormalizer"));
  EXPECT_THAT(with("pre_tokenizer", {{"type", "Whitespace"}}).message(), HasSubstr("Whitespace"));
  EXPECT_THAT(with("decoder", {{"type", "WordPiece"}}).message(), HasSubstr("WordPiece"));
  EXPECT_THAT(with("post_processor", {{"type", "Mystery"}}).message(), HasSubstr("Mystery"));
  EXPECT_THAT(
      with("pre_tokenizer",
           {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}})
          .message(),
      HasSubstr("(unclosed"));
  nlohmann::json bad_merge = base;
  bad_merge["model"]["merges"].push_back({"zzz", "qqq"});
  EXPECT_THAT(Tokenizer::FromHfJson(bad_merge.dump()).status().message(), HasSubstr("zzz"));
  EXPECT_THAT(Tokenizer::FromHfJson(base.dump(), R"({"bos_token": "<nope>"})").status().message(),
              HasSubstr("<nope>"));
}

TEST(TokenizerTest, ConcurrentEncodeAndDecodeAgreeWithSerial) {
  std::mt19937 rng(99);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(VariedText(rng));
  for (const std::string& name : testing::FixtureTokenizerNames()) {
    auto loaded = Tokenizer::Load(testing::FixtureTokenizerPath(name));  // a cold word cache
    ASSERT_TRUE(loaded.ok());
    const Tokenizer& tokenizer = **loaded;
    std::vector<std::vector<int32_t>> serial;
    const Tokenizer& reference = testing::FixtureTokenizer(name);
    for (const std::string& text : texts) serial.push_back(reference.Encode(text, true));
    std::vector<std::thread> threads;
    std::vector<int> mismatches(4, 0);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 3; ++round) {
          for (size_t i = 0; i < texts.size(); ++i) {
            const size_t k = (i * 7 + t * 13 + round) % texts.size();
            const std::vector<int32_t> ids = tokenizer.Encode(texts[k], true);
            if (ids != serial[k]) ++mismatches[t];
            if (tokenizer.Decode(ids, false) != reference.Decode(serial[k], false)) ++mismatches[t];
          }
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << name << " thread " << t;
  }
}

}  // namespace
}  // namespace lmserve::engine
