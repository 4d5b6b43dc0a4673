// Mixture of experts on the CUDA runner: the Mixtral fixture (tests/fixtures/hf-families/
// mixtral-moe) against Hugging Face's float64 logits in bf16 (relative L2, top-1) and float32
// (the CPU's tolerance), whole and in two chunks; greedy decoding through the captured graphs in
// float32 against the reference tokens; graph decode steps against eager ones in bf16; dummy
// weights in float32 against the CPU runner. Skips without a GPU.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

constexpr char kModel[] = "mixtral-moe";

#define LMSERVE_REQUIRE_CUDA_RUNNER()                                    \
  do {                                                                   \
    if (!CheckCudaDevice().ok())                                         \
      GTEST_SKIP() << "CUDA runner test skipped: " << CheckCudaDevice(); \
  } while (0)

std::vector<int32_t> Blocks(int32_t first, int64_t tokens, int32_t block_size) {
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + block_size - 1) / block_size));
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

std::unique_ptr<ModelRunner> Runner(const Checkpoint& checkpoint, Backend backend,
                                    RunnerDType dtype, bool graphs,
                                    LoadFormat format = LoadFormat::kCheckpoint) {
  RunnerConfig config;
  config.backend = backend;
  config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
  config.dtype = dtype;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 512;
  config.cuda_graphs = graphs;
  config.load_format = format;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

// Every position's logits of `prompt`, in one step or two (the second starting mid-sequence).
std::vector<float> PromptLogits(ModelRunner& runner, const std::vector<int32_t>& prompt,
                                int chunks) {
  std::vector<float> logits;
  const int64_t split = chunks == 1 ? 0 : static_cast<int64_t>(prompt.size()) / 2;
  const std::vector<int32_t> blocks = Blocks(0, prompt.size(), runner.block_size_tokens());
  for (const auto& [start, end] :
       {std::pair<int64_t, int64_t>{0, split}, {split, static_cast<int64_t>(prompt.size())}}) {
    if (end == start) continue;
    StepBatch batch;
    batch.AddSequence(std::span(prompt).subspan(start, end - start), static_cast<int32_t>(start),
                      blocks, LogitsMode::kAll);
    StepOutput output;
    EXPECT_TRUE(runner.Execute(batch, &output).ok());
    logits.insert(logits.end(), output.logits.begin(), output.logits.end());
  }
  return logits;
}

TEST(MoeGpuRunnerTest, LogitsMatchTheReference) {
  LMSERVE_REQUIRE_CUDA_RUNNER();
  const std::string dir = testing::HfFamilyDir(kModel);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  for (RunnerDType dtype : {RunnerDType::kBFloat16, RunnerDType::kFloat32}) {
    const std::string name(RunnerDTypeName(dtype));
    SCOPED_TRACE(name);
    std::unique_ptr<ModelRunner> runner = Runner(**checkpoint, Backend::kCuda, dtype, false);
    ASSERT_NE(runner, nullptr);
    const int64_t vocab = runner->model_config().vocab_size;
    int64_t rows = 0, top1 = 0;
    for (int chunks : {1, 2}) {
      for (size_t j = 0; j < ref.prompts.size(); ++j) {
        const std::vector<int32_t>& prompt = ref.prompts[j];
        const std::vector<float> got = PromptLogits(*runner, prompt, chunks);
        const std::vector<float> want = testing::LoadReferenceLogits(dir, static_cast<int>(j));
        ASSERT_EQ(got.size(), want.size());
        double num = 0, den = 0, max_scaled = 0;
        for (size_t r = 0; r < prompt.size(); ++r, ++rows) {
          const float* g = got.data() + r * vocab;
          const float* w = want.data() + r * vocab;
          double scale = 1;
          for (int64_t v = 0; v < vocab; ++v) scale = std::max(scale, double{std::abs(w[v])});
          for (int64_t v = 0; v < vocab; ++v) {
            const double d = double{g[v]} - w[v];
            num += d * d;
            den += double{w[v]} * w[v];
            max_scaled = std::max(max_scaled, std::abs(d) / std::max(1.0, scale / 10));
          }
          top1 += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
        }
        const double relative_l2 = std::sqrt(num / den);
        std::printf(
            "[ logits   ] mixtral-moe %s prompt %zu chunks %d: relative L2 %.3g, max "
            "scaled |error| %.3g\n",
            name.c_str(), j, chunks, relative_l2, max_scaled);
        if (dtype == RunnerDType::kFloat32) {
          EXPECT_LT(max_scaled, 1e-4) << "prompt " << j << " chunks " << chunks;
        } else {
          EXPECT_LE(relative_l2, 2e-2) << "prompt " << j << " chunks " << chunks;
        }
      }
    }
    std::printf("[ top-1    ] mixtral-moe %s: %lld of %lld rows agree\n", name.c_str(),
                static_cast<long long>(top1), static_cast<long long>(rows));
    EXPECT_GE(top1 * 100, rows * 99);
  }
}

TEST(MoeGpuRunnerTest, Float32GreedyDecodingThroughGraphsMatchesTheReference) {
  LMSERVE_REQUIRE_CUDA_RUNNER();
  const std::string dir = testing::HfFamilyDir(kModel);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> runner =
      Runner(**checkpoint, Backend::kCuda, RunnerDType::kFloat32, /*graphs=*/true);
  ASSERT_NE(runner, nullptr);
  ASSERT_GT(runner->stats().num_cuda_graphs, 0);
  const int64_t vocab = runner->model_config().vocab_size;
  const int32_t block_size = runner->block_size_tokens();
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  // All four prompts at once: a prefill step, then decode steps of 4 (a graph each).
  std::vector<std::vector<int32_t>> sequences = ref.prompts;
  std::vector<std::vector<int32_t>> tables;
  int32_t first = 0;
  for (const auto& prompt : ref.prompts) {
    tables.push_back(Blocks(first, prompt.size() + ref.greedy[0].size(), block_size));
    first += static_cast<int32_t>(tables.back().size());
  }
  std::vector<std::vector<int32_t>> generated(sequences.size());
  const size_t steps = ref.greedy[0].size();
  for (size_t step = 0; step < steps; ++step) {
    StepBatch batch;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const int32_t computed = step == 0 ? 0 : static_cast<int32_t>(sequences[s].size()) - 1;
      batch.AddSequence(std::span(sequences[s]).subspan(computed), computed, tables[s],
                        LogitsMode::kLast);
    }
    StepOutput output;
    ASSERT_TRUE(runner->Execute(batch, &output).ok());
    for (size_t s = 0; s < sequences.size(); ++s) {
      const float* row = output.logits.data() + s * vocab;
      const int32_t token = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      generated[s].push_back(token);
      sequences[s].push_back(token);
    }
  }
  size_t compared = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    for (size_t step = 0; step < steps; ++step) {
      if (ref.greedy_margin[s][step] <= 1e-3) break;  // a float32 engine may pick either here
      EXPECT_EQ(generated[s][step], ref.greedy[s][step]) << "prompt " << s << " step " << step;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 96u);
}

