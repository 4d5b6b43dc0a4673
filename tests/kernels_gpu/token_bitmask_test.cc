// The token bitmask on the GPU against its CPU twin (kernels::ApplyTokenBitmask), and the gated
// one, whose masks arrive in pinned host memory after its launch: released, timed out, abandoned.

#include <cstdlib>
#include <cstring>
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

// Pinned host memory of `count` T, zeroed; mapped into the device's address space.
template <typename T>
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t count) : count_(count) {
    if (cudaMallocHost(&ptr_, count * sizeof(T)) != cudaSuccess) std::abort();
    std::memset(ptr_, 0, count * sizeof(T));
  }
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* get() const { return ptr_; }
  T* device() const {
    void* address = nullptr;
    return cudaHostGetDevicePointer(&address, ptr_, 0) == cudaSuccess ? static_cast<T*>(address)
                                                                       : nullptr;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// One gated launch's buffers: logits, pinned masks (zero: they would drop every token), mask
// indices, the step number and the gate on the device, and the release, timed-out and waited
// words (pinned). `per_row`: every masked row's block polls (GatedTokenBitmaskParams::
// poll_per_row).
struct GatedCase {
  GatedCase(int64_t rows, int64_t vocab, int64_t num_masks, uint64_t step_number,
            std::vector<float> logits, const std::vector<int32_t>& index, bool per_row = false)
      : words((vocab + 31) / 32),
        d_logits(logits),
        masks(static_cast<size_t>(num_masks * words)),
        d_index(index),
        d_step(std::vector<uint64_t>{step_number}),
        d_gate(std::vector<uint64_t>{0}),
        sync(16) {
    params = GatedTokenBitmaskParams{.logits = d_logits.get(),
                                     .bitmask = masks.device(),
                                     .mask_index = d_index.get(),
                                     .step = d_step.get(),
                                     .release = sync.device(),
                                     .timed_out = sync.device() + 8,
                                     .gate = d_gate.get(),
                                     .waited_ns = sync.device() + 9,
                                     .poll_per_row = per_row,
                                     .num_rows = rows,
                                     .vocab_size = vocab,
                                     .timeout_ns = int64_t{60} * 1000 * 1000 * 1000};
  }
  uint64_t* release() const { return sync.get(); }
  uint64_t timed_out_step() const { return TokenBitmaskTimedOutStep(sync.get() + 8); }
  uint64_t waited_ns() const { return TokenBitmaskWaitedNs(sync.get() + 9); }

  int64_t words;
  DeviceBuffer<float> d_logits;
  PinnedBuffer<uint32_t> masks;
  DeviceBuffer<int32_t> d_index;
  DeviceBuffer<uint64_t> d_step;
  DeviceBuffer<uint64_t> d_gate;
  PinnedBuffer<uint64_t> sync;  // release at 0, timed out at 8, waited at 9 (words)
  GatedTokenBitmaskParams params;
};

// The masks are written, and the step released, after the kernel is launched (it waits for them
// on the device): the logits equal the CPU twin's with those masks. Vocabularies past one staged
// piece of mask (131,072 tokens) included.
TEST(TokenBitmaskGpuTest, GatedMatchesCpuWithMasksWrittenAfterTheLaunch) {
  LMSERVE_REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint64_t step_number = 0;
  for (const bool per_row : {false, true}) {
    for (int64_t rows : {1, 17, 64}) {
      for (int64_t vocab : {33, 49152, 128256, 300001}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab << " seed "
                                          << seed << " per row " << per_row);
        std::mt19937 rng(seed);
        const std::vector<float> logits = RandomFloats(rows * vocab, rng, 4.0f);
        std::vector<int32_t> index(rows);
        for (int64_t r = 0; r < rows; ++r) {
          index[r] = r % 4 == 3 ? -1 : static_cast<int32_t>(r % 3);
        }
        GatedCase c(rows, vocab, 3, ++step_number, logits, index, per_row);
        ASSERT_NE(c.params.bitmask, nullptr);
        ASSERT_NE(c.params.release, nullptr);
        // Released up to the step before: the kernel waits.
        ReleaseTokenBitmasks(c.release(), step_number - 1, false);
        CUDA_ASSERT(Launch(c.params, stream));
        std::vector<uint32_t> masks(static_cast<size_t>(3 * c.words));
        for (uint32_t& word : masks) {
          word = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
        }
        std::memcpy(c.masks.get(), masks.data(), masks.size() * sizeof(uint32_t));
        ReleaseTokenBitmasks(c.release(), step_number, false);
        CUDA_ASSERT(cudaStreamSynchronize(stream));
        EXPECT_NE(c.timed_out_step(), step_number);
        std::vector<float> expected = logits;
        for (int64_t r = 0; r < rows; ++r) {
          if (index[r] >= 0) {
            kernels::ApplyTokenBitmask(expected.data() + r * vocab,
                                       masks.data() + index[r] * c.words, vocab);
          }
        }
        EXPECT_EQ(c.d_logits.Download(), expected);
      }
    }
  }
  cudaStreamDestroy(stream);
}

