// GGUF blocks on the CUDA runner (issue 23): fixture models written as GGUF in Q8_0, Q4_0, Q4_K,
// Q6_K and a Q4_K_M-like mix (engine/model/gguf_writer.h: Q4_K with the v and down projections
// in Q6_K, so the fused QKV holds two block types; llama-hd128's down projection, 640 columns,
// falls back to Q8_0 in its K-quant files), served with their blocks kept on the GPU
// (--quantization gguf), against the CPU runner's float32 path on the same file (the blocks
// dequantized exactly, fp32 GEMMs). Each prompt runs whole (its 33- and 130-token prompts
// through the dequantize-then-cuBLASLt path) and in chunks of 8 and 3 (the quantized skinny
// kernel), and the runner's weight bytes are the blocks' (below the dequantized bf16 runner's).
// The bound is bf16's: the same as the bf16 runner that dequantizes the blocks at load
// (--quantization none), whose error against the CPU is measured beside it, with a little room
// (bf16 rounding of other values differs between the two), and at most 3e-2 relative L2.
// Also: dummy weights in each block type (--load-format dummy --quantization q4_k ...), and the
// refusals. Skipped without a GPU.

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/fp8_checkpoint.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

RunnerConfig GpuConfig(RunnerQuantization quantization, DecodeGemm decode_gemm) {
  RunnerConfig config;
  config.backend = Backend::kCuda;
  config.decode_gemm = decode_gemm;
  config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
  config.quantization = quantization;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 512;
  config.cuda_graphs = false;
  return config;
}

struct GgufCase {
  const char* model;  // hf-tiny
  GgufOutputType type;
  const char* type_name;
};

class GgufBlocksGpuTest : public ::testing::TestWithParam<GgufCase> {};

