// RMSNorm, SiLU-and-mul, embedding gather and the dummy-weight fill on the GPU against their CPU
// twins, in bf16, fp16 and fp32 (the runner's float32 mode), and the norms and the gather with an
// fp32 residual stream beside bf16 or fp16 (the runner's fp32_residual).

#include <random>
#include <vector>

#include "engine/runner/dummy_weights.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/random_fill.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::Download;
using testing::FreshSeed;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::Tolerance;
using testing::Upload;

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// An activation type and the residual stream's: each type with itself, and the 16-bit types with
// an fp32 residual.
struct ResidualCase {
  DType dtype;
  DType residual_dtype;
};
constexpr ResidualCase kResidualCases[] = {{DType::kBF16, DType::kBF16},
                                           {DType::kF16, DType::kF16},
                                           {DType::kF32, DType::kF32},
                                           {DType::kBF16, DType::kF32},
                                           {DType::kF16, DType::kF32}};

TEST(NormGpuTest, RmsNormMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (const auto [dtype, input_dtype] : kResidualCases) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t hidden : {8, 200, 4096, 32768}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << testing::Name(dtype) << " input " << testing::Name(input_dtype)
                     << " tokens " << tokens << " hidden " << hidden << " seed " << seed);
        std::mt19937 rng(seed);
        const int64_t in_stride = hidden + 8, out_stride = hidden + 16;
        std::vector<float> x = RandomFloats(tokens * in_stride, rng, 2.0f);
        std::vector<float> w = RandomFloats(hidden, rng, 0.5f, 1.0f);
        DeviceBuffer<uint8_t> d_x = Upload(x, input_dtype), d_w = Upload(w, dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * out_stride, dtype);
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
        p.input_dtype = input_dtype;
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
        cpu.epsilon = 1e-5f;  // the float the GPU kernel takes, widened
        kernels::RmsNorm(cpu);
        const std::vector<float> all = Download(d_out, dtype);
        std::vector<float> out(tokens * hidden);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] = all[t * out_stride + i];
        }
        if (dtype == DType::kF32) {
          // The sum of squares and the inverse RMS in double, then the same fp32 products: the
          // CPU's values exactly (an fp32 sum of squares would miss by an ulp in many rows).
          EXPECT_TRUE(testing::SameValues(out, ref));
        } else {
          EXPECT_LE(RelativeL2(out, ref), Tolerance(dtype));
        }
      }
    }
  }
}

TEST(NormGpuTest, FusedAddRmsNormMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (const auto [dtype, residual_dtype] : kResidualCases) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t hidden : {64, 1032, 4096, 8192}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << testing::Name(dtype) << " residual " << testing::Name(residual_dtype)
                     << " tokens " << tokens << " hidden " << hidden << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(tokens * hidden, rng);
        std::vector<float> residual = RandomFloats(tokens * hidden, rng, 3.0f);
        std::vector<float> w = RandomFloats(hidden, rng, 0.5f, 1.0f);
        DeviceBuffer<uint8_t> d_x = Upload(x, dtype), d_w = Upload(w, dtype);
        DeviceBuffer<uint8_t> d_res = Upload(residual, residual_dtype);
        DeviceBuffer<uint8_t> d_res_alone = Upload(residual, residual_dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * hidden, dtype);
        FusedAddRmsNormParams p;
        p.residual = d_res.get();
        p.input = d_x.get();
        p.weight = d_w.get();
        p.output = d_out.get();
        p.num_tokens = tokens;
        p.hidden_size = hidden;
        p.epsilon = 1e-6f;
        p.dtype = dtype;
        p.residual_dtype = residual_dtype;
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        // The add alone (no output): the same residual.
        FusedAddRmsNormParams alone = p;
        alone.residual = d_res_alone.get();
        alone.output = nullptr;
        ASSERT_TRUE(alone.Validate().ok()) << alone.Validate();
        CUDA_ASSERT(Launch(alone, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_TRUE(testing::SameValues(Download(d_res_alone, residual_dtype),
                                        Download(d_res, residual_dtype)))
            << "the add alone";

        std::vector<float> ref(tokens * hidden);
        kernels::FusedAddRmsNormParams cpu;
        cpu.epsilon = 1e-6f;
        cpu.residual = residual.data();
        cpu.input = x.data();
        cpu.weight = w.data();
        cpu.output = ref.data();
        cpu.num_tokens = tokens;
        cpu.hidden_size = hidden;
        kernels::FusedAddRmsNorm(cpu);
        const std::vector<float> new_residual = Download(d_res, residual_dtype),
                                 out = Download(d_out, dtype);
        // An fp32 residual is the CPU's sum exactly (one fp32 add, unrounded); as
        // RmsNormMatchesCpu, so is an fp32 output.
        if (residual_dtype == DType::kF32) {
          EXPECT_TRUE(testing::SameValues(new_residual, residual));
        } else {
          EXPECT_LE(RelativeL2(new_residual, residual), Tolerance(residual_dtype));
        }
        if (dtype == DType::kF32) {
          EXPECT_TRUE(testing::SameValues(out, ref));
        } else {
          EXPECT_LE(RelativeL2(out, ref), Tolerance(dtype));
        }
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
  p.dtype = DType::kQ8_0;
  EXPECT_NE(std::string(p.Validate().message()).find("supported: bf16, f16, f32"),
            std::string::npos);
  EXPECT_EQ(Launch(p, nullptr), cudaErrorInvalidValue);

  // The residual stream: the activations' type or fp32, and an fp32 input is not the output.
  p.dtype = DType::kBF16;
  p.input_dtype = DType::kF16;
  EXPECT_NE(std::string(p.Validate().message()).find("input_dtype F16"), std::string::npos)
      << p.Validate();
  EXPECT_EQ(Launch(p, nullptr), cudaErrorInvalidValue);
  alignas(16) static float row[64];
  p.input = p.output = row;
  p.weight = row;
  p.input_dtype = DType::kF32;
  EXPECT_NE(std::string(p.Validate().message()).find("output may be input only"), std::string::npos)
      << p.Validate();
  p.input_dtype = DType::kBF16;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();

  FusedAddRmsNormParams fused;
  fused.num_tokens = 0;
  fused.hidden_size = 64;
  fused.dtype = DType::kF32;
  fused.residual_dtype = DType::kBF16;  // narrower than the activations
  EXPECT_NE(std::string(fused.Validate().message())
                .find("residual_dtype BF16 is not supported with dtype F32 (supported: F32)"),
            std::string::npos)
      << fused.Validate();
  fused.dtype = DType::kBF16;
  fused.residual_dtype = DType::kF32;
  EXPECT_TRUE(fused.Validate().ok()) << fused.Validate();
}

TEST(ActivationGpuTest, SiluAndMulMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kAllDTypes) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t inter : {8, 1032, 14336}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " tokens " << tokens
                                          << " intermediate " << inter << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> gate_up = RandomFloats(tokens * 2 * inter, rng, 3.0f);
        DeviceBuffer<uint8_t> d_in = Upload(gate_up, dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * inter, dtype);
        SiluAndMulParams p{d_in.get(), d_out.get(), tokens, inter, dtype};
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> ref(tokens * inter);
        kernels::SiluAndMul({gate_up.data(), ref.data(), tokens, inter});
        EXPECT_LE(RelativeL2(Download(d_out, dtype), ref), Tolerance(dtype));
      }
    }
  }
}

