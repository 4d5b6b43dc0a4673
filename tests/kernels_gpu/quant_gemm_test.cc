// The quantized-weight kernels (kernels/cuda/quant_gemm.h) against their CPU twin, the GGUF
// blocks' DequantizeToF32 (kernels/cpu/dequant.h): blocks written by the CPU quantizers from fresh
// random values, repacked into the device layout in two parts (first_row), then dequantized to
// bf16 (bit for bit) and multiplied by the skinny kernel for every row count, with its
// gated-activation epilogue, into poisoned outputs; and the dummy fill's values.

#include "kernels/cuda/quant_gemm.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/skinny_gemm.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::RoundToHalf;

constexpr DType kTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K};

// A [rows, cols] matrix of `dtype`: its GGUF blocks, their fp32 values (the CPU twin's), and the
// device layout, repacked from the blocks in two parts.
struct QuantMatrix {
  std::vector<uint8_t> blocks;
  std::vector<float> values;
  DeviceBuffer<uint8_t> device;
};
QuantMatrix MakeMatrix(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng, float stddev) {
  QuantMatrix out;
  const std::vector<float> w = RandomFloats(rows * cols, rng, stddev);
  out.blocks.resize(rows * RowBytes(dtype, cols));
  QuantizeBlocks(dtype, w.data(), out.blocks.data(), rows * cols);
  out.values.resize(rows * cols);
  DequantizeToF32(dtype, out.blocks.data(), out.values.data(), rows * cols);
  DeviceBuffer<uint8_t> blocks(out.blocks);
  out.device = DeviceBuffer<uint8_t>(QuantMatrixBytes(dtype, rows, cols));
  out.device.Poison();
  const int64_t split = rows / 2 / 2 * 2;
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, split}, {split, rows - split}}) {
    const QuantRepackParams p{.src = blocks.get() + first * RowBytes(dtype, cols),
                              .dst = out.device.get(),
                              .dtype = dtype,
                              .matrix_rows = rows,
                              .cols = cols,
                              .first_row = first,
                              .rows = count};
    EXPECT_TRUE(p.Validate().ok()) << p.Validate();
    EXPECT_EQ(Launch(p, nullptr), cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out;
}

// y = x W^T in double, rounded to float.
std::vector<float> Reference(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                             int64_t n, int64_t k) {
  std::vector<float> y(m * n);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(x[t * k + i]) * w[j * k + i];
      y[t * n + j] = static_cast<float>(sum);
    }
  }
  return y;
}

int64_t Block(DType dtype) { return GetBlockLayout(dtype).elements_per_block; }

// x [m, k] as the integer products round it (quant_gemm.h): each 256-element block of a
// row to a multiple of 2^(E - 14), E the exponent of its largest |x|.
std::vector<float> RoundedForIntegerProducts(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += 256) {
    float largest = 0.0f;
    for (size_t i = b; i < b + 256; ++i) largest = std::fmax(largest, std::fabs(x[i]));
    int exponent = 0;
    std::frexp(largest, &exponent);  // largest = f * 2^exponent, f in [0.5, 1): E = exponent - 1
    const double quantum = std::ldexp(1.0, exponent - 1 - 14);
    for (size_t i = b; i < b + 256; ++i) {
      out[i] = static_cast<float>(std::nearbyint(x[i] / quantum) * quantum);
    }
  }
  return out;
}

// The add + RMSNorm's row in double: (add + residual) * rsqrt(mean of its squares + eps) * weight.
std::vector<float> NormedRow(const std::vector<float>& add, const std::vector<float>& residual,
                             const std::vector<float>& weight, double eps) {
  const size_t k = add.size();
  double squares = 0;
  for (size_t i = 0; i < k; ++i) {
    const double h = static_cast<double>(add[i]) + residual[i];
    squares += h * h;
  }
  const double scale = 1.0 / std::sqrt(squares / static_cast<double>(k) + eps);
  std::vector<float> normed(k);
  for (size_t i = 0; i < k; ++i) {
    normed[i] = static_cast<float>((static_cast<double>(add[i]) + residual[i]) * scale * weight[i]);
  }
  return normed;
}

