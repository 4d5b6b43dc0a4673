// The FP8 kernels (kernels/cuda/fp8.h) and cuBLASLt's FP8 GEMM (gemm.h) against their CPU twin
// (kernels/cpu/fp8.h): the row quantizer bit for bit (bytes and scales), the FP8 skinny GEMM for
// every row count (W8A16: x as it is) and with its gated-activation epilogue, and the cuBLASLt
// FP8 GEMM with per-token x per-channel outer-vector scales at awkward sizes, each on fresh random
// inputs into poisoned outputs. Skipped below compute capability 8.9.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv_postprocess.h"
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

#define LMSERVE_REQUIRE_FP8_GPU()                                                            \
  do {                                                                                       \
    LMSERVE_REQUIRE_GPU();                                                                   \
    const auto fp8_devices = ListDevices();                                                  \
    if (!SupportsFp8(fp8_devices[0].compute_capability_major,                                \
                     fp8_devices[0].compute_capability_minor)) {                             \
      GTEST_SKIP() << "GPU " << fp8_devices[0].name << " has no FP8 (compute capability "    \
                   << fp8_devices[0].compute_capability_major << "."                         \
                   << fp8_devices[0].compute_capability_minor << " < 8.9): skipped";         \
    }                                                                                        \
  } while (0)

// Quantized on the host (the reference's bytes and scales).
struct HostF8 {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};
HostF8 QuantizeOnHost(const std::vector<float>& values, int64_t rows, int64_t cols) {
  HostF8 out{std::vector<uint8_t>(rows * cols), std::vector<float>(rows)};
  QuantizeRowsF8E4M3(values.data(), rows, cols, cols, out.q.data(), out.scales.data());
  return out;
}

// W [n, k] quantized per row on the host and uploaded: the device's operands and the CPU
// reference's.
struct F8Weights {
  int64_t n = 0, k = 0;
  HostF8 host;
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<float> scales;

  // x [m, k] times W^T on the CPU (kernels/cpu/fp8.h), x as it is or (`quantize_x`) quantized
  // per token as the W8A8 path does.
  std::vector<float> Reference(const std::vector<float>& x, int64_t m,
                               bool quantize_x = false) const {
    std::vector<float> y(m * n);
    F8LinearReference(x.data(), m, k, host.q.data(), host.scales.data(), n, quantize_x, y.data());
    return y;
  }
};
F8Weights UploadF8(const std::vector<float>& w, int64_t n, int64_t k) {
  HostF8 host = QuantizeOnHost(w, n, k);
  DeviceBuffer<uint8_t> q(host.q);
  DeviceBuffer<float> scales(host.scales);
  return {n, k, std::move(host), std::move(q), std::move(scales)};
}

TEST(Fp8GpuTest, QuantizeRowsIsBitExactWithTheCpu) {
  LMSERVE_REQUIRE_FP8_GPU();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 16}, {17, 1040}, {300, 4096}}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype).data() << " rows " << rows
                                        << " cols " << cols << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> x = RandomFloats(rows * cols, rng, 3.0f);
      for (int64_t c = 0; c < cols; ++c) x[c] = 0.0f;  // an all-zero row
      if (rows > 1) x[cols + 3] = 1e6f;                 // a large outlier in another
      DeviceBuffer<uint8_t> d_x = testing::Upload(x, dtype);  // rounds x to dtype
      const HostF8 ref = QuantizeOnHost(x, rows, cols);
      DeviceBuffer<uint8_t> d_q(rows * cols);
      DeviceBuffer<float> d_scales(rows);
      d_q.Poison(0x7f);
      d_scales.Poison();
      const F8QuantizeRowsParams p{.src = d_x.get(),
                                   .dst = d_q.get(),
                                   .scales = d_scales.get(),
                                   .rows = rows,
                                   .cols = cols,
                                   .src_dtype = dtype};
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_EQ(d_q.Download(), ref.q);
      EXPECT_EQ(d_scales.Download(), ref.scales);
    }
  }
  F8QuantizeRowsParams bad{.rows = 1, .cols = 24};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("multiple of 16"));
}