// GeGLU (Gemma): gelu_tanh(gate) * up against the CPU twin, every dtype; fp32 within a few ulps
// (tanhf against std::tanh, and the cubic's fused multiply-adds).
TEST(ActivationGpuTest, GeluTanhAndMulMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kAllDTypes) {
    for (int64_t tokens : {1, 17, 64}) {
      for (int64_t inter : {8, 1032, 9216}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " tokens " << tokens
                                          << " intermediate " << inter << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> gate_up = RandomFloats(tokens * 2 * inter, rng, 3.0f);
        DeviceBuffer<uint8_t> d_in = Upload(gate_up, dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * inter, dtype);
        SiluAndMulParams p{d_in.get(), d_out.get(), tokens, inter, dtype,
                           GateActivation::kGeluTanh};
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> ref(tokens * inter);
        kernels::SiluAndMul({gate_up.data(), ref.data(), tokens, inter, GateActivation::kGeluTanh});
        EXPECT_LE(RelativeL2(Download(d_out, dtype), ref), Tolerance(dtype));
      }
    }
  }
}

// Final-logit soft-cap (Gemma 2): fp32 logits in place, against the CPU twin, at vocabulary-sized
// and odd counts, saturating values included.
TEST(ActivationGpuTest, SoftcapMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t count : {1, 1000, 3 * 256000 + 5}) {
    for (float cap : {30.0f, 1.0f}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "count " << count << " cap " << cap << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> logits = RandomFloats(count, rng, 40.0f);
      logits[0] = 1e30f;
      DeviceBuffer<float> d_logits(logits);
      const SoftcapParams p{d_logits.get(), count, cap};
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      kernels::Softcap(logits.data(), count, cap);
      const std::vector<float> out = d_logits.Download();
      EXPECT_EQ(out[0], cap);
      EXPECT_LE(RelativeL2(out, logits), Tolerance(DType::kF32));
    }
  }
  EXPECT_FALSE((SoftcapParams{nullptr, 0, 0.0f}).Validate().ok());
  EXPECT_FALSE((SoftcapParams{nullptr, 5, 30.0f}).Validate().ok());
  EXPECT_TRUE((SoftcapParams{nullptr, 0, 30.0f}).Validate().ok());
}

