// The FP8 KV cache on the CUDA runner (--kv-cache-dtype fp8, issue 23's second part), against
// Hugging Face's float64 fixtures: every fixture with attention layers served in bf16 with E4M3
// keys and values (scales 1.0), each prompt fed three ways, each held to issue 23's bounds
// (relative L2 6e-2 over all logits; top-1 agreement of at least 98% at the rows whose reference
// top-2 margin exceeds 0.1 x the row's standard deviation; testing::QuantizedAccuracy, as the FP8
// weights' test):
// - whole (prefill attention over the FP8 cache: the mma.sync kernel, which reads E4M3);
// - in chunks of 8 (chunked prefill: each chunk's queries against the cached FP8 prefix);
// - a token a step (decode attention over the FP8 cache).
// And the pool: the same --kv-cache-mb holds twice bf16's blocks. Skipped without a GPU of
// compute capability 8.9+.

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fp8.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/fp8_checkpoint.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

absl::Status CheckFp8Device() {
  if (absl::Status s = CheckCudaDevice(); !s.ok()) return s;
  const auto devices = kernels::cuda::ListDevices();
  if (devices.empty() || !kernels::cuda::SupportsFp8(devices[0].compute_capability_major,
                                                     devices[0].compute_capability_minor)) {
    return absl::FailedPreconditionError("the GPU has no FP8 (compute capability below 8.9)");
  }
  return absl::OkStatus();
}

int64_t ContextFor(const ModelConfig& config, int64_t tokens) {
  if (config.rope.scaling == RopeScaling::kLongRope &&
      tokens <= config.rope.original_max_position_embeddings) {
    return config.rope.original_max_position_embeddings;
  }
  return 0;
}

RunnerConfig KvConfig(KvCacheDType kv_dtype, int64_t context) {
  RunnerConfig config;
  config.backend = Backend::kCuda;
  config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
  config.kv_cache_dtype = kv_dtype;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 512;
  config.cuda_graphs = false;
  config.max_context_len = context;
  return config;
}

struct FixtureCase {
  const char* fixture;
  bool family;  // hf-families, else hf-tiny
};

class Fp8KvCacheGpuTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(Fp8KvCacheGpuTest, MatchesTheReference) {
  if (!CheckFp8Device().ok()) GTEST_SKIP() << "FP8 GPU test skipped: " << CheckFp8Device();
  const std::string dir = GetParam().family ? testing::HfFamilyDir(GetParam().fixture)
                                            : testing::HfTinyDir(GetParam().fixture);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  for (const size_t chunk : {size_t{0}, size_t{8}, size_t{1}}) {
    const char* mode = chunk == 0 ? "whole" : chunk == 8 ? "chunks" : "decode";
    SCOPED_TRACE(mode);
    testing::QuantizedAccuracy accuracy;
    // One runner a context length (the prompts overwrite the same blocks in turn).
    std::map<int64_t, std::unique_ptr<ModelRunner>> runners;
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      const int64_t context =
          ContextFor((*checkpoint)->config(),
                     static_cast<int64_t>(ref.prompts[j].size() + ref.greedy[j].size()));
      std::unique_ptr<ModelRunner>& runner = runners[context];
      if (runner == nullptr) {
        auto created = ModelRunner::Create(**checkpoint, KvConfig(KvCacheDType::kFp8, context));
        ASSERT_TRUE(created.ok()) << created.status();
        runner = std::move(*created);
      }
      ASSERT_EQ(runner->stats().kv_cache_dtype, KvCacheDType::kFp8);
      const std::vector<float> got = testing::PromptLogits(*runner, ref.prompts[j], chunk);
      const std::vector<float> want = testing::LoadReferenceLogits(dir, static_cast<int>(j));
      ASSERT_EQ(got.size(), want.size());
      accuracy.Add(got, want, runner->model_config().vocab_size);
    }
    std::printf("[ fp8 kv   ] %-34s %-6s relative L2 %.3g, top-1 %lld of %lld decisive rows "
                "(%lld rows)\n",
                GetParam().fixture, mode, accuracy.relative_l2(),
                static_cast<long long>(accuracy.decisive_agree),
                static_cast<long long>(accuracy.decisive_rows),
                static_cast<long long>(accuracy.rows));
    EXPECT_LE(accuracy.relative_l2(), 6e-2);
    EXPECT_GE(accuracy.top1_agreement(), 0.98);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Fp8KvCacheGpuTest,
    ::testing::Values(FixtureCase{"llama-gqa", false}, FixtureCase{"llama-hd128", false},
                      FixtureCase{"llama-mqa-tied-llama3rope", false},
                      FixtureCase{"qwen2-bias", false}, FixtureCase{"qwen3-qknorm", true},
                      FixtureCase{"gemma2-softcap-sliding", true},
                      FixtureCase{"gemma3-local-global", true},
                      FixtureCase{"gemma3-rope-scaling", true}, FixtureCase{"phi3-fused", true},
                      FixtureCase{"phi3-longrope-partial", true},
                      FixtureCase{"mistral-sliding", true}, FixtureCase{"qwen3-moe", true},
                      FixtureCase{"mixtral-moe", true}),
    [](const auto& info) {
      std::string name = info.param.fixture;
      for (char& c : name) c = c == '-' ? '_' : c;
      return name;
    });

