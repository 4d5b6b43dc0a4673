// Dequantization of the GGUF block formats against values evaluated by hand from the formats'
// definitions (llama.cpp's ggml-common.h block layouts): each test writes the bytes of a block
// itself, from chosen scales, mins and quants, and states the value each element must have.

#include "kernels/cpu/dequant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/dtype.h"

namespace lmserve::kernels {
namespace {

// fp16 bit patterns of the powers of two and small values used as scales below.
constexpr uint16_t kHalfOne = 0x3C00;       // 1.0
constexpr uint16_t kHalfTwo = 0x4000;       // 2.0
constexpr uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr uint16_t kHalfEighth = 0x3000;    // 0.125
constexpr uint16_t kHalfMinus1p5 = 0xBE00;  // -1.5

void PutHalf(std::vector<uint8_t>& bytes, size_t offset, uint16_t bits) {
  bytes[offset] = static_cast<uint8_t>(bits & 0xFF);
  bytes[offset + 1] = static_cast<uint8_t>(bits >> 8);
}

std::vector<float> Dequantize(DType dtype, const std::vector<uint8_t>& bytes, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), RowBytes(dtype, n));
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());  // poisoned
  DequantizeToF32(dtype, bytes.data(), out.data(), n);
  return out;
}

// ---- half.h
// --------------------------------------------------------------------------------------

TEST(HalfTest, F16ToF32ExactValues) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x3555), 0.25f * (1 + 0x155 / 1024.0f));  // 0.333251953125
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);                       // largest finite
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));          // smallest normal
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));          // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));       // largest subnormal
  EXPECT_EQ(F16ToF32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));
}

TEST(HalfTest, F32ToF16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  // 1 + 2^-11 lies halfway between 1 (even mantissa) and 1 + 2^-10: down to 1.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  // Just above halfway rounds up.
  EXPECT_EQ(F32ToF16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  // 65520 is halfway between 65504 and 65536 (even, but not finite in fp16): infinity.
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
}

TEST(HalfTest, F32ToF16Subnormals) {
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);     // halfway to 0 and 1 unit: even
  EXPECT_EQ(F32ToF16(std::ldexp(1.001f, -25)), 0x0001);   // above halfway
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 units: up to 2 (even)
  EXPECT_EQ(F32ToF16(std::ldexp(5.0f, -25)), 0x0002);     // 2.5 units: down to 2 (even)
  EXPECT_EQ(F32ToF16(std::ldexp(2047.0f, -25)), 0x0400);  // 1023.5 units: up to the normal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -30)), 0x8000);  // signed zero
}

TEST(HalfTest, F32ToF16InfAndNan) {
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  const uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(HalfTest, EveryF16RoundTripsThroughF32) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00, 0x7C00u);
      continue;
    }
    ASSERT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

TEST(HalfTest, Bf16) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0x4049), 3.140625f);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // halfway: down to even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // halfway: up to even
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lies only in the low 16 bits must not become infinity.
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::bit_cast<float>(0x7F800001u)))));
}

// ---- unquantized types
// ---------------------------------------------------------------------------

TEST(DequantTest, FloatTypes) {
  const float f32[3] = {1.5f, -0.0f, 3e38f};
  std::vector<uint8_t> bytes(12);
  std::memcpy(bytes.data(), f32, 12);
  std::vector<float> out = Dequantize(DType::kF32, bytes, 3);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(out[2], 3e38f);

  std::vector<uint8_t> f16(6);
  PutHalf(f16, 0, kHalfMinus1p5);
  PutHalf(f16, 2, 0x0001);
  PutHalf(f16, 4, 0x7BFF);
  out = Dequantize(DType::kF16, f16, 3);
  EXPECT_EQ(out[0], -1.5f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[2], 65504.0f);

  std::vector<uint8_t> bf16(4);
  PutHalf(bf16, 0, 0x4049);
  PutHalf(bf16, 2, 0xC000);
  out = Dequantize(DType::kBF16, bf16, 2);
  EXPECT_EQ(out[0], 3.140625f);
  EXPECT_EQ(out[1], -2.0f);
}

// ---- 32-element blocks
// ---------------------------------------------------------------------------

