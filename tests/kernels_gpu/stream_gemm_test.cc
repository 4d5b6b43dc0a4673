// The stream GEMM (kernels/cuda/stream_gemm.h) against the CPU linear layer and activation, at
// every token bucket and at shapes that exercise its paths: tiles and k off their multiples,
// whole-k tiles only, split-K tails, several units per block.

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/stream_gemm.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::HalfToFloat;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::RoundToHalf;

std::vector<float> CpuLinear(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                             int64_t n, int64_t k) {
  std::vector<float> y(m * n);
  kernels::LinearParams linear;
  linear.input = x.data();
  linear.weight = w.data();
  linear.output = y.data();
  linear.num_tokens = m;
  linear.in_features = k;
  linear.out_features = n;
  kernels::Linear(linear);
  return y;
}

// A workspace as the kernel wants it: zero-filled once.
DeviceBuffer<uint8_t> Workspace() {
  DeviceBuffer<uint8_t> workspace(StreamGemmWorkspaceBytes());
  workspace.Poison(0);
  return workspace;
}

// Every byte of the workspace's tile counters is zero again after a launch.
void ExpectCountersReset(const DeviceBuffer<uint8_t>& workspace) {
  const std::vector<uint8_t> bytes = workspace.Download();
  for (size_t i = 0; i < 64 * 1024; ++i) {
    if (bytes[i] != 0) {
      ADD_FAILURE() << "tile counter byte " << i << " is " << int{bytes[i]} << " after a launch";
      return;
    }
  }
}

struct Shape {
  int64_t n, k;
};
// 200 x 72: a partial tile and a partial chunk; 4096 x 4096: split tails at 1-16 tokens, whole
// waves at 64 (32 tiles of 128 rows); 6144 x 4096 and 1032 x 14336: whole waves plus split
// tails; 40000 x 256: several whole tiles per block.
const Shape kShapes[] = {{64, 64}, {200, 72}, {4096, 4096}, {6144, 4096}, {1032, 14336},
                         {40000, 256}};

