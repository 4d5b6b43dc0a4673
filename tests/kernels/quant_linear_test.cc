// QuantLinear, the CPU linear layer over weights in their GGUF block formats (and F16 / BF16):
// every SIMD path this machine has gives the portable path's bits exactly, and the portable path
// equals the dot products of the dequantized weights (dequant.cc, itself checked against the
// formats' definitions) with the int8-quantized input, summed in double.

#include "kernels/cpu/quant_linear.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dtype.h"

namespace lmserve::kernels {
namespace {

// Random rows of `dtype`: random bytes, with every fp16 scale (and min) field replaced by a
// moderate random value, so that no block holds an infinity or a NaN.
std::vector<uint8_t> RandomRows(DType dtype, int64_t rows, int64_t cols, std::mt19937* rng) {
  const int64_t row_bytes = RowBytes(dtype, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(*rng));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  auto put_half = [&](size_t offset, float v) {
    const uint16_t bits = F32ToF16(v);
    std::memcpy(bytes.data() + offset, &bits, 2);
  };
  if (dtype == DType::kF16 || dtype == DType::kBF16) {
    for (size_t i = 0; i < bytes.size(); i += 2) {
      const uint16_t bits = dtype == DType::kF16 ? F32ToF16(value(*rng)) : F32ToBf16(value(*rng));
      std::memcpy(bytes.data() + i, &bits, 2);
    }
    return bytes;
  }
  const BlockLayout layout = GetBlockLayout(dtype);
  for (size_t block = 0; block < bytes.size(); block += layout.bytes_per_block) {
    switch (dtype) {
      case DType::kQ8_0:
      case DType::kQ4_0:
        put_half(block, 0.05f * value(*rng));
        break;
      case DType::kQ4_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        put_half(block, 0.05f * value(*rng));
        put_half(block + 2, 0.05f * value(*rng));
        break;
      case DType::kQ6_K:
        put_half(block + 208, 0.01f * value(*rng));
        break;
      default:
        break;
    }
  }
  return bytes;
}

std::vector<float> RandomFloats(int64_t n, std::mt19937* rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = normal(*rng);
  return values;
}

// The sum in double of w[e] * x[e] over n elements, and of their magnitudes (the scale of a sum's
// rounding error).
struct DoubleDot {
  double sum = 0, magnitude = 0;
};
DoubleDot SumInDouble(const float* w, const float* x, int64_t n) {
  DoubleDot d;
  for (int64_t e = 0; e < n; ++e) {
    const double term = double{w[e]} * x[e];
    d.sum += term;
    d.magnitude += std::fabs(term);
  }
  return d;
}

struct Case {
  DType dtype;
  int64_t rows, cols, tokens;
};

std::string CaseName(const Case& c) {
  return std::string(DTypeName(c.dtype)) + " " + std::to_string(c.rows) + "x" +
         std::to_string(c.cols) + ", " + std::to_string(c.tokens) + " tokens";
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kF16, DType::kBF16}) {
    // 1 to 8 tokens: Q8_0, Q4_0 and Q4_1 rows read in place, up to four tokens against each
    // extracted group of blocks (1, 2, 3, 4 + 1, 4 + 4); 17: unpacked tiles.
    for (int64_t tokens : {1, 2, 3, 5, 8, 17}) {
      cases.push_back({dtype, 37, 96, tokens});  // three blocks: an odd last one
      cases.push_back({dtype, 9, 512, tokens});
      cases.push_back({dtype, 6, 544, tokens});  // 16 blocks and one
      cases.push_back({dtype, 5, 576, tokens});  // 16 blocks and two
      cases.push_back({dtype, 3, 1504, tokens});  // 32 blocks and 15
    }
  }
  for (DType dtype : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t tokens : {1, 3, 17}) cases.push_back({dtype, 21, 768, tokens});
  }
  return cases;
}

std::vector<SimdPath> SupportedPaths() {
  std::vector<SimdPath> paths;
  for (SimdPath path : {SimdPath::kPortable, SimdPath::kAvx2, SimdPath::kAvx512Vnni}) {
    if (SimdPathSupported(path)) paths.push_back(path);
  }
  return paths;
}

