// cuBLASLt GEMM plans (bf16, and true fp32) and the skinny GEMM against the CPU linear layer, and
// dequantization to bf16 and to fp32 bit for bit against the CPU's llama.cpp-exact dequantization.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::CpuLinear;
using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::RoundToHalf;

TEST(GemmGpuTest, MatchesCpuLinear) {
  LMSERVE_REQUIRE_GPU();
  auto handle = BlasLtHandle::Create();
  ASSERT_TRUE(handle.ok()) << handle.status();
  DeviceBuffer<uint8_t> workspace(32 << 20);
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t m : {1, 17, 64}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{8, 64}, {4096, 4096}, {1032, 264}}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " out "
                                          << DTypeName(out_dtype).data() << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
        GemmShape shape;
        shape.m = m;
        shape.n = n;
        shape.k = k;
        shape.output_dtype = out_dtype;
        auto plan = GemmPlan::Create((*handle)->get(), shape, workspace.get(), workspace.size(),
                                     /*autotune=*/m == 17, nullptr);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const std::vector<float> ref = CpuLinear(x, w, m, n, k);
        std::vector<float> out;
        if (out_dtype == DType::kF32) {
          DeviceBuffer<float> d_y(m * n);
          d_y.Poison();
          ASSERT_EQ((*plan)->Run(d_x.get(), d_w.get(), d_y.get(), nullptr), CUBLAS_STATUS_SUCCESS);
          CUDA_ASSERT(cudaDeviceSynchronize());
          out = d_y.Download();
          EXPECT_LE(RelativeL2(out, ref), 1e-4);
        } else {
          DeviceBuffer<uint16_t> d_y(m * n);
          d_y.Poison();
          ASSERT_EQ((*plan)->Run(d_x.get(), d_w.get(), d_y.get(), nullptr), CUBLAS_STATUS_SUCCESS);
          CUDA_ASSERT(cudaDeviceSynchronize());
          out = HalfToFloat(d_y.Download(), DType::kBF16);
          EXPECT_LE(RelativeL2(out, ref), 1e-2);
        }
      }
    }
  }
}

// The float32 mode's GEMMs: fp32 x and W, fp32 y, fp32 products and sums. Against OpenBLAS's
// sgemm, two fp32 summation orders differ by a few ulps of the partial sums: a relative L2 error
// near 1e-6 for k = 4096 (about sqrt(k) * 2^-24 at worst for sequential sums, less for the
// blocked sums both use). TF32 (10 mantissa bits: each product off by up to 2^-11) would land
// near 3e-4, and bf16 inputs near 3e-3, so 1e-5 proves neither is used.
TEST(GemmGpuTest, Fp32MatchesCpuLinearWithoutTf32) {
  LMSERVE_REQUIRE_GPU();
  auto handle = BlasLtHandle::Create();
  ASSERT_TRUE(handle.ok()) << handle.status();
  DeviceBuffer<uint8_t> workspace(32 << 20);
  for (int64_t m : {1, 3, 17, 64, 300}) {
    for (auto [n, k] :
         {std::pair<int64_t, int64_t>{8, 64}, {4096, 4096}, {1032, 264}, {49152, 576}}) {
      if (m == 300 && n == 49152) continue;  // keeps the CPU reference quick
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << m << " n " << n << " k " << k << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
      DeviceBuffer<float> d_x(x), d_w(w), d_y(m * n);
      d_y.Poison();
      GemmShape shape;
      shape.m = m;
      shape.n = n;
      shape.k = k;
      shape.input_dtype = DType::kF32;
      shape.output_dtype = DType::kF32;
      auto plan = GemmPlan::Create((*handle)->get(), shape, workspace.get(), workspace.size(),
                                   /*autotune=*/m == 17 || m == 1, nullptr);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ((*plan)->Run(d_x.get(), d_w.get(), d_y.get(), nullptr), CUBLAS_STATUS_SUCCESS);
      CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeL2(d_y.Download(), CpuLinear(x, w, m, n, k)), 1e-5);
    }
  }
  GemmShape mixed;
  mixed.m = 1;
  mixed.n = 8;
  mixed.k = 8;
  mixed.input_dtype = DType::kF32;
  mixed.output_dtype = DType::kBF16;
  EXPECT_FALSE(mixed.Validate().ok());
}