TEST(StreamGemmGpuTest, MatchesCpuLinearAtEveryTokenBucket) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint8_t> workspace = Workspace();
  const DType dtype = DType::kBF16;
  {
    for (const Shape& shape : kShapes) {
      const int64_t n = shape.n, k = shape.k;
      const uint32_t w_seed = FreshSeed();
      std::mt19937 w_rng(w_seed);
      std::vector<float> w = RandomFloats(n * k, w_rng, 0.05f);
      DeviceBuffer<uint16_t> d_w(RoundToHalf(w, dtype));
      auto w_op = StreamGemmOperand::Weights(d_w.get(), n, k);
      ASSERT_TRUE(w_op.ok()) << w_op.status();
      const bool small = n * k <= 1 << 20;
      for (int64_t m : {1, 2, 7, 8, 9, 16, 17, 32, 33, 64}) {
        if (!small && m != 1 && m != 8 && m != 16 && m != 17 && m != 64) continue;
        // bf16 out, and fp32 (the LM head's case).
        for (DType out_dtype : {DType::kBF16, DType::kF32}) {
          const uint32_t seed = FreshSeed();
          SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n
                                            << " k " << k << " out " << DTypeName(out_dtype).data()
                                            << " seeds " << w_seed << ", " << seed);
          std::mt19937 rng(seed);
          std::vector<float> x = RandomFloats(m * k, rng);
          DeviceBuffer<uint16_t> d_x(RoundToHalf(x, dtype));
          const std::vector<float> ref = CpuLinear(x, w, m, n, k);
          auto x_op = StreamGemmOperand::Input(d_x.get(), m, k);
          ASSERT_TRUE(x_op.ok()) << x_op.status();
          StreamGemmParams p;
          p.w = &*w_op;
          p.x = &*x_op;
          p.output_dtype = out_dtype;
          p.workspace = workspace.get();
          if (out_dtype == DType::kF32) {
            DeviceBuffer<float> d_y(m * n);
            d_y.Poison();
            p.y = d_y.get();
            ASSERT_TRUE(p.Validate().ok()) << p.Validate();
            CUDA_ASSERT(Launch(p, nullptr));
            CUDA_ASSERT(cudaDeviceSynchronize());
            // bf16 products are exact in fp32; only the order of the sums differs from the CPU.
            EXPECT_LE(RelativeL2(d_y.Download(), ref), 1e-5);
          } else {
            DeviceBuffer<uint16_t> d_y(m * n);
            d_y.Poison();
            p.y = d_y.get();
            CUDA_ASSERT(Launch(p, nullptr));
            CUDA_ASSERT(cudaDeviceSynchronize());
            EXPECT_LE(RelativeL2(HalfToFloat(d_y.Download(), dtype), ref),
                      testing::Tolerance(dtype));
          }
          ExpectCountersReset(workspace);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Rows of y past m and columns past n are never written; a row stride wider than the row works.
TEST(StreamGemmGpuTest, WritesOnlyItsRowsAndColumns) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint8_t> workspace = Workspace();
  const int64_t m = 3, n = 200, k = 520, y_stride = 264, x_stride = 528;
  std::mt19937 rng(FreshSeed());
  std::vector<float> x = RandomFloats(8 * x_stride, rng), w = RandomFloats(n * k, rng, 0.05f);
  DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
  std::vector<float> x_dense(m * k);
  for (int64_t t = 0; t < m; ++t) {
    std::memcpy(&x_dense[t * k], &x[t * x_stride], k * sizeof(float));
  }
  const std::vector<float> ref = CpuLinear(x_dense, w, m, n, k);
  auto w_op = StreamGemmOperand::Weights(d_w.get(), n, k);
  auto x_op = StreamGemmOperand::Input(d_x.get(), m, k, x_stride);
  ASSERT_TRUE(w_op.ok() && x_op.ok());
  DeviceBuffer<float> d_y(8 * y_stride);
  d_y.Poison(0x7f);  // 0x7f7f7f7f: a large finite float, to tell apart from any result
  StreamGemmParams p;
  p.w = &*w_op;
  p.x = &*x_op;
  p.y = d_y.get();
  p.y_stride = y_stride;
  p.output_dtype = DType::kF32;
  p.workspace = workspace.get();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> y = d_y.Download();
  float poison;
  const uint32_t poison_bits = 0x7f7f7f7fu;
  std::memcpy(&poison, &poison_bits, 4);
  std::vector<float> got(m * n);
  for (int64_t t = 0; t < 8; ++t) {
    for (int64_t j = 0; j < y_stride; ++j) {
      const float v = y[t * y_stride + j];
      if (t < m && j < n) {
        got[t * n + j] = v;
      } else {
        ASSERT_EQ(v, poison) << "row " << t << " column " << j << " was written";
      }
    }
  }
  EXPECT_LE(RelativeL2(got, ref), 1e-5);
}

// The same launch twice gives the same bits: split tiles are summed in split order, whichever
// block finishes them last.
TEST(StreamGemmGpuTest, IsDeterministic) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint8_t> workspace = Workspace();
  for (int64_t m : {1, 16, 64}) {
    const int64_t n = 4096, k = 14336;
    std::mt19937 rng(FreshSeed());
    std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.05f);
    DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
    auto w_op = StreamGemmOperand::Weights(d_w.get(), n, k);
    auto x_op = StreamGemmOperand::Input(d_x.get(), m, k);
    ASSERT_TRUE(w_op.ok() && x_op.ok());
    DeviceBuffer<float> d_y(m * n);
    StreamGemmParams p;
    p.w = &*w_op;
    p.x = &*x_op;
    p.y = d_y.get();
    p.output_dtype = DType::kF32;
    p.workspace = workspace.get();
    std::vector<float> first;
    for (int run = 0; run < 5; ++run) {
      d_y.Poison();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> y = d_y.Download();
      if (run == 0) {
        first = y;
        EXPECT_LE(RelativeL2(y, CpuLinear(x, w, m, n, k)), 1e-5);
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * 4)) << "m " << m << " run " << run;
      }
    }
  }
}