std::vector<float> RunCase(const Case& c, const std::vector<uint8_t>& weight,
                       const std::vector<float>& input, const std::vector<float>& bias,
                       SimdPath path, int threads, bool accumulate, bool precise = true,
                       int64_t gemm_min_tokens = 0) {
  // Outputs in a wider buffer (stride cols + 3), starting from a known pattern.
  const int64_t stride = c.rows + 3;
  std::vector<float> output(static_cast<size_t>(c.tokens * stride));
  for (size_t i = 0; i < output.size(); ++i) output[i] = 0.25f * static_cast<float>(i % 7);
  QuantLinearWorkspace workspace;
  QuantLinear({.weight = weight.data(),
               .dtype = c.dtype,
               .input = input.data(),
               .bias = bias.empty() ? nullptr : bias.data(),
               .output = output.data(),
               .num_tokens = c.tokens,
               .in_features = c.cols,
               .out_features = c.rows,
               .output_stride = stride,
               .accumulate = accumulate,
               .num_threads = threads,
               .path = path,
               .workspace = &workspace,
               .precise_input = precise,
               .gemm_min_tokens = gemm_min_tokens});
  return output;
}

TEST(QuantLinearTest, EverySimdPathGivesThePortableBits) {
  std::mt19937 rng(7);
  for (const Case& c : Cases()) {
    const std::vector<uint8_t> weight = RandomRows(c.dtype, c.rows, c.cols, &rng);
    std::vector<float> input = RandomFloats(c.tokens * c.cols, &rng);
    // Blocks the input quantization treats apart: all zeros (step 0), one large element.
    std::fill_n(input.begin() + 32, 32, 0.0f);
    input[70] = 3.0e6f;
    const std::vector<float> bias = RandomFloats(c.rows, &rng);
    for (int64_t gemm : {0, 2}) {  // never, or from 2 tokens on (fp32 tiles and sgemm)
     for (bool precise : {true, false}) {
      for (bool accumulate : {false, true}) {
        const std::vector<float> want =
            RunCase(c, weight, input, bias, SimdPath::kPortable, 1, accumulate, precise, gemm);
        for (SimdPath path : SupportedPaths()) {
          for (int threads : {1, 2, 3}) {
            const std::vector<float> got =
                RunCase(c, weight, input, bias, path, threads, accumulate, precise, gemm);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << CaseName(c) << ", path " << SimdPathName(path) << ", " << threads
                << " threads, accumulate " << accumulate << ", precise " << precise
                << ", gemm from " << gemm;
          }
        }
      }
     }
    }
  }
}

// The portable path against sums in double of the dequantized weights times the quantized input
// (one or two int8 parts; for F16 / BF16: times the input itself). The bound is fp32 rounding of
// the blocks' fused multiply-adds, relative to the sum of the terms' magnitudes.
TEST(QuantLinearTest, EqualsTheDequantizedWeightsTimesTheQuantizedInput) {
  std::mt19937 rng(11);
  for (const Case& c : Cases()) {
   for (bool precise : {true, false}) {
    const bool two_parts = precise && c.dtype != DType::kQ6_K;
    const std::vector<uint8_t> weight = RandomRows(c.dtype, c.rows, c.cols, &rng);
    const std::vector<float> input = RandomFloats(c.tokens * c.cols, &rng);
    std::vector<float> dequantized(static_cast<size_t>(c.rows * c.cols));
    DequantizeToF32(c.dtype, weight.data(), dequantized.data(), c.rows * c.cols);
    // The input the kernel multiplies: quantized to int8 per 32 for the block formats.
    std::vector<float> effective = input;
    if (IsQuantized(c.dtype)) {
      std::vector<int8_t> q(static_cast<size_t>(c.cols)), q_low(static_cast<size_t>(c.cols));
      std::vector<float> scale(static_cast<size_t>(c.cols / 32));
      std::vector<int32_t> lanes(static_cast<size_t>(c.cols / 4));
      for (int64_t t = 0; t < c.tokens; ++t) {
        QuantizeInputRow(input.data() + t * c.cols, c.cols, q.data(), scale.data(), lanes.data(),
                         two_parts ? q_low.data() : nullptr);
        for (int64_t e = 0; e < c.cols; ++e) {
          const double steps = two_parts ? q[e] * 256.0 + q_low[e] : static_cast<double>(q[e]);
          effective[t * c.cols + e] = static_cast<float>(steps * scale[e / 32]);
        }
      }
    }
    const std::vector<float> got =
        RunCase(c, weight, input, {}, SimdPath::kPortable, 1, false, precise);
    const int64_t stride = c.rows + 3;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t o = 0; o < c.rows; ++o) {
        const DoubleDot want = SumInDouble(dequantized.data() + o * c.cols,
                                           effective.data() + t * c.cols, c.cols);
        ASSERT_NEAR(got[t * stride + o], want.sum, 2e-6 * want.magnitude + 1e-30)
            << CaseName(c) << ", token " << t << ", row " << o;
      }
      // The padding between rows is left alone.
      for (int64_t o = c.rows; o < stride; ++o) {
        ASSERT_EQ(got[t * stride + o], 0.25f * static_cast<float>((t * stride + o) % 7));
      }
    }
   }
  }
}