// The same --kv-cache-mb holds twice the blocks in FP8; float32 refuses it.
TEST(Fp8KvCachePoolGpuTest, TwiceTheBlocksAndRefusals) {
  if (!CheckFp8Device().ok()) GTEST_SKIP() << "FP8 GPU test skipped: " << CheckFp8Device();
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-hd128"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig config = KvConfig(KvCacheDType::kFp8, 0);
  config.kv_cache_bytes = int64_t{16} << 20;
  auto fp8 = ModelRunner::Create(**checkpoint, config);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  config.kv_cache_dtype = KvCacheDType::kAuto;
  auto bf16 = ModelRunner::Create(**checkpoint, config);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const ModelConfig& c = (*checkpoint)->config();
  EXPECT_EQ(CudaKvBlockBytes(c, 16, RunnerDType::kBFloat16, KvCacheDType::kFp8) * 2,
            CudaKvBlockBytes(c, 16, RunnerDType::kBFloat16));
  EXPECT_EQ((*fp8)->num_kv_blocks(),
            config.kv_cache_bytes /
                CudaKvBlockBytes(c, 16, RunnerDType::kBFloat16, KvCacheDType::kFp8));
  EXPECT_EQ((*bf16)->num_kv_blocks(),
            config.kv_cache_bytes / CudaKvBlockBytes(c, 16, RunnerDType::kBFloat16));
  EXPECT_EQ((*fp8)->stats().kv_cache_dtype, KvCacheDType::kFp8);
  EXPECT_EQ((*bf16)->stats().kv_cache_dtype, KvCacheDType::kAuto);
  config.kv_cache_dtype = KvCacheDType::kFp8;
  config.dtype = RunnerDType::kFloat32;
  auto refused = ModelRunner::Create(**checkpoint, config);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--dtype bfloat16"), std::string::npos)
      << refused.status();
}

// A checkpoint's calibrated scales (compressed-tensors' kv_cache_scheme: self_attn.k_scale and
// v_scale per layer, here 0.05 x (layer + 1) and 0.05 x (layer + 2) / 2) are the cache's: the
// FP8 cache with them against the same checkpoint's bf16 cache, a token a step and in chunks of
// 8 (a scale applied on one side only would be off by 20x and more).
TEST(Fp8KvCachePoolGpuTest, CheckpointScales) {
  if (!CheckFp8Device().ok()) GTEST_SKIP() << "FP8 GPU test skipped: " << CheckFp8Device();
  const std::string fixture = testing::HfTinyDir("llama-gqa");
  auto dir = testing::WriteFp8Checkpoint(fixture,
                                         testing::Fp8CheckpointLayout::kCompressedTensorsChannel,
                                         32, 64, true, /*kv_scale=*/0.05f);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto checkpoint = OpenCheckpoint(*dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadReference(fixture);
  RunnerConfig config = KvConfig(KvCacheDType::kFp8, 0);
  config.quantization = RunnerQuantization::kNone;  // the weights dequantized: KV alone
  auto fp8 = ModelRunner::Create(**checkpoint, config);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  config.kv_cache_dtype = KvCacheDType::kAuto;
  auto bf16 = ModelRunner::Create(**checkpoint, config);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  for (const size_t chunk : {size_t{1}, size_t{8}}) {
    SCOPED_TRACE(chunk == 1 ? "decode" : "chunks");
    testing::QuantizedAccuracy accuracy;
    for (const auto& prompt : ref.prompts) {
      const std::vector<float> got = testing::PromptLogits(**fp8, prompt, chunk);
      const std::vector<float> want = testing::PromptLogits(**bf16, prompt, chunk);
      ASSERT_EQ(got.size(), want.size());
      accuracy.Add(got, want, (*fp8)->model_config().vocab_size);
    }
    std::printf("[ fp8 kv   ] llama-gqa, checkpoint scales, against its bf16 cache: relative L2 "
                "%.3g, top-1 %lld of %lld decisive rows\n",
                accuracy.relative_l2(), static_cast<long long>(accuracy.decisive_agree),
                static_cast<long long>(accuracy.decisive_rows));
    EXPECT_LE(accuracy.relative_l2(), 4e-2);
    EXPECT_GE(accuracy.top1_agreement(), 0.98);
  }
}

}  // namespace
}  // namespace lmserve::engine