// The SiLU-and-mul epilogue: against the CPU, and against the plain stream GEMM followed by the
// SiLU-and-mul kernel. Not bit for bit: the two tile the rows differently (a tile of the epilogue
// holds gate rows and their up rows), so a row may fall in a split tile one way and in a whole
// one the other, and its fp32 sum be ordered differently; after rounding to bf16 that moves an
// element by an ulp here and there (relative L2 far below the 2e-3 checked), where an indexing
// error would move every element.
TEST(StreamGemmGpuTest, SiluAndMulEpilogue) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint8_t> workspace = Workspace();
  for (int64_t m : {1, 5, 16, 17, 64}) {
    for (auto [inter, k] : {std::pair<int64_t, int64_t>{1032, 264}, {14336, 512}, {104, 4096}}) {
      const int64_t n = 2 * inter;
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << "m " << m << " intermediate " << inter << " k " << k
                                        << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> x = RandomFloats(m * k, rng), w = RandomFloats(n * k, rng, 0.1f);
      DeviceBuffer<uint16_t> d_x(RoundToHalf(x, DType::kBF16)), d_w(RoundToHalf(w, DType::kBF16));
      const std::vector<float> gate_up = CpuLinear(x, w, m, n, k);
      std::vector<float> ref(m * inter);
      kernels::SiluAndMulParams act;
      act.gate_up = gate_up.data();
      act.output = ref.data();
      act.num_tokens = m;
      act.intermediate_size = inter;
      kernels::SiluAndMul(act);

      auto w_plain = StreamGemmOperand::Weights(d_w.get(), n, k);
      auto w_pairs = StreamGemmOperand::Weights(d_w.get(), n, k, /*gate_up=*/true);
      auto x_op = StreamGemmOperand::Input(d_x.get(), m, k);
      ASSERT_TRUE(w_plain.ok() && w_pairs.ok() && x_op.ok());
      DeviceBuffer<uint16_t> d_gate_up(m * n), d_unfused(m * inter), d_fused(m * inter);
      d_fused.Poison();
      StreamGemmParams p;
      p.w = &*w_plain;
      p.x = &*x_op;
      p.y = d_gate_up.get();
      p.workspace = workspace.get();
      CUDA_ASSERT(Launch(p, nullptr));
      SiluAndMulParams silu;
      silu.gate_up = d_gate_up.get();
      silu.output = d_unfused.get();
      silu.num_tokens = m;
      silu.intermediate_size = inter;
      CUDA_ASSERT(Launch(silu, nullptr));
      p.w = &*w_pairs;
      p.y = d_fused.get();
      p.silu_and_mul = true;
      ASSERT_TRUE(p.Validate().ok()) << p.Validate();
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> fused = HalfToFloat(d_fused.Download(), DType::kBF16);
      EXPECT_LE(RelativeL2(fused, HalfToFloat(d_unfused.Download(), DType::kBF16)), 2e-3);
      EXPECT_LE(RelativeL2(fused, ref), 1e-2);
      ExpectCountersReset(workspace);
    }
  }
}

TEST(StreamGemmGpuTest, RejectsWhatItDoesNotSupport) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint16_t> buffer(1 << 20);
  DeviceBuffer<uint8_t> workspace = Workspace();
  EXPECT_FALSE(StreamGemmOperand::Input(buffer.get(), kMaxStreamGemmRows + 1, 64).ok());
  EXPECT_FALSE(StreamGemmOperand::Input(buffer.get(), 4, 60).ok());
  EXPECT_FALSE(StreamGemmOperand::Weights(buffer.get(), 63, 64, /*gate_up=*/true).ok());
  EXPECT_FALSE(
      StreamGemmOperand::Weights(reinterpret_cast<uint8_t*>(buffer.get()) + 2, 64, 64).ok());
  auto w = StreamGemmOperand::Weights(buffer.get(), 64, 128);
  auto x = StreamGemmOperand::Input(buffer.get(), 4, 64);
  ASSERT_TRUE(w.ok() && x.ok());
  StreamGemmParams p;
  p.w = &*w;
  p.x = &*x;  // k 64 against W's 128
  p.y = buffer.get();
  p.workspace = workspace.get();
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_EQ(Launch(p, nullptr), cudaErrorInvalidValue);
  auto x128 = StreamGemmOperand::Input(buffer.get(), 4, 128);
  ASSERT_TRUE(x128.ok());
  p.x = &*x128;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  p.silu_and_mul = true;  // without a gate/up descriptor
  EXPECT_FALSE(p.Validate().ok());
  auto pairs = StreamGemmOperand::Weights(buffer.get(), 64, 128, /*gate_up=*/true);
  ASSERT_TRUE(pairs.ok());
  p.w = &*pairs;
  EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  p.output_dtype = DType::kF32;
  EXPECT_FALSE(p.Validate().ok());
  p.output_dtype = DType::kF16;
  p.silu_and_mul = false;
  p.w = &*w;
  EXPECT_FALSE(p.Validate().ok());
  p.output_dtype = DType::kBF16;
  p.workspace = nullptr;
  EXPECT_FALSE(p.Validate().ok());
  p.workspace = workspace.get();
  p.x = &*w;  // operands swapped
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace lmserve::kernels::cuda