// From gemm_min_tokens tokens on: the dequantized weights (dequant.cc's values exactly) times the
// fp32 input, as the float32 path computes it (fp32 sums: the bound is their rounding).
TEST(QuantLinearTest, ManyTokensTakeTheDequantizedWeightsThroughSgemm) {
  std::mt19937 rng(13);
  for (const Case& c : Cases()) {
    const std::vector<uint8_t> weight = RandomRows(c.dtype, c.rows, c.cols, &rng);
    const std::vector<float> input = RandomFloats(c.tokens * c.cols, &rng);
    std::vector<float> dequantized(static_cast<size_t>(c.rows * c.cols));
    DequantizeToF32(c.dtype, weight.data(), dequantized.data(), c.rows * c.cols);
    const std::vector<float> got =
        RunCase(c, weight, input, {}, SimdPath::kAuto, 2, false, true, /*gemm_min_tokens=*/1);
    const int64_t stride = c.rows + 3;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t o = 0; o < c.rows; ++o) {
        const DoubleDot want = SumInDouble(dequantized.data() + o * c.cols,
                                           input.data() + t * c.cols, c.cols);
        ASSERT_NEAR(got[t * stride + o], want.sum, 1e-5 * want.magnitude)
            << CaseName(c) << ", token " << t;
      }
    }
    // One-hot inputs read the converted weights back: dequant.cc's values, bit for bit.
    const Case identity{c.dtype, c.rows, c.cols, c.cols};
    std::vector<float> one_hot(static_cast<size_t>(c.cols * c.cols), 0.0f);
    for (int64_t e = 0; e < c.cols; ++e) one_hot[e * c.cols + e] = 1.0f;
    const std::vector<float> columns = RunCase(identity, weight, one_hot, {}, SimdPath::kAuto, 2,
                                               false, true, /*gemm_min_tokens=*/1);
    for (int64_t e = 0; e < c.cols; ++e) {
      for (int64_t o = 0; o < c.rows; ++o) {
        ASSERT_EQ(columns[e * stride + o], dequantized[o * c.cols + e]) << CaseName(c);
      }
    }
  }
}

// Every finite fp16 scale converts as half.h's F16ToF32 does (subnormals included): Q8_0 rows
// with one quant of 1, read back through the fp32 tiles by a one-hot input.
TEST(QuantLinearTest, ScalesConvertAsF16ToF32) {
  std::vector<uint16_t> scales;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if (((bits >> 10) & 0x1f) != 0x1f) scales.push_back(static_cast<uint16_t>(bits));
  }
  const int64_t rows = static_cast<int64_t>(scales.size());
  std::vector<uint8_t> weight(static_cast<size_t>(rows * 34), 0);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(weight.data() + r * 34, &scales[r], 2);
    weight[r * 34 + 2] = 1;  // quant 0 = 1, the others 0
  }
  std::vector<float> input(32, 0.0f);
  input[0] = 1.0f;
  std::vector<float> output(static_cast<size_t>(rows));
  QuantLinearWorkspace workspace;
  QuantLinear({.weight = weight.data(),
               .dtype = DType::kQ8_0,
               .input = input.data(),
               .output = output.data(),
               .num_tokens = 1,
               .in_features = 32,
               .out_features = rows,
               .num_threads = 2,
               .workspace = &workspace,
               .gemm_min_tokens = 1});
  for (int64_t r = 0; r < rows; ++r) {
    // Float equality: exact for every finite value (only a zero's sign, which the sum of the
    // one-hot products loses, is not compared).
    ASSERT_EQ(output[r], F16ToF32(scales[r])) << "fp16 bits " << scales[r];
  }
}

