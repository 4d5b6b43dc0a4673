// QKV post-processing (bias, per-head q/k RMSNorm, rotary with each scaling and layout, partial
// rotary, longrope's attention factor, paged KV write) on the GPU against its CPU twin. Rotary
// inverse frequencies come from the engine's RopeInverseFrequencies, the function the runners
// use.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/qkv_postprocess.h"
#include "kernels/cuda/qkv_postprocess.h"
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

std::vector<double> InverseFrequencies(int64_t head_dim, engine::RopeScaling scaling) {
  engine::ModelConfig config;
  config.head_dim = head_dim;
  config.rope.theta = 500000.0;
  config.rope.scaling = scaling;
  config.rope.factor = 8.0;
  config.rope.low_freq_factor = 1.0;
  config.rope.high_freq_factor = 4.0;
  config.rope.original_max_position_embeddings = 8192;
  return engine::RopeInverseFrequencies(config.rope, config.head_dim);
}

struct QkvCase {
  DType dtype;
  int64_t tokens, num_heads, num_kv_heads, head_dim;
  RotaryLayout layout;
  engine::RopeScaling scaling;
  bool bias;
  int64_t rotary_dim = 0;  // 0: head_dim
  double attention_factor = 1.0;
  bool norm = false;  // q_norm and k_norm
  // An FP8 E4M3 cache with these scales (kernels/cuda/fp8_cache.cuh); 16-bit dtypes only.
  bool fp8_cache = false;
  float k_scale = 1.0f, v_scale = 1.0f;
};

