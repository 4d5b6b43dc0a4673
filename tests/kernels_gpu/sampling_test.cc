// Argmax and the sampler on the GPU against their CPU twins.

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/argmax.h"
#include "kernels/cpu/philox.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/sampling.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FreshSeed;
using testing::RandomFloats;

TEST(ArgmaxGpuTest, MatchesCpuWithTiesAndNans) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t rows : {1, 17, 64}) {
    for (int64_t vocab : {4, 1000, 128256}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " vocab " << vocab << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> logits = RandomFloats(rows * vocab, rng, 4.0f);
      std::uniform_int_distribution<int64_t> col(0, vocab - 1);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits.data() + r * vocab;
        if (r % 3 == 1) row[col(rng)] = NAN;
        if (r % 4 == 2) {  // a tie for the maximum
          const int64_t a = col(rng), b = col(rng);
          row[a] = row[b] = 100.0f;
        }
        if (r % 7 == 5) {
          for (int64_t i = 0; i < vocab; ++i) row[i] = NAN;
        }
      }
      DeviceBuffer<float> d_logits(logits);
      DeviceBuffer<int32_t> d_out(rows);
      d_out.Poison();
      ArgmaxParams p{d_logits.get(), d_out.get(), rows, vocab, 0};
      CUDA_ASSERT(Launch(p, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<int32_t> ref(rows);
      kernels::Argmax({logits.data(), ref.data(), rows, vocab});
      EXPECT_EQ(d_out.Download(), ref);
    }
  }
}

struct RowSettings {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};

// The GPU token equals the CPU twin's, or (for a draw within rounding of a boundary) is a kept
// token whose cumulative-weight interval reaches the target within 1e-4.
void ExpectAgrees(const float* row, int64_t vocab, const RowSettings& s, uint64_t seed,
                  uint64_t step, int32_t gpu_token) {
  if (!(s.temperature > 0)) {
    int32_t ref = 0;
    kernels::Argmax({row, &ref, 1, vocab});
    EXPECT_EQ(gpu_token, ref);
    return;
  }
  const SamplingDecision d = SampleRow(row, vocab, s.temperature, s.top_k, s.top_p, s.min_p,
                                       UniformFromSeed(seed, step));
  if (gpu_token == d.token) return;
  ASSERT_GE(gpu_token, 0);
  ASSERT_LT(gpu_token, vocab);
  ASSERT_TRUE(d.kept[gpu_token]) << "GPU token " << gpu_token << " is not kept (CPU: " << d.token
                                 << ")";
  double before = 0, total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (i < gpu_token) before += d.weights[i];
    total += d.weights[i];
  }
  const double slack = 1e-4 * total;
  EXPECT_LE(before, d.target + slack) << "GPU " << gpu_token << " CPU " << d.token;
  EXPECT_GT(before + d.weights[gpu_token], d.target - slack) << "GPU " << gpu_token << " CPU "
                                                             << d.token;
}

// Samples rows of `settings` over `logits` ([rows, vocab]; seeds and steps from `rng`) and checks
// every token against the CPU twin, and that a second launch draws the same; `tokens`, when
// given, receives them.
void RunSamplingRows(int64_t vocab, const std::vector<float>& logits,
                     const std::vector<RowSettings>& settings, std::mt19937& rng,
                     std::vector<int32_t>* tokens = nullptr) {
  const auto rows = static_cast<int64_t>(settings.size());
  ASSERT_EQ(logits.size(), static_cast<size_t>(rows * vocab));
  std::vector<float> temperature, top_p, min_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seeds, steps;
  for (int64_t r = 0; r < rows; ++r) {
    temperature.push_back(settings[r].temperature);
    top_k.push_back(settings[r].top_k);
    top_p.push_back(settings[r].top_p);
    min_p.push_back(settings[r].min_p);
    seeds.push_back(rng());
    steps.push_back(rng() % 1000);
  }
  DeviceBuffer<float> d_logits(logits), d_temp(temperature), d_top_p(top_p), d_min_p(min_p);
  DeviceBuffer<int32_t> d_top_k(top_k), d_out(rows);
  DeviceBuffer<uint64_t> d_seeds(seeds), d_steps(steps);
  d_out.Poison();
  SamplingParams p;
  p.logits = d_logits.get();
  p.output = d_out.get();
  p.temperature = d_temp.get();
  p.top_k = d_top_k.get();
  p.top_p = d_top_p.get();
  p.min_p = d_min_p.get();
  p.seeds = d_seeds.get();
  p.steps = d_steps.get();
  p.num_rows = rows;
  p.vocab_size = vocab;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<int32_t> out = d_out.Download();
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r << " T " << settings[r].temperature << " k "
                                      << settings[r].top_k << " p " << settings[r].top_p
                                      << " min_p " << settings[r].min_p);
    ExpectAgrees(logits.data() + r * vocab, vocab, settings[r], seeds[r], steps[r], out[r]);
  }
  // Same seeds and steps: the same tokens.
  CUDA_ASSERT(Launch(p, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_EQ(d_out.Download(), out);
  if (tokens != nullptr) *tokens = out;
}

// RunSamplingRows over random logits (`spread` their standard deviation).
void RunSamplingCase(int64_t vocab, const std::vector<RowSettings>& settings, float spread,
                     uint32_t seed = FreshSeed(), std::vector<int32_t>* tokens = nullptr) {
  SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " spread " << spread << " seed "
                                    << seed);
  std::mt19937 rng(seed);
  const auto rows = static_cast<int64_t>(settings.size());
  const std::vector<float> logits = RandomFloats(rows * vocab, rng, spread);
  RunSamplingRows(vocab, logits, settings, rng, tokens);
}

