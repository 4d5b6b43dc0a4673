// The Hopper GEMM (gemm_sm90.h) against the CPU linear layer, and its SiLU-and-mul epilogue
// against the CPU's linear layer and gated activation. Skipped where the kernel does not run
// (anything but compute capability 9.0).

#include "kernels/cuda/gemm_sm90.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/activation.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::CpuLinear;
using testing::Download;
using testing::FreshSeed;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::Upload;

#define LMSERVE_REQUIRE_SM90_GEMM()                                                           \
  do {                                                                                        \
    LMSERVE_REQUIRE_GPU();                                                                    \
    if (!Sm90GemmAvailable()) GTEST_SKIP() << "the Hopper GEMM needs compute capability 9.0"; \
  } while (0)

// The elements of y ([rows][stride]) within [m, cols) as an [m][cols] matrix; *touched counts
// the elements outside it (the padding past each row, the rows past m) that are no longer the
// poison's NaN.
std::vector<float> WithinShape(const std::vector<float>& y, int64_t rows, int64_t stride, int64_t m,
                               int64_t cols, int64_t* touched) {
  std::vector<float> out(m * cols);
  *touched = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < stride; ++col) {
      const float v = y[r * stride + col];
      if (r < m && col < cols) {
        out[r * cols + col] = v;
      } else if (!std::isnan(v)) {
        ++*touched;
      }
    }
  }
  return out;
}

struct Case {
  int64_t m, n, k;
  int64_t x_pad = 0, y_pad = 0;  // elements past each row of x and y (strides)
  int group_m = 16;
  int max_blocks = 0;
  int cluster = 1;
};

// Every row and column of y within the shape is the product; the padding past each row and the
// rows past m are left as they were (poisoned).
TEST(Sm90GemmGpuTest, MatchesCpuLinear) {
  LMSERVE_REQUIRE_SM90_GEMM();
  const std::vector<Case> cases = {
      {1, 8, 64},
      {130, 264, 72},                // partial tiles in m, n and k
      {300, 1032, 264, 8, 16},       // strides
      {257, 512, 4096, 0, 0, 2, 3},  // 3 blocks take 6 tiles each; groups of 2 row tiles
      {640, 768, 136, 0, 0, 3, 5},   // a last group of 2 row tiles
      // Clusters of two blocks sharing W's tiles: an odd count of row tiles (the last pair's
      // second block reads zeros past m and stores nothing), persistent clusters.
      {130, 264, 72, 0, 0, 16, 0, 2},
      {640, 1032, 200, 8, 16, 1, 4, 2},
      {1100, 512, 4096, 0, 0, 2, 6, 2},
  };
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m " << c.m << " n " << c.n << " k " << c.k << " " << testing::Name(dtype)
                   << " cluster " << c.cluster << " seed " << seed);
      std::mt19937 rng(seed);
      const int64_t x_stride = c.k + c.x_pad, y_stride = c.n + c.y_pad;
      std::vector<float> x = RandomFloats(c.m * x_stride, rng);
      std::vector<float> w = RandomFloats(c.n * c.k, rng, 1.0f / std::sqrt(float(c.k)));
      auto d_x = Upload(x, dtype), d_w = Upload(w, dtype);
      const int64_t y_rows = c.m + 1;  // one more row, to see that it stays untouched
      auto d_y = testing::Poisoned(y_rows * y_stride, dtype);
      Sm90GemmParams p{.x = d_x.get(),
                       .w = d_w.get(),
                       .y = d_y.get(),
                       .m = c.m,
                       .n = c.n,
                       .k = c.k,
                       .x_stride = x_stride,
                       .y_stride = y_stride,
                       .dtype = dtype};
      p.group_m = c.group_m;
      p.max_blocks = c.max_blocks;
      p.cluster = c.cluster;
      ASSERT_TRUE(Sm90GemmSupports(p));
      CUDA_ASSERT(LaunchSm90Gemm(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> y = Download(d_y, dtype);
      const std::vector<float> ref = CpuLinear(x, w, c.m, c.n, c.k, x_stride);
      int64_t touched = 0;
      const std::vector<float> out = WithinShape(y, y_rows, y_stride, c.m, c.n, &touched);
      EXPECT_EQ(touched, 0) << "values written outside the shape";
      EXPECT_LE(RelativeL2(out, ref), testing::Tolerance(dtype));
    }
  }
}

