// Mamba-2 (tests/fixtures/hf-families/mamba2-ssm) on the CUDA runner, beyond family_gpu_test.cc:
// in float32, the state carried between prefill chunks (chunks of 1, 7, 32 and 50 tokens against
// one chunk), the CPU runner's logits, and sequences prefilling and decoding in one step (the
// conv and scan kernels, not the fused decode one) in slots that are not their batch indices,
// against each alone. Bounds: 1e-4 on the fixture tests' scale (testing::ScaledError): the GPU's
// scan sums in fp32 where the CPU's sums in double. In bfloat16, decode steps of one token (the
// gated norm folded into the decode kernel and out_proj) against the reference's logits; and
// prefill chunks of 7, 32 and 50 tokens and the whole prompt (the chunked SSD scan, its state
// carried through the slot between steps) against the reference and against each other.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

class SsmGpuRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CheckCudaDevice().ok()) GTEST_SKIP() << "CUDA runner test skipped: " << CheckCudaDevice();
    dir_ = testing::HfFamilyDir("mamba2-ssm");
    auto checkpoint = OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    ref_ = testing::LoadReference(dir_);
  }

  std::unique_ptr<ModelRunner> Runner(Backend backend, RunnerDType dtype = RunnerDType::kFloat32,
                                      bool fuse_ssm_norm = true, bool prefill_legacy = false,
                                      bool fold_add_norm = true) {
    RunnerConfig config;
    config.backend = backend;
    config.dtype = dtype;
    config.fuse_ssm_norm = fuse_ssm_norm;
    config.fold_add_norm = fold_add_norm;
    config.ssm_prefill_legacy = prefill_legacy;
    if (backend == Backend::kCuda) {
      config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
    }
    config.kv_cache_bytes = int64_t{16} << 20;
    config.max_num_seqs = 8;
    config.max_num_batched_tokens = 512;
    config.num_threads = 2;
    auto runner = ModelRunner::Create(*checkpoint_, config);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }

  // Teacher-forced logits of `prompt` in slot `slot`, in chunks of `chunk` (0: at once).
  static std::vector<float> Logits(ModelRunner& runner, const std::vector<int32_t>& prompt,
                                   size_t chunk = 0, int32_t slot = 0) {
    return testing::PromptLogits(runner, prompt, chunk, slot);
  }

  std::string dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
  testing::HfTinyReference ref_;
};

TEST_F(SsmGpuRunnerTest, Float32ChunkedPrefillAndTheCpuRunnerAgree) {
  std::unique_ptr<ModelRunner> gpu = Runner(Backend::kCuda);
  std::unique_ptr<ModelRunner> cpu = Runner(Backend::kCpu);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(gpu->num_state_slots(), 8);
  const std::vector<int32_t>& prompt = ref_.prompts[3];  // 130 tokens
  const std::vector<float> whole = Logits(*gpu, prompt);
  const std::vector<float> on_cpu = Logits(*cpu, prompt);
  ASSERT_EQ(whole.size(), on_cpu.size());
  const double cpu_error = testing::ScaledError(whole, on_cpu);
  std::printf("[ cpu      ] scaled max |GPU fp32 logit - CPU logit| %.3g\n", cpu_error);
  EXPECT_LE(cpu_error, 1e-4);
  for (size_t chunk : {1, 7, 32, 50}) {
    const std::vector<float> chunked = Logits(*gpu, prompt, chunk, 3);
    ASSERT_EQ(chunked.size(), whole.size());
    const double error = testing::ScaledError(chunked, whole);
    std::printf("[ chunks   ] of %2zu: scaled max |logit - one chunk's| %.3g\n", chunk, error);
    EXPECT_LE(error, 1e-4) << "chunks of " << chunk;
  }
}