TEST(Fp8GpuTest, SkinnyGemmMatchesTheCpuForEveryRowCount) {
  LMSERVE_REQUIRE_FP8_GPU();
  for (const bool tensor_cores : {true, false}) {
    const testing::ScopedSwitch scoped(SetF8SkinnyTensorCores, tensor_cores);
    for (DType out_dtype : {DType::kBF16, DType::kF32}) {
      for (int64_t m = 1; m <= kMaxSkinnyGemmRows; ++m) {
        // k = 3600: a whole step of 128 pieces of 16 and 97 left for the tail; n = 66: a last block
        // with idle warps.
        for (auto [n, k] : {std::pair<int64_t, int64_t>{8, 64},
                            {4096, 4096},
                            {1034, 272},
                            {130, 14336},
                            {66, 3600}}) {
          const uint32_t seed = FreshSeed();
          SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " out "
                                            << DTypeName(out_dtype).data() << " tensor cores "
                                            << tensor_cores << " seed " << seed);
          std::mt19937 rng(seed);
          std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
          DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
          const F8Weights wq = UploadF8(w, n, k);
          const std::vector<float> ref = wq.Reference(x, m);
          F8SkinnyGemmParams p{.x = d_x.get(),
                               .w = wq.q.get(),
                               .w_scales = wq.scales.get(),
                               .m = m,
                               .n = n,
                               .k = k,
                               .output_dtype = out_dtype};
          DeviceBuffer<uint8_t> d_y = testing::Poisoned(m * n, out_dtype);
          p.y = d_y.get();
          ASSERT_TRUE(p.Validate().ok()) << p.Validate();
          CUDA_ASSERT(Launch(p, nullptr));
          CUDA_ASSERT(cudaDeviceSynchronize());
          EXPECT_LE(RelativeL2(testing::Download(d_y, out_dtype), ref),
                    out_dtype == DType::kF32 ? 1e-5 : 1e-2);
        }
      }
    }
  }
  F8SkinnyGemmParams bad{.m = 1, .n = 8, .k = 24};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("multiple of 16"));
}

