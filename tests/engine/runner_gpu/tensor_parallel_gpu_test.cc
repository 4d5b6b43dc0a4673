// Tensor parallelism on two GPUs (engine/runner/tensor_parallel_runner.h, NCCL): the fixtures on
// two ranks against one GPU. float32: teacher-forced logits within 1e-4 of one GPU's (scaled
// beyond |logit| 10; sums in another order) and the same greedy tokens through decode steps replayed from the ranks' CUDA
// graphs; bf16: relative L2 against Hugging Face's float64 logits within 2e-2, as one GPU's.
// Skipped without two supported GPUs or without NCCL (nccl_communicator.h says where it looks).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "engine/model/checkpoint.h"
#include "engine/runner/cuda/nccl_communicator.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/allreduce.h"
#include "tests/gpu_main/kernel_path.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

struct Fixture {
  const char* name;
  bool family;
};

const Fixture kFixtures[] = {
    {"llama-gqa", false},          {"llama-mqa-tied-llama3rope", false},
    {"qwen2-bias", false},         {"qwen3-qknorm", true},
    {"gemma2-softcap-sliding", true}, {"phi3-fused", true},
    {"mistral-sliding", true},     {"qwen3-moe", true},
    {"mixtral-moe", true},
};

absl::StatusOr<std::unique_ptr<ModelRunner>> Runner(const Checkpoint& checkpoint,
                                                    RunnerDType dtype, int32_t tp) {
  RunnerConfig config;
  config.backend = Backend::kCuda;
  config.cuda_kernel_path = lmserve::testing::KernelPathUnderTest<CudaKernelPath>();
  config.dtype = dtype;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 512;
  config.tensor_parallel_size = tp;
  return ModelRunner::Create(checkpoint, config);
}

std::vector<int32_t> Blocks(int64_t tokens) {
  std::vector<int32_t> blocks(static_cast<size_t>((tokens + 15) / 16));
  std::iota(blocks.begin(), blocks.end(), 0);
  return blocks;
}

// Teacher-forced logits of `prompt`, then `steps` greedy decode steps (one token each, kSample:
// the graphs); the tokens drawn.
struct Outcome {
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};
Outcome Forward(ModelRunner& runner, const std::vector<int32_t>& prompt, int steps) {
  Outcome run;
  const std::vector<int32_t> blocks = Blocks(static_cast<int64_t>(prompt.size()) + steps);
  StepBatch batch;
  testing::AddSequenceToEveryGroup(&batch, runner, prompt, 0, blocks, LogitsMode::kAll);
  StepOutput output;
  absl::Status status = runner.Execute(batch, &output);
  EXPECT_TRUE(status.ok()) << status;
  run.logits = output.logits;
  const int64_t vocab = runner.model_config().vocab_size;
  int32_t token = static_cast<int32_t>(
      std::max_element(run.logits.end() - vocab, run.logits.end()) - (run.logits.end() - vocab));
  for (int s = 0; s < steps; ++s) {
    run.greedy.push_back(token);
    StepBatch decode;
    testing::AddSequenceToEveryGroup(&decode, runner, std::span(&token, 1),
                                     static_cast<int32_t>(prompt.size()) + s, blocks,
                                     LogitsMode::kSample);
    decode.sampling.push_back({});  // temperature 0: greedy
    status = runner.Execute(decode, &output);
    EXPECT_TRUE(status.ok()) << status;
    token = output.sampled_tokens.empty() ? -1 : output.sampled_tokens[0];
  }
  return run;
}

class TensorParallelGpuTest : public ::testing::TestWithParam<Fixture> {};

TEST_P(TensorParallelGpuTest, TwoGpusGiveOneGpusLogits) {
  if (!CheckCudaDevice(0).ok() || !CheckCudaDevice(1).ok()) {
    GTEST_SKIP() << "needs two supported CUDA GPUs";
  }
  const std::string dir = GetParam().family ? testing::HfFamilyDir(GetParam().name)
                                            : testing::HfTinyDir(GetParam().name);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const testing::HfTinyReference ref = testing::LoadReference(dir);
  for (RunnerDType dtype : {RunnerDType::kFloat32, RunnerDType::kBFloat16}) {
    auto one = Runner(**checkpoint, dtype, 1);
    ASSERT_TRUE(one.ok()) << one.status();
    auto two = Runner(**checkpoint, dtype, 2);
    if (!two.ok() && two.status().message().find("NCCL") != std::string::npos) {
      GTEST_SKIP() << two.status();
    }
    ASSERT_TRUE(two.ok()) << two.status();
    for (size_t j = 0; j < ref.prompts.size(); ++j) {
      const Outcome want = Forward(**one, ref.prompts[j], 8);
      const Outcome got = Forward(**two, ref.prompts[j], 8);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      const std::vector<float> reference = testing::LoadReferenceLogits(dir, static_cast<int>(j));
      double worst = 0, num = 0, num_one = 0, den = 0;
      for (size_t i = 0; i < got.logits.size(); ++i) {
        // Scaled beyond |logit| 10, as the family tests (tied embeddings' logits reach hundreds).
        const double scale = std::max(1.0, std::abs(double{want.logits[i]}) / 10);
        worst = std::max(worst, std::abs(double{got.logits[i]} - want.logits[i]) / scale);
        const double d = double{got.logits[i]} - reference[i];
        const double d_one = double{want.logits[i]} - reference[i];
        num += d * d;
        num_one += d_one * d_one;
        den += double{reference[i]} * reference[i];
      }
      const double relative_l2 = std::sqrt(num / den), one_gpu = std::sqrt(num_one / den);
      std::printf("[ tp 2     ] %-26s %s prompt %zu: scaled max |tp2 - tp1| %.3g, relative L2 %.3g "
                  "(one GPU %.3g)\n",
                  GetParam().name, dtype == RunnerDType::kFloat32 ? "float32 " : "bfloat16", j,
                  worst, relative_l2, one_gpu);
      if (dtype == RunnerDType::kFloat32) {
        EXPECT_LE(worst, 1e-4) << "prompt " << j;
        EXPECT_EQ(got.greedy, want.greedy) << "prompt " << j;
      } else {
        // bf16 rounds the partial sums before they are added: the bound of one GPU, or one GPU's
        // own error with room (a mixture of experts' router may flip at a near-tie either way).
        EXPECT_LE(relative_l2, std::max(2e-2, 1.5 * one_gpu)) << "prompt " << j;
      }
    }
  }
}