TEST(DequantTest, Q8_0) {
  // Two blocks {half d, int8 qs[32]}: d = 0.5 with qs = -128, -120, ..., and d = 2 with qs = 127 -
  // j.
  std::vector<uint8_t> bytes(2 * 34);
  PutHalf(bytes, 0, kHalfHalf);
  PutHalf(bytes, 34, kHalfTwo);
  for (int j = 0; j < 32; ++j) {
    bytes[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(-128 + 8 * j));
    bytes[34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(127 - j));
  }
  const std::vector<float> out = Dequantize(DType::kQ8_0, bytes, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], 0.5f * (-128 + 8 * j)) << j;
    EXPECT_EQ(out[32 + j], 2.0f * (127 - j)) << j;
  }
}

TEST(DequantTest, Q4_0LowNibblesFirstThenHighNibbles) {
  // {half d, uint8 qs[16]}: element j < 16 is the low nibble of qs[j], element 16 + j its high
  // nibble; value = d * (q - 8).
  std::vector<uint8_t> bytes(2 * 18);
  PutHalf(bytes, 0, kHalfTwo);
  PutHalf(bytes, 18, kHalfQuarter);
  for (int j = 0; j < 16; ++j) {
    bytes[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    bytes[18 + 2 + j] = static_cast<uint8_t>(((j * 3) % 16) | (((j * 5 + 1) % 16) << 4));
  }
  const std::vector<float> out = Dequantize(DType::kQ4_0, bytes, 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(out[16 + j], 2.0f * (15 - j - 8)) << j;
    EXPECT_EQ(out[32 + j], 0.25f * ((j * 3) % 16 - 8)) << j;
    EXPECT_EQ(out[48 + j], 0.25f * ((j * 5 + 1) % 16 - 8)) << j;
  }
}

TEST(DequantTest, Q4_1AddsTheMin) {
  // {half d, half m, uint8 qs[16]}: value = d * q + m, same nibble order as Q4_0.
  std::vector<uint8_t> bytes(20);
  PutHalf(bytes, 0, kHalfQuarter);
  PutHalf(bytes, 2, kHalfMinus1p5);
  for (int j = 0; j < 16; ++j) bytes[4 + j] = static_cast<uint8_t>((15 - j) | (j << 4));
  const std::vector<float> out = Dequantize(DType::kQ4_1, bytes, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.25f * (15 - j) - 1.5f) << j;
    EXPECT_EQ(out[16 + j], 0.25f * j - 1.5f) << j;
  }
}

// ---- K-quants
// ------------------------------------------------------------------------------------

// Sub-block scales and mins (6 bits each) of the Q4_K / Q5_K tests: the upper sub-blocks 4..7 use
// values >= 16 so that their top two bits, stored apart from the low four, matter.
constexpr uint8_t kScales6[8] = {1, 17, 33, 63, 5, 40, 22, 59};
constexpr uint8_t kMins6[8] = {2, 7, 63, 31, 48, 9, 60, 17};

// The 12 scale bytes of a K-quant super-block: byte k (k < 4) holds scale k in its low 6 bits and
// bits 4..5 of scale k + 4 in its top 2; byte 4 + k likewise for the mins; byte 8 + k holds the
// low 4 bits of scale k + 4 (low nibble) and of min k + 4 (high nibble).
void PackScales(uint8_t* out) {
  for (int k = 0; k < 4; ++k) {
    out[k] = static_cast<uint8_t>(kScales6[k] | ((kScales6[k + 4] >> 4) << 6));
    out[4 + k] = static_cast<uint8_t>(kMins6[k] | ((kMins6[k + 4] >> 4) << 6));
    out[8 + k] = static_cast<uint8_t>((kScales6[k + 4] & 15) | ((kMins6[k + 4] & 15) << 4));
  }
}

// The 4-bit quant of element e of the Q4_K / Q5_K tests, and where it is stored: in 64-element
// group g = e / 64, elements g*64 + l (l < 32) are the low nibbles of qs[g*32 + l] and
// g*64 + 32 + l the high nibbles.
int Quant4(int e) { return (e * 7 + 3) % 16; }
void PackQuants4(uint8_t* qs) {
  std::memset(qs, 0, 128);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 64, r = e % 64;
    qs[g * 32 + r % 32] |= static_cast<uint8_t>(r < 32 ? Quant4(e) : Quant4(e) << 4);
  }
}