// Bfloat16 decode steps of one token (chunks of 1 after the first: the SSM decode kernel with the
// gated RMSNorm's gating folded in, out_proj's skinny GEMM with its scale and k split), which the
// fixture tests' one-step prefill does not run; and the second layer's add + RMSNorm folded into
// in_proj's skinny GEMM, its residual settled by out_proj's): teacher-forced logits against the
// reference's, relative L2 at most 2e-2 and top-1 at least 99% as family_gpu_test.cc holds bf16
// to; and against the same steps with both folds off (RunnerConfig::fuse_ssm_norm and
// fold_add_norm) and with the add + RMSNorm's alone off, within bf16's rounding.
TEST_F(SsmGpuRunnerTest, Bfloat16DecodeStepsMatchTheReference) {
  std::unique_ptr<ModelRunner> fused = Runner(Backend::kCuda, RunnerDType::kBFloat16, true);
  std::unique_ptr<ModelRunner> unfused = Runner(Backend::kCuda, RunnerDType::kBFloat16, false,
                                                /*prefill_legacy=*/false, /*fold_add_norm=*/false);
  std::unique_ptr<ModelRunner> norm_kernel = Runner(
      Backend::kCuda, RunnerDType::kBFloat16, true, /*prefill_legacy=*/false, false);
  ASSERT_NE(fused, nullptr);
  ASSERT_NE(unfused, nullptr);
  ASSERT_NE(norm_kernel, nullptr);
  const int64_t vocab = fused->model_config().vocab_size;
  int64_t top1 = 0, rows = 0;
  for (size_t j : {size_t{0}, size_t{3}}) {
    const std::vector<int32_t>& prompt = ref_.prompts[j];
    const std::vector<float> got = Logits(*fused, prompt, /*chunk=*/1);
    const std::vector<float> plain = Logits(*unfused, prompt, /*chunk=*/1);
    const std::vector<float> unfolded = Logits(*norm_kernel, prompt, /*chunk=*/1);
    const std::vector<float> want = testing::LoadReferenceLogits(dir_, static_cast<int>(j));
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(plain.size(), want.size());
    ASSERT_EQ(unfolded.size(), want.size());
    auto relative_l2_of_got = [&](const std::vector<float>& against) {
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        num += (double{got[i]} - against[i]) * (double{got[i]} - against[i]);
        den += double{against[i]} * against[i];
      }
      return std::sqrt(num / den);
    };
    const double relative_l2 = relative_l2_of_got(want), fold_l2 = relative_l2_of_got(plain);
    const double add_norm_l2 = relative_l2_of_got(unfolded);
    for (size_t r = 0; r < prompt.size(); ++r) {
      const float* g = got.data() + r * vocab;
      const float* w = want.data() + r * vocab;
      top1 += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
      ++rows;
    }
    std::printf("[ decode   ] bf16 prompt %zu, steps of 1: relative L2 %.3g against the "
                "reference, %.3g against both norms unfolded, %.3g against the add + RMSNorm "
                "unfolded\n",
                j, relative_l2, fold_l2, add_norm_l2);
    EXPECT_LE(relative_l2, 2e-2) << "prompt " << j;
    EXPECT_LE(fold_l2, 2e-2) << "prompt " << j;
    EXPECT_LE(add_norm_l2, 2e-2) << "prompt " << j;
  }
  std::printf("[ decode   ] bf16 top-1: %lld of %lld rows\n", static_cast<long long>(top1),
              static_cast<long long>(rows));
  EXPECT_GE(top1, 0.99 * static_cast<double>(rows));
}

// Relative L2 of `got` against `want` and the rows of `vocab` logits whose top-1 agree.
struct LogitsAgreement {
  double relative_l2 = 0;
  int64_t top1 = 0, rows = 0;
};
LogitsAgreement Agreement(const std::vector<float>& got, const std::vector<float>& want,
                          int64_t vocab) {
  LogitsAgreement a;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  a.relative_l2 = got.size() == want.size() && den > 0 ? std::sqrt(num / den) : INFINITY;
  for (size_t r = 0; (r + 1) * vocab <= got.size() && (r + 1) * vocab <= want.size(); ++r) {
    const float* g = got.data() + r * vocab;
    const float* w = want.data() + r * vocab;
    a.top1 += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
    ++a.rows;
  }
  return a;
}

