// The serving benchmark's statistics: percentiles as numpy computes them, ITL/TPOT as vLLM defines
// them, goodput against SLOs.

#include "bench/lmserve_bench/stats.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::bench {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

TEST(PercentileTest, InterpolatesLinearlyAsNumpy) {
  // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
  const std::vector<double> values = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(values, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(values, 50), 2.5);
  EXPECT_NEAR(Percentile(values, 90), 3.7, 1e-12);
  EXPECT_NEAR(Percentile(values, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(values, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(SummarizeTest, MeanStddevAndPercentiles) {
  const Distribution d = Summarize(std::vector<double>{2, 4, 4, 4, 5, 5, 7, 9}, {50, 90});
  EXPECT_EQ(d.count, 8);
  EXPECT_DOUBLE_EQ(d.mean, 5);
  EXPECT_DOUBLE_EQ(d.stddev, 2);  // population standard deviation, as numpy.std
  EXPECT_DOUBLE_EQ(d.min, 2);
  EXPECT_DOUBLE_EQ(d.max, 9);
  EXPECT_DOUBLE_EQ(d.percentiles.at(50), 4.5);
  EXPECT_NEAR(d.percentiles.at(90), 7.6, 1e-12);
}

TEST(AddChunkTest, FirstChunkIsTtftLaterChunksSpreadTheirGap) {
  RequestRecord record;
  record.send_time = 10.0;
  AddChunk(&record, 10.5, 2);  // first chunk: TTFT 0.5 s; its second token has no gap of its own
  AddChunk(&record, 10.6, 1);
  AddChunk(&record, 10.9, 3);  // 0.3 s for 3 tokens: three gaps of 0.1 s
  AddChunk(&record, 11.0, 0);  // an empty chunk (text held back) changes nothing
  EXPECT_EQ(record.output_tokens, 6);
  EXPECT_DOUBLE_EQ(record.ttft_seconds(), 0.5);
  EXPECT_THAT(record.itl_seconds, ElementsAre(DoubleNear(0.1, 1e-9), DoubleNear(0.1, 1e-9),
                                              DoubleNear(0.1, 1e-9), DoubleNear(0.1, 1e-9)));
  record.end_time = 11.0;
  // TPOT = (e2e - ttft) / (tokens - 1) = (1.0 - 0.5) / 5
  EXPECT_NEAR(record.tpot_seconds(), 0.1, 1e-9);
}

RequestRecord Finished(double ttft, double e2e, int32_t tokens, int32_t prompt_tokens = 10) {
  RequestRecord record;
  record.success = true;
  record.send_time = 100;
  record.first_token_time = 100 + ttft;
  record.end_time = 100 + e2e;
  record.output_tokens = tokens;
  record.prompt_tokens = prompt_tokens;
  return record;
}

TEST(SlosTest, ParsesPairsAndRejectsNonsense) {
  absl::StatusOr<Slos> slos = ParseSlos("ttft:500 tpot:50,e2el:2000");
  ASSERT_TRUE(slos.ok()) << slos.status();
  EXPECT_DOUBLE_EQ(slos->limits_ms.at("ttft"), 500);
  EXPECT_DOUBLE_EQ(slos->limits_ms.at("tpot"), 50);
  EXPECT_DOUBLE_EQ(slos->limits_ms.at("e2el"), 2000);
  EXPECT_TRUE(ParseSlos("").ok());
  EXPECT_FALSE(ParseSlos("ttft").ok());
  EXPECT_FALSE(ParseSlos("itl:5").ok());
  EXPECT_FALSE(ParseSlos("ttft:-1").ok());
  EXPECT_FALSE(ParseSlos("ttft:5x").ok());
}

TEST(SlosTest, EveryGivenSloMustHold) {
  const Slos slos = *ParseSlos("ttft:500 tpot:50");
  EXPECT_TRUE(MeetsSlos(Finished(0.4, 0.4 + 9 * 0.05, 10), slos));   // TPOT exactly 50 ms
  EXPECT_FALSE(MeetsSlos(Finished(0.6, 0.7, 10), slos));             // TTFT too long
  EXPECT_FALSE(MeetsSlos(Finished(0.1, 0.1 + 9 * 0.06, 10), slos));  // TPOT too long
  EXPECT_TRUE(MeetsSlos(Finished(0.1, 5.0, 1), slos));               // one token: no TPOT
  RequestRecord failed = Finished(0.1, 0.2, 10);
  failed.success = false;
  EXPECT_FALSE(MeetsSlos(failed, slos));
}

TEST(SummarizeTest, ThroughputGoodputAndFailures) {
  std::vector<RequestRecord> records = {Finished(0.1, 1.0, 10), Finished(0.2, 2.0, 10),
                                        Finished(0.9, 3.0, 10)};
  RequestRecord failed;
  failed.error = "gRPC UNAVAILABLE: draining";
  records.push_back(failed);
  records.push_back(failed);
  const BenchmarkSummary s = Summarize(records, 4.0, *ParseSlos("ttft:500"), {50, 99});
  EXPECT_EQ(s.num_issued, 5);
  EXPECT_EQ(s.num_completed, 3);
  EXPECT_EQ(s.num_failed, 2);
  EXPECT_EQ(s.errors.at("gRPC UNAVAILABLE: draining"), 2);
  EXPECT_EQ(s.num_good, 2);
  EXPECT_DOUBLE_EQ(s.request_throughput, 0.75);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);
  EXPECT_EQ(s.total_output_tokens, 30);
  EXPECT_EQ(s.total_input_tokens, 30);
  EXPECT_DOUBLE_EQ(s.output_throughput, 7.5);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 15);
  EXPECT_EQ(s.ttft_ms.count, 3);
  EXPECT_NEAR(s.ttft_ms.mean, 400, 1e-9);
  EXPECT_NEAR(s.ttft_ms.percentiles.at(50), 200, 1e-9);
  EXPECT_NEAR(s.e2el_ms.mean, 2000, 1e-9);
  EXPECT_EQ(s.tpot_ms.count, 3);
  EXPECT_NEAR(s.tpot_ms.percentiles.at(50), 200, 1e-9);  // (2.0 - 0.2) / 9
}

TEST(SummarizeTest, WithoutSlosGoodputIsThroughput) {
  const BenchmarkSummary s = Summarize({Finished(0.1, 1.0, 5)}, 2.0, Slos{}, {50});
  EXPECT_EQ(s.num_good, 1);
  EXPECT_DOUBLE_EQ(s.goodput, s.request_throughput);
}

}  // namespace
}  // namespace lmserve::bench