TEST(DequantTest, Q4_K) {
  // block_q4_K = {half d, half dmin, uint8 scales[12], uint8 qs[128]}; sub-block j = e / 32:
  // value = d * scale_j * q - dmin * min_j.
  std::vector<uint8_t> bytes(144);
  PutHalf(bytes, 0, kHalfHalf);
  PutHalf(bytes, 2, kHalfQuarter);
  PackScales(&bytes[4]);
  PackQuants4(&bytes[16]);
  const std::vector<float> out = Dequantize(DType::kQ4_K, bytes, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    const double expected = 0.5 * kScales6[j] * Quant4(e) - 0.25 * kMins6[j];
    ASSERT_EQ(out[e], expected) << "element " << e;
  }
}

TEST(DequantTest, Q4_KSecondSuperBlockUsesItsOwnScales) {
  std::vector<uint8_t> bytes(2 * 144, 0);
  PutHalf(bytes, 0, kHalfHalf);
  PackScales(&bytes[4]);
  PutHalf(bytes, 144, kHalfOne);
  PutHalf(bytes, 146, kHalfOne);
  bytes[144 + 4] = 3;      // scale 0 = 3
  bytes[144 + 4 + 4] = 1;  // min 0 = 1
  bytes[144 + 16] = 0x5;   // element 0 of the second block: q = 5
  const std::vector<float> out = Dequantize(DType::kQ4_K, bytes, 512);
  EXPECT_EQ(out[256], 3.0f * 5 - 1.0f);
  EXPECT_EQ(out[257], -1.0f);
  EXPECT_EQ(out[256 + 32], 0.0f);  // sub-block 1: scale 0, min 0
}

TEST(DequantTest, Q5_K) {
  // block_q5_K = {half d, half dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]}: the 5th bit
  // of element e = g*64 + r lives in qh[r % 32], bit 2g for r < 32 and bit 2g + 1 otherwise.
  std::vector<uint8_t> bytes(176, 0);
  PutHalf(bytes, 0, kHalfEighth);
  PutHalf(bytes, 2, kHalfHalf);
  PackScales(&bytes[4]);
  auto high_bit = [](int e) { return (e / 3 + e / 64) % 2; };
  for (int e = 0; e < 256; ++e) {
    const int g = e / 64, r = e % 64;
    if (high_bit(e)) bytes[16 + r % 32] |= static_cast<uint8_t>(1 << (2 * g + (r < 32 ? 0 : 1)));
  }
  PackQuants4(&bytes[48]);
  const std::vector<float> out = Dequantize(DType::kQ5_K, bytes, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    const int q = Quant4(e) + 16 * high_bit(e);
    const double expected = 0.125 * kScales6[j] * q - 0.5 * kMins6[j];
    ASSERT_EQ(out[e], expected) << "element " << e;
  }
}

TEST(DequantTest, Q6_K) {
  // block_q6_K = {uint8 ql[128], uint8 qh[64], int8 scales[16], half d}. Element e: half
  // n = e / 128, r = e % 128, l = r % 32, k = r / 32. Low 4 bits: ql[n*64 + l + 32*(k % 2)], low
  // nibble for k < 2, high otherwise; high 2 bits: qh[n*32 + l] >> 2k; scale: scales[n*8 + l/16 +
  // 2k]; value = d * scale * (q - 32).
  constexpr int8_t kScales[16] = {-128, 127, -3, 1, 64, -64, 7, 100, 2, -1, 33, -77, 0, 5, 90, -9};
  auto quant = [](int e) { return (e * 5 + 1) % 64; };
  std::vector<uint8_t> bytes(210, 0);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, l = r % 32, k = r / 32;
    const int q = quant(e);
    bytes[n * 64 + l + 32 * (k % 2)] |= static_cast<uint8_t>(k < 2 ? (q & 15) : (q & 15) << 4);
    bytes[128 + n * 32 + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
  }
  for (int s = 0; s < 16; ++s) bytes[192 + s] = static_cast<uint8_t>(kScales[s]);
  PutHalf(bytes, 208, kHalfEighth);
  const std::vector<float> out = Dequantize(DType::kQ6_K, bytes, 256);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, r = e % 128, l = r % 32, k = r / 32;
    const double expected = 0.125 * kScales[n * 8 + l / 16 + 2 * k] * (quant(e) - 32);
    ASSERT_EQ(out[e], expected) << "element " << e;
  }
}

// ---- Q8_0 quantization
// ---------------------------------------------------------------------------