TEST(SkinnyGemmGpuTest, MatchesCpuLinearForEveryRowCount) {
  LMSERVE_REQUIRE_GPU();
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    for (int64_t m = 1; m <= kMaxSkinnyGemmRows; ++m) {
      // k = 1824: one whole step of the kernel's loop (128 chunks of 8) and 100 chunks left for
      // its tail, where lanes run different numbers of pieces.
      for (auto [n, k] : {std::pair<int64_t, int64_t>{8, 64},
                          {4096, 4096},
                          {1034, 264},
                          {130, 14336},
                          {66, 1824}}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " out "
                                          << DTypeName(out_dtype).data() << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
        const std::vector<float> ref = CpuLinear(x, w, m, n, k);
        SkinnyGemmParams p;
        p.x = d_x.get();
        p.w = d_w.get();
        p.m = m;
        p.n = n;
        p.k = k;
        p.output_dtype = out_dtype;
        // Odd row counts ask L2 for W before the wait (a hint: the products must not change);
        // one row into bf16 splits k over two warps where the shape allows (n 4096, 1034).
        p.l2_prefetch_bytes = m % 2 == 1 ? int64_t{1} << 24 : 0;
        p.k_split = m == 1 && out_dtype == DType::kBF16 ? 2 : 1;
        if (out_dtype == DType::kF32) {
          DeviceBuffer<float> d_y(m * n);
          d_y.Poison();
          p.y = d_y.get();
          ASSERT_TRUE(p.Validate().ok()) << p.Validate();
          CUDA_ASSERT(Launch(p, nullptr));
          CUDA_ASSERT(cudaDeviceSynchronize());
          EXPECT_LE(RelativeL2(d_y.Download(), ref), 1e-4);
        } else {
          DeviceBuffer<uint16_t> d_y(m * n);
          d_y.Poison();
          p.y = d_y.get();
          CUDA_ASSERT(Launch(p, nullptr));
          CUDA_ASSERT(cudaDeviceSynchronize());
          EXPECT_LE(RelativeL2(HalfToFloat(d_y.Download(), DType::kBF16), ref), 1e-2);
        }
      }
    }
  }
  SkinnyGemmParams bad;
  bad.m = kMaxSkinnyGemmRows + 1;
  bad.n = 8;
  bad.k = 8;
  EXPECT_FALSE(bad.Validate().ok());
  // A 16-bit kernel: fp32 is refused with a pointer to the way to do it.
  SkinnyGemmParams f32;
  f32.m = 1;
  f32.n = 8;
  f32.k = 8;
  f32.x = f32.w = f32.y = reinterpret_cast<void*>(256);
  f32.input_dtype = f32.output_dtype = DType::kF32;
  EXPECT_THAT(std::string(f32.Validate().message()), ::testing::HasSubstr("GemmPlan"));
  EXPECT_EQ(Launch(f32, nullptr), cudaErrorInvalidValue);
}