TEST(MoeGpuRunnerTest, GraphDecodeStepsMatchEagerOnes) {
  LMSERVE_REQUIRE_CUDA_RUNNER();
  auto checkpoint = OpenCheckpoint(testing::HfFamilyDir(kModel));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> graphs =
      Runner(**checkpoint, Backend::kCuda, RunnerDType::kBFloat16, true);
  std::unique_ptr<ModelRunner> eager =
      Runner(**checkpoint, Backend::kCuda, RunnerDType::kBFloat16, false);
  ASSERT_NE(graphs, nullptr);
  ASSERT_NE(eager, nullptr);
  const int64_t vocab = graphs->model_config().vocab_size;
  const int32_t block_size = graphs->block_size_tokens();
  // 1, 3 (bucket 4, one padding sequence) and 8 sequences: the fused and the grouped paths.
  for (size_t num_seqs : {size_t{1}, size_t{3}, size_t{8}}) {
    std::vector<std::vector<int32_t>> sequences;
    std::vector<std::vector<int32_t>> tables;
    for (size_t s = 0; s < num_seqs; ++s) {
      sequences.push_back({static_cast<int32_t>(5 + 31 * s), 9, static_cast<int32_t>(100 + s)});
      tables.push_back(Blocks(static_cast<int32_t>(s) * 4, 64, block_size));
    }
    for (int step = 0; step < 6; ++step) {
      StepBatch batch;
      for (size_t s = 0; s < num_seqs; ++s) {
        const int32_t computed = step == 0 ? 0 : static_cast<int32_t>(sequences[s].size()) - 1;
        batch.AddSequence(std::span(sequences[s]).subspan(computed), computed, tables[s],
                          LogitsMode::kLast);
      }
      StepOutput from_graph, from_eager;
      ASSERT_TRUE(graphs->Execute(batch, &from_graph).ok());
      ASSERT_TRUE(eager->Execute(batch, &from_eager).ok());
      ASSERT_EQ(from_graph.logits.size(), from_eager.logits.size());
      // A padded graph step may route through the other path than the eager one (its token count
      // is the bucket's): agreement to bf16's rounding.
      double num = 0, den = 0;
      for (size_t i = 0; i < from_eager.logits.size(); ++i) {
        const double d = double{from_graph.logits[i]} - from_eager.logits[i];
        num += d * d;
        den += double{from_eager.logits[i]} * from_eager.logits[i];
      }
      EXPECT_LE(std::sqrt(num / den), 1e-2) << num_seqs << " sequences, step " << step;
      for (size_t s = 0; s < num_seqs; ++s) {
        const float* e = from_eager.logits.data() + s * vocab;
        sequences[s].push_back(static_cast<int32_t>(std::max_element(e, e + vocab) - e));
      }
    }
  }
}

TEST(MoeGpuRunnerTest, Float32DummyWeightsAgreeWithTheCpuRunner) {
  LMSERVE_REQUIRE_CUDA_RUNNER();
  auto checkpoint = OpenConfigOnlyCheckpoint(testing::HfFamilyDir(kModel));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> cuda =
      Runner(**checkpoint, Backend::kCuda, RunnerDType::kFloat32, false, LoadFormat::kDummy);
  std::unique_ptr<ModelRunner> cpu =
      Runner(**checkpoint, Backend::kCpu, RunnerDType::kFloat32, false, LoadFormat::kDummy);
  ASSERT_NE(cuda, nullptr);
  ASSERT_NE(cpu, nullptr);
  const std::vector<int32_t> prompt = {5, 9, 200, 17, 3, 800, 1000, 42, 7};
  const std::vector<float> got = PromptLogits(*cuda, prompt, 2);
  const std::vector<float> want = PromptLogits(*cpu, prompt, 2);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double{got[i]} - want[i]));
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace lmserve::engine
