// Runs the built `bin/lmserve logits` and `bin/lmserve generate` on a fixture model and checks
// their outputs against the Hugging Face reference, and their errors.

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/model/safetensors.h"
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
using ::testing::MatchesRegex;

std::string IdList(const std::vector<int32_t>& ids) { return StrJoin(ids, ","); }

TEST(CliLogitsTest, WritesTheReferenceLogits) {
  for (const char* model : {"llama-gqa", "qwen2-bias"}) {
    const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
    const int prompt = 2;  // 33 tokens: crosses a block boundary
    const std::string out = StrCat(testing::TempDir(), "/", model, "_logits.safetensors");
    const RunResult run = RunLmserve(StrCat("logits --model ", testing::HfTinyDir(model), " --ids ",
                                            IdList(ref.prompts[prompt]), " --out ", out));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    auto file = engine::SafetensorsFile::Open(out);
    ASSERT_TRUE(file.ok()) << file.status();
    const auto& tensors = (*file)->tensors();
    ASSERT_EQ(tensors.size(), 1u);
    const engine::TensorView& logits = tensors.at("logits");
    EXPECT_EQ(logits.dtype, kernels::DType::kF32);
    EXPECT_EQ(logits.shape,
              (std::vector<int64_t>{static_cast<int64_t>(ref.prompts[prompt].size()), 1024}));
    auto actual = (*file)->ReadF32("logits");
    ASSERT_TRUE(actual.ok()) << actual.status();
    const std::vector<float> expected = testing::LoadHfTinyReferenceLogits(model, prompt);
    ASSERT_EQ(actual->size(), expected.size());
    double max_error = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      max_error = std::max(max_error, double{std::abs((*actual)[i] - expected[i])});
    }
    EXPECT_LT(max_error, 1e-4) << model;
  }
}

TEST(CliGenerateTest, PrintsTheGreedyIds) {
  const char* model = "llama-gqa";
  const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
  for (int prompt : {0, 3}) {
    const RunResult run = RunLmserve(StrCat("generate --model ", testing::HfTinyDir(model),
                                            " --ids ", IdList(ref.prompts[prompt]),
                                            " --max-tokens 24 --ignore-eos --threads 1"));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_THAT(run.out, MatchesRegex("\\{\"ids\": \\[[0-9, ]*\\]\\}\n"));
    const nlohmann::json parsed = nlohmann::json::parse(run.out, nullptr, false);
    ASSERT_TRUE(parsed.is_object()) << run.out;
    const auto ids = parsed.at("ids").get<std::vector<int32_t>>();
    ASSERT_EQ(ids.size(), 24u);
    for (size_t step = 0; step < ids.size() && ref.greedy_margin[prompt][step] > 1e-3; ++step) {
      EXPECT_EQ(ids[step], ref.greedy[prompt][step]) << "prompt " << prompt << " step " << step;
    }
  }
  const RunResult none = RunLmserve(
      StrCat("generate --model ", testing::HfTinyDir(model), " --ids 5,6 --max-tokens 0"));
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_EQ(none.out, "{\"ids\": []}\n");
}

TEST(CliGenerateTest, StopsAfterAnEosId) {
  // A copy of the fixture whose EOS id is the 4th greedy token of prompt 1 (and none before it).
  const char* model = "llama-gqa";
  const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
  const std::vector<int32_t>& greedy = ref.greedy[1];
  ASSERT_GT(ref.greedy_margin[1][0], 1e-3);
  const int32_t eos = greedy[3];
  ASSERT_EQ(std::find(greedy.begin(), greedy.begin() + 3, eos), greedy.begin() + 3);
  const std::string dir = StrCat(testing::TempDir(), "/eos-model");
  std::filesystem::create_directories(dir);
  std::ifstream config_in(StrCat(testing::HfTinyDir(model), "/config.json"));
  nlohmann::json config = nlohmann::json::parse(config_in);
  config["eos_token_id"] = {eos, 1000};
  std::ofstream(StrCat(dir, "/config.json")) << config.dump();
  std::error_code ec;
  std::filesystem::create_symlink(StrCat(testing::HfTinyDir(model), "/model.safetensors"),
                                  StrCat(dir, "/model.safetensors"), ec);
  const std::string base =
      StrCat("generate --model ", dir, " --ids ", IdList(ref.prompts[1]), " --max-tokens 10");

  const RunResult stopped = RunLmserve(base);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(
      stopped.out,
      StrCat("{\"ids\": [", StrJoin(std::vector<int32_t>(greedy.begin(), greedy.begin() + 4), ", "),
             "]}\n"));
  const RunResult ignored = RunLmserve(base + " --ignore-eos");
  ASSERT_EQ(ignored.exit_code, 0) << ignored.err;
  EXPECT_EQ(nlohmann::json::parse(ignored.out).at("ids").size(), 10u);
}

TEST(CliErrorsTest, BadPathAndOutOfVocabularyIdsFailClearly) {
  const RunResult missing =
      RunLmserve("generate --model /nonexistent/model --ids 1,2 --max-tokens 2");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/model"));
  EXPECT_TRUE(missing.out.empty());

  const RunResult out_of_vocab =
      RunLmserve(StrCat("logits --model ", testing::HfTinyDir("llama-gqa"), " --ids 1,1024 --out ",
                        testing::TempDir(), "/never.safetensors"));
  EXPECT_NE(out_of_vocab.exit_code, 0);
  EXPECT_THAT(out_of_vocab.err, HasSubstr("token id 1024"));
  EXPECT_THAT(out_of_vocab.err, HasSubstr("vocabulary"));

  const RunResult bad_cache_size =
      RunLmserve(StrCat("generate --model ", testing::HfTinyDir("llama-gqa"),
                        " --ids 1,2 --max-tokens 2 --kv-cache-mb x"));
  EXPECT_NE(bad_cache_size.exit_code, 0);
  EXPECT_THAT(bad_cache_size.err, HasSubstr("--kv-cache-mb"));

  const RunResult usage = RunLmserve("logits --ids 1,2");
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("--model is required"));
}

// --dtype: the CPU runner computes in float32 only (auto and float32 run, bfloat16 is refused
// with the reason), and an unknown name is refused by the option.
TEST(CliErrorsTest, TheCpuBackendRefusesBfloat16) {
  const std::string base =
      StrCat("generate --model ", testing::HfTinyDir("llama-gqa"), " --ids 1,2 --max-tokens 2");
  const RunResult float32 = RunLmserve(base + " --dtype float32");
  EXPECT_EQ(float32.exit_code, 0) << float32.err;
  const RunResult bfloat16 = RunLmserve(base + " --dtype bfloat16");
  EXPECT_NE(bfloat16.exit_code, 0);
  EXPECT_THAT(bfloat16.err, HasSubstr("bfloat16 needs --backend cuda"));
  const RunResult unknown = RunLmserve(base + " --dtype half");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_THAT(unknown.err, HasSubstr("--dtype: 'half'"));
  // serve checks --backend cpu with bfloat16 before it opens the model.
  const RunResult serve =
      RunLmserve("serve --model /nonexistent/model --backend cpu --dtype bfloat16");
  EXPECT_NE(serve.exit_code, 0);
  EXPECT_THAT(serve.err, HasSubstr("--dtype bfloat16"));
}

}  // namespace
}  // namespace lmserve::server