void RunQkvCase(const QkvCase& c) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << testing::Name(c.dtype) << " tokens " << c.tokens << " heads " << c.num_heads
               << "/" << c.num_kv_heads << " head_dim " << c.head_dim << " interleaved "
               << (c.layout == RotaryLayout::kInterleaved) << " scaling "
               << static_cast<int>(c.scaling) << " bias " << c.bias << " rotary_dim "
               << c.rotary_dim << " attention factor " << c.attention_factor << " norm "
               << c.norm << (c.fp8_cache ? " FP8 cache k_scale " : "")
               << (c.fp8_cache ? std::to_string(c.k_scale) : "") << " seed " << seed);
  std::mt19937 rng(seed);
  const int64_t row = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const int64_t stride = row + 8;
  const int64_t block_size = 16, num_blocks = (c.tokens + block_size - 1) / block_size * 2 + 3;
  const int64_t max_position = 5000;
  const int64_t kv_row = c.num_kv_heads * c.head_dim;

  std::vector<float> qkv = RandomFloats(c.tokens * stride, rng);
  std::vector<float> bias = RandomFloats(row, rng, 0.5f);
  std::vector<float> q_norm = RandomFloats(c.head_dim, rng, 0.5f, 1.0f);
  std::vector<float> k_norm = RandomFloats(c.head_dim, rng, 0.5f, 1.0f);
  const int64_t rotary_dim = c.rotary_dim != 0 ? c.rotary_dim : c.head_dim;
  std::vector<int32_t> positions(c.tokens);
  std::uniform_int_distribution<int32_t> pos_dist(0, static_cast<int32_t>(max_position - 1));
  for (int32_t& p : positions) p = pos_dist(rng);
  positions[0] = 4098;
  // Distinct slots, shuffled; the last token is padding (no slot) when there are several.
  std::vector<int64_t> slots(num_blocks * block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(c.tokens);
  if (c.tokens > 1) slots.back() = -1;

  const std::vector<double> inv_freq = InverseFrequencies(rotary_dim, c.scaling);
  const std::vector<float> table =
      RotaryCosSinTable(inv_freq.data(), rotary_dim, max_position, c.attention_factor);

  DeviceBuffer<uint8_t> d_qkv = Upload(qkv, c.dtype), d_bias = Upload(bias, c.dtype);
  DeviceBuffer<uint8_t> d_q_norm = Upload(q_norm, c.dtype), d_k_norm = Upload(k_norm, c.dtype);
  DeviceBuffer<int32_t> d_pos(positions);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<float> d_table(table);
  const int64_t cache_elements = num_blocks * block_size * kv_row;
  DeviceBuffer<uint8_t> d_q = Poisoned(c.tokens * c.num_heads * c.head_dim, c.dtype);
  // E4M3's 0xff is NaN too.
  DeviceBuffer<uint8_t> d_k = c.fp8_cache ? Poisoned(cache_elements / 2, DType::kBF16)
                                          : Poisoned(cache_elements, c.dtype);
  DeviceBuffer<uint8_t> d_v = c.fp8_cache ? Poisoned(cache_elements / 2, DType::kBF16)
                                          : Poisoned(cache_elements, c.dtype);
  QkvPostProcessParams p;
  p.qkv = d_qkv.get();
  p.bias = c.bias ? d_bias.get() : nullptr;
  p.positions = d_pos.get();
  p.cos_sin = d_table.get();
  p.q_norm = c.norm ? d_q_norm.get() : nullptr;
  p.k_norm = c.norm ? d_k_norm.get() : nullptr;
  p.slot_mapping = d_slots.get();
  p.query_out = d_q.get();
  p.key_cache = d_k.get();
  p.value_cache = d_v.get();
  p.num_tokens = c.tokens;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.block_size = block_size;
  p.num_blocks = num_blocks;
  p.qkv_stride = stride;
  p.max_position = max_position;
  p.layout = c.layout;
  p.dtype = c.dtype;
  p.cache_fp8 = c.fp8_cache;
  p.k_scale = c.k_scale;
  p.v_scale = c.v_scale;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());

  std::vector<float> ref_q(c.tokens * c.num_heads * c.head_dim);
  std::vector<float> ref_k(cache_elements, 0.0f), ref_v(cache_elements, 0.0f);
  kernels::QkvPostProcessParams cpu;
  cpu.qkv = qkv.data();
  cpu.bias = c.bias ? bias.data() : nullptr;
  cpu.positions = positions.data();
  cpu.inv_freq = inv_freq.data();
  cpu.q_norm = c.norm ? q_norm.data() : nullptr;
  cpu.k_norm = c.norm ? k_norm.data() : nullptr;
  cpu.slot_mapping = slots.data();
  cpu.query_out = ref_q.data();
  cpu.key_cache = ref_k.data();
  cpu.value_cache = ref_v.data();
  cpu.num_tokens = c.tokens;
  cpu.num_heads = c.num_heads;
  cpu.num_kv_heads = c.num_kv_heads;
  cpu.head_dim = c.head_dim;
  cpu.rotary_dim = c.rotary_dim;
  cpu.attention_factor = c.attention_factor;
  cpu.block_size = block_size;
  cpu.num_blocks = num_blocks;
  cpu.qkv_stride = stride;
  cpu.layout = c.layout;
  kernels::QkvPostProcess(cpu);

  // fp32: bias, then the rotation rounded step by step from the same cos/sin values as the CPU's:
  // its values exactly. With the q/k norm the sum of squares is a double sum in another order
  // (per lane, then across lanes): the inverse RMS, rounded to fp32, may then differ by an ulp in
  // about one head in 10^8, so fp32 with a norm is held to 1e-7 (one such head's ulp is 6e-8
  // of it; a wrong weight, epsilon or head would be 1e-3 and more). The 16-bit types: within
  // their rounding.
  auto check = [&](const std::vector<float>& out, const std::vector<float>& ref) {
    if (c.dtype == DType::kF32 && c.norm) {
      EXPECT_LE(RelativeL2(out, ref), 1e-7);
    } else if (c.dtype == DType::kF32) {
      EXPECT_TRUE(testing::SameValues(out, ref));
    } else {
      EXPECT_LE(RelativeL2(out, ref), Tolerance(c.dtype));
    }
  };
  check(Download(d_q, c.dtype), ref_q);
  // Written slots match; every other slot still holds the poison (NaN).
  std::vector<float> k_all, v_all;
  if (c.fp8_cache) {
    // The values the bytes stand for; the twin's values quantized on the host as the kernel does
    // (x * (1 / scale), rounded to nearest even): equal but where the GPU's fp32 value before the
    // rounding differs from the twin's across a rounding boundary (a step of 1/16 in a few
    // elements).
    auto dequantize = [](const std::vector<uint8_t>& bytes, float scale) {
      std::vector<float> values(bytes.size());
      for (size_t i = 0; i < bytes.size(); ++i) values[i] = scale * F8E4M3ToF32(bytes[i]);
      return values;
    };
    k_all = dequantize(d_k.Download(), c.k_scale);
    v_all = dequantize(d_v.Download(), c.v_scale);
    const float k_inv = 1.0f / c.k_scale, v_inv = 1.0f / c.v_scale;
    for (float& x : ref_k) x = c.k_scale * F8E4M3ToF32(F32ToF8E4M3(x * k_inv));
    for (float& x : ref_v) x = c.v_scale * F8E4M3ToF32(F32ToF8E4M3(x * v_inv));
  } else {
    k_all = Download(d_k, c.dtype);
    v_all = Download(d_v, c.dtype);
  }
  std::vector<bool> written(num_blocks * block_size, false);
  for (int64_t s : slots) {
    if (s >= 0) written[s] = true;
  }
  std::vector<float> out_k, out_v, exp_k, exp_v;
  for (int64_t s = 0; s < num_blocks * block_size; ++s) {
    for (int64_t i = 0; i < kv_row; ++i) {
      const int64_t e = s * kv_row + i;
      if (!written[s]) {
        ASSERT_TRUE(std::isnan(k_all[e])) << "slot " << s << " written";
        ASSERT_TRUE(std::isnan(v_all[e])) << "slot " << s << " written";
        continue;
      }
      out_k.push_back(k_all[e]);
      out_v.push_back(v_all[e]);
      exp_k.push_back(ref_k[e]);
      exp_v.push_back(ref_v[e]);
    }
  }
  if (c.fp8_cache) {
    EXPECT_LE(RelativeL2(out_k, exp_k), 1e-2);
    EXPECT_LE(RelativeL2(out_v, exp_v), 1e-2);
    return;
  }
  check(out_k, exp_k);
  check(out_v, exp_v);
}

