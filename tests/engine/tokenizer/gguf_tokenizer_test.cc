// Tokenizers built from GGUF metadata (GgufTokenizerData), checked against Hugging Face output: the
// fixture vocabularies rebuilt as GGUF "gpt2" and "llama" tokenizers must reproduce the fixture
// ids, and the demo model's GGUF tokenizer must reproduce ids that HF `tokenizers` gives for the
// same vocabulary in SmolLM2's tokenizer.json layout.

#include "engine/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/model/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int32_t kNormal = static_cast<int32_t>(GgufTokenType::kNormal);
constexpr int32_t kUnknown = static_cast<int32_t>(GgufTokenType::kUnknown);
constexpr int32_t kControl = static_cast<int32_t>(GgufTokenType::kControl);
constexpr int32_t kByte = static_cast<int32_t>(GgufTokenType::kByte);

// The vocabulary, merges and added tokens of a fixture tokenizer.json, as a GGUF converter writes
// them. Added tokens become CONTROL tokens ("<unk>" UNKNOWN); <0xXX> tokens BYTE tokens.
GgufTokenizerData GgufFromFixture(const std::string& name, std::string model, std::string pre) {
  const nlohmann::json j =
      nlohmann::json::parse(testing::ReadTextFile(testing::FixtureTokenizerPath(name)));
  GgufTokenizerData data;
  data.model = std::move(model);
  data.pre = std::move(pre);
  const auto& vocab = j.at("model").at("vocab");
  data.tokens.resize(vocab.size());
  data.token_types.assign(vocab.size(), kNormal);
  for (const auto& [token, id] : vocab.items()) data.tokens.at(id.get<size_t>()) = token;
  for (const auto& merge : j.at("model").at("merges")) {
    data.merges.push_back(merge.is_string()
                              ? merge.get<std::string>()
                              : merge[0].get<std::string>() + " " + merge[1].get<std::string>());
  }
  for (const auto& added : j.at("added_tokens")) {
    const auto id = added.at("id").get<size_t>();
    data.token_types.at(id) = added.at("content") == "<unk>" ? kUnknown : kControl;
  }
  for (size_t id = 0; id < data.tokens.size(); ++id) {
    const std::string& t = data.tokens[id];
    if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') data.token_types[id] = kByte;
  }
  return data;
}

void ExpectFixtureCases(const Tokenizer& tokenizer, const std::string& name) {
  for (const testing::TokenizerCase& c : testing::TokenizerCases().at(name)) {
    SCOPED_TRACE(name + ": \"" + c.text + "\"");
    EXPECT_THAT(tokenizer.Encode(c.text, false), ElementsAreArray(c.ids));
    EXPECT_THAT(tokenizer.Encode(c.text, true), ElementsAreArray(c.ids_with_special));
    EXPECT_EQ(tokenizer.Decode(c.ids, false), c.decoded);
    EXPECT_EQ(tokenizer.Decode(c.ids_with_special, true), c.decoded_skip_special);
  }
}

TEST(GgufTokenizerTest, Gpt2ModelMatchesTokenizerJsonOnByteLevelFixtures) {
  // (fixture, tokenizer.ggml.pre of the same layout)
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"gpt2-bytelevel", "gpt2"}, {"llama3-regex", "llama-bpe"}, {"smollm-digits", "smollm"}};
  for (const auto& [name, pre] : layouts) {
    GgufTokenizerData data = GgufFromFixture(name, "gpt2", pre);
    if (name == "llama3-regex") data.bos_id = 0;  // <|begin_of_text|>, prepended by default
    auto tokenizer = Tokenizer::FromGguf(data);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    ExpectFixtureCases(**tokenizer, name);
    EXPECT_EQ((*tokenizer)->add_bos(), name == "llama3-regex");
  }
}