// The add + RMSNorm folded into the skinny GEMM (add_norm_residual): against the CPU's add, norm
// (unrounded) and linear layer, and against the norm kernel followed by the plain skinny GEMM on
// the same device, both within bf16's rounding of the output and of the normed row; the
// residual is left as it was. Shapes: Mamba-2-2.7B's in_proj (661 blocks, more than a wave),
// k in the loop's whole steps plus its tail (1824), and k in the tail alone (64); and with the
// gated activation, Llama-3-8B's gate/up.
TEST(SkinnyGemmGpuTest, FoldedAddRmsNormMatchesTheNormKernel) {
  LMSERVE_REQUIRE_GPU();
  struct Case {
    int64_t n, k;
    bool gated;  // the gated activation: against the two kernels only
  };
  for (const Case c : {Case{10576, 2560, false}, Case{96, 1824, false}, Case{130, 64, false},
                       Case{2 * 14336, 4096, true}}) {
    const int64_t n = c.n, k = c.k, y_width = c.gated ? n / 2 : n;
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << (c.gated ? " gated" : "")
                                      << " seed " << seed);
    std::mt19937 rng(seed);
    const float eps = 1e-5f;
    std::vector<float> add = RandomFloats(k, rng), residual = RandomFloats(k, rng, 2.0f);
    std::vector<float> norm_w = RandomFloats(k, rng, 0.2f, 1.0f);
    std::vector<float> w = RandomFloats(n * k, rng, c.gated ? 0.02f : 0.05f);
    DeviceBuffer<uint16_t> d_add(RoundToHalf(add, DType::kBF16));
    DeviceBuffer<uint16_t> d_norm_w(RoundToHalf(norm_w, DType::kBF16));
    DeviceBuffer<uint16_t> d_w(RoundToHalf(w, DType::kBF16));
    DeviceBuffer<float> d_residual(residual), d_residual2(residual);
    DeviceBuffer<uint16_t> d_y(y_width), d_normed(k), d_y2(y_width);
    d_y.Poison();
    d_normed.Poison();
    d_y2.Poison();
    SkinnyGemmParams folded;
    folded.x = d_add.get();
    folded.w = d_w.get();
    folded.y = d_y.get();
    folded.m = 1;
    folded.n = n;
    folded.k = k;
    folded.silu_and_mul = c.gated;
    folded.k_split = 0;  // the fold takes k whole all the same
    folded.l2_prefetch_bytes = int64_t{1} << 24;
    folded.add_norm_residual = d_residual.get();
    folded.add_norm_weight = d_norm_w.get();
    folded.add_norm_epsilon = eps;
    ASSERT_TRUE(folded.Validate().ok()) << folded.Validate();
    CUDA_ASSERT(Launch(folded, nullptr));
    // The two kernels it replaces.
    CUDA_ASSERT(testing::LaunchUnfolded(folded, d_residual2.get(), d_normed.get(), d_y2.get()));
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> h(k), normed(k);
    double squares = 0;
    for (int64_t i = 0; i < k; ++i) {
      h[i] = residual[i] + add[i];
      squares += double{h[i]} * h[i];
    }
    const double scale = 1.0 / std::sqrt(squares / k + eps);
    for (int64_t i = 0; i < k; ++i) normed[i] = static_cast<float>(h[i] * scale * norm_w[i]);
    const std::vector<float> y = HalfToFloat(d_y.Download(), DType::kBF16);
    if (!c.gated) {
      EXPECT_LE(RelativeL2(y, CpuLinear(normed, w, 1, n, k)), 1e-2) << "against the CPU";
    }
    EXPECT_LE(RelativeL2(y, HalfToFloat(d_y2.Download(), DType::kBF16)), 1e-2)
        << "against the two kernels";
    EXPECT_EQ(d_residual.Download(), residual) << "the fold does not write the residual";
    EXPECT_EQ(d_residual2.Download(), h) << "the norm kernel's residual";
  }
  SkinnyGemmParams bad;
  bad.x = bad.w = bad.y = reinterpret_cast<void*>(256);
  bad.n = 8;
  bad.k = 8;
  bad.add_norm_residual = reinterpret_cast<const float*>(256);
  bad.add_norm_weight = reinterpret_cast<const void*>(256);
  bad.m = 2;
  EXPECT_FALSE(bad.Validate().ok()) << "two rows";
  bad.m = 1;
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate();
  bad.norm_partials = reinterpret_cast<const float*>(256);
  bad.num_norm_partials = 1;
  bad.norm_width = 8;
  EXPECT_FALSE(bad.Validate().ok()) << "with the norm epilogue";
  bad.norm_partials = nullptr;
  bad.k_split = 2;
  EXPECT_FALSE(bad.Validate().ok()) << "k split";
  bad.k_split = 1;
  bad.k = kMaxSkinnyAddNormK + 8;
  EXPECT_FALSE(bad.Validate().ok()) << "k past the shared memory's row";
  bad.k = 8;
  bad.settle_residual = reinterpret_cast<float*>(256);
  EXPECT_FALSE(bad.Validate().ok()) << "with the settle (its kernels leave it out)";
  bad.settle_residual = nullptr;
  bad.add_norm_weight = nullptr;
  EXPECT_FALSE(bad.Validate().ok()) << "no weight";
}