TEST(QkvPostProcessGpuTest, MatchesCpuAcrossShapesLayoutsAndScalings) {
  LMSERVE_REQUIRE_GPU();
  const std::vector<std::pair<int64_t, int64_t>> heads = {{8, 8}, {16, 4}, {32, 4}};
  int variant = 0;
  for (int64_t head_dim : {32, 64, 80, 96, 128, 256}) {
    for (int64_t tokens : {1, 17, 97}) {
      for (const auto& [num_heads, num_kv_heads] : heads) {
        ++variant;
        const RotaryLayout layout =
            variant % 2 == 0 ? RotaryLayout::kHalfSplit : RotaryLayout::kInterleaved;
        const auto scaling = static_cast<engine::RopeScaling>(variant % 3);
        const DType dtype = variant % 4 == 3   ? DType::kF16
                            : variant % 4 == 2 ? DType::kF32
                                               : DType::kBF16;
        RunQkvCase({dtype, tokens, num_heads, num_kv_heads, head_dim, layout, scaling,
                    variant % 5 != 0});
      }
    }
  }
}

TEST(QkvPostProcessGpuTest, BothLayoutsEveryScaling) {
  LMSERVE_REQUIRE_GPU();
  for (RotaryLayout layout : {RotaryLayout::kHalfSplit, RotaryLayout::kInterleaved}) {
    for (auto scaling : {engine::RopeScaling::kDefault, engine::RopeScaling::kLinear,
                         engine::RopeScaling::kLlama3}) {
      for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
        RunQkvCase({dtype, 64, 32, 8, 128, layout, scaling, true});
      }
    }
  }
}

