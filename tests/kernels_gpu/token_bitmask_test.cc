// The token bitmask on the GPU against its CPU twin (kernels::ApplyTokenBitmask).

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/token_bitmask.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::RandomFloats;

TEST(TokenBitmaskGpuTest, MatchesCpuWithFreeRowsAndAwkwardSizes) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t rows : {1, 17, 64}) {
    for (int64_t vocab : {33, 49152, 128256, 100003}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab << " seed " << seed);
      std::mt19937 rng(seed);
      const int64_t words = (vocab + 31) / 32;
      std::vector<float> logits = RandomFloats(rows * vocab, rng, 4.0f);
      const int64_t num_masks = 3;
      std::vector<uint32_t> masks(num_masks * words);
      for (uint32_t& word : masks) word = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
      std::vector<int32_t> index(rows);
      for (int64_t r = 0; r < rows; ++r) index[r] = r % 4 == 3 ? -1 : static_cast<int32_t>(r % 3);
      DeviceBuffer<float> d_logits(logits);
      DeviceBuffer<uint32_t> d_masks(masks);
      DeviceBuffer<int32_t> d_index(index);
      TokenBitmaskParams p{.logits = d_logits.get(), .bitmask = d_masks.get(),
                           .mask_index = d_index.get(), .num_rows = rows, .vocab_size = vocab};
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<float> expected = logits;
      for (int64_t r = 0; r < rows; ++r) {
        if (index[r] >= 0) {
          kernels::ApplyTokenBitmask(expected.data() + r * vocab, masks.data() + index[r] * words,
                                     vocab);
        }
      }
      EXPECT_EQ(d_logits.Download(), expected);
    }
  }
}

TEST(TokenBitmaskGpuTest, ValidateRefusesBadShapes) {
  TokenBitmaskParams p;
  p.num_rows = 2;
  p.vocab_size = 10;
  EXPECT_FALSE(p.Validate().ok());  // null pointers
  p.num_rows = 70000;
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace lmserve::kernels::cuda