// A launch's logits and its rows' temperatures, seeds and steps on the device (no filters), and
// the parameters that point at them.
struct TemperatureLaunch {
  TemperatureLaunch(const std::vector<float>& logits, const std::vector<float>& temperature,
                    const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& steps)
      : d_logits(logits), d_temp(temperature), d_seeds(seeds), d_steps(steps),
        d_out(temperature.size()) {
    params.logits = d_logits.get();
    params.output = d_out.get();
    params.temperature = d_temp.get();
    params.seeds = d_seeds.get();
    params.steps = d_steps.get();
    params.num_rows = static_cast<int64_t>(temperature.size());
    params.vocab_size = static_cast<int64_t>(logits.size() / temperature.size());
  }
  DeviceBuffer<float> d_logits, d_temp;
  DeviceBuffer<uint64_t> d_seeds, d_steps;
  DeviceBuffer<int32_t> d_out;
  SamplingParams params;
};

// Greedy rows split over several blocks (a workspace given, at most kSamplingSplitRows rows): the
// CPU's argmax, with ties between slices, NaNs and all-NaN rows; the workspace is reused by
// three launches in a row (the counters go back to zero), and rows with a temperature in the same
// launch still sample.
TEST(SamplingGpuTest, SplitGreedyRowsMatchCpuArgmax) {
  LMSERVE_REQUIRE_GPU();
  DeviceBuffer<uint8_t> workspace(kSamplingWorkspaceBytes);
  CUDA_ASSERT(cudaMemset(workspace.get(), 0, kSamplingWorkspaceBytes));
  for (int64_t rows : {int64_t{1}, int64_t{5}, kSamplingSplitRows, kSamplingSplitRows + 1}) {
    for (int64_t vocab : {4096, 128256, 1000}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "rows " << rows << " vocab " << vocab << " seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> logits = RandomFloats(rows * vocab, rng, 4.0f);
      std::vector<float> temperature(rows, 0.0f);
      std::uniform_int_distribution<int64_t> col(0, vocab - 1);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits.data() + r * vocab;
        if (r % 3 == 1) row[col(rng)] = NAN;
        if (r % 4 == 2) {  // a tie for the maximum, likely in two slices
          row[col(rng) / 2] = 100.0f;
          row[vocab / 2 + col(rng) / 2] = 100.0f;
        }
        if (r % 5 == 3) row[vocab - 1] = 100.0f;  // the last slice's last entry
        if (r % 7 == 5) {
          for (int64_t i = 0; i < vocab; ++i) row[i] = NAN;
        }
        if (r % 11 == 10) temperature[r] = 1.0f;  // sampled: one block
      }
      std::vector<uint64_t> seeds(rows), steps(rows);
      for (int64_t r = 0; r < rows; ++r) seeds[r] = rng(), steps[r] = r;
      TemperatureLaunch device(logits, temperature, seeds, steps);
      device.params.workspace = workspace.get();
      for (int launch = 0; launch < 3; ++launch) {
        device.d_out.Poison();
        CUDA_ASSERT(Launch(device.params, nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<int32_t> out = device.d_out.Download();
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE(::testing::Message() << "launch " << launch << " row " << r);
          ExpectAgrees(logits.data() + r * vocab, vocab, {temperature[r], 0, 1.0f, 0.0f}, seeds[r],
                       steps[r], out[r]);
        }
      }
      std::vector<uint8_t> counters(kSamplingSplitRows * 4);
      CUDA_ASSERT(
          cudaMemcpy(counters.data(), workspace.get(), counters.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(counters, std::vector<uint8_t>(counters.size(), 0));
    }
  }
}

std::vector<RowSettings> SettingsMix(int64_t rows) {
  const std::vector<RowSettings> kinds = {
      {0.0f, 0, 1.0f, 0.0f},     {1.0f, 0, 1.0f, 0.0f},     {0.7f, 50, 1.0f, 0.0f},
      {1.0f, 1, 1.0f, 0.0f},     {1.0f, 0, 0.9f, 0.0f},     {0.8f, 40, 0.95f, 0.0f},
      {1.0f, 0, 1.0f, 0.05f},    {1.2f, 1000, 0.5f, 0.02f}, {1.0f, 20000, 1.0f, 0.0f},
      {1.0f, 0, 0.0f, 0.0f},     {2.0f, 0, 0.99f, 0.0f},    {0.5f, 5, 0.3f, 0.1f},
  };
  std::vector<RowSettings> s;
  for (int64_t r = 0; r < rows; ++r) s.push_back(kinds[r % kinds.size()]);
  return s;
}

TEST(SamplingGpuTest, MatchesCpuAcrossSettings) {
  LMSERVE_REQUIRE_GPU();
  for (int64_t rows : {1, 17, 64}) {
    for (int64_t vocab : {1000, 128256}) {
      for (float spread : {1.0f, 4.0f}) RunSamplingCase(vocab, SettingsMix(rows), spread);
    }
  }
}

// Flat logits put tens of thousands of candidates above the histogram bound: the sampler falls
// back to reading global memory for the exact thresholds.
TEST(SamplingGpuTest, FlatDistributionsTakeTheGlobalPath) {
  LMSERVE_REQUIRE_GPU();
  RunSamplingCase(128256, {{1.0f, 0, 0.9f, 0.0f}, {1.0f, 30000, 1.0f, 0.0f},
                           {1.0f, 30000, 0.8f, 0.0f}, {1.0f, 0, 1.0f, 0.001f}},
                  0.05f);
}

// The portable path keeps at most kSamplingCandidatesPortable candidates in shared memory, the
// Hopper path kSamplingCandidates: rows with a number of candidates in between read them from
// global memory on the one and from shared memory on the other. The tokens must be the same.
TEST(SamplingGpuTest, EitherPathsCandidateCapacityDrawsTheSameTokens) {
  LMSERVE_REQUIRE_GPU();
  {
    testing::ScopedKernelPath hopper(KernelPath::kAuto);
    if (!UseHopperKernels()) GTEST_SKIP() << "no Hopper path here: nothing to compare";
  }
  static_assert(kSamplingCandidatesPortable < 8000 && 12000 < kSamplingCandidates);
  const std::vector<RowSettings> settings = {{1.0f, 8000, 1.0f, 0.0f},
                                             {1.0f, 12000, 0.99f, 0.0f},
                                             {0.9f, 6000, 1.0f, 0.0f},
                                             {1.0f, 50, 1.0f, 0.0f}};
  const uint32_t seed = FreshSeed();
  std::vector<int32_t> tokens[2];
  for (int path = 0; path < 2; ++path) {
    testing::ScopedKernelPath scoped(path == 0 ? KernelPath::kAuto : KernelPath::kPortable);
    RunSamplingCase(128256, settings, 1.0f, seed, &tokens[path]);
  }
  EXPECT_EQ(tokens[0], tokens[1]) << "seed " << seed;
}

// Logits of spread 3.5 at temperature 1 put about 10,000-12,000 tokens within 10.5 nats of the
// maximum: on the Hopper path they fit in shared memory and the filters run on pass 1's
// candidates (one pass over the logits); on the portable path (4096) they do not, and the
// histogram path runs. Both must draw the same tokens.
TEST(SamplingGpuTest, OnePassAndHistogramPathsDrawTheSameTokens) {
  LMSERVE_REQUIRE_GPU();
  {
    testing::ScopedKernelPath hopper(KernelPath::kAuto);
    if (!UseHopperKernels()) GTEST_SKIP() << "no Hopper path here: nothing to compare";
  }
  const std::vector<RowSettings> settings = {{1.0f, 0, 0.9f, 0.0f},   {1.0f, 50, 0.9f, 0.0f},
                                             {1.0f, 0, 1.0f, 0.05f},  {1.0f, 0, 0.5f, 0.0f},
                                             {1.0f, 500, 1.0f, 0.0f}, {1.0f, 0, 0.95f, 0.01f}};
  for (int repeat = 0; repeat < 4; ++repeat) {
    const uint32_t seed = FreshSeed();
    std::vector<int32_t> tokens[2];
    for (int path = 0; path < 2; ++path) {
      testing::ScopedKernelPath scoped(path == 0 ? KernelPath::kAuto : KernelPath::kPortable);
      RunSamplingCase(128256, settings, 3.5f, seed, &tokens[path]);
    }
    EXPECT_EQ(tokens[0], tokens[1]) << "seed " << seed;
  }
}

// Rows whose kept set is large or sits on ties: flat rows (every token within a few nats of the
// maximum, more candidates than shared memory holds) under top-p 1.0 with min-p, top-p near 1
// and a large top-k; rows of few distinct values (long runs of equal logits) cut by top-k and
// top-p inside a run of ties; and rows where a few spikes, two of them tied, stand far above the
// rest in different parts of the row (a handful of candidates).
TEST(SamplingGpuTest, LargeKeptSetsTiesAndSpikesMatchCpu) {
  LMSERVE_REQUIRE_GPU();
  const int64_t vocab = 128256;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<RowSettings> settings = {
      {1.0f, 0, 1.0f, 0.5f},   {1.0f, 0, 0.999f, 0.0f}, {1.0f, 100000, 0.95f, 0.0f},
      {1.0f, 0, 1.0f, 0.0f},   {0.7f, 777, 1.0f, 0.0f}, {1.0f, 0, 0.37f, 0.0f},
      {1.3f, 5, 0.8f, 0.05f},  {1.0f, 0, 0.9f, 0.0f},   {1.0f, 3, 1.0f, 0.0f},
      {1.0f, 0, 1.0f, 0.2f},
  };
  const auto rows = static_cast<int64_t>(settings.size());
  std::vector<float> logits(rows * vocab);
  std::uniform_int_distribution<int64_t> col(0, vocab - 1);
  std::uniform_int_distribution<int> level(0, 7);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits.data() + r * vocab;
    if (r < 4) {  // flat: N(0, 0.3)
      const std::vector<float> v = RandomFloats(vocab, rng, 0.3f);
      std::copy(v.begin(), v.end(), row);
    } else if (r < 7) {  // levels 3 apart, each a run of ties: ~30 at 0, ~300 at -3, ~3000 at
      // -6, ~7000 at -9, the rest at -12 to -21 (about 10,000 within 10.5 nats of the maximum)
      for (int64_t i = 0; i < vocab; ++i) {
        const int64_t u = col(rng);
        const int l = u < 30 ? 0 : u < 330 ? 1 : u < 3330 ? 2 : u < 10330 ? 3 : 4 + level(rng) % 4;
        row[i] = -3.0f * static_cast<float>(l);
      }
    } else {  // N(0, 1) with three spikes at 30, in different tiles, two of them tied
      const std::vector<float> v = RandomFloats(vocab, rng, 1.0f);
      std::copy(v.begin(), v.end(), row);
      row[col(rng) / 3] = 30.0f;
      row[vocab / 3 + col(rng) / 3] = 30.0f;
      row[2 * vocab / 3 + col(rng) / 3] = 29.0f;
    }
  }
  RunSamplingRows(vocab, logits, settings, rng);
}

// A 2.2M-token vocabulary: the maximum at the row's end and the kept set at both ends (top-p);
// a spike with no other token within 10 nats of it, under top-k 20 (the histogram path).
TEST(SamplingGpuTest, LongVocabularyMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  const int64_t vocab = 2200000;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<RowSettings> settings = {{1.0f, 0, 0.9f, 0.0f}, {1.0f, 20, 1.0f, 0.0f}};
  std::vector<float> logits = RandomFloats(2 * vocab, rng, 1.0f);
  logits[vocab - 5] = 25.0f;       // row 0: the maximum in the last tile
  logits[1000] = 24.0f;            // row 0: a second token within reach, in the first
  logits[2 * vocab - 100] = 20.0f;  // row 1
  RunSamplingRows(vocab, logits, settings, rng);
}

// The one-pass path's warps each keep their part's candidates in a region of their own (raising
// a floor under them where it would overflow), then the smallest window that holds the kept set
// is gathered. Rows for each outcome: peaked rows (the narrowest window), the kernel bench's rows
// (N(0, 3) at T 0.8, top-p 0.9: windows of 8-10 nats), min-p ranges of 3 and 7 nats, a top-k
// larger than the final arrays (the histogram path); N(0, 1) rows with a flat part of 4096
// tokens in [5, 6) (warp 3's part): the row's maximum at its end (every warp fills its region
// before it is seen, and raises its floor), in its first token (no floor), or in the flat part
// itself (warp 3's floor cuts every window: the histogram path).
TEST(SamplingGpuTest, WarpRegionsAndWindowsMatchCpu) {
  LMSERVE_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  {
    const int64_t vocab = 128256;
    const std::vector<RowSettings> settings = {
        {0.5f, 0, 0.9f, 0.0f},    {0.8f, 0, 0.9f, 0.0f},  {0.8f, 0, 0.9f, 0.0f},
        {0.8f, 50, 0.9f, 0.0f},   {0.8f, 0, 1.0f, 0.05f}, {0.8f, 0, 1.0f, 0.001f},
        {0.8f, 7000, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f},  {1.0f, 0, 0.9f, 0.0f},
        {1.0f, 0, 0.9f, 0.0f},    {1.0f, 20, 1.0f, 0.0f},
    };
    const auto rows = static_cast<int64_t>(settings.size());
    std::vector<float> logits = RandomFloats(rows * vocab, rng, 3.0f);
    for (int64_t r = 7; r < rows; ++r) {  // N(0, 1); tokens [3 * 4096, 4 * 4096) in [5, 6)
      float* row = logits.data() + r * vocab;
      const std::vector<float> v = RandomFloats(vocab, rng, 1.0f);
      std::copy(v.begin(), v.end(), row);
      std::uniform_real_distribution<float> flat(5.0f, 6.0f);
      for (int64_t i = 3 * 4096; i < 4 * 4096; ++i) row[i] = flat(rng);
    }
    logits[8 * vocab - 1] = 20.0f;  // row 7: the maximum in the last token
    logits[8 * vocab] = 30.0f;      // row 8: the maximum in the first
    logits[11 * vocab - 1] = 9.0f;  // row 10: the maximum in the last token, 3-4 nats above
                                    // the flat part (top-k 20 from both)
    RunSamplingRows(vocab, logits, settings, rng);
  }
}

// Rows of exactly 32 x 65,536 tokens, the largest vocabulary whose warps' offsets fit 16 bits on
// the one-pass path: N(-30, 1) but three tokens, the maximum in the last; top-k 1 must find it,
// top-p 0.9 keeps all three.
TEST(SamplingGpuTest, LargestOnePassVocabularyMatchesCpu) {
  LMSERVE_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t vocab = int64_t{32} * 65536;
  const std::vector<RowSettings> settings = {{1.0f, 1, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f}};
  std::vector<float> logits = RandomFloats(2 * vocab, rng, 1.0f);
  for (float& x : logits) x -= 30.0f;
  for (int64_t r = 0; r < 2; ++r) {
    logits[r * vocab + 5] = 0.5f;
    logits[r * vocab + vocab / 2 + 7] = 0.0f;
    logits[r * vocab + vocab - 1] = 1.0f;
  }
  RunSamplingRows(vocab, logits, settings, rng);
}

TEST(SamplingGpuTest, DrawsFollowTheDistribution) {
  LMSERVE_REQUIRE_GPU();
  // 4096 rows of the same 8 logits, different seeds: token frequencies near the probabilities.
  const int64_t rows = 4096, vocab = 8;
  const std::vector<float> base = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, -3.0f, 0.2f};
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), base.begin(), base.end());
  std::vector<float> temperature(rows, 1.0f);
  std::vector<uint64_t> seeds(rows), steps(rows, 3);
  for (int64_t r = 0; r < rows; ++r) seeds[r] = 1000 + r;
  TemperatureLaunch launch(logits, temperature, seeds, steps);
  CUDA_ASSERT(Launch(launch.params, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<double> freq(vocab, 0.0);
  for (int32_t t : launch.d_out.Download()) freq[t] += 1.0 / rows;
  double z = 0;
  for (float x : base) z += std::exp(x);
  for (int64_t i = 0; i < vocab; ++i) {
    const double prob = std::exp(base[i]) / z;
    EXPECT_NEAR(freq[i], prob, 5 * std::sqrt(prob * (1 - prob) / rows) + 1e-3) << "token " << i;
  }
}

}  // namespace
}  // namespace lmserve::kernels::cuda
