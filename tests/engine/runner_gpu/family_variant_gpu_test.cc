// The test-defined Phi-3 family (tests/engine/runner/phi3_test_family.cc, no runner edit) on the
// CUDA runner: its logits against Hugging Face's float64 reference in bf16 and float32, and its
// decode steps through the captured graphs against eager ones.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

constexpr char kModel[] = "phi3-fused";

std::vector<int32_t> Blocks(int64_t tokens, int32_t block_size) {
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + block_size - 1) / block_size));
  std::iota(blocks.begin(), blocks.end(), 0);
  return blocks;
}

std::unique_ptr<ModelRunner> CudaRunner(const Checkpoint& checkpoint, RunnerDType dtype,
                                        bool graphs) {
  RunnerConfig config;
  config.backend = Backend::kCuda;
  config.dtype = dtype;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 512;
  config.cuda_graphs = graphs;
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? *std::move(runner) : nullptr;
}

TEST(FamilyVariantGpuTest, LogitsMatchTheReference) {
  if (!CheckCudaDevice().ok()) GTEST_SKIP() << "CUDA runner test skipped: " << CheckCudaDevice();
  const std::string dir = testing::HfFamilyDir(kModel);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_EQ((*checkpoint)->config().family, "phi3");
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  for (RunnerDType dtype : {RunnerDType::kBFloat16, RunnerDType::kFloat32}) {
    SCOPED_TRACE(std::string(RunnerDTypeName(dtype)));
    std::unique_ptr<ModelRunner> runner = CudaRunner(**checkpoint, dtype, /*graphs=*/false);
    ASSERT_NE(runner, nullptr);
    const int64_t vocab = runner->model_config().vocab_size;
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      const std::vector<int32_t>& prompt = ref.prompts[j];
      StepBatch batch;
      batch.AddSequence(prompt, 0, Blocks(prompt.size(), runner->block_size_tokens()),
                        LogitsMode::kAll);
      StepOutput output;
      ASSERT_TRUE(runner->Execute(batch, &output).ok());
      const std::vector<float> expected = testing::LoadReferenceLogits(dir, static_cast<int>(j));
      ASSERT_EQ(output.logits.size(), expected.size());
      double num = 0, den = 0, max_error = 0;
      int64_t top1 = 0;
      for (size_t r = 0; r < prompt.size(); ++r) {
        const float* got = output.logits.data() + r * vocab;
        const float* want = expected.data() + r * vocab;
        for (int64_t v = 0; v < vocab; ++v) {
          num += (double{got[v]} - want[v]) * (double{got[v]} - want[v]);
          den += double{want[v]} * want[v];
          max_error = std::max(max_error, std::abs(double{got[v]} - want[v]));
        }
        top1 += std::max_element(got, got + vocab) ==
                got + (std::max_element(want, want + vocab) - want);
      }
      const double relative_l2 = std::sqrt(num / den);
      std::printf(
          "[ logits   ] phi3-fused %s prompt %zu: relative L2 %.3g, max |error| %.3g, "
          "top-1 %lld of %zu\n",
          std::string(RunnerDTypeName(dtype)).c_str(), j, relative_l2, max_error,
          static_cast<long long>(top1), prompt.size());
      // The tolerances of the hf-tiny fixtures' CUDA tests (cuda_runner_test.cc).
      if (dtype == RunnerDType::kFloat32) {
        EXPECT_LT(max_error, 1e-4) << "prompt " << j;
      } else {
        EXPECT_LT(relative_l2, 2e-2) << "prompt " << j;
      }
    }
  }
}

TEST(FamilyVariantGpuTest, GraphDecodeStepsMatchEagerOnes) {
  if (!CheckCudaDevice().ok()) GTEST_SKIP() << "CUDA runner test skipped: " << CheckCudaDevice();
  auto checkpoint = OpenCheckpoint(testing::HfFamilyDir(kModel));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  std::unique_ptr<ModelRunner> graphs = CudaRunner(**checkpoint, RunnerDType::kBFloat16, true);
  std::unique_ptr<ModelRunner> eager = CudaRunner(**checkpoint, RunnerDType::kBFloat16, false);
  ASSERT_NE(graphs, nullptr);
  ASSERT_NE(eager, nullptr);
  ASSERT_GT(graphs->stats().num_cuda_graphs, 0);
  // Three sequences: a prefill each, then decode steps of all three (a graph's bucket of 4).
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 200}, {7}, {100, 3, 4, 8, 9, 10}};
  const int32_t block_size = graphs->block_size_tokens();
  std::vector<std::vector<int32_t>> sequences = prompts;
  std::vector<std::vector<int32_t>> tables;
  for (size_t s = 0; s < prompts.size(); ++s) {
    std::vector<int32_t> table = Blocks(64, block_size);
    for (int32_t& b : table) b += static_cast<int32_t>(s) * 4;
    tables.push_back(table);
  }
  for (int step = 0; step < 8; ++step) {
    StepBatch batch;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const int32_t computed = step == 0 ? 0 : static_cast<int32_t>(sequences[s].size()) - 1;
      batch.AddSequence(std::span(sequences[s]).subspan(computed), computed, tables[s],
                        LogitsMode::kLast);
    }
    StepOutput from_graph, from_eager;
    ASSERT_TRUE(graphs->Execute(batch, &from_graph).ok());
    ASSERT_TRUE(eager->Execute(batch, &from_eager).ok());
    ASSERT_EQ(from_graph.logits.size(), from_eager.logits.size());
    const int64_t vocab = graphs->model_config().vocab_size;
    // Graphs run padded to their bucket, where the GEMMs may take other kernels than the eager
    // step's: agreement to bf16's rounding, as cuda_runner_test.cc's graph replay test asks.
    double num = 0, den = 0;
    for (size_t i = 0; i < from_eager.logits.size(); ++i) {
      const double d = double{from_graph.logits[i]} - from_eager.logits[i];
      num += d * d;
      den += double{from_eager.logits[i]} * from_eager.logits[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-2) << "step " << step;
    for (size_t s = 0; s < sequences.size(); ++s) {
      const float* g = from_graph.logits.data() + s * vocab;
      const float* e = from_eager.logits.data() + s * vocab;
      std::vector<float> sorted(e, e + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      const int32_t eager_top = static_cast<int32_t>(std::max_element(e, e + vocab) - e);
      if (sorted[0] - sorted[1] > 0.05f) {
        EXPECT_EQ(std::max_element(g, g + vocab) - g, eager_top)
            << "step " << step << " sequence " << s;
      }
      sequences[s].push_back(eager_top);
    }
  }
}

}  // namespace
}  // namespace lmserve::engine