// The gated activation epilogue, against the CPU's activation of the reference product.
TEST(Fp8GpuTest, SkinnyGemmSiluAndMulEpilogue) {
  LMSERVE_REQUIRE_FP8_GPU();
  for (const bool tensor_cores : {true, false}) {
    const testing::ScopedSwitch scoped(SetF8SkinnyTensorCores, tensor_cores);
    for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
      for (int64_t m : {1, 5, 8}) {
        const int64_t inter = 1032, k = 272, n = 2 * inter;
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "activation " << static_cast<int>(activation) << " m " << m
                     << " tensor cores " << tensor_cores << " seed " << seed);
        std::mt19937 rng(seed);
        std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.1f);
        DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
        const F8Weights wq = UploadF8(w, n, k);
        const std::vector<float> gate_up = wq.Reference(x, m);
        const std::vector<float> ref = testing::CpuGatedActivation(gate_up, m, inter, activation);
        DeviceBuffer<uint16_t> d_y(m * inter);
        d_y.Poison();
        const F8SkinnyGemmParams p{.x = d_x.get(),
                                   .w = wq.q.get(),
                                   .w_scales = wq.scales.get(),
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

// The add + RMSNorm folded into the FP8 skinny GEMM (add_norm_residual), plain and with the
// gated activation, against the norm kernel followed by the same GEMM on the same device, within
// bf16's rounding of the normed row and of the output; the residual left as it was. Then
// settle_residual: the residual plus the output buffer's old values, bit for bit, and the
// product equal bit for bit to the same launch without it. Llama-3-8B's QKV, gate/up and o_proj
// shapes.
TEST(Fp8GpuTest, SkinnyGemmFoldsTheAddRmsNormAndSettlesTheResidual) {
  LMSERVE_REQUIRE_FP8_GPU();
  const int64_t k = 4096;
  for (const bool gated : {false, true}) {
    const int64_t n = gated ? 2 * 14336 : 6144, y_width = gated ? n / 2 : n;
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << (gated ? "gate/up" : "qkv") << " seed " << seed);
    std::mt19937 rng(seed);
    const float eps = 1e-5f;
    std::vector<float> add = RandomFloats(k, rng), residual = RandomFloats(k, rng, 2.0f);
    std::vector<float> norm_w = RandomFloats(k, rng, 0.2f, 1.0f);
    std::vector<float> w = RandomFloats(n * k, rng, 0.02f);
    DeviceBuffer<uint16_t> d_add(RoundToHalf(add, DType::kBF16));
    DeviceBuffer<uint16_t> d_norm_w(RoundToHalf(norm_w, DType::kBF16));
    const F8Weights wq = UploadF8(w, n, k);
    DeviceBuffer<float> d_residual(residual), d_residual2(residual);
    DeviceBuffer<uint16_t> d_y(y_width), d_normed(k), d_y2(y_width);
    d_y.Poison();
    d_normed.Poison();
    d_y2.Poison();
    F8SkinnyGemmParams folded{.x = d_add.get(),
                              .w = wq.q.get(),
                              .w_scales = wq.scales.get(),
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
    EXPECT_LE(RelativeL2(HalfToFloat(d_y.Download(), DType::kBF16),
                         HalfToFloat(d_y2.Download(), DType::kBF16)),
              1e-2);
    EXPECT_EQ(d_residual.Download(), residual) << "the fold does not write the residual";
  }
  // settle_residual, on o_proj's shape (4096 x 4096).
  const int64_t n = 4096;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "settle seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> x = RandomFloats(k, rng), w = RandomFloats(n * k, rng, 0.02f);
  std::vector<float> before = RandomFloats(n, rng), residual = RandomFloats(n, rng, 2.0f);
  const std::vector<uint16_t> before_bits = RoundToHalf(before, DType::kBF16);
  const F8Weights wq = UploadF8(w, n, k);
  DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_y(before_bits), d_y2(n);
  DeviceBuffer<float> d_residual(residual);
  F8SkinnyGemmParams p{.x = d_x.get(),
                       .w = wq.q.get(),
                       .w_scales = wq.scales.get(),
                       .y = d_y.get(),
                       .m = 1,
                       .n = n,
                       .k = k};
  p.settle_residual = d_residual.get();
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  F8SkinnyGemmParams q = p;
  q.y = d_y2.get();
  q.settle_residual = nullptr;
  CUDA_ASSERT(Launch(q, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  for (int64_t i = 0; i < n; ++i) residual[i] += before[i];
  EXPECT_EQ(d_residual.Download(), residual);
  EXPECT_EQ(d_y.Download(), d_y2.Download());
  p.add_norm_residual = d_residual.get();
  p.add_norm_weight = d_x.get();
  EXPECT_FALSE(p.Validate().ok()) << "settle with the fold";
  p.add_norm_residual = nullptr;
  p.add_norm_weight = nullptr;
  p.silu_and_mul = true;
  EXPECT_FALSE(p.Validate().ok()) << "settle with the activation";
  p.silu_and_mul = false;
  p.m = 2;
  EXPECT_FALSE(p.Validate().ok()) << "settle at two rows";
}

// The activations' range: x past fp16's 65,504 in some chunks and under its normal range
// (6e-5) in others, and a chunk of zeros. The tensor-core kernel (2 to 8 tokens) takes x in fp16
// with a power of two a chunk; its output must still match the CPU's fp32 product of the same
// bf16 values, as the CUDA-core kernel's does.
TEST(Fp8GpuTest, SkinnyGemmTakesActivationsPastFp16sRange) {
  LMSERVE_REQUIRE_FP8_GPU();
  for (const bool tensor_cores : {true, false}) {
    const testing::ScopedSwitch scoped(SetF8SkinnyTensorCores, tensor_cores);
    for (const int64_t m : {1, 2, 5}) {
      const int64_t n = 272, k = 4096;
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << m << " tensor cores " << tensor_cores << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t c = 0; c < k; ++c) {
          const int64_t chunk = c / 64;
          float& v = x[t * k + c];
          if (chunk % 4 == 1) v *= 3e5f;   // past fp16's largest finite value
          if (chunk % 4 == 2) v *= 1e-6f;  // under fp16's smallest normal one
          if (chunk == 7 + t) v = 0.0f;    // a chunk of zeros
        }
      }
      DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
      const std::vector<float> x_bf16 = HalfToFloat(RoundToHalf(x, DType::kBF16), DType::kBF16);
      const F8Weights wq = UploadF8(w, n, k);
      const std::vector<float> ref = wq.Reference(x_bf16, m);
      DeviceBuffer<float> d_y(m * n);
      d_y.Poison();
      const F8SkinnyGemmParams p{.x = d_x.get(),
                                 .w = wq.q.get(),
                                 .w_scales = wq.scales.get(),
                                 .y = d_y.get(),
                                 .m = m,
                                 .n = n,
                                 .k = k,
                                 .output_dtype = DType::kF32};
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> got = d_y.Download();
      EXPECT_LE(RelativeL2(got, ref), 1e-5);
      // The small chunks' share alone: the product over them only, where the large ones are 0.
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t c = 0; c < k; ++c) {
          if ((c / 64) % 4 != 2) x[t * k + c] = 0.0f;
        }
      }
      const std::vector<float> small_bf16 = HalfToFloat(RoundToHalf(x, DType::kBF16), DType::kBF16);
      DeviceBuffer<uint16_t> d_small(RoundToHalf(x, DType::kBF16));
      const std::vector<float> small_ref = wq.Reference(small_bf16, m);
      F8SkinnyGemmParams q = p;
      q.x = d_small.get();
      CUDA_ASSERT(Launch(q, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeL2(d_y.Download(), small_ref), 1e-5);
    }
  }
}

// cuBLASLt's FP8 GEMM: x quantized per token on the GPU, W per channel, outer-vector scales (or
// the scaling kernel after a unit-scale GEMM, where cuBLASLt refuses them), bf16 out, against the
// CPU's product of the same quantized values.
TEST(Fp8GpuTest, CublasLtGemmWithPerTokenAndPerChannelScales) {
  LMSERVE_REQUIRE_FP8_GPU();
  auto handle = BlasLtHandle::Create();
  ASSERT_TRUE(handle.ok()) << handle.status();
  const size_t workspace_bytes = size_t{32} << 20;
  DeviceBuffer<uint8_t> workspace(workspace_bytes);
  for (bool autotune : {false, true}) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{9, 64, 64},
                           {17, 1040, 272},
                           {97, 4096, 4096},
                           {300, 768, 14336},
                           {1, 32, 48}}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " autotune "
                                        << autotune << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
      // Rows of very different sizes: per-token and per-channel scales must each be applied.
      for (int64_t c = 0; c < k; ++c) x[(m / 2) * k + c] *= 1000.0f;
      for (int64_t c = 0; c < k; ++c) w[(n - 1) * k + c] *= 1e-3f;
      DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16));
      const F8Weights wq = UploadF8(w, n, k);
      DeviceBuffer<uint8_t> d_xq(m * k);
      DeviceBuffer<float> d_x_scales(m);
      const std::vector<float> ref = wq.Reference(x, m, /*quantize_x=*/true);
      const F8QuantizeRowsParams quantize{.src = d_x.get(),
                                          .dst = d_xq.get(),
                                          .scales = d_x_scales.get(),
                                          .rows = m,
                                          .cols = k};
      CUDA_ASSERT(Launch(quantize, nullptr));
      const GemmShape shape{
          .m = m, .n = n, .k = k, .input_dtype = DType::kF8E4M3, .output_dtype = DType::kBF16};
      auto plan = GemmPlan::Create((*handle)->get(), shape, workspace.get(), workspace_bytes,
                                   autotune, nullptr);
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (m == 9 && !autotune) {
        std::printf("[ cublaslt ] FP8 scales applied by %s\n",
                    (*plan)->fp8_outer_vector_scales() ? "cuBLASLt (outer-vector scaling)"
                                                       : "a kernel after a unit-scale GEMM");
      }
      DeviceBuffer<uint16_t> d_y(m * n);
      d_y.Poison();
      ASSERT_EQ((*plan)->Run(d_xq.get(), wq.q.get(), d_y.get(), nullptr, wq.scales.get(),
                             d_x_scales.get()),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ((*plan)->Run(d_xq.get(), wq.q.get(), d_y.get(), nullptr),
                CUBLAS_STATUS_INVALID_VALUE)
          << "FP8 without scales is refused";
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> y = HalfToFloat(d_y.Download(), DType::kBF16);
      EXPECT_LE(RelativeL2(y, ref), 1e-2);
      // The small channel and the large token, each against its own scale of the reference.
      std::vector<float> small_channel, small_ref;
      for (int64_t t = 0; t < m; ++t) {
        small_channel.push_back(y[t * n + n - 1]);
        small_ref.push_back(ref[t * n + n - 1]);
      }
      EXPECT_LE(RelativeL2(small_channel, small_ref), 1e-2);
    }
  }
  const GemmShape bad{.m = 4, .n = 40, .k = 64, .input_dtype = DType::kF8E4M3};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("multiples of 16"));
}