// settle_residual: the product's output buffer holds the addend a folded norm left unadded; the
// kernel adds it into the residual before overwriting it. The residual bit for bit (one fp32
// addition of the same values), the product against the CPU; k split over two warps or not, with
// and without the norm epilogue (Mamba-2-2.7B's out_proj: n 2560, k 5120, the gated norm).
TEST(SkinnyGemmGpuTest, SettledResidualAddsTheOutputItOverwrites) {
  LMSERVE_REQUIRE_GPU();
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2560, 5120}, {130, 1824}}) {
    for (const int k_split : {0, 1}) {
      for (const bool gated : {false, true}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << " k_split " << k_split
                                          << (gated ? " gated" : "") << " seed " << seed);
        std::mt19937 rng(seed);
        const float eps = 1e-5f;
        std::vector<float> x = RandomFloats(k, rng), w = RandomFloats(n * k, rng, 0.05f);
        std::vector<float> before = RandomFloats(n, rng), residual = RandomFloats(n, rng, 2.0f);
        RoundToHalf(before, DType::kBF16);
        std::vector<float> partials = {0.25f * k, 0.5f * k, 0.25f * k};
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
        DeviceBuffer<uint16_t> d_y(RoundToHalf(before, DType::kBF16));
        DeviceBuffer<float> d_residual(residual), d_partials(partials);
        SkinnyGemmParams p;
        p.x = d_x.get();
        p.w = d_w.get();
        p.y = d_y.get();
        p.m = 1;
        p.n = n;
        p.k = k;
        p.k_split = k_split;
        p.settle_residual = d_residual.get();
        if (gated) {
          p.norm_partials = d_partials.get();
          p.num_norm_partials = 3;
          p.norm_width = k;
          p.norm_epsilon = eps;
        }
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> product = CpuLinear(x, w, 1, n, k);
        if (gated) {
          for (float& v : product) v /= std::sqrt(1.0f + eps);
        }
        for (int64_t i = 0; i < n; ++i) residual[i] += before[i];
        EXPECT_EQ(d_residual.Download(), residual);
        EXPECT_LE(RelativeL2(HalfToFloat(d_y.Download(), DType::kBF16), product), 1e-2);
      }
    }
  }
  SkinnyGemmParams bad;
  bad.x = bad.w = bad.y = reinterpret_cast<void*>(256);
  bad.m = 2;
  bad.n = 8;
  bad.k = 8;
  bad.settle_residual = reinterpret_cast<float*>(256);
  EXPECT_FALSE(bad.Validate().ok()) << "two rows";
  bad.m = 1;
  bad.output_dtype = DType::kF32;
  EXPECT_FALSE(bad.Validate().ok()) << "fp32 out";
}

// The gated-activation epilogue (SiLU and GELU-tanh): against the CPU's linear layer and
// activation, and bit for bit against the same skinny GEMM followed by the SiLU-and-mul kernel
// with the same activation (a warp sums a row in the same order either way, and both apply the
// one device function, GateActivationOf, to the same bf16-rounded gate and up values).
TEST(SkinnyGemmGpuTest, SiluAndMulEpilogue) {
  LMSERVE_REQUIRE_GPU();
  for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
    for (int64_t m : {1, 3, 8}) {
      for (auto [inter, k] : {std::pair<int64_t, int64_t>{1032, 264}, {4096, 1024}, {136, 1824}}) {
        const int64_t n = 2 * inter;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "activation " << static_cast<int>(activation) << " m " << m
                     << " intermediate " << inter << " k " << k << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.1f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
        const std::vector<float> gate_up = CpuLinear(x, w, m, n, k);
        const std::vector<float> ref = testing::CpuGatedActivation(gate_up, m, inter, activation);

        SkinnyGemmParams p;
        p.x = d_x.get();
        p.w = d_w.get();
        p.m = m;
        p.n = n;
        p.k = k;
        DeviceBuffer<uint16_t> d_gate_up(m * n), d_unfused(m * inter), d_fused(m * inter);
        d_fused.Poison();
        p.y = d_gate_up.get();
        CUDA_ASSERT(Launch(p, nullptr));
        SiluAndMulParams silu;
        silu.gate_up = d_gate_up.get();
        silu.output = d_unfused.get();
        silu.num_tokens = m;
        silu.intermediate_size = inter;
        silu.activation = activation;
        CUDA_ASSERT(Launch(silu, nullptr));
        p.y = d_fused.get();
        p.silu_and_mul = true;
        p.activation = activation;
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<uint16_t> fused = d_fused.Download();
        EXPECT_EQ(fused, d_unfused.Download());
        EXPECT_LE(RelativeL2(HalfToFloat(fused, DType::kBF16), ref), 1e-2);
      }
    }
  }
  SkinnyGemmParams bad;
  bad.m = 1;
  bad.n = 8;
  bad.k = 8;
  bad.x = bad.w = bad.y = reinterpret_cast<void*>(256);
  bad.silu_and_mul = true;
  bad.output_dtype = DType::kF32;
  EXPECT_FALSE(bad.Validate().ok());
}

