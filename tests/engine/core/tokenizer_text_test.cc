// The engine's text path with the real tokenizers of the fixtures: streamed text deltas add up to
// the tokenizer's own Decode, and stop strings cut the text there, across token boundaries and
// byte-fallback runs.

#include "engine/core/tokenizer_text.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/engine/core/engine_test_util.h"
#include "tests/engine/core/fake_runner.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine::testing {
namespace {

constexpr int32_t kContextTokens = 5;  // TokenizerTextDecoder's default

class TokenizerTextTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto tokenizer =
        Tokenizer::Load(StrCat(lmserve::testing::FixturesDir(), "/tokenizers/", GetParam()));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  std::unique_ptr<CoreHarness> Harness() {
    FakeRunnerOptions options;
    options.vocab_size = tokenizer_->vocab_size();
    options.num_kv_blocks = 256;
    options.max_position_embeddings = 1024;
    options.eos_token_ids = {tokenizer_->eos_id().value_or(0)};
    EngineConfig config;
    config.max_num_batched_tokens = 64;
    return std::make_unique<CoreHarness>(options, config,
                                         std::make_unique<TokenizerTextDecoder>(tokenizer_.get()));
  }

  // What the generated ids read as after the prompt: Decode(context + ids) - Decode(context).
  std::string ExpectedText(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ids) {
    std::vector<int32_t> context(prompt.end() - std::min<size_t>(prompt.size(), kContextTokens),
                                 prompt.end());
    const std::string before = tokenizer_->Decode(context, /*skip_special=*/true);
    context.insert(context.end(), ids.begin(), ids.end());
    const std::string after = tokenizer_->Decode(context, /*skip_special=*/true);
    EXPECT_EQ(after.compare(0, before.size(), before), 0);
    return after.substr(before.size());
  }

  // A sampled request: a high temperature gives a mix of ordinary, special and byte-fallback ids.
  Request Sampled(const std::vector<int32_t>& prompt, uint64_t seed) {
    Request request;
    request.prompt_token_ids = prompt;
    request.sampling.temperature = 3.0;
    request.sampling.seed = seed;
    request.sampling.max_tokens = 48;
    request.sampling.ignore_eos = true;
    return request;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerTextTest, StreamedTextAddsUpToTheTokenizersDecode) {
  std::unique_ptr<CoreHarness> h = Harness();
  const std::vector<int32_t> prompt =
      tokenizer_->Encode("The quick brown fox, 12 dogs, \xC3\xA9t\xC3\xA9 \xE2\x82\xAC", false);
  ASSERT_FALSE(prompt.empty());
  std::vector<RequestId> ids;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    ids.push_back(h->Add(StrCat("R", seed), Sampled(prompt, seed)));
  }
  h->RunToCompletion();
  int num_byte_fallback = 0;
  int num_special = 0;
  for (RequestId id : ids) {
    const SampleResult& r = h->result(id);
    ASSERT_EQ(r.token_ids.size(), 48u);
    EXPECT_EQ(r.text, ExpectedText(prompt, r.token_ids)) << "request " << id;
    for (int32_t token : r.token_ids) {
      num_byte_fallback += tokenizer_->IsByteFallback(token) ? 1 : 0;
      num_special += tokenizer_->IsSpecial(token) ? 1 : 0;
    }
  }
  // The draws exercise the hard cases where the tokenizer has them.
  bool has_byte_fallback = false;
  for (int32_t id = 0; id < tokenizer_->vocab_size() && !has_byte_fallback; ++id) {
    has_byte_fallback = tokenizer_->IsByteFallback(id);
  }
  if (has_byte_fallback) {
    EXPECT_GT(num_byte_fallback, 0);
  }
  std::printf("[ text     ] %s: vocabulary %d, %d byte-fallback and %d special ids drawn\n",
              GetParam().c_str(), tokenizer_->vocab_size(), num_byte_fallback, num_special);
}

TEST_P(TokenizerTextTest, StopStringsCutTheDecodedText) {
  std::unique_ptr<CoreHarness> reference = Harness();
  const std::vector<int32_t> prompt = tokenizer_->Encode("Once upon a time", false);
  const RequestId free_run = reference->Add("F", Sampled(prompt, 42));
  reference->RunToCompletion();
  const std::string full = reference->result(free_run).text;
  ASSERT_GE(full.size(), 12u);
  // A stop string from the middle of the text: 3 bytes at a character boundary.
  size_t start = full.size() / 2;
  while (start > 0 && (static_cast<uint8_t>(full[start]) & 0xC0) == 0x80) --start;
  size_t end = start + 3;
  while (end < full.size() && (static_cast<uint8_t>(full[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = full.substr(start, end - start);

  std::unique_ptr<CoreHarness> h = Harness();
  Request request = Sampled(prompt, 42);
  request.sampling.stop = {stop};
  const RequestId id = h->Add("S", request);
  h->RunToCompletion();
  const SampleResult& r = h->result(id);
  EXPECT_EQ(r.final_output->finish_reason, FinishReason::kStopString);
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
  // Generation stopped at the token completing the stop string: the same seed gave the same ids.
  const std::vector<int32_t>& all = reference->result(free_run).token_ids;
  ASSERT_LE(r.token_ids.size(), all.size());
  EXPECT_TRUE(std::equal(r.token_ids.begin(), r.token_ids.end(), all.begin()));
  EXPECT_NE(ExpectedText(prompt, r.token_ids).find(stop), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerTextTest,
                         ::testing::Values("sentencepiece-bpe.json", "smollm-digits.json",
                                           "llama3-regex.json"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.find('.'));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace lmserve::engine::testing
