// tokenizer.json variants that exercise what the four shared fixtures do not (Split behaviours and
// invert, NFC/NFKC, Replace, added-token flags, ignore_merges, legacy merges, subword
// prefix/suffix, unknown tokens, other decoders and post-processors), against the ids and decodes
// of Hugging Face `tokenizers` recorded in testdata/variant_cases.json (made by
// testdata/make_variant_cases.py).

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAreArray;

const nlohmann::json& VariantCases() {
  static const nlohmann::json* cases = new nlohmann::json(nlohmann::json::parse(
      testing::ReadTextFile(std::string(LMSERVE_SOURCE_DIR) +
                            "/tests/engine/tokenizer/testdata/variant_cases.json")));
  return *cases;
}

// The base fixture's tokenizer.json with the variant's patch applied (as make_variant_cases.py
// does).
std::string PatchedJson(const nlohmann::json& variant) {
  const nlohmann::json& patch = variant.at("patch");
  if (patch.contains("full")) return patch.at("full").dump();
  nlohmann::json j = nlohmann::json::parse(
      testing::ReadTextFile(testing::FixtureTokenizerPath(variant.at("base").get<std::string>())));
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder", "post_processor"}) {
    if (patch.contains(key)) j[key] = patch.at(key);
  }
  if (patch.contains("added_tokens_extra")) {
    for (const auto& token : patch.at("added_tokens_extra")) j["added_tokens"].push_back(token);
  }
  if (patch.contains("model_patch")) j["model"].update(patch.at("model_patch"));
  if (patch.contains("legacy_merges")) {
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& merge : j["model"]["merges"]) {
      merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
    }
    j["model"]["merges"] = merges;
  }
  return j.dump();
}

TEST(HfVariantsTest, EveryVariantMatchesHuggingFace) {
  const nlohmann::json& variants = VariantCases().at("variants");
  ASSERT_GE(variants.size(), 20u);
  for (const nlohmann::json& variant : variants) {
    const std::string name = variant.at("name").get<std::string>();
    SCOPED_TRACE("variant " + name);
    auto tokenizer = Tokenizer::FromHfJson(PatchedJson(variant));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const nlohmann::json& c : variant.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      SCOPED_TRACE("text \"" + text + "\"");
      const auto ids = c.at("ids").get<std::vector<int32_t>>();
      const auto ids_with_special = c.at("ids_with_special").get<std::vector<int32_t>>();
      EXPECT_THAT((*tokenizer)->Encode(text, false), ElementsAreArray(ids));
      EXPECT_THAT((*tokenizer)->Encode(text, true), ElementsAreArray(ids_with_special));
      EXPECT_EQ((*tokenizer)->Decode(ids, false), c.at("decoded").get<std::string>());
      EXPECT_EQ((*tokenizer)->Decode(ids_with_special, true),
                c.at("decoded_skip_special").get<std::string>());
    }
  }
}

}  // namespace
}  // namespace lmserve::engine
