// The same model gives the same numbers from either file: each fixture model written by the project
// as GGUF (F32, F16, Q8_0; llama's Q/K rows permuted as llama.cpp's converter does) is run by the
// CPU runner and compared with its safetensors form.
//
// F32 holds the same weights, but llama-architecture GGUF rotates interleaved pairs over permuted
// Q/K rows, so q.k is summed in another order: the logits agree to fp32 rounding, not bit for bit.
// The bound is 1e-5 absolute for logits up to 10 and 1e-5 * |logit| / 10 beyond (the fixture with
// tied embeddings reaches |logit| 218, where one fp32 step is 1.5e-5). F16 and Q8_0 round the
// weights: their error is printed, and bounded only loosely (a wrong permutation or dequantization
// gives errors of the logits' own size).

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/checkpoint.h"
#include "engine/model/gguf_writer.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

// Teacher-forced logits of every fixture prompt, [sum of prompt lengths, vocab].
std::vector<float> AllLogits(const Checkpoint& checkpoint, const std::string& model,
                             RunnerDType dtype = RunnerDType::kFloat32) {
  RunnerConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.num_threads = 1;
  config.dtype = dtype;  // float32 unless asked: the fp32 reference path
  auto runner = ModelRunner::Create(checkpoint, config);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return {};
  const testing::HfTinyReference ref = testing::LoadHfTinyReference(model);
  std::vector<float> all;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    const int32_t block = (*runner)->block_size_tokens();
    std::vector<int32_t> blocks((prompt.size() + block - 1) / block);
    std::iota(blocks.begin(), blocks.end(), 0);
    StepBatch batch;
    batch.AddSequence(prompt, 0, blocks, LogitsMode::kAll);
    StepOutput output;
    EXPECT_TRUE((*runner)->Execute(batch, &output).ok());
    all.insert(all.end(), output.logits.begin(), output.logits.end());
  }
  return all;
}

TEST(GgufLogitsTest, GgufFormsGiveTheSafetensorsLogits) {
  struct Form {
    GgufOutputType type;
    const char* name;
    double bound;  // max abs error allowed, times max(1, max |logit| / 10)
  };
  // F32 holds the bf16 weights exactly: only summation order may differ. F16 rounds weights with
  // 11-bit mantissas (bf16 has 8): exact except for tiny values. Q8_0 quantizes to 8 bits per block.
  const Form forms[] = {{GgufOutputType::kF32, "F32", 1e-5},
                        {GgufOutputType::kF16, "F16", 1e-3},
                        {GgufOutputType::kQ8_0, "Q8_0", 0.25}};
  for (const std::string& model : testing::HfTinyModelNames()) {
    auto hf = OpenCheckpoint(testing::HfTinyDir(model));
    ASSERT_TRUE(hf.ok()) << hf.status();
    const std::vector<float> expected = AllLogits(**hf, model);
    double max_abs_logit = 0;
    for (float v : expected) max_abs_logit = std::max<double>(max_abs_logit, std::fabs(v));
    for (const Form& form : forms) {
      const std::string path = testing::TempDir() + "/" + model + "-" + form.name + ".gguf";
      ASSERT_TRUE(WriteGgufCheckpoint(**hf, form.type, path).ok()) << model << " " << form.name;
      auto gguf = OpenCheckpoint(path);
      ASSERT_TRUE(gguf.ok()) << gguf.status();
      if (model.rfind("llama", 0) == 0) {
        EXPECT_EQ((*gguf)->config().rope.layout, RopeLayout::kInterleaved) << model;
      }
      const std::vector<float> actual = AllLogits(**gguf, model);
      ASSERT_EQ(actual.size(), expected.size());
      double max_err = 0;
      for (size_t i = 0; i < actual.size(); ++i) {
        max_err = std::max<double>(max_err, std::fabs(actual[i] - expected[i]));
      }
      std::printf("%-28s GGUF %-5s max |logit - safetensors logit| = %.3g (|logit| max %.1f)\n",
                  model.c_str(), form.name, max_err, max_abs_logit);
      EXPECT_LE(max_err, form.bound * std::max(1.0, max_abs_logit / 10)) << model << " " << form.name;
      std::remove(path.c_str());
    }
  }
}

// The CPU runner's native path (issue 22: weights kept in the file's types) against its fp32 path
// on the same file: bf16 safetensors and F16 GGUF are converted exactly and summed in another
// order (the F32 bound above); Q8_0 GGUF multiplies int8-quantized activations, whose relative L2
// error against the fp32 path is printed and bounded.
TEST(GgufLogitsTest, NativeWeightsFollowTheFloat32Path) {
  for (const std::string& model : testing::HfTinyModelNames()) {
    auto hf = OpenCheckpoint(testing::HfTinyDir(model));
    ASSERT_TRUE(hf.ok()) << hf.status();
    for (const char* form : {"safetensors", "F16", "Q8_0"}) {
      const std::string path = testing::TempDir() + "/" + model + "-native-" + form + ".gguf";
      std::unique_ptr<Checkpoint> gguf;
      if (std::string(form) != "safetensors") {
        const GgufOutputType type =
            std::string(form) == "F16" ? GgufOutputType::kF16 : GgufOutputType::kQ8_0;
        ASSERT_TRUE(WriteGgufCheckpoint(**hf, type, path).ok()) << model << " " << form;
        auto opened = OpenCheckpoint(path);
        ASSERT_TRUE(opened.ok()) << opened.status();
        gguf = *std::move(opened);
      }
      const Checkpoint& checkpoint = gguf != nullptr ? *gguf : **hf;
      const std::vector<float> want = AllLogits(checkpoint, model);
      const std::vector<float> got = AllLogits(checkpoint, model, RunnerDType::kNative);
      ASSERT_EQ(got.size(), want.size());
      double max_abs_logit = 0, max_err = 0, diff = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_abs_logit = std::max<double>(max_abs_logit, std::fabs(want[i]));
        max_err = std::max<double>(max_err, std::fabs(got[i] - want[i]));
        diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
        norm += double{want[i]} * want[i];
      }
      const double relative_l2 = std::sqrt(diff / std::max(norm, 1e-30));
      std::printf("%-28s %-11s native vs float32: max |diff| %.3g, relative L2 %.3g\n",
                  model.c_str(), form, max_err, relative_l2);
      if (std::string(form) == "Q8_0") {
        EXPECT_GT(relative_l2, 0.0) << model << ": the int8 path did not run";
        EXPECT_LE(relative_l2, 0.02) << model;
      } else {
        EXPECT_LE(max_err, 1e-5 * std::max(1.0, max_abs_logit / 10)) << model << " " << form;
      }
      if (gguf != nullptr) std::remove(path.c_str());
    }
  }
}

}  // namespace
}  // namespace lmserve::engine
