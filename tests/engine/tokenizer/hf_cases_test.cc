// The fixture tokenizers against Hugging Face `tokenizers`' own output (tokenizer_cases.json):
// 30 strings x 4 tokenizers, ids with and without special tokens, and both decodes, exactly.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine {
namespace {

using ::testing::ElementsAreArray;

class HfCasesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfCasesTest, MatchesHuggingFaceExactly) {
  const std::string& name = GetParam();
  const Tokenizer& tokenizer = testing::FixtureTokenizer(name);
  const auto& cases = testing::TokenizerCases().at(name);
  ASSERT_EQ(cases.size(), 30u);
  for (const testing::TokenizerCase& c : cases) {
    SCOPED_TRACE("text: \"" + c.text + "\"");
    EXPECT_THAT(tokenizer.Encode(c.text, /*add_special=*/false), ElementsAreArray(c.ids));
    EXPECT_THAT(tokenizer.Encode(c.text, /*add_special=*/true),
                ElementsAreArray(c.ids_with_special));
    EXPECT_EQ(tokenizer.Decode(c.ids, /*skip_special=*/false), c.decoded);
    EXPECT_EQ(tokenizer.Decode(c.ids_with_special, /*skip_special=*/true), c.decoded_skip_special);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfCasesTest,
                         ::testing::ValuesIn(testing::FixtureTokenizerNames()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace lmserve::engine