// Partial rotary (Phi-3's partial_rotary_factor: 24 of 32 dims in the phi3-longrope-partial
// fixture, 96 of 128 in Phi-4-mini), longrope's attention factor, and Qwen3's / Gemma 3's per-head
// q/k RMSNorm, with and without a bias, in every dtype and both layouts, at the head dims the
// runners take: rotary partners held by other lanes, rotary_dim not a multiple of 16, head dims
// (80, 96) whose lanes are padded to a power of two.
TEST(QkvPostProcessGpuTest, PartialRotaryAttentionFactorAndQkNorm) {
  LMSERVE_REQUIRE_GPU();
  struct Shape {
    int64_t head_dim, rotary_dim;
    bool norm;
  };
  const Shape shapes[] = {{32, 24, false}, {32, 0, true},  {64, 0, true},   {64, 16, true},
                          {80, 32, false}, {80, 0, true},  {96, 24, true},  {128, 96, false},
                          {128, 64, true}, {128, 0, true}, {256, 0, true},  {256, 128, false}};
  int variant = 0;
  for (const Shape& shape : shapes) {
    for (RotaryLayout layout : {RotaryLayout::kHalfSplit, RotaryLayout::kInterleaved}) {
      for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
        ++variant;
        const double factor = variant % 3 == 0 ? 1.1902380714238083 : 1.0;
        const int64_t tokens = variant % 2 == 0 ? 17 : 3;
        RunQkvCase({dtype, tokens, 8, 2, shape.head_dim, layout, engine::RopeScaling::kDefault,
                    variant % 4 != 0, shape.rotary_dim, factor, shape.norm});
      }
    }
  }
}

// The FP8 cache write: E4M3 bytes of each key / k_scale and value / v_scale, in bf16 and fp16,
// with scales of 1 and others (large values saturating at 448 * scale, small ones subnormal),
// a norm, a bias and partial rotary; unwritten slots untouched.
TEST(QkvPostProcessGpuTest, Fp8CacheWrite) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t head_dim : {64, 80, 128, 256}) {
      QkvCase c{dtype, 17, 8, 2, head_dim, RotaryLayout::kHalfSplit, engine::RopeScaling::kDefault,
                true};
      c.fp8_cache = true;
      RunQkvCase(c);
      c.k_scale = 0.004f;  // |x| > 1.8 saturates
      c.v_scale = 8.0f;    // |x| < 0.125 subnormal
      c.norm = true;
      c.rotary_dim = head_dim / 2;
      c.layout = RotaryLayout::kInterleaved;
      RunQkvCase(c);
    }
  }
}

TEST(QkvPostProcessGpuTest, ValidateRejectsFp8CacheInF32AndBadScales) {
  QkvPostProcessParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 1;
  p.cache_fp8 = true;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  p.k_scale = 0.0f;
  EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("scales must be positive"));
  p.k_scale = 1.0f;
  p.dtype = DType::kF32;
  EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("bf16 or f16"));
}

TEST(QkvPostProcessGpuTest, ValidateRejectsHalfANormAndBadRotaryDim) {
  QkvPostProcessParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 1;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  const std::vector<float> weight(64);  // only compared with null: no tokens, no device needed
  p.q_norm = weight.data();
  EXPECT_NE(std::string(p.Validate().message()).find("k_norm"), std::string::npos);
  p.k_norm = weight.data();
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  p.rotary_dim = 66;
  EXPECT_NE(std::string(p.Validate().message()).find("rotary_dim 66"), std::string::npos);
  p.rotary_dim = 23;
  EXPECT_NE(std::string(p.Validate().message()).find("rotary_dim 23"), std::string::npos);
}

TEST(QkvPostProcessGpuTest, ValidateExplainsHeadDim) {
  QkvPostProcessParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 72;
  p.block_size = 16;
  p.num_blocks = 1;
  EXPECT_NE(std::string(p.Validate().message()).find("multiple of 16"), std::string::npos);
}

}  // namespace
}  // namespace lmserve::kernels::cuda