TEST(Fp8GpuTest, ScaleOutputMultipliesRowsAndColumns) {
  LMSERVE_REQUIRE_FP8_GPU();
  const int64_t m = 7, n = 264, stride = 272;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> y = RandomFloats(m * stride, rng, 100.0f);
  const std::vector<float> rows = RandomFloats(m, rng), cols = RandomFloats(n, rng);
  DeviceBuffer<uint16_t> d_y(RoundToHalf(y, DType::kBF16));
  DeviceBuffer<float> d_rows(rows), d_cols(cols);
  const F8ScaleOutputParams p{.y = d_y.get(),
                              .row_scales = d_rows.get(),
                              .col_scales = d_cols.get(),
                              .m = m,
                              .n = n,
                              .y_stride = stride};
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> out = HalfToFloat(d_y.Download(), DType::kBF16);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < stride; ++j) {
      // The columns past n are not touched; the others are the bf16 of the fp32 product.
      const float want = j < n ? Bf16ToF32(F32ToBf16(y[t * stride + j] * (rows[t] * cols[j])))
                               : y[t * stride + j];
      ASSERT_EQ(out[t * stride + j], want) << t << " " << j;
    }
  }
}

// FP8 scales as a GEMM's would be: positive, small (unscaled products are large: E4M3 values up to
// 448, summed over k).
std::vector<float> PositiveScales(int64_t count, std::mt19937& rng) {
  std::vector<float> v = RandomFloats(count, rng, 0.01f);
  for (float& x : v) x = std::abs(x) + 1e-4f;
  return v;
}