TEST(EmbeddingGpuTest, GatherMatchesCpuAndZeroesBadIds) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kAllDTypes) {
    for (int64_t tokens : {1, 17, 64}) {
      const int64_t vocab = 1000, hidden = 4104;
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << testing::Name(dtype) << " tokens " << tokens << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> table = RandomFloats(vocab * hidden, rng);
      std::vector<int32_t> ids(tokens);
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      for (int32_t& id : ids) id = pick(rng);
      ids[0] = static_cast<int32_t>(vocab - 1);
      DeviceBuffer<uint8_t> d_table = Upload(table, dtype);
      DeviceBuffer<uint8_t> d_out = Poisoned(tokens * hidden, dtype);
      DeviceBuffer<int32_t> d_ids(ids);
      EmbeddingParams p{d_table.get(), d_ids.get(), d_out.get(), tokens, vocab, hidden, dtype};
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<float> ref(tokens * hidden);
      kernels::EmbeddingGather({table.data(), ids.data(), ref.data(), tokens, vocab, hidden});
      EXPECT_TRUE(testing::SameValues(Download(d_out, dtype), ref));

      ids[tokens - 1] = static_cast<int32_t>(vocab);  // out of range: zeros
      d_ids.Upload(ids);
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<uint8_t> out = d_out.Download();
      const int64_t row_bytes = hidden * testing::ElementBytes(dtype);
      for (int64_t i = 0; i < row_bytes; ++i) ASSERT_EQ(out[(tokens - 1) * row_bytes + i], 0);
    }
  }
}

// A 16-bit table gathered into fp32 rows (the runner's fp32 residual stream): each element times
// the scale in fp32, unrounded, as the CPU runner computes it after its gather.
TEST(EmbeddingGpuTest, GathersFp32RowsOfA16BitTable) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (float scale : {1.0f, 64.0624695f}) {  // 1 and Gemma's sqrt(hidden)
      for (int64_t tokens : {1, 17, 64}) {
        const int64_t vocab = 1000, hidden = 4104;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " scale " << scale
                                          << " tokens " << tokens << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> table = RandomFloats(vocab * hidden, rng);
        std::vector<int32_t> ids(tokens);
        std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
        for (int32_t& id : ids) id = pick(rng);
        ids[0] = static_cast<int32_t>(vocab - 1);
        DeviceBuffer<uint8_t> d_table = Upload(table, dtype);  // rounds `table` to dtype
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * hidden, DType::kF32);
        DeviceBuffer<int32_t> d_ids(ids);
        EmbeddingParams p{d_table.get(), d_ids.get(), d_out.get(), tokens, vocab, hidden, dtype};
        p.scale = scale;
        p.output_dtype = DType::kF32;
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> ref(tokens * hidden);
        kernels::EmbeddingGather({table.data(), ids.data(), ref.data(), tokens, vocab, hidden});
        for (float& x : ref) x *= scale;
        EXPECT_TRUE(testing::SameValues(Download(d_out, DType::kF32), ref));

        ids[tokens - 1] = static_cast<int32_t>(vocab);  // out of range: zeros
        d_ids.Upload(ids);
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<float> out = Download(d_out, DType::kF32);
        for (int64_t i = 0; i < hidden; ++i) ASSERT_EQ(out[(tokens - 1) * hidden + i], 0.0f);
      }
    }
  }
  // fp32 rows only: not a 16-bit type of another kind.
  EmbeddingParams p;
  p.num_tokens = 0;
  p.vocab_size = 8;
  p.hidden_size = 8;
  p.output_dtype = DType::kF16;
  EXPECT_NE(std::string(p.Validate().message()).find("output_dtype F16"), std::string::npos)
      << p.Validate();
}

// The dummy weights: in fp32 the GPU fill gives the CPU runner's values (engine::FillDummyF32) bit
// for bit; in bf16 and fp16 the same values rounded.
TEST(RandomFillGpuTest, MatchesTheCpuRunnersDummyWeights) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kAllDTypes) {
    for (const auto& [name, fan_in] :
         {std::pair<std::string, int64_t>{"model.layers.3.mlp.down_proj.weight", 14336},
          {"model.embed_tokens.weight", 4096},
          {"model.layers.0.self_attn.q_proj.bias", 4096}}) {
      SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " " << name);
      const int64_t n = 100003;
      std::vector<float> ref(n);
      engine::FillDummyF32(name, fan_in, ref.data(), n);
      const engine::DummyRange range = engine::DummyWeightRange(name, fan_in);
      DeviceBuffer<uint8_t> d_out = Poisoned(n, dtype);
      RandomFillParams p;
      p.output = d_out.get();
      p.num_elements = n;
      p.low = range.low;
      p.high = range.high;
      p.seed = engine::DummyTensorSeed(name);
      p.dtype = dtype;
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> out = Download(d_out, dtype);
      if (dtype == DType::kF32) {
        EXPECT_TRUE(testing::SameValues(out, ref));
      } else {
        EXPECT_LE(RelativeL2(out, ref), Tolerance(dtype));
      }
    }
  }
}

}  // namespace
}  // namespace lmserve::kernels::cuda