TEST(QuantGemmGpuTest, DequantizeIsBitExactWithTheCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kTypes) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{2, 1}, {34, 9}, {130, 16}}) {
      cols *= Block(dtype);
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype).data() << " rows " << rows << " cols "
                                        << cols << " seed " << seed);
      std::mt19937 rng(seed);
      QuantMatrix w = MakeMatrix(dtype, rows, cols, rng, 0.5f);
      DeviceBuffer<uint16_t> d_out(rows * cols);
      d_out.Poison();
      const QuantDequantizeParams p{
          .w = w.device.get(), .dst = d_out.get(), .dtype = dtype, .rows = rows, .cols = cols};
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<uint16_t> expected(w.values.size());
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = F32ToBf16(w.values[i]);
      EXPECT_EQ(d_out.Download(), expected);
    }
  }
}

TEST(QuantGemmGpuTest, SkinnyGemmMatchesTheCpuForEveryRowCount) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kTypes) {
    for (DType out_dtype : {DType::kBF16, DType::kF32}) {
      for (int64_t m = 1; m <= kMaxSkinnyGemmRows; ++m) {
        // k in blocks: one; 9 (a lane's units do not fill a step); 16 and 56 (4096 and 14336 for
        // the K-quants). n = 66: a last block with idle warps. n = 6144: more blocks than
        // multiprocessors (Q4_K's one token streams instead where QuantSkinnyStreams).
        for (auto [n, k_blocks] :
             {std::pair<int64_t, int64_t>{2, 1}, {66, 9}, {1034, 16}, {130, 56}, {6144, 16}}) {
          const int64_t k = k_blocks * Block(dtype);
          const uint32_t seed = FreshSeed();
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype).data() << " m " << m << " n " << n << " k " << k
                       << " out " << DTypeName(out_dtype).data() << " seed " << seed);
          std::mt19937 rng(seed);
          std::vector<float> x = RandomFloats(m * k, rng);
          DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
          QuantMatrix w = MakeMatrix(dtype, n, k, rng, 0.05f);
          // The integer products (quant_gemm.h) are exact for x as they round it; against x
          // itself, that rounding's error (about 5e-6 typically here, 7e-5 at worst over
          // 300 draws of n 2 and k 256 in a simulation) is held to 2e-4.
          const bool rounds_x = QuantSkinnyRoundsX(dtype, m, k);
          const std::vector<float> ref =
              Reference(rounds_x ? RoundedForIntegerProducts(x) : x, w.values, m, n, k);
          DeviceBuffer<uint8_t> d_y = testing::Poisoned(m * n, out_dtype);
          const QuantSkinnyGemmParams p{.x = d_x.get(),
                                        .w = w.device.get(),
                                        .w_dtype = dtype,
                                        .y = d_y.get(),
                                        .m = m,
                                        .n = n,
                                        .k = k,
                                        .output_dtype = out_dtype};
          ASSERT_TRUE(p.Validate().ok()) << p.Validate();
          CUDA_ASSERT(Launch(p, nullptr));
          CUDA_ASSERT(cudaDeviceSynchronize());
          const std::vector<float> got = testing::Download(d_y, out_dtype);
          EXPECT_LE(RelativeL2(got, ref), out_dtype == DType::kF32 ? 1e-5 : 1e-2);
          if (rounds_x) {
            EXPECT_LE(RelativeL2(got, Reference(x, w.values, m, n, k)),
                      out_dtype == DType::kF32 ? 2e-4 : 1e-2);
          }
        }
      }
    }
  }
}

