// Runs the built `bin/lmserve tokenize` and `bin/lmserve detokenize` on the fixture tokenizers and
// checks their JSON against the Hugging Face reference ids, and their errors.

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/run_lmserve.h"

namespace lmserve::server {
namespace {

using testing::RunLmserve;
using testing::RunResult;

using ::testing::HasSubstr;

std::string ShellQuote(std::string_view text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string Fixture(const std::string& name) {
  return testing::FixturesDir() + "/tokenizers/" + name + ".json";
}

// The reference case of `name` whose text is `text`.
nlohmann::json Case(const std::string& name, const std::string& text) {
  std::ifstream in(testing::FixturesDir() + "/tokenizers/tokenizer_cases.json");
  const nlohmann::json cases = nlohmann::json::parse(in);
  for (const nlohmann::json& c : cases.at(name)) {
    if (c.at("text") == text) return c;
  }
  ADD_FAILURE() << "no case " << text;
  return nlohmann::json();
}

TEST(CliTokenizeTest, PrintsTheReferenceIds) {
  const std::string text = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n";
  const nlohmann::json c = Case("llama3-regex", text);
  const RunResult plain = RunLmserve(
      StrCat("tokenize --tokenizer ", Fixture("llama3-regex"), " --text ", ShellQuote(text)));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(nlohmann::json::parse(plain.out), nlohmann::json({{"ids", c.at("ids")}}));
  const RunResult special = RunLmserve(StrCat("tokenize --tokenizer ", Fixture("llama3-regex"),
                                              " --add-special --text ", ShellQuote(text)));
  ASSERT_EQ(special.exit_code, 0) << special.err;
  EXPECT_EQ(nlohmann::json::parse(special.out).at("ids"), c.at("ids_with_special"));
}

TEST(CliTokenizeTest, PrintsPiecesOnRequest) {
  const RunResult result = RunLmserve(
      StrCat("tokenize --tokenizer ", Fixture("gpt2-bytelevel"), " --pieces --text 'Hello world'"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json out = nlohmann::json::parse(result.out);
  ASSERT_EQ(out.at("pieces").size(), out.at("ids").size());
  EXPECT_EQ(out.at("pieces")[0], "H");
}

TEST(CliDetokenizeTest, PrintsTheReferenceText) {
  const nlohmann::json c =
      Case("sentencepiece-bpe", "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD done");
  std::string ids;
  for (const auto& id : c.at("ids_with_special"))
    ids += StrCat(ids.empty() ? "" : ",", id.get<int>());
  const RunResult skipped = RunLmserve(StrCat(
      "detokenize --tokenizer ", Fixture("sentencepiece-bpe"), " --skip-special --ids ", ids));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_EQ(nlohmann::json::parse(skipped.out).at("text"), c.at("decoded_skip_special"));
  const RunResult kept =
      RunLmserve(StrCat("detokenize --tokenizer ", Fixture("sentencepiece-bpe"), " --ids ", ids));
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_THAT(nlohmann::json::parse(kept.out).at("text").get<std::string>(), HasSubstr("<s>"));
}

TEST(CliDetokenizeTest, PartialCharactersAreEscapedAsReplacementCharacters) {
  // Byte-level id 130 is half of a two-byte character.
  const RunResult result =
      RunLmserve(StrCat("detokenize --tokenizer ", Fixture("gpt2-bytelevel"), " --ids 130"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out).at("text"), "\xEF\xBF\xBD");
}

TEST(CliTokenizeTest, Errors) {
  EXPECT_EQ(RunLmserve("tokenize --text x").exit_code, 2);  // no --tokenizer
  EXPECT_EQ(RunLmserve(StrCat("detokenize --tokenizer ", Fixture("gpt2-bytelevel"), " --ids 1,x"))
                .exit_code,
            2);
  const RunResult out_of_range =
      RunLmserve(StrCat("detokenize --tokenizer ", Fixture("gpt2-bytelevel"), " --ids 1,5000"));
  EXPECT_EQ(out_of_range.exit_code, 1);
  EXPECT_THAT(out_of_range.err, HasSubstr("5000"));
  const RunResult missing = RunLmserve("tokenize --tokenizer /no/such/tokenizer.json --text x");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/no/such/tokenizer.json"));
}

TEST(CliTokenizeTest, DemoModelGguf) {
  const std::optional<std::string> model = testing::DemoModelPath();
  if (!model.has_value()) GTEST_SKIP() << "demo model absent (scripts/fetch-demo-model.sh)";
  const RunResult result =
      RunLmserve(StrCat("tokenize --tokenizer ", *model, " --text 'Hello world! How are you?'"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // Hugging Face `tokenizers` ids for SmolLM2 (see gguf_tokenizer_test.cc).
  EXPECT_EQ(nlohmann::json::parse(result.out).at("ids"),
            nlohmann::json({19556, 905, 17, 1073, 359, 346, 47}));
}

}  // namespace
}  // namespace lmserve::server