TEST(GgufTokenizerTest, SentencePieceLlamaModelWithScoresMatchesFixture) {
  GgufTokenizerData data = GgufFromFixture("sentencepiece-bpe", "llama", "");
  // Merges are not used by the "llama" model: scores rank the merged pieces instead. The fixture
  // vocabulary lists merge results in merge order, so score = -id ranks them as the merges do.
  data.merges.clear();
  data.scores.resize(data.tokens.size());
  for (size_t id = 0; id < data.tokens.size(); ++id) {
    data.scores[id] = data.token_types[id] == kNormal ? -static_cast<float>(id) : 0.0f;
  }
  auto tokenizer = Tokenizer::FromGguf(data);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ExpectFixtureCases(**tokenizer, "sentencepiece-bpe");
  EXPECT_EQ((*tokenizer)->bos_id(), 1);
  EXPECT_EQ((*tokenizer)->eos_id(), 2);
  EXPECT_EQ((*tokenizer)->unk_id(), 0);
  EXPECT_TRUE((*tokenizer)->add_bos());
  EXPECT_TRUE((*tokenizer)->IsSpecial(0));
  EXPECT_TRUE((*tokenizer)->IsByteFallback(3 + 0x41));
  EXPECT_FALSE((*tokenizer)->IsByteFallback(300));
}

TEST(GgufTokenizerTest, SentencePieceWithoutSpacePrefixKeepsTheTextAsIs) {
  GgufTokenizerData data = GgufFromFixture("sentencepiece-bpe", "llama", "");
  data.add_space_prefix = false;
  data.add_bos = false;
  auto tokenizer = Tokenizer::FromGguf(data);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (const std::string text : {"Hello world", " two", "x  y"}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> ids = (*tokenizer)->Encode(text, true);
    ASSERT_FALSE(ids.empty());
    // No BOS, and no "▁" put in front of text that does not start with a space.
    const bool leading_space = text[0] == ' ';
    EXPECT_EQ((*tokenizer)->IdToPiece(ids[0]).rfind("\u2581", 0) == 0, leading_space);
    EXPECT_EQ((*tokenizer)->Decode(ids, false), text);
  }
}

TEST(GgufTokenizerTest, PreTokenizerRegexesFollowLlamaCpp) {
  auto smollm = GgufPreTokenizerRegexes("smollm");
  ASSERT_TRUE(smollm.ok());
  ASSERT_EQ(smollm->size(), 2u);
  EXPECT_EQ((*smollm)[0], "\\p{N}");
  auto llama3 = GgufPreTokenizerRegexes("llama-bpe");
  ASSERT_TRUE(llama3.ok());
  EXPECT_THAT((*llama3)[0], HasSubstr("\\p{N}{1,3}"));
  auto qwen2 = GgufPreTokenizerRegexes("qwen2");
  ASSERT_TRUE(qwen2.ok());
  EXPECT_THAT((*qwen2)[0], HasSubstr("|\\p{N}|"));
  EXPECT_TRUE(GgufPreTokenizerRegexes("default").ok());
  EXPECT_TRUE(GgufPreTokenizerRegexes("gpt2").ok());
  auto unknown = GgufPreTokenizerRegexes("no-such-pre");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no-such-pre"));
}

TEST(GgufTokenizerTest, RejectsWhatItCannotBuild) {
  GgufTokenizerData data = GgufFromFixture("gpt2-bytelevel", "gpt2", "gpt2");
  GgufTokenizerData bad_model = data;
  bad_model.model = "bert";
  EXPECT_EQ(Tokenizer::FromGguf(bad_model).status().code(), absl::StatusCode::kUnimplemented);
  GgufTokenizerData bad_pre = data;
  bad_pre.pre = "mystery";
  EXPECT_THAT(Tokenizer::FromGguf(bad_pre).status().message(), HasSubstr("mystery"));
  GgufTokenizerData bad_merge = data;
  bad_merge.merges.push_back("nospace");
  EXPECT_THAT(Tokenizer::FromGguf(bad_merge).status().message(), HasSubstr("nospace"));
  GgufTokenizerData unknown_merge = data;
  unknown_merge.merges.push_back("zzzq qqqz");
  EXPECT_FALSE(Tokenizer::FromGguf(unknown_merge).ok());
  GgufTokenizerData bad_bos = data;
  bad_bos.bos_id = 1 << 20;
  EXPECT_THAT(Tokenizer::FromGguf(bad_bos).status().message(), HasSubstr("bos_token_id"));
  GgufTokenizerData bad_types = data;
  bad_types.token_types.pop_back();
  EXPECT_FALSE(Tokenizer::FromGguf(bad_types).ok());
  EXPECT_FALSE(Tokenizer::FromGguf(GgufTokenizerData{}).ok());
}