TEST(QuantGemmGpuTest, SkinnyGemmSiluAndMulEpilogue) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kTypes) {
    for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
      for (int64_t m : {1, 5, 8}) {
        const int64_t inter = 1032, k = 2 * 256, n = 2 * inter;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype).data() << " activation " << static_cast<int>(activation)
                     << " m " << m << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(m * k, rng);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
        QuantMatrix w = MakeMatrix(dtype, n, k, rng, 0.1f);
        const std::vector<float> gate_up = Reference(x, w.values, m, n, k);
        const std::vector<float> ref = testing::CpuGatedActivation(gate_up, m, inter, activation);
        DeviceBuffer<uint16_t> d_y(m * inter);
        d_y.Poison();
        const QuantSkinnyGemmParams p{.x = d_x.get(),
                                      .w = w.device.get(),
                                      .w_dtype = dtype,
                                      .y = d_y.get(),
                                      .m = m,
                                      .n = n,
                                      .k = k,
                                      .silu_and_mul = true,
                                      .activation = activation};
        ASSERT_TRUE(p.Validate().ok()) << p.Validate();
        CUDA_ASSERT(Launch(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeL2(HalfToFloat(d_y.Download(), DType::kBF16), ref), 1e-2);
      }
    }
  }
}

// The add + RMSNorm folded into the integer products at one token (add_norm_residual), plain and
// with the gated activation, against the norm kernel followed by the same launch on its output,
// within bf16's rounding of the normed row and of the output (the fold rounds h * weight to
// bf16 and applies the norm's scale to the sums; the kernel rounds the normed row once); the
// residual left as it was. Then settle_residual: the residual plus the output buffer's old
// values, bit for bit, and the product equal bit for bit to the same launch without it. Each
// integer type, at Llama-3-8B's k (4096) and a small one; and what Validate refuses.
TEST(QuantGemmGpuTest, SkinnyGemmFoldsTheAddRmsNormAndSettlesTheResidual) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kQ4_K, DType::kQ8_0, DType::kQ6_K}) {
    for (const int64_t k : {int64_t{256}, int64_t{4096}}) {
      for (const bool gated : {false, true}) {
        const int64_t n = gated ? 2 * 1032 : 1034, y_width = gated ? n / 2 : n;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype).data() << " k " << k
                                          << (gated ? " gated" : "") << " seed " << seed);
        std::mt19937 rng(seed);
        const float eps = 1e-5f;
        std::vector<float> add = RandomFloats(k, rng), residual = RandomFloats(k, rng, 2.0f);
        std::vector<float> norm_w = RandomFloats(k, rng, 0.2f, 1.0f);
        QuantMatrix w = MakeMatrix(dtype, n, k, rng, 0.05f);
        DeviceBuffer<uint16_t> d_add(RoundToHalf(add, DType::kBF16));
        DeviceBuffer<uint16_t> d_norm_w(RoundToHalf(norm_w, DType::kBF16));
        DeviceBuffer<float> d_residual(residual), d_residual2(residual);
        DeviceBuffer<uint16_t> d_y(y_width), d_normed(k), d_y2(y_width);
        d_y.Poison();
        d_normed.Poison();
        d_y2.Poison();
        QuantSkinnyGemmParams folded{.x = d_add.get(),
                                     .w = w.device.get(),
                                     .w_dtype = dtype,
                                     .y = d_y.get(),
                                     .m = 1,
                                     .n = n,
                                     .k = k,
                                     .silu_and_mul = gated};
        folded.add_norm_residual = d_residual.get();
        folded.add_norm_weight = d_norm_w.get();
        folded.add_norm_epsilon = eps;
        ASSERT_TRUE(folded.Validate().ok()) << folded.Validate();
        CUDA_ASSERT(Launch(folded, nullptr));
        CUDA_ASSERT(testing::LaunchUnfolded(folded, d_residual2.get(), d_normed.get(), d_y2.get()));
        CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<float> got = HalfToFloat(d_y.Download(), DType::kBF16);
        const std::vector<float> want = HalfToFloat(d_y2.Download(), DType::kBF16);
        EXPECT_LE(RelativeL2(got, want), 1e-2);
        if (!gated) {  // and against the double-precision product of the normed row
          // (add and norm_w as rounded to bf16 above)
          EXPECT_LE(
              RelativeL2(got, Reference(NormedRow(add, residual, norm_w, eps), w.values, 1, n, k)),
              1e-2);
        }
        EXPECT_EQ(d_residual.Download(), residual) << "the fold does not write the residual";
      }
    }
    // settle_residual, on o_proj's shape (4096 x 4096).
    const int64_t n = 4096, k = 4096;
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << DTypeName(dtype).data() << " settle seed " << seed);
    std::mt19937 rng(seed);
    std::vector<float> x = RandomFloats(k, rng), before = RandomFloats(n, rng);
    std::vector<float> residual = RandomFloats(n, rng, 2.0f);
    QuantMatrix w = MakeMatrix(dtype, n, k, rng, 0.02f);
    const std::vector<uint16_t> before_bits = RoundToHalf(before, DType::kBF16);  // in place
    DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_y(before_bits), d_y2(n);
    DeviceBuffer<float> d_residual(residual);
    QuantSkinnyGemmParams p{.x = d_x.get(),
                            .w = w.device.get(),
                            .w_dtype = dtype,
                            .y = d_y.get(),
                            .m = 1,
                            .n = n,
                            .k = k};
    p.settle_residual = d_residual.get();
    ASSERT_TRUE(p.Validate().ok()) << p.Validate();
    CUDA_ASSERT(Launch(p, nullptr));
    QuantSkinnyGemmParams q = p;
    q.y = d_y2.get();
    q.settle_residual = nullptr;
    CUDA_ASSERT(Launch(q, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    for (int64_t i = 0; i < n; ++i) residual[i] += before[i];
    EXPECT_EQ(d_residual.Download(), residual);
    EXPECT_EQ(d_y.Download(), d_y2.Download());
    // Refusals: the settle with the fold, with the activation, or at two rows.
    p.add_norm_residual = d_residual.get();
    p.add_norm_weight = d_x.get();
    EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("settle_residual"));
    p.add_norm_residual = nullptr;
    p.add_norm_weight = nullptr;
    p.silu_and_mul = true;
    EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("settle_residual"));
    p.silu_and_mul = false;
    p.m = 2;
    EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("settle_residual"));
  }
  // The fold where the float kernel would run: Q4_0, a k that is no multiple of 256, two rows,
  // an fp32 output.
  std::mt19937 rng(FreshSeed());
  QuantMatrix q40 = MakeMatrix(DType::kQ4_0, 2, 512, rng, 0.05f);
  QuantMatrix q8 = MakeMatrix(DType::kQ8_0, 2, 96, rng, 0.05f);
  QuantMatrix q8_512 = MakeMatrix(DType::kQ8_0, 2, 512, rng, 0.05f);
  DeviceBuffer<uint16_t> d_x(512), d_w(512);
  DeviceBuffer<float> d_residual(512), d_y(4);
  for (auto [matrix, dtype, m, k, out] :
       {std::tuple<const QuantMatrix*, DType, int64_t, int64_t, DType>{&q40, DType::kQ4_0, 1, 512,
                                                                       DType::kBF16},
        {&q8, DType::kQ8_0, 1, 96, DType::kBF16},
        {&q8_512, DType::kQ8_0, 2, 512, DType::kBF16},
        {&q8_512, DType::kQ8_0, 1, 512, DType::kF32}}) {
    QuantSkinnyGemmParams p{.x = d_x.get(),
                            .w = matrix->device.get(),
                            .w_dtype = dtype,
                            .y = d_y.get(),
                            .m = m,
                            .n = 2,
                            .k = k,
                            .output_dtype = out};
    ASSERT_TRUE(p.Validate().ok()) << p.Validate();
    p.add_norm_residual = d_residual.get();
    p.add_norm_weight = d_w.get();
    EXPECT_THAT(std::string(p.Validate().message()), ::testing::HasSubstr("integer products"))
        << DTypeName(dtype).data() << " m " << m << " k " << k;
  }
}