// The two-part input is what it claims: within one low step (1/256 of the int8 step) of the input,
// where one part is within half an int8 step. (Half a low step, but for a residual of exactly half
// an int8 step, 128 low steps, which the int8 low part holds as 127.)
TEST(QuantLinearTest, TheTwoPartInputIsWithinAStepOver256) {
  std::mt19937 rng(5);
  const std::vector<float> x = RandomFloats(256, &rng);
  std::vector<int8_t> q(256), q_low(256);
  std::vector<float> scale(8);
  std::vector<int32_t> lanes(64);
  QuantizeInputRow(x.data(), 256, q.data(), scale.data(), lanes.data(), q_low.data());
  for (int e = 0; e < 256; ++e) {
    const float step = scale[e / 32] * 256;  // the int8 part's step
    const double value = (q[e] * 256.0 + q_low[e]) * scale[e / 32];
    EXPECT_LE(std::fabs(value - x[e]), step / 256 * (1 + 1e-3)) << e;
    EXPECT_LE(std::abs(q_low[e]), 127);
  }
  for (int l = 0; l < 64; ++l) {
    int32_t sum = 0;
    for (int i = 4 * l; i < 4 * l + 4; ++i) sum += q[i] * 256 + q_low[i];
    EXPECT_EQ(lanes[l], sum);
  }
}

TEST(QuantLinearTest, InputQuantizationRoundsToTheNearestStep) {
  std::mt19937 rng(3);
  std::vector<float> x = RandomFloats(64, &rng);
  std::fill(x.begin() + 32, x.end(), 0.0f);  // the second block all zeros
  std::vector<int8_t> q(64);
  std::vector<float> scale(2);
  std::vector<int32_t> lanes(16);
  QuantizeInputRow(x.data(), 64, q.data(), scale.data(), lanes.data());
  float amax = 0;
  for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[e]));
  EXPECT_EQ(scale[0], amax / 127.0f);
  EXPECT_EQ(scale[1], 0.0f);
  for (int e = 0; e < 32; ++e) {
    EXPECT_LE(std::abs(q[e]), 127);
    EXPECT_LE(std::fabs(q[e] * scale[0] - x[e]), 0.5f * scale[0] * (1 + 1e-6f)) << e;
  }
  for (int e = 32; e < 64; ++e) EXPECT_EQ(q[e], 0);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(lanes[l], q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
  }
}

TEST(QuantLinearTest, RefusesWhatItCannotRun) {
  const std::vector<uint8_t> weight(4096);
  const std::vector<float> input(64);
  std::vector<float> output(64);
  QuantLinearWorkspace workspace;
  QuantLinearParams p{.weight = weight.data(),
                      .dtype = DType::kQ4_0,
                      .input = input.data(),
                      .output = output.data(),
                      .num_tokens = 1,
                      .in_features = 64,
                      .out_features = 2,
                      .workspace = &workspace};
  EXPECT_TRUE(p.Validate().ok());
  QuantLinearParams bad = p;
  bad.in_features = 48;  // not whole blocks
  EXPECT_FALSE(bad.Validate().ok());
  bad = p;
  bad.dtype = DType::kF32;
  EXPECT_FALSE(bad.Validate().ok());
  bad = p;
  bad.dtype = DType::kQ4_K;  // 64 is not a whole super-block
  EXPECT_FALSE(bad.Validate().ok());
  bad = p;
  bad.workspace = nullptr;
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_FALSE(QuantLinearSupports(DType::kBF16, 24));
  EXPECT_TRUE(QuantLinearSupports(DType::kBF16, 32));
  EXPECT_TRUE(SimdPathSupported(SimdPath::kPortable));
  EXPECT_NE(BestSimdPath(), SimdPath::kAuto);
}

