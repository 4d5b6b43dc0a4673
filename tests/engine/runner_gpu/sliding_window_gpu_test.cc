// Sliding windows on the CUDA runner with the block tables the engine keeps: three sequences of
// mistral-sliding (every layer one windowed KV cache group) and of gemma2-softcap-sliding (a
// windowed group and a full one) are prefilled in chunks of 17 and decoded for 24 steps together
// (a decode graph's bucket of 4, one padding sequence), each step's tables from a BlockManager
// that drops (-1) the blocks that left the window and reuses them. The CUDA runner in float32,
// graphs on, against the CPU runner given the same batches: every logits row within 1e-3
// (scaled beyond |logit| 10), and the same greedy tokens. Skips without a GPU.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/block_manager.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

constexpr int32_t kBlockSize = 16;

std::unique_ptr<ModelRunner> Runner(const Checkpoint& checkpoint, Backend backend) {
  RunnerConfig config;
  config.backend = backend;
  config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
  config.dtype = RunnerDType::kFloat32;
  config.block_size_tokens = kBlockSize;
  config.kv_cache_bytes = int64_t{16} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 256;
  config.num_threads = 2;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

using testing::ScaledError;

class SlidingWindowGpuTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SlidingWindowGpuTest, DroppedBlocksChunksAndGraphsGiveTheCpuRunnersLogits) {
  if (!CheckCudaDevice().ok()) GTEST_SKIP() << "CUDA runner test skipped: " << CheckCudaDevice();
  const std::string dir = testing::HfFamilyDir(GetParam());
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> cuda = Runner(**checkpoint, Backend::kCuda);
  std::unique_ptr<ModelRunner> cpu = Runner(**checkpoint, Backend::kCpu);
  ASSERT_NE(cuda, nullptr);
  ASSERT_NE(cpu, nullptr);
  ASSERT_GT(cuda->stats().num_cuda_graphs, 0);
  ASSERT_EQ(cuda->kv_group_windows(), cpu->kv_group_windows());
  const std::vector<int32_t> windows = cuda->kv_group_windows();
  // One block manager for both: the same block ids on both runners (each has at least as many).
  BlockManager blocks(std::min(cuda->num_kv_blocks(), cpu->num_kv_blocks()), kBlockSize,
                      /*enable_prefix_caching=*/false, windows);
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  std::vector<std::vector<int32_t>> sequences = {ref.prompts[3], ref.prompts[2], ref.prompts[1]};
  std::vector<int32_t> computed(sequences.size(), 0);
  const int64_t vocab = cuda->model_config().vocab_size;
  double worst = 0;
  int64_t dropped_seen = 0, steps = 0, decode_steps = 0;
  std::vector<std::span<const int32_t>> tables;
  auto run_step = [&](size_t chunk) {
    StepBatch batch;
    std::vector<size_t> in_batch;
    std::vector<int32_t> num_new;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const int32_t n = static_cast<int32_t>(
          std::min(chunk, sequences[s].size() - static_cast<size_t>(computed[s])));
      if (n == 0) continue;
      EXPECT_TRUE(
          blocks.Allocate(static_cast<BlockManager::SeqId>(s), computed[s] + n, {}, computed[s]));
      tables.clear();
      for (int32_t g = 0; g < blocks.num_groups(); ++g) {
        tables.push_back(blocks.BlockTable(static_cast<BlockManager::SeqId>(s), g));
        dropped_seen += std::count(tables.back().begin(), tables.back().end(), -1);
      }
      batch.AddSequence(std::span(sequences[s]).subspan(computed[s], n), computed[s], tables,
                        LogitsMode::kLast);
      in_batch.push_back(s);
      num_new.push_back(n);
    }
    StepOutput from_cuda, from_cpu;
    const absl::Status cuda_status = cuda->Execute(batch, &from_cuda);
    ASSERT_TRUE(cuda_status.ok()) << cuda_status;
    ASSERT_TRUE(cpu->Execute(batch, &from_cpu).ok());
    ASSERT_EQ(from_cuda.logits.size(), from_cpu.logits.size());
    worst = std::max(worst, ScaledError(from_cuda.logits, from_cpu.logits));
    for (size_t k = 0; k < in_batch.size(); ++k) {
      const size_t s = in_batch[k];
      computed[s] += num_new[k];
      const float* row = from_cpu.logits.data() + k * vocab;
      const float* got = from_cuda.logits.data() + k * vocab;
      const int32_t want_token = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      const int32_t got_token = static_cast<int32_t>(std::max_element(got, got + vocab) - got);
      if (chunk == 1) {
        EXPECT_EQ(got_token, want_token) << "sequence " << s << " step " << steps;
        sequences[s].push_back(want_token);
      }
    }
    ++steps;
  };
  // Prefill in chunks of 17 (the last chunk of each prompt asks for its logits row)...
  while (computed[0] < static_cast<int32_t>(sequences[0].size())) run_step(17);
  // ... then each sequence has its first sampled token appended: 24 decode steps of 3.
  for (size_t s = 0; s < sequences.size(); ++s) sequences[s].push_back(1 + static_cast<int32_t>(s));
  for (int step = 0; step < 24; ++step, ++decode_steps) run_step(1);
  std::printf(
      "[ window   ] %s (windows %s): %ld steps, %ld dropped entries seen, scaled max "
      "|cuda - cpu| %.3g\n",
      GetParam(), windows.size() == 1 ? "one" : "two", static_cast<long>(steps),
      static_cast<long>(dropped_seen), worst);
  EXPECT_GT(dropped_seen, 0);
  EXPECT_LE(worst, 1e-3);
  blocks.CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SlidingWindowGpuTest,
                         ::testing::Values("mistral-sliding", "gemma2-softcap-sliding"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace lmserve::engine