// The all-reduce on two GPUs against its CPU twin, the sum in rank order: bit for bit through the
// peer-to-peer kernel (fp32 sums, like the twin's), within bf16 rounding through NCCL (messages
// beyond the kernel's, summed in its own order), replayed from a CUDA graph too.
TEST(TensorParallelGpuAllReduceTest, SumsLikeTheCpuTwin) {
  if (!CheckCudaDevice(0).ok() || !CheckCudaDevice(1).ok()) {
    GTEST_SKIP() << "needs two supported CUDA GPUs";
  }
  auto comms = cuda::CreateNcclCommunicators(0, 2);
  if (!comms.ok()) GTEST_SKIP() << comms.status();
  for (const kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
    for (const int64_t count : {int64_t{8}, int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
      const int64_t element = dtype == kernels::DType::kF32 ? 4 : 2;
      std::vector<std::vector<float>> values(2, std::vector<float>(static_cast<size_t>(count)));
      for (int r = 0; r < 2; ++r) {
        for (int64_t i = 0; i < count; ++i) {
          values[r][i] = static_cast<float>(((i * 37 + r * 11) % 101) - 50) / 16.0f;
        }
      }
      std::vector<std::vector<float>> results(2);
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
          std::vector<uint16_t> bf16(static_cast<size_t>(count));
          const void* host = values[r].data();
          if (dtype == kernels::DType::kBF16) {
            for (int64_t i = 0; i < count; ++i) bf16[i] = kernels::F32ToBf16(values[r][i]);
            host = bf16.data();
          }
          void* data = nullptr;
          cudaStream_t stream;
          ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&data, count * element), cudaSuccess);
          // Twice: eagerly, then the same call replayed from a graph on fresh input.
          for (int pass = 0; pass < 2; ++pass) {
            ASSERT_EQ(cudaMemcpy(data, host, count * element, cudaMemcpyHostToDevice),
                      cudaSuccess);
            if (pass == 0) {
              ASSERT_TRUE((*comms)[r]->AllReduceSum(data, count, dtype, stream).ok());
            } else {
              cudaGraph_t graph;
              cudaGraphExec_t exec;
              ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                        cudaSuccess);
              ASSERT_TRUE((*comms)[r]->AllReduceSum(data, count, dtype, stream).ok());
              ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
              ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
              ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
              ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
              cudaGraphExecDestroy(exec);
              cudaGraphDestroy(graph);
            }
            ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          }
          std::vector<float>& out = results[r];
          out.resize(static_cast<size_t>(count));
          if (dtype == kernels::DType::kBF16) {
            ASSERT_EQ(cudaMemcpy(bf16.data(), data, count * 2, cudaMemcpyDeviceToHost),
                      cudaSuccess);
            for (int64_t i = 0; i < count; ++i) out[i] = kernels::Bf16ToF32(bf16[i]);
          } else {
            ASSERT_EQ(cudaMemcpy(out.data(), data, count * 4, cudaMemcpyDeviceToHost),
                      cudaSuccess);
          }
          cudaFree(data);
          cudaStreamDestroy(stream);
        });
      }
      for (std::thread& thread : threads) thread.join();
      const bool peer = count * element <= kernels::cuda::kPeerAllReduceMaxBytes;
      double worst = 0;
      for (int64_t i = 0; i < count; ++i) {
        // The twin: inputs as the GPU holds them, summed in fp32 in rank order, stored as dtype.
        float want = 0;
        for (int r = 0; r < 2; ++r) {
          want += dtype == kernels::DType::kBF16
                      ? kernels::Bf16ToF32(kernels::F32ToBf16(values[r][i]))
                      : values[r][i];
        }
        if (dtype == kernels::DType::kBF16) want = kernels::Bf16ToF32(kernels::F32ToBf16(want));
        worst = std::max(worst, double{std::abs(results[0][i] - want)});
        ASSERT_EQ(results[0][i], results[1][i]) << "ranks differ at " << i;
      }
      if (peer) {
        EXPECT_EQ(worst, 0.0) << count << " elements";
      } else {
        EXPECT_LE(worst, 0.07) << count << " elements";  // one bf16 step of the sums (< 8)
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelGpuTest, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<Fixture>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace lmserve::engine
