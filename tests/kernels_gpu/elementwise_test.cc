// RMSNorm, SiLU-and-mul and embedding gather on the GPU against their CPU twins.

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::RoundToHalf;
using testing::Tolerance;

TEST(NormGpuTest, RmsNormMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t hidden : {8, 200, 4096, 32768}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " tokens " << tokens
                                          << " hidden " << hidden << " seed " << seed);
        std::mt19937 rng(seed);
        const int64_t in_stride = hidden + 8, out_stride = hidden + 16;
        std::vector<float> x = RandomFloats(tokens * in_stride, rng, 2.0f);
        std::vector<float> w = RandomFloats(hidden, rng, 0.5f, 1.0f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, dtype)), d_w(RoundToHalf(w, dtype));
        DeviceBuffer<uint16_t> d_out(tokens * out_stride);
        d_out.Poison();
        RmsNormParams p;
        p.input = d_x.get();
        p.weight = d_w.get();
        p.output = d_out.get();
        p.num_tokens = tokens;
        p.hidden_size = hidden;
        p.input_stride = in_stride;
        p.output_stride = out_stride;
        p.epsilon = 1e-5f;
        p.dtype = dtype;
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());

        std::vector<float> ref(tokens * hidden);
        kernels::RmsNormParams cpu;
        cpu.input = x.data();
        cpu.weight = w.data();
        cpu.output = ref.data();
        cpu.num_tokens = tokens;
        cpu.hidden_size = hidden;
        cpu.input_stride = in_stride;
        cpu.epsilon = 1e-5;
        kernels::RmsNorm(cpu);
        const std::vector<float> all = HalfToFloat(d_out.Download(), dtype);
        std::vector<float> out(tokens * hidden);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] = all[t * out_stride + i];
        }
        EXPECT_LE(RelativeL2(out, ref), Tolerance(dtype));
      }
    }
  }
}

TEST(NormGpuTest, FusedAddRmsNormMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t hidden : {64, 1032, 4096, 8192}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " tokens " << tokens
                                          << " hidden " << hidden << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(tokens * hidden, rng);
        std::vector<float> residual = RandomFloats(tokens * hidden, rng, 3.0f);
        std::vector<float> w = RandomFloats(hidden, rng, 0.5f, 1.0f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, dtype)), d_w(RoundToHalf(w, dtype));
        DeviceBuffer<uint16_t> d_res(RoundToHalf(residual, dtype));
        DeviceBuffer<uint16_t> d_out(tokens * hidden);
        d_out.Poison();
        FusedAddRmsNormParams p;
        p.residual = d_res.get();
        p.input = d_x.get();
        p.weight = d_w.get();
        p.output = d_out.get();
        p.num_tokens = tokens;
        p.hidden_size = hidden;
        p.dtype = dtype;
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());

        std::vector<float> ref(tokens * hidden);
        kernels::FusedAddRmsNormParams cpu;
        cpu.residual = residual.data();
        cpu.input = x.data();
        cpu.weight = w.data();
        cpu.output = ref.data();
        cpu.num_tokens = tokens;
        cpu.hidden_size = hidden;
        kernels::FusedAddRmsNorm(cpu);
        EXPECT_LE(RelativeL2(HalfToFloat(d_res.Download(), dtype), residual), Tolerance(dtype));
        EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), ref), Tolerance(dtype));
      }
    }
  }
}

TEST(NormGpuTest, ValidateExplainsUnsupportedShapes) {
  RmsNormParams p;
  p.num_tokens = 1;
  p.hidden_size = 100;  // not a multiple of 8
  EXPECT_NE(std::string(p.Validate().message()).find("multiple of 8"), std::string::npos);
  p.hidden_size = 64;
  p.dtype = DType::kF32;
  EXPECT_NE(std::string(p.Validate().message()).find("supported: bf16, f16"), std::string::npos);
  EXPECT_EQ(Launch(p, nullptr), cudaErrorInvalidValue);
}

TEST(ActivationGpuTest, SiluAndMulMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t inter : {8, 1032, 14336}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " tokens " << tokens
                                          << " intermediate " << inter << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> gate_up = RandomFloats(tokens * 2 * inter, rng, 3.0f);
        DeviceBuffer<uint16_t> d_in(RoundToHalf(gate_up, dtype)), d_out(tokens * inter);
        d_out.Poison();
        SiluAndMulParams p{d_in.get(), d_out.get(), tokens, inter, dtype};
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> ref(tokens * inter);
        kernels::SiluAndMul({gate_up.data(), ref.data(), tokens, inter});
        EXPECT_LE(RelativeL2(HalfToFloat(d_out.Download(), dtype), ref), Tolerance(dtype));
      }
    }
  }
}

TEST(EmbeddingGpuTest, GatherMatchesCpuAndZeroesBadIds) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t tokens : {1, 17, 64}) {
      const int64_t vocab = 1000, hidden = 4104;
      std::mt19937 rng(FreshSeed());
      std::vector<float> table = RandomFloats(vocab * hidden, rng);
      std::vector<int32_t> ids(tokens);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int32_t& id : ids) id = pick(rng);
      ids[0] = static_cast<int32_t>(vocab - 1);
      DeviceBuffer<uint16_t> d_table(RoundToHalf(table, dtype)), d_out(tokens * hidden);
      DeviceBuffer<int32_t> d_ids(ids);
      d_out.Poison();
      EmbeddingParams p{d_table.get(), d_ids.get(), d_out.get(), tokens, vocab, hidden, dtype};
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<float> ref(tokens * hidden);
      kernels::EmbeddingGather({table.data(), ids.data(), ref.data(), tokens, vocab, hidden});
      EXPECT_EQ(HalfToFloat(d_out.Download(), dtype), ref);

      ids[tokens - 1] = static_cast<int32_t>(vocab);  // out of range: zeros
      d_ids.Upload(ids);
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<uint16_t> out = d_out.Download();
      for (int64_t i = 0; i < hidden; ++i) ASSERT_EQ(out[(tokens - 1) * hidden + i], 0);
    }
  }
}

}  // namespace
}  // namespace lmserve::kernels::cuda