// Q4_K's one-token products streamed through shared memory (QuantSkinnyStreams; the row-count
// test above takes them on small matrices) on matrices whose warps take several groups of rows
// (sized from this GPU's multiprocessors): plain against the double-precision product of x as
// rounded, with a last pass of 4 units (k 2304) and at down's k with the residual's settle;
// gated against the CPU's activation; the add + RMSNorm folded in, against the norm kernel and
// the same launch, and the double-precision product of the normed row. Then the same with
// streaming off: the kernel of the GPUs with less shared memory a block (compute capability 8.6
// and 8.9), which no test would reach on a Hopper GPU or an A100 otherwise.
TEST(QuantGemmGpuTest, SkinnyGemmLargeOneTokenProductsStreamedAndNot) {
  LMSERVE_REQUIRE_GPU();
  const int multiprocessors = CurrentMultiprocessorCount();
  struct Case {
    int64_t k;
    bool gated, fold, settle;
    DType out;
  };
  for (const bool streaming : {true, false}) {
    const testing::ScopedSwitch scoped(SetQuantSkinnyStreaming, streaming);
    for (const Case c :
         {Case{2304, false, false, false, DType::kF32},
          Case{14336, false, false, true, DType::kBF16},
          Case{4096, true, false, false, DType::kBF16}, Case{4096, true, true, false, DType::kBF16},
          Case{4096, false, true, false, DType::kBF16}}) {
      const int64_t passes = (c.k / 64 + 31) / 32;
      // Two rows a group (a gate row and its up row gated), n / 2 groups: about four passes for
      // each of 16 warps a multiprocessor, 3 groups past a multiple.
      const int64_t n = 2 * (64 * multiprocessors / passes + 3);
      const int64_t y_width = c.gated ? n / 2 : n;
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << (streaming ? "streamed" : "not streamed") << ", n " << n << " k " << c.k
                   << (c.gated ? " gated" : "") << (c.fold ? " fold" : "")
                   << (c.settle ? " settle" : "") << " seed " << seed);
      ASSERT_EQ(QuantSkinnyStreams(DType::kQ4_K, 1, c.k), streaming)
          << "less shared memory a block";
      std::mt19937 rng(seed);
      // x, norm_w and before as rounded to bf16 (RoundToHalf, in place) below.
      std::vector<float> x = RandomFloats(c.k, rng), norm_w = RandomFloats(c.k, rng, 0.2f, 1.0f);
      std::vector<float> before = RandomFloats(y_width, rng);
      const std::vector<float> residual = RandomFloats(c.k, rng, 2.0f);
      std::vector<float> settle = RandomFloats(y_width, rng, 2.0f);
      QuantMatrix w = MakeMatrix(DType::kQ4_K, n, c.k, rng, 0.05f);
      DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
      DeviceBuffer<uint16_t> d_norm_w(RoundToHalf(norm_w, DType::kBF16)), d_normed(c.k);
      DeviceBuffer<float> d_residual(residual), d_residual2(residual), d_settle(settle);
      DeviceBuffer<uint8_t> d_y = testing::Poisoned(y_width, c.out);
      DeviceBuffer<uint8_t> d_y2 = testing::Poisoned(y_width, c.out);
      if (c.settle) {  // the output buffer holds what the settle adds
        const std::vector<uint16_t> bits = RoundToHalf(before, DType::kBF16);
        CUDA_ASSERT(cudaMemcpy(d_y.get(), bits.data(), 2 * y_width, cudaMemcpyHostToDevice));
      }
      QuantSkinnyGemmParams p{.x = d_x.get(),
                              .w = w.device.get(),
                              .w_dtype = DType::kQ4_K,
                              .y = d_y.get(),
                              .m = 1,
                              .n = n,
                              .k = c.k,
                              .output_dtype = c.out,
                              .silu_and_mul = c.gated};
      if (c.fold) {
        p.add_norm_residual = d_residual.get();
        p.add_norm_weight = d_norm_w.get();
        p.add_norm_epsilon = 1e-5f;
      }
      if (c.settle) p.settle_residual = d_settle.get();
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      if (c.settle) {  // the same product without the settle
        QuantSkinnyGemmParams q = p;
        q.y = d_y2.get();
        q.settle_residual = nullptr;
        CUDA_ASSERT(Launch(q, nullptr));
      } else if (c.fold) {
        CUDA_ASSERT(testing::LaunchUnfolded(p, d_residual2.get(), d_normed.get(), d_y2.get()));
      }
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> got = testing::Download(d_y, c.out);
      // The row multiplied: x as the integer products round it, or the normed row in double.
      std::vector<float> want =
          Reference(c.fold ? NormedRow(x, residual, norm_w, p.add_norm_epsilon)
                           : RoundedForIntegerProducts(x),
                    w.values, 1, n, c.k);
      if (c.gated) want = testing::CpuGatedActivation(want, 1, y_width, GateActivation::kSilu);
      EXPECT_LE(RelativeL2(got, want), c.out == DType::kF32 ? 1e-5 : 1e-2);
      if (c.fold) {
        EXPECT_LE(RelativeL2(got, testing::Download(d_y2, c.out)), 1e-2);
        EXPECT_EQ(d_residual.Download(), residual) << "the fold does not write the residual";
      }
      if (c.settle) {
        for (int64_t i = 0; i < y_width; ++i) settle[i] += before[i];
        EXPECT_EQ(d_settle.Download(), settle);
        EXPECT_EQ(testing::Download(d_y, c.out), testing::Download(d_y2, c.out));
      }
    }
  }
}