// Random blocks of each type with finite fp16 scales.
std::vector<uint8_t> RandomBlocks(DType dtype, int64_t num_elements, std::mt19937& rng) {
  const BlockLayout layout = GetBlockLayout(dtype);
  const int64_t blocks = num_elements / layout.elements_per_block;
  std::vector<uint8_t> bytes(blocks * layout.bytes_per_block);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
  auto put_half = [&](uint8_t* p) {
    const uint16_t h = F32ToF16(scale(rng));
    std::memcpy(p, &h, 2);
  };
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* block = bytes.data() + i * layout.bytes_per_block;
    switch (dtype) {
      case DType::kQ8_0:
      case DType::kQ4_0:
        put_half(block);
        break;
      case DType::kQ4_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        put_half(block);
        put_half(block + 2);
        break;
      case DType::kQ6_K:
        put_half(block + 208);
        break;
      default:
        break;
    }
  }
  return bytes;
}

// Dequantizes random blocks of `dtype` to `output_dtype` on the GPU and compares the bits with
// the CPU's DequantizeToF32 (rounded to bf16 for a bf16 output).
void CheckDequantize(DType dtype, DType output_dtype) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << DTypeName(dtype).data() << " to "
                                    << DTypeName(output_dtype).data() << " seed " << seed);
  std::mt19937 rng(seed);
  const int64_t n = 256 * 37;
  std::vector<uint8_t> src;
  if (IsQuantized(dtype)) {
    src = RandomBlocks(dtype, n, rng);
  } else {
    std::vector<float> values = RandomFloats(n, rng);
    if (dtype == DType::kF32) {
      src.resize(n * 4);
      std::memcpy(src.data(), values.data(), src.size());
    } else {
      const std::vector<uint16_t> bits = RoundToHalf(values, dtype);
      src.resize(n * 2);
      std::memcpy(src.data(), bits.data(), src.size());
    }
  }
  std::vector<float> ref(n);
  DequantizeToF32(dtype, src.data(), ref.data(), n);
  DeviceBuffer<uint8_t> d_src(src);
  DeviceBuffer<uint8_t> d_dst(n * (output_dtype == DType::kF32 ? 4 : 2));
  d_dst.Poison();
  DequantizeParams p{d_src.get(), d_dst.get(), n, dtype, output_dtype};
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<uint8_t> bytes = d_dst.Download();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Bits, not values: fp32 outputs must be DequantizeToF32's own (NaNs and signed zeros too).
    uint32_t got = 0, want = 0;
    if (output_dtype == DType::kF32) {
      std::memcpy(&got, bytes.data() + 4 * i, 4);
      std::memcpy(&want, &ref[i], 4);
    } else {
      uint16_t bits = 0;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      got = bits;
      want = F32ToBf16(ref[i]);
    }
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << ": GPU 0x" << std::hex << got << ", CPU 0x" << want
                    << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DequantGpuTest, BitExactWithCpuForEveryType) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ5_K,
                      DType::kQ6_K, DType::kF16, DType::kBF16, DType::kF32}) {
    for (DType output_dtype : {DType::kBF16, DType::kF32}) CheckDequantize(dtype, output_dtype);
  }
  DequantizeParams bad_output;
  bad_output.num_elements = 32;
  bad_output.dtype = DType::kQ8_0;
  bad_output.output_dtype = DType::kF16;
  EXPECT_THAT(std::string(bad_output.Validate().message()),
              ::testing::HasSubstr("supported: bf16, f32"));
}

}  // namespace
}  // namespace lmserve::kernels::cuda