// W is [gate; up] as the runner holds it (no reordering): tile j multiplies gate rows 128 j ..
// 128 j + 127 and the up rows I further.
TEST(Sm90GemmGpuTest, GatedEpiloguesMatchCpu) {
  LMSERVE_REQUIRE_SM90_GEMM();
  const std::vector<Case> cases = {{1, 256, 64},
                                   {200, 768, 136},
                                   {333, 1024, 520, 8, 8, 2, 4},
                                   {333, 1024, 520, 8, 8, 1, 4, 2},
                                   {700, 512, 64, 0, 0, 1, 0, 2}};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      for (kernels::GateActivation act :
           {kernels::GateActivation::kSilu, kernels::GateActivation::kGeluTanh}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "m " << c.m << " n " << c.n << " k " << c.k << " " << testing::Name(dtype)
                     << (act == kernels::GateActivation::kSilu ? " silu" : " gelu") << " cluster "
                     << c.cluster << " seed " << seed);
        std::mt19937 rng(seed);
        const int64_t intermediate = c.n / 2;
        const int64_t x_stride = c.k + c.x_pad, y_stride = intermediate + c.y_pad;
        std::vector<float> x = RandomFloats(c.m * x_stride, rng);
        std::vector<float> w = RandomFloats(c.n * c.k, rng, 2.0f / std::sqrt(float(c.k)));
        auto d_x = Upload(x, dtype), d_w = Upload(w, dtype);
        auto d_y = testing::Poisoned((c.m + 1) * y_stride, dtype);
        Sm90GemmParams p{.x = d_x.get(),
                         .w = d_w.get(),
                         .y = d_y.get(),
                         .m = c.m,
                         .n = c.n,
                         .k = c.k,
                         .x_stride = x_stride,
                         .y_stride = y_stride,
                         .dtype = dtype,
                         .epilogue = act == kernels::GateActivation::kSilu
                                         ? Sm90GemmEpilogue::kSiluAndMul
                                         : Sm90GemmEpilogue::kGeluTanhAndMul};
        p.group_m = c.group_m;
        p.max_blocks = c.max_blocks;
        p.cluster = c.cluster;
        ASSERT_TRUE(Sm90GemmSupports(p));
        CUDA_ASSERT(LaunchSm90Gemm(p, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<float> y = Download(d_y, dtype);
        // The CPU: the product rounded to the 16-bit type (the unfused path's gate_up), then the
        // gated activation.
        std::vector<float> gate_up = CpuLinear(x, w, c.m, c.n, c.k, x_stride);
        testing::RoundToHalf(gate_up, dtype);
        const std::vector<float> ref = testing::CpuGatedActivation(gate_up, c.m, intermediate, act);
        int64_t touched = 0;
        const std::vector<float> out =
            WithinShape(y, c.m + 1, y_stride, c.m, intermediate, &touched);
        EXPECT_EQ(touched, 0) << "values written outside the shape";
        EXPECT_LE(RelativeL2(out, ref), testing::Tolerance(dtype));
      }
    }
  }
  // Widths the epilogue cannot pair are refused.
  Sm90GemmParams odd{.x = nullptr,
                     .w = nullptr,
                     .y = nullptr,
                     .m = 4,
                     .n = 384,
                     .k = 64,
                     .epilogue = Sm90GemmEpilogue::kSiluAndMul};
  EXPECT_FALSE(Sm90GemmSupports(odd));
}

}  // namespace
}  // namespace lmserve::kernels::cuda
