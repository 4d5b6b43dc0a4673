// `lmserve serve` with a model larger than the machine's memory: a clean refusal with the numbers
// (exit 1), not std::bad_alloc (exit 134) or the OOM killer. Issue 27.

#include <filesystem>
#include <fstream>
#include <string>

#include "common/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/run_lmserve.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;
using testing::RunLmserve;
using testing::RunResult;

TEST(ServeMemoryPlanTest, AModelLargerThanMemoryIsRefusedWithTheNumbers) {
  // About 56 TiB of fp32 weights.
  const std::string dir = StrCat(testing::TempDir(), "/serve_huge_model");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128000, "hidden_size": 65536, "intermediate_size": 262144,
    "num_hidden_layers": 256, "num_attention_heads": 512, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "bos_token_id": 1, "eos_token_id": 2})";
  const RunResult run = RunLmserve(
      StrCat("serve --model ", dir, " --load-format dummy --backend cpu --port 0 --threads 1"),
      120);
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err,
              HasSubstr("cannot serve the model: the model does not fit in RAM: weights "));
  EXPECT_THAT(run.err, HasSubstr("TiB + workspaces "));
  EXPECT_THAT(run.err, HasSubstr("--kv-cache-mb"));
}

}  // namespace
}  // namespace lmserve::server