TEST(QuantizeTest, Q8_0RoundsHalfAwayFromZero) {
  // amax 127 gives d = 1 exactly: quants are roundf(x), which rounds halfway cases away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 3.49f;
  x[6] = -126.5f;
  std::vector<uint8_t> block(34);
  QuantizeQ8_0(x.data(), block.data(), 32);
  EXPECT_EQ(block[0] | (block[1] << 8), kHalfOne);
  const int expected[7] = {127, 3, -3, 1, -1, 3, -127};
  for (int j = 0; j < 7; ++j) EXPECT_EQ(static_cast<int8_t>(block[2 + j]), expected[j]) << j;
  for (int j = 7; j < 32; ++j) EXPECT_EQ(block[2 + j], 0) << j;
}

TEST(QuantizeTest, Q8_0ZeroBlock) {
  std::vector<float> x(32, 0.0f);
  std::vector<uint8_t> block(34, 0xAB);
  QuantizeQ8_0(x.data(), block.data(), 32);
  for (uint8_t b : block) EXPECT_EQ(b, 0);
}

TEST(QuantizeTest, Q8_0RoundTripWithinHalfAStep) {
  // Per block, d = amax / 127 and q = round(x / d), so |x - q*d| <= d / 2; the stored scale is
  // d16 = fp16(d), which adds |q| * |d - d16| <= 127 * |d - d16|. fp32 rounding of x / d and of
  // q * d16 adds a few ulps of amax, allowed for with 1e-6 * amax.
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kBlocks = 64;
  std::vector<float> x(32 * kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    const float scale = std::ldexp(1.0f, b % 20 - 10);  // 2^-10 .. 2^9: some d are fp16 subnormals
    for (int j = 0; j < 32; ++j) x[b * 32 + j] = normal(rng) * scale;
  }
  std::vector<uint8_t> q(34 * kBlocks);
  QuantizeQ8_0(x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  DequantizeToF32(DType::kQ8_0, q.data(), y.data(), static_cast<int64_t>(y.size()));
  for (int b = 0; b < kBlocks; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const double d = amax / 127.0f;
    const double d16 = F16ToF32(static_cast<uint16_t>(q[34 * b] | (q[34 * b + 1] << 8)));
    // fp16 rounding: half an ulp, relative 2^-11 for normals, absolute 2^-25 for subnormals.
    EXPECT_LE(std::fabs(d - d16), std::max(d * std::ldexp(1.0, -11), std::ldexp(1.0, -25)));
    const double bound = d / 2 + 127 * std::fabs(d - d16) + 1e-6 * amax;
    for (int j = 0; j < 32; ++j) {
      ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), bound) << "block " << b << " j " << j;
    }
  }
}

// The writer's quantizers (Q4_0, Q4_K, Q6_K): what they write dequantizes to the input within a
// fraction of its steps. Per block the step is about the range over 15 (4 bits) or the largest
// magnitude over 31 (Q6_K's 6 bits), 6-bit scale rounding adds up to half a scale step of
// 1/63 (Q4_K) or 1/127 (Q6_K) of the largest: the bounds are the relative L2 errors those give
// with room.
TEST(QuantizeTest, BlockQuantizersRoundTrip) {
  std::mt19937 rng(4321);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const struct {
    DType dtype;
    double max_relative_l2;
  } cases[] = {
      {DType::kQ8_0, 0.01}, {DType::kQ4_0, 0.15}, {DType::kQ4_K, 0.15}, {DType::kQ6_K, 0.04}};
  for (const auto& c : cases) {
    std::vector<float> x(256 * 16);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (1.0f + (i / 256) % 4);
    std::vector<uint8_t> q(static_cast<size_t>(RowBytes(c.dtype, static_cast<int64_t>(x.size()))));
    QuantizeBlocks(c.dtype, x.data(), q.data(), static_cast<int64_t>(x.size()));
    std::vector<float> y(x.size());
    DequantizeToF32(c.dtype, q.data(), y.data(), static_cast<int64_t>(y.size()));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
      norm += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(diff / norm), c.max_relative_l2) << DTypeName(c.dtype);
    EXPECT_GT(std::sqrt(diff / norm), 0.0) << DTypeName(c.dtype);
  }
  // A zero block stays zero.
  for (DType dtype : {DType::kQ4_0, DType::kQ4_K, DType::kQ6_K}) {
    std::vector<float> zeros(256, 0.0f), y(256, 1.0f);
    std::vector<uint8_t> q(static_cast<size_t>(RowBytes(dtype, 256)), 0xAB);
    QuantizeBlocks(dtype, zeros.data(), q.data(), 256);
    DequantizeToF32(dtype, q.data(), y.data(), 256);
    for (float v : y) EXPECT_EQ(v, 0.0f) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace lmserve::kernels