// The demo model (SmolLM2-135M-Instruct, tokenizer.ggml.model "gpt2", pre "smollm"). The expected
// ids come from Hugging Face `tokenizers` 0.23 with the GGUF's vocabulary and merges in SmolLM2's
// tokenizer.json layout (Digits(individual_digits) + ByteLevel, CONTROL tokens as special tokens).
TEST(GgufTokenizerTest, DemoModelMatchesHuggingFace) {
  const std::optional<std::string> path = testing::DemoModelPath();
  if (!path.has_value()) GTEST_SKIP() << "demo model absent (scripts/fetch-demo-model.sh)";
  auto file = GgufFile::Open(*path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto data = GgufTokenizerDataFromFile(**file);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->model, "gpt2");
  EXPECT_EQ(data->pre, "smollm");
  EXPECT_EQ(data->merges.size(), 48900u);
  EXPECT_EQ(data->add_bos, false);
  auto tokenizer = Tokenizer::Load(*path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.eot_id(), 2);  // <|im_end|>
  EXPECT_EQ(t.bos_token(), "<|im_start|>");
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_FALSE(t.add_bos());
  EXPECT_TRUE(t.IsSpecial(0));
  EXPECT_FALSE(t.IsSpecial(19556));
  EXPECT_THAT(t.chat_template(), HasSubstr("<|im_start|>"));
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world! How are you?", {19556, 905, 17, 1073, 359, 346, 47}},
      {"numbers 1234567 and 3.14",
       {28707, 216, 33, 34, 35, 36, 37, 38, 39, 284, 216, 35, 30, 33, 36}},
      {"<|im_start|>user\nhi there<|im_end|>\n", {1, 4093, 198, 6004, 665, 2, 198}},
      {"你好世界 😀 café", {18645, 250, 48392, 138, 7906, 240, 178, 239, 230, 40303, 218, 37366}},
      {"def f(x):\n    return x ** 2\n",
       {1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 198}},
      {"I'm sure they'll say we've done it",
       {57, 5248, 2090, 502, 3060, 1643, 392, 3543, 2294, 357}},
  };
  for (const auto& [text, ids] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(t.Encode(text, true), ElementsAreArray(ids));
    EXPECT_EQ(t.Decode(ids, false), text);
  }
  EXPECT_EQ(t.Decode({1, 4093, 198, 6004, 665, 2, 198}, true), "user\nhi there\n");
}

TEST(GgufTokenizerTest, FileWithoutATokenizerIsAClearError) {
  // A GGUF file with no tokenizer.* keys.
  const std::string path = testing::TempDir() + "/no-tokenizer.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    const uint32_t version = 3;
    const uint64_t zero = 0;
    out.write("GGUF", 4);
    out.write(reinterpret_cast<const char*>(&version), 4);
    out.write(reinterpret_cast<const char*>(&zero), 8);  // tensors
    out.write(reinterpret_cast<const char*>(&zero), 8);  // keys
  }
  const absl::Status status = Tokenizer::Load(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.model"));
  EXPECT_THAT(status.message(), HasSubstr("no-tokenizer.gguf"));
}

}  // namespace
}  // namespace lmserve::engine