// Dummy weights: finite, within about +-high, not constant, and the same for the same seed.
TEST(QuantGemmGpuTest, DummyFillGivesBoundedVariedValues) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : kTypes) {
    SCOPED_TRACE(DTypeName(dtype).data());
    const int64_t rows = 64, cols = 4 * 256;
    const float high = 0.02f;
    std::vector<uint16_t> first;
    for (int pass = 0; pass < 2; ++pass) {
      DeviceBuffer<uint8_t> w(QuantMatrixBytes(dtype, rows, cols));
      w.Poison();
      for (int64_t first_row : {int64_t{0}, rows / 2}) {
        const QuantDummyFillParams fill{.dst = w.get(),
                                        .dtype = dtype,
                                        .matrix_rows = rows,
                                        .cols = cols,
                                        .first_row = first_row,
                                        .rows = rows / 2,
                                        .high = high,
                                        .seed = 42};
        ASSERT_TRUE(fill.Validate().ok()) << fill.Validate();
        CUDA_ASSERT(Launch(fill, nullptr));
      }
      DeviceBuffer<uint16_t> d_out(rows * cols);
      const QuantDequantizeParams p{
          .w = w.get(), .dst = d_out.get(), .dtype = dtype, .rows = rows, .cols = cols};
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<uint16_t> bits = d_out.Download();
      const std::vector<float> values = HalfToFloat(bits, DType::kBF16);
      float lo = values[0], hi = values[0];
      for (float v : values) {
        ASSERT_TRUE(std::isfinite(v));
        lo = std::fmin(lo, v), hi = std::fmax(hi, v);
      }
      EXPECT_LE(hi, high * 1.05f);
      EXPECT_GE(lo, -high * 1.05f);
      EXPECT_GT(hi - lo, high / 2);
      if (pass == 0)
        first = bits;
      else
        EXPECT_EQ(bits, first);
    }
  }
}

TEST(QuantGemmGpuTest, ValidateNamesWhatIsNotSupported) {
  EXPECT_THAT(std::string(CheckQuantMatrix(DType::kQ4_K, 8, 128).message()),
              ::testing::HasSubstr("multiple of 256"));
  EXPECT_THAT(std::string(CheckQuantMatrix(DType::kQ5_K, 8, 256).message()),
              ::testing::HasSubstr("Q8_0, Q4_0, Q4_K, Q6_K"));
  EXPECT_THAT(std::string(CheckQuantMatrix(DType::kQ8_0, 7, 64).message()),
              ::testing::HasSubstr("rows even"));
  const QuantSkinnyGemmParams f16{.m = 1, .n = 2, .k = 32, .input_dtype = DType::kF16};
  EXPECT_THAT(std::string(f16.Validate().message()), ::testing::HasSubstr("bf16"));
  EXPECT_TRUE(SupportsQuantWeights(DType::kQ6_K));
  EXPECT_FALSE(SupportsQuantWeights(DType::kQ4_1));
}

}  // namespace
}  // namespace lmserve::kernels::cuda