// Bfloat16 prefill of prompt 3 (130 tokens) at once and in chunks of 7, 32 and 50 (the SSD scan
// over 3 chunks of its 64 tokens, or short chunks whose state comes from the slot), against the
// reference (relative L2 at most 2e-2, top-1 at least 99%, as family_gpu_test.cc holds bf16 to)
// and against the prompt at once (2e-2); the prompt at once also against the earlier kernels
// (RunnerConfig::ssm_prefill_legacy: the exact recurrence) within 2e-2.
TEST_F(SsmGpuRunnerTest, Bfloat16ChunkedPrefillMatchesTheReference) {
  std::unique_ptr<ModelRunner> gpu = Runner(Backend::kCuda, RunnerDType::kBFloat16);
  std::unique_ptr<ModelRunner> legacy =
      Runner(Backend::kCuda, RunnerDType::kBFloat16, true, /*prefill_legacy=*/true);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(legacy, nullptr);
  const int64_t vocab = gpu->model_config().vocab_size;
  const std::vector<int32_t>& prompt = ref_.prompts[3];
  const std::vector<float> want = testing::LoadReferenceLogits(dir_, 3);
  const std::vector<float> whole = Logits(*gpu, prompt);
  const std::vector<float> old_kernels = Logits(*legacy, prompt);
  ASSERT_EQ(whole.size(), want.size());
  for (size_t chunk : {0, 7, 32, 50}) {
    const std::vector<float> got = chunk == 0 ? whole : Logits(*gpu, prompt, chunk, 3);
    const LogitsAgreement reference = Agreement(got, want, vocab);
    const LogitsAgreement at_once = Agreement(got, whole, vocab);
    std::printf("[ prefill  ] bf16 chunks of %2zu: relative L2 %.3g against the reference, top-1 "
                "%lld of %lld; %.3g against the prompt at once\n",
                chunk, reference.relative_l2, static_cast<long long>(reference.top1),
                static_cast<long long>(reference.rows), at_once.relative_l2);
    EXPECT_LE(reference.relative_l2, 2e-2) << "chunks of " << chunk;
    EXPECT_GE(reference.top1, 0.99 * static_cast<double>(reference.rows)) << "chunks of " << chunk;
    EXPECT_LE(at_once.relative_l2, 2e-2) << "chunks of " << chunk;
  }
  const LogitsAgreement legacy_agreement = Agreement(whole, old_kernels, vocab);
  std::printf("[ prefill  ] bf16 at once: relative L2 %.3g against the earlier kernels\n",
              legacy_agreement.relative_l2);
  EXPECT_LE(legacy_agreement.relative_l2, 2e-2);
}

// Mamba-2's own heads (64 of state 128, the SSD kernel's main shape, which the fixture's 32 x 16
// heads do not run): a two-layer model of dummy weights, bf16. A prompt of 150 tokens at once
// against the earlier kernels (the recurrence), and in chunks of 7 and 50 against at once:
// relative L2 of the logits at most 2e-2 and top-1 agreeing on at least 95% of the rows.
TEST_F(SsmGpuRunnerTest, Bfloat16SsdOnMamba2HeadsMatchesTheRecurrence) {
  const std::string dir = testing::TempDir();
  {
    std::ofstream config(dir + "/config.json");
    config << R"({"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2",
      "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 512, "num_heads": 8,
      "head_dim": 64, "state_size": 128, "n_groups": 1, "expand": 2, "conv_kernel": 4,
      "chunk_size": 256, "use_conv_bias": true, "use_bias": false, "rms_norm": true,
      "layer_norm_epsilon": 1e-05, "tie_word_embeddings": true, "bos_token_id": 0,
      "eos_token_id": 0, "torch_dtype": "bfloat16"})";
  }
  auto checkpoint = OpenConfigOnlyCheckpoint(dir + "/config.json");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto make = [&](bool legacy) -> std::unique_ptr<ModelRunner> {
    RunnerConfig config;
    config.backend = Backend::kCuda;
    config.dtype = RunnerDType::kBFloat16;
    config.load_format = LoadFormat::kDummy;
    config.ssm_prefill_legacy = legacy;
    config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
    config.kv_cache_bytes = int64_t{16} << 20;
    config.max_num_seqs = 4;
    config.max_num_batched_tokens = 512;
    auto runner = ModelRunner::Create(**checkpoint, config);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  };
  std::unique_ptr<ModelRunner> ssd = make(false), recurrence = make(true);
  ASSERT_NE(ssd, nullptr);
  ASSERT_NE(recurrence, nullptr);
  const int64_t vocab = ssd->model_config().vocab_size;
  std::vector<int32_t> prompt(150);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  const std::vector<float> whole = Logits(*ssd, prompt);
  const std::vector<float> exact = Logits(*recurrence, prompt);
  ASSERT_EQ(whole.size(), prompt.size() * vocab);
  const LogitsAgreement against_exact = Agreement(whole, exact, vocab);
  std::printf("[ mamba2   ] bf16 64 x 128 heads: SSD against the recurrence: relative L2 %.3g, "
              "top-1 %lld of %lld\n",
              against_exact.relative_l2, static_cast<long long>(against_exact.top1),
              static_cast<long long>(against_exact.rows));
  EXPECT_LE(against_exact.relative_l2, 2e-2);
  EXPECT_GE(against_exact.top1, 0.95 * static_cast<double>(against_exact.rows));
  for (size_t chunk : {7, 50}) {
    const LogitsAgreement a = Agreement(Logits(*ssd, prompt, chunk, 2), whole, vocab);
    std::printf("[ mamba2   ] bf16 64 x 128 heads: chunks of %zu against at once: relative L2 "
                "%.3g, top-1 %lld of %lld\n",
                chunk, a.relative_l2, static_cast<long long>(a.top1),
                static_cast<long long>(a.rows));
    EXPECT_LE(a.relative_l2, 2e-2) << "chunks of " << chunk;
    EXPECT_GE(a.top1, 0.95 * static_cast<double>(a.rows)) << "chunks of " << chunk;
  }
}

