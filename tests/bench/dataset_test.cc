// The benchmark's prompt sources: JSONL datasets and synthetic token-id prompts.

#include "bench/lmserve_bench/dataset.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(JsonlDatasetTest, ReadsTextAndTokenIdPrompts) {
  absl::StatusOr<std::vector<Prompt>> prompts = ParseJsonlDataset(
      "{\"prompt\": \"Hello there\", \"output_len\": 32}\n"
      "\n"
      "{\"prompt_token_ids\": [5, 6, 7], \"max_tokens\": 4}\r\n"
      "{\"prompt\": \"no length\", \"input_len\": 3}\n",
      /*default_output_tokens=*/16);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 3u);
  EXPECT_EQ((*prompts)[0].text, "Hello there");
  EXPECT_EQ((*prompts)[0].output_tokens, 32);
  EXPECT_EQ((*prompts)[0].input_tokens, 0);  // unknown until the server says
  EXPECT_THAT((*prompts)[1].token_ids, ElementsAre(5, 6, 7));
  EXPECT_EQ((*prompts)[1].input_tokens, 3);
  EXPECT_EQ((*prompts)[1].output_tokens, 4);
  EXPECT_EQ((*prompts)[2].output_tokens, 16);
  EXPECT_EQ((*prompts)[2].input_tokens, 3);
}

TEST(JsonlDatasetTest, ErrorsNameTheLine) {
  auto error = [](const std::string& text) {
    return std::string(ParseJsonlDataset(text, 16).status().message());
  };
  EXPECT_THAT(error("{\"prompt\": \"a\"}\nnot json\n"), HasSubstr("line 2"));
  EXPECT_THAT(error("{\"text\": \"a\"}\n"), HasSubstr("line 1: no \"prompt\""));
  EXPECT_THAT(error("{\"prompt\": \"\"}\n"), HasSubstr("non-empty"));
  EXPECT_THAT(error("{\"prompt_token_ids\": [1, -2]}\n"), HasSubstr("non-negative"));
  EXPECT_THAT(error("{\"prompt\": \"a\", \"output_len\": 0}\n"), HasSubstr("positive"));
  EXPECT_THAT(error("\n\n"), HasSubstr("no prompts"));
  EXPECT_FALSE(ParseJsonlDataset("{\"prompt\": \"a\"}\n", 0).ok());  // no length anywhere
}

TEST(SyntheticDatasetTest, LengthsAndIdsInRangeAndSeeded) {
  SyntheticSpec spec;
  spec.num_prompts = 200;
  spec.input_len = 100;
  spec.output_len = 20;
  spec.range_ratio = 0.5;
  spec.vocab_size = 1000;
  spec.first_id = 10;
  spec.seed = 7;
  absl::StatusOr<std::vector<Prompt>> prompts = MakeSyntheticDataset(spec);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 200u);
  std::set<int32_t> input_lengths;
  for (const Prompt& prompt : *prompts) {
    EXPECT_TRUE(prompt.text.empty());
    EXPECT_EQ(prompt.input_tokens, static_cast<int32_t>(prompt.token_ids.size()));
    EXPECT_GE(prompt.input_tokens, 50);
    EXPECT_LE(prompt.input_tokens, 150);
    EXPECT_GE(prompt.output_tokens, 10);
    EXPECT_LE(prompt.output_tokens, 30);
    for (int32_t id : prompt.token_ids) {
      EXPECT_GE(id, 10);
      EXPECT_LT(id, 1000);
    }
    input_lengths.insert(prompt.input_tokens);
  }
  EXPECT_GT(input_lengths.size(), 20u);  // lengths do vary
  absl::StatusOr<std::vector<Prompt>> again = MakeSyntheticDataset(spec);
  EXPECT_EQ((*again)[17].token_ids, (*prompts)[17].token_ids);
  spec.range_ratio = 0;
  absl::StatusOr<std::vector<Prompt>> fixed = MakeSyntheticDataset(spec);
  ASSERT_TRUE(fixed.ok());
  for (const Prompt& prompt : *fixed) {
    EXPECT_EQ(prompt.input_tokens, 100);
    EXPECT_EQ(prompt.output_tokens, 20);
  }
}

TEST(SyntheticDatasetTest, RejectsEmptyVocabularies) {
  SyntheticSpec spec;
  spec.num_prompts = 1;
  spec.vocab_size = 10;
  spec.first_id = 10;
  EXPECT_FALSE(MakeSyntheticDataset(spec).ok());
}

}  // namespace
}  // namespace lmserve::bench