TEST_P(GgufBlocksGpuTest, BlocksOnTheGpuFollowTheCpuFloat32Path) {
  if (absl::Status s = CheckCudaDevice(); !s.ok()) GTEST_SKIP() << "GPU test skipped: " << s;
  const GgufCase& c = GetParam();
  auto hf = OpenCheckpoint(testing::HfTinyDir(c.model));
  ASSERT_TRUE(hf.ok()) << hf.status();
  const std::string path = testing::TempDir() + "/" + c.model + "-" + c.type_name + ".gguf";
  ASSERT_TRUE(WriteGgufCheckpoint(**hf, c.type, path).ok());
  auto checkpoint = OpenCheckpoint(path);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadHfTinyReference(c.model);

  RunnerConfig cpu_config;
  cpu_config.dtype = RunnerDType::kFloat32;
  cpu_config.kv_cache_bytes = int64_t{64} << 20;
  auto cpu = ModelRunner::Create(**checkpoint, cpu_config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<std::vector<float>> want;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    want.push_back(testing::PromptLogits(**cpu, prompt));
  }
  const int64_t vocab = (*checkpoint)->config().vocab_size;

  auto dequantized =
      ModelRunner::Create(**checkpoint, GpuConfig(RunnerQuantization::kNone, DecodeGemm::kAuto));
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  ASSERT_EQ((*dequantized)->stats().quantization, RunnerQuantization::kNone);
  // Blocks are opt-in: auto dequantizes them at load, as none does.
  auto automatic =
      ModelRunner::Create(**checkpoint, GpuConfig(RunnerQuantization::kAuto, DecodeGemm::kAuto));
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->stats().quantization, RunnerQuantization::kNone);
  EXPECT_EQ((*automatic)->stats().weight_bytes, (*dequantized)->stats().weight_bytes);
  // Whole prompts; chunks of 8 (steps of 8 tokens and the prompts' remainders 1, 7 and 2), of 3
  // (the kernel's 4-token form) and of 1 (every step a decode step's shape: the integer products
  // of Q4_K, Q8_0 and Q6_K where k allows, quant_gemm.h): every form of the skinny kernel.
  for (const size_t chunk : {size_t{0}, size_t{8}, size_t{3}, size_t{1}}) {
    SCOPED_TRACE(chunk == 0 ? std::string("whole prompts") : StrCat("chunks of ", chunk));
    auto blocks =
        ModelRunner::Create(**checkpoint, GpuConfig(RunnerQuantization::kGguf, DecodeGemm::kAuto));
    ASSERT_TRUE(blocks.ok()) << blocks.status();
    EXPECT_EQ((*blocks)->stats().quantization, RunnerQuantization::kGguf);
    EXPECT_LT((*blocks)->stats().weight_bytes, (*dequantized)->stats().weight_bytes);
    testing::QuantizedAccuracy accuracy, baseline;
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      const std::vector<float> got = testing::PromptLogits(**blocks, ref.prompts[j], chunk);
      const std::vector<float> base = testing::PromptLogits(**dequantized, ref.prompts[j], chunk);
      ASSERT_EQ(got.size(), want[j].size());
      ASSERT_EQ(base.size(), want[j].size());
      accuracy.Add(got, want[j], vocab);
      baseline.Add(base, want[j], vocab);
    }
    std::printf(
        "[ gguf     ] %-28s %-5s %-6s weights %lld of %lld bytes; relative L2 to the CPU "
        "%.3g (dequantized at load: %.3g), top-1 %lld of %lld decisive rows\n",
        c.model, c.type_name,
        chunk == 0 ? "whole" : StrCat("chunk", chunk).c_str(),
        static_cast<long long>((*blocks)->stats().weight_bytes),
        static_cast<long long>((*dequantized)->stats().weight_bytes), accuracy.relative_l2(),
        baseline.relative_l2(), static_cast<long long>(accuracy.decisive_agree),
        static_cast<long long>(accuracy.decisive_rows));
    EXPECT_LE(accuracy.relative_l2(), std::fmax(1.5 * baseline.relative_l2(), 1e-2));
    EXPECT_LE(accuracy.relative_l2(), 3e-2);
    EXPECT_GE(accuracy.top1_agreement(), 0.98);
    // Steps of one token (every step of chunks of 1, the remainders of others) fold the add +
    // RMSNorms into the integer products where every block type of QKV and gate/up takes them
    // (k, the hidden size, a multiple of 256; not Q4_0), and only there
    // (RunnerConfig::fold_add_norm; the dequantized runner's 16-bit skinny kernel folds them too).
    const bool folds =
        c.type != GgufOutputType::kQ4_0 && (*checkpoint)->config().hidden_size % 256 == 0;
    if (!folds) {
      EXPECT_EQ((*blocks)->stats().num_folded_add_norms, 0);
    } else if (chunk == 1) {
      EXPECT_GT((*blocks)->stats().num_folded_add_norms, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, GgufBlocksGpuTest,
    ::testing::Values(GgufCase{"llama-gqa", GgufOutputType::kQ8_0, "Q8_0"},
                      GgufCase{"qwen2-bias", GgufOutputType::kQ4_0, "Q4_0"},
                      GgufCase{"llama-mqa-tied-llama3rope", GgufOutputType::kQ4_K, "Q4_K"},
                      GgufCase{"llama-mqa-tied-llama3rope", GgufOutputType::kQ6_K, "Q6_K"},
                      // Q/K Q4_K and V Q6_K in one fused QKV (two block segments), down Q6_K.
                      GgufCase{"llama-mqa-tied-llama3rope", GgufOutputType::kQ4_K_M, "Q4_K_M"},
                      GgufCase{"llama-hd128", GgufOutputType::kQ4_K, "Q4_K"}),
    [](const ::testing::TestParamInfo<GgufCase>& info) {
      std::string name = std::string(info.param.model) + "_" + info.param.type_name;
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

// Dummy weights in each block type: the runner holds them in blocks (fewer bytes than bf16),
// and a prompt and a decode step give finite logits.
TEST(GgufBlocksGpuTest, DummyWeightsInEveryBlockType) {
  if (absl::Status s = CheckCudaDevice(); !s.ok()) GTEST_SKIP() << "GPU test skipped: " << s;
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-mqa-tied-llama3rope"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig bf16 = GpuConfig(RunnerQuantization::kNone, DecodeGemm::kAuto);
  bf16.load_format = LoadFormat::kDummy;
  auto plain = ModelRunner::Create(**checkpoint, bf16);
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (RunnerQuantization q : {RunnerQuantization::kQ8_0, RunnerQuantization::kQ4_0,
                               RunnerQuantization::kQ4_K, RunnerQuantization::kQ6_K}) {
    SCOPED_TRACE(std::string(RunnerQuantizationName(q)));
    RunnerConfig config = GpuConfig(q, DecodeGemm::kAuto);
    config.load_format = LoadFormat::kDummy;
    auto runner = ModelRunner::Create(**checkpoint, config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    EXPECT_EQ((*runner)->stats().quantization, q);
    EXPECT_LT((*runner)->stats().weight_bytes, (*plain)->stats().weight_bytes);
    const std::vector<int32_t> prompt = {1, 17, 300, 5, 9, 44, 2, 8, 100, 7, 3, 12};
    for (size_t chunk : {size_t{0}, size_t{1}}) {
      const std::vector<float> logits = testing::PromptLogits(**runner, prompt, chunk);
      ASSERT_EQ(logits.size(), prompt.size() * (*runner)->model_config().vocab_size);
      for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

TEST(GgufBlocksTest, BlockTypesAreRefusedWhereTheyDoNotApply) {
  auto checkpoint = OpenCheckpoint(testing::HfTinyDir("llama-gqa"));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  RunnerConfig cpu;
  cpu.quantization = RunnerQuantization::kQ4_K;
  cpu.load_format = LoadFormat::kDummy;
  auto refused = ModelRunner::Create(**checkpoint, cpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.status().message()).find("q4_k"), std::string::npos)
      << refused.status();
  if (absl::Status s = CheckCudaDevice(); !s.ok()) GTEST_SKIP() << "GPU part skipped: " << s;
  // A block type with the checkpoint's weights, and in float32.
  RunnerConfig gpu = GpuConfig(RunnerQuantization::kQ8_0, DecodeGemm::kAuto);
  auto not_dummy = ModelRunner::Create(**checkpoint, gpu);
  ASSERT_FALSE(not_dummy.ok());
  EXPECT_NE(std::string(not_dummy.status().message()).find("--load-format dummy"),
            std::string::npos)
      << not_dummy.status();
  gpu.load_format = LoadFormat::kDummy;
  gpu.dtype = RunnerDType::kFloat32;
  auto f32 = ModelRunner::Create(**checkpoint, gpu);
  ASSERT_FALSE(f32.ok());
  EXPECT_NE(std::string(f32.status().message()).find("bfloat16"), std::string::npos)
      << f32.status();
  EXPECT_EQ(RunnerQuantizationFromName("q4_k"), RunnerQuantization::kQ4_K);
  EXPECT_EQ(RunnerQuantizationFromName("gguf"), RunnerQuantization::kGguf);
  EXPECT_EQ(RunnerQuantizationBlockType(RunnerQuantization::kQ6_K), kernels::DType::kQ6_K);
  EXPECT_FALSE(RunnerQuantizationBlockType(RunnerQuantization::kGguf).has_value());
}

}  // namespace
}  // namespace lmserve::engine
