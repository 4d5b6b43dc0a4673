// `lmserve serve`'s flags as ServeConfigFromArgs reads them: --dtype and its interplay with
// --backend, and the start-up summary.

#include "server/serve_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/args.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;

// Parses `flags` (after a --model) as `lmserve serve` does.
absl::StatusOr<ServeConfig> Parse(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--model", "model.gguf"});
  std::vector<char*> argv;
  for (std::string& flag : flags) argv.push_back(flag.data());
  Args args("serve", "serves a model");
  AddServeOptions(&args);
  absl::StatusOr<bool> parsed = args.Parse(static_cast<int>(argv.size()), argv.data());
  if (!parsed.ok()) return parsed.status();
  return ServeConfigFromArgs(args);
}

TEST(ServeConfigTest, DtypeDefaultsToAuto) {
  absl::StatusOr<ServeConfig> config = Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->dtype, engine::RunnerDType::kAuto);
  EXPECT_EQ(config->backend, "auto");
  EXPECT_THAT(DescribeServeConfig(*config), HasSubstr("backend: auto, dtype: auto"));
}

TEST(ServeConfigTest, DtypeTakesAutoBfloat16AndFloat32) {
  for (const char* backend : {"auto", "cuda"}) {
    for (const char* dtype : {"auto", "bfloat16", "float32"}) {
      absl::StatusOr<ServeConfig> config = Parse({"--backend", backend, "--dtype", dtype});
      ASSERT_TRUE(config.ok()) << backend << " " << dtype << ": " << config.status();
      EXPECT_EQ(engine::RunnerDTypeName(config->dtype), dtype);
      EXPECT_THAT(DescribeServeConfig(*config), HasSubstr(std::string("dtype: ") + dtype));
    }
  }
  absl::StatusOr<ServeConfig> equals = Parse({"--dtype=float32", "--backend=cpu"});
  ASSERT_TRUE(equals.ok()) << equals.status();
  EXPECT_EQ(equals->dtype, engine::RunnerDType::kFloat32);
  EXPECT_EQ(equals->backend, "cpu");
}

TEST(ServeConfigTest, RejectsUnknownDtypes) {
  for (const char* dtype : {"half", "float16", "fp32", "FLOAT32", ""}) {
    absl::StatusOr<ServeConfig> config = Parse({"--dtype", dtype});
    ASSERT_FALSE(config.ok()) << dtype;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr("--dtype"));
    EXPECT_THAT(config.status().message(), HasSubstr("auto, bfloat16, float32"));
  }
}

// The CPU runner computes in float32 only: an explicit CPU backend with bfloat16 is refused here,
// before the model loads (with --backend auto the CPU runner refuses it itself).
TEST(ServeConfigTest, RejectsBfloat16OnTheCpuBackend) {
  absl::StatusOr<ServeConfig> config = Parse({"--backend", "cpu", "--dtype", "bfloat16"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("--dtype bfloat16"));
  EXPECT_THAT(config.status().message(), HasSubstr("float32 only"));
  EXPECT_TRUE(Parse({"--backend", "cpu", "--dtype", "float32"}).ok());
  EXPECT_TRUE(Parse({"--backend", "cpu", "--dtype", "auto"}).ok());
}

}  // namespace
}  // namespace lmserve::server