// Steps that mix prefills and decodes run the conv and scan kernels for every sequence; each
// sequence gets the logits it has alone.
TEST_F(SsmGpuRunnerTest, MixedStepsKeepEachSequencesState) {
  std::unique_ptr<ModelRunner> gpu = Runner(Backend::kCuda);
  ASSERT_NE(gpu, nullptr);
  const int64_t vocab = gpu->model_config().vocab_size;
  // A (33 tokens) prefilled alone in step 0; then B (130 tokens) prefills in chunks of 40 while A
  // decodes, in slots 5 and 2.
  const std::vector<int32_t>& a = ref_.prompts[2];
  const std::vector<int32_t>& b = ref_.prompts[3];
  std::vector<int32_t> a_sequence = a;
  a_sequence.insert(a_sequence.end(), ref_.greedy[2].begin(), ref_.greedy[2].begin() + 4);
  const std::vector<float> a_alone = Logits(*gpu, a_sequence, 0, 0);
  const std::vector<float> b_alone = Logits(*gpu, b, 0, 0);
  const std::vector<int32_t> a_blocks = testing::ConsecutiveBlocks(*gpu, 64),
                             b_blocks = testing::ConsecutiveBlocks(*gpu, 160, 8);
  {
    StepBatch batch;
    batch.AddSequence(a, 0, a_blocks, LogitsMode::kLast, 5);
    StepOutput output;
    ASSERT_TRUE(gpu->Execute(batch, &output).ok());
  }
  for (int step = 0; step < 4; ++step) {
    StepBatch batch;
    const int32_t token = ref_.greedy[2][static_cast<size_t>(step)];
    const int32_t a_computed = static_cast<int32_t>(a.size()) + step;
    batch.AddSequence(std::span(&token, 1), a_computed, a_blocks, LogitsMode::kLast, 5);
    const size_t b_start = static_cast<size_t>(step) * 40;
    const size_t b_count = std::min<size_t>(40, b.size() - b_start);
    batch.AddSequence(std::span(b).subspan(b_start, b_count), static_cast<int32_t>(b_start),
                      b_blocks, LogitsMode::kAll, 2);
    StepOutput output;
    ASSERT_TRUE(gpu->Execute(batch, &output).ok());
    const std::span<const float> a_got(output.logits.data(), static_cast<size_t>(vocab));
    const std::span<const float> a_want(a_alone.data() + (a_computed) * vocab,
                                        static_cast<size_t>(vocab));
    EXPECT_LE(testing::ScaledError(a_got, a_want), 1e-4) << "A, step " << step;
    const std::span<const float> b_got(output.logits.data() + vocab, b_count * vocab);
    const std::span<const float> b_want(b_alone.data() + b_start * vocab, b_count * vocab);
    EXPECT_LE(testing::ScaledError(b_got, b_want), 1e-4) << "B, step " << step;
  }
}

}  // namespace
}  // namespace lmserve::engine
