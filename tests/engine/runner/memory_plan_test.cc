// The memory plan (engine/runner/memory_plan.h): the host's available memory read from
// /proc/meminfo and the cgroup files (fake ones under a temporary root), the refusal's message,
// and a CPU runner that refuses a model larger than any machine instead of dying of bad_alloc.

#include "engine/runner/memory_plan.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

using ::testing::HasSubstr;

// Writes `contents` at root/path, creating directories.
void Write(const std::string& root, const std::string& path, const std::string& contents) {
  const std::filesystem::path file = std::filesystem::path(root + path);
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << contents;
}

std::string FreshRoot(const std::string& name) {
  const std::string root = StrCat(testing::TempDir(), "/memory_plan_", name);
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  return root;
}

constexpr char kMeminfo[] =
    "MemTotal:       16384000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:    8388608 kB\n"
    "Buffers:           10000 kB\n";

TEST(AvailableHostMemoryTest, MemAvailableWithoutACgroupLimit) {
  const std::string root = FreshRoot("nolimit");
  Write(root, "/proc/meminfo", kMeminfo);
  Write(root, "/proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  Write(root, "/sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  Write(root, "/sys/fs/cgroup/user.slice/session-1.scope/memory.current", "123456\n");
  const HostMemory memory = AvailableHostMemory(root);
  EXPECT_EQ(memory.available_bytes, int64_t{8388608} * 1024);
  EXPECT_EQ(memory.source, "MemAvailable in /proc/meminfo");
}

TEST(AvailableHostMemoryTest, TheTightestCgroupLevelWins) {
  const std::string root = FreshRoot("v2");
  Write(root, "/proc/meminfo", kMeminfo);
  Write(root, "/proc/self/cgroup", "0::/kubepods/pod1/container\n");
  // The container has no limit of its own; its pod has 1 GiB, 256 MiB of it used.
  Write(root, "/sys/fs/cgroup/kubepods/pod1/container/memory.max", "max\n");
  Write(root, "/sys/fs/cgroup/kubepods/pod1/container/memory.current", "1000\n");
  Write(root, "/sys/fs/cgroup/kubepods/pod1/memory.max", StrCat(int64_t{1} << 30, "\n"));
  Write(root, "/sys/fs/cgroup/kubepods/pod1/memory.current", StrCat(int64_t{256} << 20, "\n"));
  Write(root, "/sys/fs/cgroup/kubepods/memory.max", StrCat(int64_t{64} << 30, "\n"));
  Write(root, "/sys/fs/cgroup/kubepods/memory.current", StrCat(int64_t{2} << 30, "\n"));
  const HostMemory memory = AvailableHostMemory(root);
  EXPECT_EQ(memory.available_bytes, int64_t{768} << 20);
  EXPECT_THAT(memory.source, HasSubstr("/sys/fs/cgroup/kubepods/pod1/memory.max 1024 MiB"));
}

TEST(AvailableHostMemoryTest, CgroupV1) {
  const std::string root = FreshRoot("v1");
  Write(root, "/proc/meminfo", kMeminfo);
  Write(root, "/proc/self/cgroup", "12:cpu,cpuacct:/docker/abc\n7:memory:/docker/abc\n");
  Write(root, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
        StrCat(int64_t{2} << 30, "\n"));
  Write(root, "/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes",
        StrCat(int64_t{512} << 20, "\n"));
  const HostMemory memory = AvailableHostMemory(root);
  EXPECT_EQ(memory.available_bytes, int64_t{1536} << 20);
  EXPECT_THAT(memory.source, HasSubstr("memory.limit_in_bytes"));
}

TEST(AvailableHostMemoryTest, UnknownWithoutProc) {
  const HostMemory memory = AvailableHostMemory(FreshRoot("empty"));
  EXPECT_EQ(memory.available_bytes, -1);
}

TEST(CheckMemoryPlanTest, RefusesWithTheNumbers) {
  MemoryPlan plan;
  plan.device = "RAM";
  plan.weight_bytes = int64_t{3000} << 20;
  plan.workspace_bytes = int64_t{100} << 20;
  plan.kv_cache_bytes = int64_t{512} << 20;
  plan.available_bytes = int64_t{2048} << 20;
  plan.available_source = "MemAvailable in /proc/meminfo";
  const absl::Status status = CheckMemoryPlan(plan, "try less");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "the model does not fit in RAM: weights 3000 MiB + workspaces 100 MiB + KV cache 512 "
            "MiB = 3612 MiB, but only 2048 MiB are available (MemAvailable in /proc/meminfo); "
            "try less");
  plan.available_bytes = plan.needed_bytes();
  EXPECT_TRUE(CheckMemoryPlan(plan, "").ok());
  plan.available_bytes = -1;  // unknown: no check
  plan.weight_bytes = int64_t{1} << 50;
  EXPECT_TRUE(CheckMemoryPlan(plan, "").ok());
}

// A Llama config of about 58 TiB of fp32 weights: more than any machine's RAM.
std::string HugeModelDir() {
  const std::string dir = StrCat(testing::TempDir(), "/huge_model");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128000, "hidden_size": 65536, "intermediate_size": 262144,
    "num_hidden_layers": 256, "num_attention_heads": 512, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "max_position_embeddings": 4096,
    "bos_token_id": 1, "eos_token_id": 2})";
  return dir;
}

// Issue 27: this ended in an uncaught std::bad_alloc (exit 134) before the plan.
TEST(CpuRunnerMemoryPlanTest, AModelLargerThanMemoryIsRefusedBeforeAllocating) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = OpenConfigOnlyCheckpoint(HugeModelDir());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig config;
  config.load_format = LoadFormat::kDummy;
  config.kv_cache_bytes = int64_t{64} << 20;
  const absl::StatusOr<std::unique_ptr<ModelRunner>> runner =
      ModelRunner::Create(**checkpoint, config);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted) << runner.status();
  EXPECT_THAT(std::string(runner.status().message()),
              HasSubstr("the model does not fit in RAM: weights 5"));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("TiB"));
  EXPECT_THAT(std::string(runner.status().message()), HasSubstr("are available ("));
}

}  // namespace
}  // namespace lmserve::engine
