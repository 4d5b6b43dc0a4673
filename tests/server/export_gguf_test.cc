// lmserve export-gguf, called as the binary's dispatcher calls it.

#include <filesystem>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "gtest/gtest.h"
#include "server/cli.h"
#include "tests/testing/fixtures.h"

namespace lmserve::server {
namespace {

int RunExport(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return RunExportGguf(static_cast<int>(argv.size()), argv.data());
}

TEST(ExportGgufCommandTest, WritesALoadableFile) {
  const std::string out = testing::TempDir() + "/cli-export.gguf";
  ASSERT_EQ(
      RunExport({"--model", testing::HfTinyDir("qwen2-bias"), "--type", "q8_0", "--out", out}), 0);
  {
    auto checkpoint = engine::OpenCheckpoint(out);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    EXPECT_EQ((*checkpoint)->config().family, "qwen2");
    EXPECT_EQ((*(*checkpoint)->Find("model.layers.0.mlp.up_proj.weight"))->dtype,
              kernels::DType::kQ8_0);
  }
  std::filesystem::remove(out);
}

TEST(ExportGgufCommandTest, BadArguments) {
  const std::string out = testing::TempDir() + "/cli-bad.gguf";
  // q5_k: a type export-gguf does not write.
  EXPECT_EQ(RunExport({"--model", testing::HfTinyDir("llama-gqa"), "--type", "q5_k", "--out", out}),
            2);
  EXPECT_EQ(RunExport({"--model", testing::HfTinyDir("llama-gqa")}), 2);  // no --out
  EXPECT_EQ(RunExport({"--model", "/nonexistent", "--out", out}), 1);
}

}  // namespace
}  // namespace lmserve::server