// The gated activation applying an FP8 GEMM's output scales as it reads the product (the runner's
// path where cuBLASLt leaves them to a kernel): bit for bit F8ScaleOutput followed by the plain
// activation, both activations, and its refusals.
TEST(Fp8GpuTest, GatedActivationAppliesOutputScalesAsScaleOutputThenActivation) {
  LMSERVE_REQUIRE_FP8_GPU();
  const int64_t m = 5, inter = 264, n = 2 * inter;
  for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "activation " << static_cast<int>(activation) << " seed "
                                      << seed);
    std::mt19937 rng(seed);
    std::vector<float> products = RandomFloats(m * n, rng, 3000.0f);
    const std::vector<uint16_t> gate_up = RoundToHalf(products, DType::kBF16);
    const std::vector<float> rows = PositiveScales(m, rng), cols = PositiveScales(n, rng);
    DeviceBuffer<uint16_t> d_scaled(gate_up), d_unscaled(gate_up), d_want(m * inter),
        d_got(m * inter);
    DeviceBuffer<float> d_rows(rows), d_cols(cols);
    d_got.Poison();
    const F8ScaleOutputParams scale{
        .y = d_scaled.get(), .row_scales = d_rows.get(), .col_scales = d_cols.get(), .m = m,
        .n = n};
    CUDA_ASSERT(Launch(scale, nullptr));
    SiluAndMulParams act{.gate_up = d_scaled.get(),
                         .output = d_want.get(),
                         .num_tokens = m,
                         .intermediate_size = inter,
                         .activation = activation};
    CUDA_ASSERT(Launch(act, nullptr));
    act.gate_up = d_unscaled.get();
    act.output = d_got.get();
    act.row_scales = d_rows.get();
    act.col_scales = d_cols.get();
    ASSERT_TRUE(act.Validate().ok()) << act.Validate();
    CUDA_ASSERT(Launch(act, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(d_got.Download(), d_want.Download());
  }
  SiluAndMulParams bad{.gate_up = reinterpret_cast<void*>(256),
                       .output = reinterpret_cast<void*>(256),
                       .num_tokens = 1,
                       .intermediate_size = 8,
                       .row_scales = reinterpret_cast<const float*>(256)};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("come together"));
  bad.col_scales = reinterpret_cast<const float*>(256);
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate();
  bad.dtype = DType::kF16;
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("bf16"));
  bad.dtype = DType::kBF16;
  bad.col_scales = reinterpret_cast<const float*>(260);
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("aligned"));
}