// Released before the launch: the masks are applied, and the wait's time is written (one read of
// the release word: far below the test's bound of a second).
TEST(TokenBitmaskGpuTest, GatedReleasedBeforeTheLaunchDoesNotWait) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const int64_t rows = 4, vocab = 1000;
  const std::vector<float> logits = RandomFloats(rows * vocab, rng);
  GatedCase c(rows, vocab, 1, 5, logits, {0, -1, 0, 0});
  c.sync.get()[9] = 12345;  // overwritten by the wait
  std::vector<uint32_t> mask(static_cast<size_t>(c.words));
  for (uint32_t& word : mask) word = static_cast<uint32_t>(rng());
  std::memcpy(c.masks.get(), mask.data(), mask.size() * sizeof(uint32_t));
  ReleaseTokenBitmasks(c.release(), 5, false);
  CUDA_ASSERT(Launch(c.params, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(c.timed_out_step(), 0u);
  EXPECT_NE(c.waited_ns(), 12345u);
  EXPECT_LT(c.waited_ns(), 1000u * 1000u * 1000u);
  std::vector<float> expected = logits;
  for (int64_t r : {0, 2, 3}) {
    kernels::ApplyTokenBitmask(expected.data() + r * vocab, mask.data(), vocab);
  }
  EXPECT_EQ(c.d_logits.Download(), expected);
}

// Never released: the masked rows give up after the timeout, leave their logits alone and say
// so (the host fails the step); the stream does not hang.
TEST(TokenBitmaskGpuTest, GatedWaitGivesUpAfterItsTimeout) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const int64_t rows = 5, vocab = 1000;
  const std::vector<float> logits = RandomFloats(rows * vocab, rng);
  for (const bool per_row : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "per row " << per_row);
    GatedCase c(rows, vocab, 1, 7, logits, {0, -1, 0, 0, -1}, per_row);
    c.params.timeout_ns = 1000 * 1000;  // 1 ms
    ReleaseTokenBitmasks(c.release(), 6, false);
    CUDA_ASSERT(Launch(c.params, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(c.timed_out_step(), 7u);
    if (!per_row) {
      EXPECT_GE(c.waited_ns(), 1000u * 1000u);  // the whole timeout
    }
    EXPECT_EQ(c.d_logits.Download(), logits);
  }
}

// Abandoned (the host gave the step up): the rows stop waiting, unmasked, without a timeout.
TEST(TokenBitmaskGpuTest, GatedAbandonedStepLeavesItsRowsAlone) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const int64_t rows = 3, vocab = 4096;
  const std::vector<float> logits = RandomFloats(rows * vocab, rng);
  for (const bool per_row : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "per row " << per_row);
    GatedCase c(rows, vocab, 1, 3, logits, {0, 0, -1}, per_row);
    CUDA_ASSERT(Launch(c.params, nullptr));
    ReleaseTokenBitmasks(c.release(), 3, /*abandoned=*/true);
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(c.timed_out_step(), 0u);
    EXPECT_EQ(c.d_logits.Download(), logits);
  }
}

// A launch without masked rows reads no release: never released, with a wait of an hour, it
// returns at once (were it to wait, the test would hang past ctest's timeout).
TEST(TokenBitmaskGpuTest, GatedRowsWithoutMasksDoNotWait) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  const int64_t rows = 64, vocab = 49152;
  const std::vector<float> logits = RandomFloats(rows * vocab, rng);
  for (const bool per_row : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "per row " << per_row);
    GatedCase c(rows, vocab, 1, 9, logits, std::vector<int32_t>(rows, -1), per_row);
    c.params.timeout_ns = int64_t{3600} * 1000 * 1000 * 1000;
    c.sync.get()[9] = 12345;  // not written: no wait
    CUDA_ASSERT(Launch(c.params, nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(c.timed_out_step(), 0u);
    EXPECT_EQ(c.waited_ns(), 12345u);
    EXPECT_EQ(c.d_logits.Download(), logits);
  }
}

TEST(TokenBitmaskGpuTest, GatedValidateRefusesBadParams) {
  GatedTokenBitmaskParams p;
  p.num_rows = 2;
  p.vocab_size = 10;
  p.timeout_ns = 1000;
  EXPECT_FALSE(p.Validate().ok());  // null pointers
  float logits = 0;
  const uint32_t mask = 0;
  const int32_t index = 0;
  uint64_t word = 0;
  p = {.logits = &logits, .bitmask = &mask, .mask_index = &index, .step = &word,
       .release = &word, .timed_out = &word, .num_rows = 1, .vocab_size = 10, .timeout_ns = 1};
  EXPECT_FALSE(p.Validate().ok());  // no gate for the one poller's outcome
  p.poll_per_row = true;
  EXPECT_TRUE(p.Validate().ok());  // polling per row needs none
  p.poll_per_row = false;
  p.gate = &word;
  EXPECT_TRUE(p.Validate().ok());
  p.timeout_ns = 0;
  EXPECT_FALSE(p.Validate().ok());  // no bound on the wait
  p.timeout_ns = 1;
  p.logits_stride = 5;
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace lmserve::kernels::cuda
