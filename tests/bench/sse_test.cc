// Server-sent events, OpenAI stream chunks and Prometheus text, as the benchmark reads them.

#include "bench/lmserve_bench/sse.h"

#include "bench/lmserve_bench/prometheus_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(SseParserTest, EventsEndAtABlankLine) {
  SseParser parser;
  EXPECT_THAT(parser.Feed("data: {\"a\":1}\n\ndata: [DONE]\n\n"),
              ElementsAre("{\"a\":1}", "[DONE]"));
}

TEST(SseParserTest, BytesMaySplitAnywhere) {
  const std::string stream =
      "data: one\r\n\r\n: keep-alive\r\n\r\ndata:two\r\r"
      "data: three\n\n";
  for (size_t piece = 1; piece <= 4; ++piece) {
    SseParser parser;
    std::vector<std::string> events;
    for (size_t i = 0; i < stream.size(); i += piece) {
      for (std::string& e : parser.Feed(std::string_view(stream).substr(i, piece))) {
        events.push_back(std::move(e));
      }
    }
    EXPECT_THAT(events, ElementsAre("one", "two", "three")) << "pieces of " << piece;
  }
}

TEST(SseParserTest, MultiLineDataAndOtherFields) {
  SseParser parser;
  EXPECT_THAT(parser.Feed("event: x\nid: 3\ndata: a\ndata:  b\nretry: 5\n\n"),
              ElementsAre("a\n b"));
  EXPECT_THAT(parser.Feed("event: only\n\n"), IsEmpty());  // no data: no event
  EXPECT_THAT(parser.Feed("data: unfinished\n"), IsEmpty());
  EXPECT_THAT(parser.Feed("\n"), ElementsAre("unfinished"));
}

TEST(CompletionChunkTest, ReadsTextTokensUsageAndErrors) {
  absl::StatusOr<CompletionChunk> chunk = ParseCompletionChunk(
      R"({"id":"x","choices":[{"index":0,"text":" Paris","finish_reason":null}]})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_TRUE(chunk->has_choice);
  EXPECT_EQ(chunk->text, " Paris");
  EXPECT_FALSE(chunk->num_tokens.has_value());

  chunk = ParseCompletionChunk(R"({"choices":[{"text":"ab","token_ids":[5,6]}]})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->num_tokens, 2);

  chunk = ParseCompletionChunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_FALSE(chunk->has_choice);
  EXPECT_EQ(chunk->usage_prompt_tokens, 12);
  EXPECT_EQ(chunk->usage_completion_tokens, 34);

  chunk = ParseCompletionChunk("[DONE]");
  ASSERT_TRUE(chunk.ok());
  EXPECT_TRUE(chunk->done);

  chunk = ParseCompletionChunk(R"({"error":{"message":"out of memory","code":500}})");
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->error, "out of memory");

  EXPECT_FALSE(ParseCompletionChunk("{not json").ok());
}

TEST(PrometheusTextTest, SumsAHistogramOverLabelSets) {
  const std::string exposition =
      "# HELP lmserve_time_to_first_token_seconds TTFT\n"
      "# TYPE lmserve_time_to_first_token_seconds histogram\n"
      "lmserve_time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} 3\n"
      "lmserve_time_to_first_token_seconds_sum{model_name=\"m\"} 1.5\n"
      "lmserve_time_to_first_token_seconds_count{model_name=\"m\"} 4\n"
      "lmserve_time_to_first_token_seconds_sum{model_name=\"odd } \\\" name\"} 0.5 1700000000\n"
      "lmserve_time_to_first_token_seconds_count{model_name=\"odd } \\\" name\"} 1\n"
      "lmserve_time_to_first_token_seconds_sum_other 99\n"
      "lmserve_time_to_first_token_seconds_count 2\n";
  const HistogramTotals totals = ReadHistogram(exposition, "lmserve_time_to_first_token_seconds");
  EXPECT_DOUBLE_EQ(totals.sum, 2.0);
  EXPECT_DOUBLE_EQ(totals.count, 7);
  EXPECT_DOUBLE_EQ(SumSamples(exposition, "absent_metric"), 0);
}

TEST(PrometheusTextTest, SumsTheSamplesOfOneLabelValue) {
  const std::string exposition =
      "lmserve_engine_step_phase_seconds_total{model_name=\"m\",phase=\"prepare\"} 1.25\n"
      "lmserve_engine_step_phase_seconds_total{phase=\"process\",model_name=\"m\"} 2\n"
      "lmserve_engine_step_phase_seconds_total{model_name=\"phase=\\\"process\\\"\",phase="
      "\"launch\"} 4\n"
      "lmserve_engine_step_phase_seconds_total{model_name=\"m\",phase=\"process_x\"} 8\n"
      "lmserve_engine_step_phase_seconds_total 16\n";
  const std::string_view name = "lmserve_engine_step_phase_seconds_total";
  EXPECT_DOUBLE_EQ(SumSamples(exposition, name, "phase=\"prepare\""), 1.25);
  EXPECT_DOUBLE_EQ(SumSamples(exposition, name, "phase=\"process\""), 2);
  EXPECT_DOUBLE_EQ(SumSamples(exposition, name, "phase=\"launch\""), 4);
  EXPECT_DOUBLE_EQ(SumSamples(exposition, name, "phase=\"finish\""), 0);
  EXPECT_DOUBLE_EQ(SumSamples(exposition, name), 31.25);
}

}  // namespace
}  // namespace lmserve::bench