// QKV post-processing and the add + RMSNorm applying an FP8 GEMM's output scales as they read
// the product: bit for bit F8ScaleOutput followed by the plain kernel (queries, both caches, the
// residual and the normed output).
TEST(Fp8GpuTest, QkvPostProcessAndAddRmsNormApplyOutputScalesAsScaleOutputThenThemselves) {
  LMSERVE_REQUIRE_FP8_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t tokens = 5, heads = 4, kv_heads = 2, head_dim = 64, max_position = 8;
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  {
    std::vector<float> products = RandomFloats(tokens * width, rng, 3000.0f);
    std::vector<float> bias = RandomFloats(width, rng, 0.5f);
    std::vector<float> cos_sin = RandomFloats(max_position * head_dim, rng);
    const std::vector<uint16_t> qkv = RoundToHalf(products, DType::kBF16);
    DeviceBuffer<uint16_t> d_want(qkv), d_got(qkv), d_bias(RoundToHalf(bias, DType::kBF16));
    DeviceBuffer<float> d_rows(PositiveScales(tokens, rng)), d_cols(PositiveScales(width, rng));
    DeviceBuffer<float> d_cos_sin(cos_sin);
    DeviceBuffer<int32_t> d_positions(std::vector<int32_t>{0, 3, 1, 7, 2});
    DeviceBuffer<int64_t> d_slots(std::vector<int64_t>{4, 0, 9, -1, 15});
    const int64_t cache = 16 * kv_heads * head_dim;
    DeviceBuffer<uint16_t> k_want(cache), v_want(cache), k_got(cache), v_got(cache);
    for (auto* b : {&k_want, &v_want, &k_got, &v_got}) {
      CUDA_ASSERT(cudaMemset(b->get(), 0, cache * 2));
    }
    const F8ScaleOutputParams scale{.y = d_want.get(), .row_scales = d_rows.get(),
                                    .col_scales = d_cols.get(), .m = tokens, .n = width};
    CUDA_ASSERT(Launch(scale, nullptr));
    QkvPostProcessParams post{.qkv = d_want.get(), .bias = d_bias.get(),
                              .positions = d_positions.get(), .cos_sin = d_cos_sin.get(),
                              .slot_mapping = d_slots.get(), .query_out = d_want.get(),
                              .key_cache = k_want.get(), .value_cache = v_want.get(),
                              .num_tokens = tokens, .num_heads = heads, .num_kv_heads = kv_heads,
                              .head_dim = head_dim, .block_size = 16, .num_blocks = 1,
                              .qkv_stride = width, .query_out_stride = width,
                              .max_position = max_position};
    CUDA_ASSERT(Launch(post, nullptr));
    post.qkv = post.query_out = d_got.get();
    post.key_cache = k_got.get();
    post.value_cache = v_got.get();
    post.qkv_row_scales = d_rows.get();
    post.qkv_col_scales = d_cols.get();
    ASSERT_TRUE(post.Validate().ok()) << post.Validate();
    CUDA_ASSERT(Launch(post, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    // The queries (written over qkv's query columns; the key and value columns stay as each path
    // left them: scaled in place by F8ScaleOutput on one, unscaled on the other).
    const std::vector<uint16_t> got = d_got.Download(), want = d_want.Download();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < heads * head_dim; ++j) {
        ASSERT_EQ(got[t * width + j], want[t * width + j]) << "token " << t << " column " << j;
      }
    }
    EXPECT_EQ(k_got.Download(), k_want.Download());
    EXPECT_EQ(v_got.Download(), v_want.Download());
    post.qkv_col_scales = nullptr;
    EXPECT_THAT(std::string(post.Validate().message()), ::testing::HasSubstr("come together"));
  }
  {
    const int64_t hidden = 264;
    std::vector<float> products = RandomFloats(tokens * hidden, rng, 3000.0f);
    std::vector<float> weight = RandomFloats(hidden, rng);
    const std::vector<float> residual = RandomFloats(tokens * hidden, rng, 4.0f);
    const std::vector<uint16_t> input = RoundToHalf(products, DType::kBF16);
    DeviceBuffer<uint16_t> in_want(input), in_got(input);
    DeviceBuffer<uint16_t> d_weight(RoundToHalf(weight, DType::kBF16));
    DeviceBuffer<uint16_t> out_want(tokens * hidden), out_got(tokens * hidden);
    DeviceBuffer<float> res_want(residual), res_got(residual);
    DeviceBuffer<float> d_rows(PositiveScales(tokens, rng)), d_cols(PositiveScales(hidden, rng));
    const F8ScaleOutputParams scale{.y = in_want.get(), .row_scales = d_rows.get(),
                                    .col_scales = d_cols.get(), .m = tokens, .n = hidden};
    CUDA_ASSERT(Launch(scale, nullptr));
    FusedAddRmsNormParams norm{.residual = res_want.get(), .input = in_want.get(),
                               .weight = d_weight.get(), .output = out_want.get(),
                               .num_tokens = tokens, .hidden_size = hidden,
                               .residual_dtype = DType::kF32};
    CUDA_ASSERT(Launch(norm, nullptr));
    norm.residual = res_got.get();
    norm.input = in_got.get();
    norm.output = out_got.get();
    norm.input_row_scales = d_rows.get();
    norm.input_col_scales = d_cols.get();
    ASSERT_TRUE(norm.Validate().ok()) << norm.Validate();
    CUDA_ASSERT(Launch(norm, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(res_got.Download(), res_want.Download());
    EXPECT_EQ(out_got.Download(), out_want.Download());
    norm.dtype = DType::kF16;
    EXPECT_THAT(std::string(norm.Validate().message()), ::testing::HasSubstr("bf16"));
  }
}

// A kernel's rows quantized per token by itself (`got`, `got_scales`; its f8_output) against
// F8QuantizeRows of the bf16 rows its plain form wrote (`rows`, [m, cols]), bit for bit; row
// `zero_row` is all zeros (scale 1).
void ExpectQuantizedAsQuantizeRows(const DeviceBuffer<uint16_t>& rows, int64_t m, int64_t cols,
                                   const DeviceBuffer<uint8_t>& got,
                                   const DeviceBuffer<float>& got_scales, int64_t zero_row) {
  DeviceBuffer<uint8_t> want(m * cols);
  DeviceBuffer<float> want_scales(m);
  const F8QuantizeRowsParams quantize{.src = rows.get(), .dst = want.get(),
                                      .scales = want_scales.get(), .rows = m, .cols = cols};
  CUDA_ASSERT(Launch(quantize, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(got.Download(), want.Download());
  const std::vector<float> scales = got_scales.Download();
  EXPECT_EQ(scales, want_scales.Download());
  EXPECT_EQ(scales[zero_row], 1.0f);
}

// The gated activation writing its rows quantized per token for an FP8 GEMM (f8_output): bit
// for bit its bf16 rows through F8QuantizeRows, both activations, rows held in registers (272,
// 14336: one and seven vectors a thread) and rows computed twice (16400), a zero row, with and
// without an FP8 product's scales applied as it reads, whose row array the new scales then
// overwrite (the runner's in-place use).
TEST(Fp8GpuTest, GatedActivationQuantizesItsRowsAsQuantizeRowsDoes) {
  LMSERVE_REQUIRE_FP8_GPU();
  const int64_t m = 5;
  for (const int64_t inter : {272, 14336, 16400}) {
    for (GateActivation activation : {GateActivation::kSilu, GateActivation::kGeluTanh}) {
      for (const bool scaled : {false, true}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << "intermediate " << inter << " activation "
                                          << static_cast<int>(activation)
                                          << (scaled ? " scaled" : "") << " seed " << seed);
        std::mt19937 rng(seed);
        const int64_t n = 2 * inter;
        std::vector<float> products = RandomFloats(m * n, rng, scaled ? 3000.0f : 3.0f);
        for (int64_t j = 0; j < n; ++j) products[3 * n + j] = 0.0f;  // a zero row
        const std::vector<uint16_t> gate_up = RoundToHalf(products, DType::kBF16);
        const std::vector<float> rows = PositiveScales(m, rng), cols = PositiveScales(n, rng);
        DeviceBuffer<uint16_t> d_want_in(gate_up), d_got_in(gate_up), d_act(m * inter);
        DeviceBuffer<float> d_rows(rows), d_cols(cols), s_got(rows);  // the input's, then ours
        DeviceBuffer<uint8_t> q_got(m * inter);
        q_got.Poison();
        if (scaled) {
          const F8ScaleOutputParams scale{.y = d_want_in.get(), .row_scales = d_rows.get(),
                                          .col_scales = d_cols.get(), .m = m, .n = n};
          CUDA_ASSERT(Launch(scale, nullptr));
        }
        SiluAndMulParams act{.gate_up = d_want_in.get(),
                             .output = d_act.get(),
                             .num_tokens = m,
                             .intermediate_size = inter,
                             .activation = activation};
        CUDA_ASSERT(Launch(act, nullptr));
        act.gate_up = d_got_in.get();
        act.output = nullptr;
        act.f8_output = q_got.get();
        act.f8_output_scales = s_got.get();
        if (scaled) {
          act.row_scales = s_got.get();
          act.col_scales = d_cols.get();
        }
        ASSERT_TRUE(act.Validate().ok()) << act.Validate();
        CUDA_ASSERT(Launch(act, nullptr));
        ExpectQuantizedAsQuantizeRows(d_act, m, inter, q_got, s_got, /*zero_row=*/3);
      }
    }
  }
  SiluAndMulParams bad{.gate_up = reinterpret_cast<void*>(256),
                       .num_tokens = 1,
                       .intermediate_size = 8,
                       .f8_output = reinterpret_cast<void*>(512)};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("go together"));
  bad.f8_output_scales = reinterpret_cast<float*>(768);
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate();
  bad.output = reinterpret_cast<void*>(1024);
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("no output beside"));
}

// The add + RMSNorm writing its rows quantized per token for an FP8 GEMM (f8_output): bit for
// bit the norm's bf16 rows through F8QuantizeRows (the bytes, the scales, and the residual), at
// hidden sizes held in registers ahead of use and not (272, 4096; 14336, 32768), an fp32 and a
// bf16 residual, a zero row (scale 1, zero bytes), and with an FP8 product's input scales
// applied as it reads, whose array the new scales then overwrite (the runner's in-place use).
TEST(Fp8GpuTest, AddRmsNormQuantizesItsRowsAsQuantizeRowsDoes) {
  LMSERVE_REQUIRE_FP8_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t tokens = 5;
  for (const int64_t hidden : {272, 4096, 14336, 32768}) {
    for (const DType residual_dtype : {DType::kF32, DType::kBF16}) {
      for (const bool scaled : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "hidden " << hidden << " residual "
                                          << testing::Name(residual_dtype)
                                          << (scaled ? " scaled input" : ""));
        std::vector<float> products = RandomFloats(tokens * hidden, rng, scaled ? 3000.0f : 2.0f);
        std::vector<float> residual = RandomFloats(tokens * hidden, rng, 4.0f);
        for (int64_t j = 0; j < hidden; ++j) products[2 * hidden + j] = residual[2 * hidden + j] = 0;
        const std::vector<uint16_t> input = RoundToHalf(products, DType::kBF16);
        DeviceBuffer<uint16_t> d_input(input), scaled_input(input);
        std::vector<float> weight = RandomFloats(hidden, rng);
        DeviceBuffer<uint16_t> d_weight(RoundToHalf(weight, DType::kBF16));
        const bool f32 = residual_dtype == DType::kF32;
        DeviceBuffer<float> res32_want(residual), res32_got(residual);
        DeviceBuffer<uint16_t> res16_want(RoundToHalf(residual, DType::kBF16)),
            res16_got(RoundToHalf(residual, DType::kBF16));
        const std::vector<float> row_scales = PositiveScales(tokens, rng);
        DeviceBuffer<float> d_rows(row_scales), d_cols(PositiveScales(hidden, rng));
        DeviceBuffer<uint16_t> normed(tokens * hidden);
        DeviceBuffer<uint8_t> q_got(tokens * hidden);
        DeviceBuffer<float> s_got(row_scales);  // the input's, then ours
        q_got.Poison();
        // Want: the product's scales applied (F8ScaleOutput), the norm's bf16 rows (quantized by
        // ExpectQuantizedAsQuantizeRows).
        if (scaled) {
          const F8ScaleOutputParams scale{.y = scaled_input.get(), .row_scales = d_rows.get(),
                                          .col_scales = d_cols.get(), .m = tokens, .n = hidden};
          CUDA_ASSERT(Launch(scale, nullptr));
        }
        FusedAddRmsNormParams norm{
            .residual = f32 ? static_cast<void*>(res32_want.get()) : res16_want.get(),
            .input = scaled ? scaled_input.get() : d_input.get(),
            .weight = d_weight.get(),
            .output = normed.get(),
            .num_tokens = tokens,
            .hidden_size = hidden,
            .residual_dtype = residual_dtype};
        CUDA_ASSERT(Launch(norm, nullptr));
        // Got: one kernel.
        norm.residual = f32 ? static_cast<void*>(res32_got.get()) : res16_got.get();
        norm.input = d_input.get();
        norm.output = nullptr;
        norm.f8_output = q_got.get();
        norm.f8_output_scales = s_got.get();
        if (scaled) {
          norm.input_row_scales = s_got.get();
          norm.input_col_scales = d_cols.get();
        }
        ASSERT_TRUE(norm.Validate().ok()) << norm.Validate();
        CUDA_ASSERT(Launch(norm, nullptr));
        ExpectQuantizedAsQuantizeRows(normed, tokens, hidden, q_got, s_got, /*zero_row=*/2);
        if (f32) {
          EXPECT_EQ(res32_got.Download(), res32_want.Download());
        } else {
          EXPECT_EQ(res16_got.Download(), res16_want.Download());
        }
      }
    }
  }
  FusedAddRmsNormParams bad{.residual = reinterpret_cast<void*>(256),
                            .input = reinterpret_cast<const void*>(512),
                            .weight = reinterpret_cast<const void*>(768),
                            .num_tokens = 1,
                            .hidden_size = 64,
                            .f8_output = reinterpret_cast<void*>(1024)};
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("go together"));
  bad.f8_output_scales = reinterpret_cast<float*>(1280);
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate();
  bad.output = reinterpret_cast<void*>(1536);
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("no output beside"));
  bad.output = nullptr;
  bad.dtype = DType::kF16;
  EXPECT_THAT(std::string(bad.Validate().message()), ::testing::HasSubstr("bf16"));
}

}  // namespace
}  // namespace lmserve::kernels::cuda