TEST(ParallelForTest, EachIndexOnceOverAnyThreadCount) {
  for (int threads : {1, 2, 5}) {
    for (int64_t n : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      ParallelFor(n, threads, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) seen[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << n << " " << threads;
    }
  }
  EXPECT_GE(PhysicalCoreCount(), 1);
}

TEST(ParallelForTest, ThreadsForWorkGivesEachThreadItsLeastShare) {
  EXPECT_EQ(ThreadsForWork(0, 100, 8), 1);
  EXPECT_EQ(ThreadsForWork(199, 100, 8), 1);
  EXPECT_EQ(ThreadsForWork(200, 100, 8), 2);
  EXPECT_EQ(ThreadsForWork(int64_t{1} << 40, 100, 8), 8);
  EXPECT_EQ(ThreadsForWork(1000, 100, 0), 1);  // no team: the caller alone
  EXPECT_EQ(ThreadsForWork(1000, 0, 4), 4);    // no least share: every thread
}

TEST(ParallelForTest, RangesDependOnlyOnTheLoop) {
  for (int round = 0; round < 200; ++round) {  // many loops in a row: a late worker stays in its own
    for (int threads : {2, 3}) {
      const int64_t n = 1 + round % 37;
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> ranges;
      ParallelFor(n, threads, [&](int64_t begin, int64_t end) {
        std::lock_guard<std::mutex> lock(mu);
        ranges.insert({begin, end});
      });
      const int64_t r = std::min<int64_t>(n, 4 * threads);
      std::set<std::pair<int64_t, int64_t>> expected;
      for (int64_t i = 0; i < r; ++i) expected.insert({n * i / r, n * (i + 1) / r});
      ASSERT_EQ(ranges, expected) << n << " " << threads;
    }
  }
}

TEST(ParallelForTest, ChunksCoverEachIndexOnceInRangesOfTheChunk) {
  for (int threads : {1, 2, 5}) {
    for (int64_t chunk : {1, 4, 7}) {
      for (int64_t n : {0, 1, 3, 100}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        std::atomic<int> bad_ranges{0};
        ParallelForChunks(n, threads, chunk, [&](int64_t begin, int64_t end) {
          // Ranges start at multiples of the chunk and hold a chunk, the last one what is left.
          if (begin % chunk != 0 || end != std::min(n, begin + chunk)) bad_ranges.fetch_add(1);
          for (int64_t i = begin; i < end; ++i) seen[i].fetch_add(1);
        });
        EXPECT_EQ(bad_ranges.load(), 0) << n << " " << threads << " " << chunk;
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(seen[i].load(), 1) << n << " " << threads << " " << chunk;
        }
      }
    }
  }
}

// A member that stalls (descheduled on a busy machine) holds the loop up by its own range only:
// the others take every other range. With shares fixed per thread this would wait out the stall.
TEST(ParallelForTest, OthersTakeTheRangesOfAStalledMember) {
  const auto caller = std::this_thread::get_id();
  constexpr int64_t kN = 8;  // 8 ranges over 2 threads
  std::atomic<int> finished{0};
  std::atomic<bool> gave_up{false};
  ParallelFor(kN, 2, [&](int64_t begin, int64_t end) {
    if (std::this_thread::get_id() != caller) {
      // The worker's range (one of eight: one index) waits until the caller has run all the
      // others; with a fixed half each it would wait for indices it holds itself.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (finished.load() < kN - 1) {
        if (std::chrono::steady_clock::now() > deadline) {
          gave_up.store(true);
          break;
        }
        std::this_thread::yield();
      }
    }
    finished.fetch_add(static_cast<int>(end - begin));
  });
  EXPECT_EQ(finished.load(), kN);
  EXPECT_FALSE(gave_up.load());
}

}  // namespace
}  // namespace lmserve::kernels
