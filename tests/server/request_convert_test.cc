// The API-to-engine conversion: defaults, and errors that name the field. (The
// end-to-end table in tests/e2e checks the same through a real server.)

#include "server/request_convert.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;

engine::RequestLimits Limits() {
  engine::RequestLimits limits;
  limits.vocab_size = 100;
  limits.max_context_tokens = 64;
  limits.kv_cache_tokens = 1024;
  limits.max_logprobs = 20;
  limits.max_n = 16;
  return limits;
}

TEST(ConvertSamplingTest, Defaults) {
  absl::StatusOr<engine::SamplingParams> params =
      ConvertSampling(v1::SamplingParams(), Limits(), ApiLimits());
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->max_tokens, 16);
  EXPECT_EQ(params->temperature, 1.0);
  EXPECT_EQ(params->top_p, 1.0);
  EXPECT_EQ(params->top_k, 0);
  EXPECT_EQ(params->n, 1);
  EXPECT_FALSE(params->logprobs.has_value());
  EXPECT_FALSE(params->prompt_logprobs.has_value());
  EXPECT_FALSE(params->seed.has_value());
}

TEST(ConvertSamplingTest, CarriesEveryField) {
  v1::SamplingParams s;
  s.set_max_tokens(8);
  s.set_temperature(0.5f);
  s.set_top_k(5);
  s.set_top_p(0.9f);
  s.set_min_p(0.1f);
  s.set_repetition_penalty(1.2f);
  s.set_presence_penalty(0.5f);
  s.set_frequency_penalty(-0.5f);
  (*s.mutable_logit_bias())[7] = 3;
  (*s.mutable_logit_bias())[2] = -1;
  s.set_seed(42);
  s.set_min_tokens(2);
  s.set_ignore_eos(true);
  s.add_stop_token_ids(9);
  s.set_logprobs(3);
  s.set_prompt_logprobs(1);
  s.set_n(4);
  absl::StatusOr<engine::SamplingParams> p = ConvertSampling(s, Limits(), ApiLimits());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->max_tokens, 8);
  EXPECT_FLOAT_EQ(p->temperature, 0.5);
  EXPECT_EQ(p->top_k, 5);
  EXPECT_FLOAT_EQ(p->top_p, 0.9);
  EXPECT_FLOAT_EQ(p->min_p, 0.1);
  EXPECT_FLOAT_EQ(p->repetition_penalty, 1.2);
  EXPECT_FLOAT_EQ(p->presence_penalty, 0.5);
  EXPECT_FLOAT_EQ(p->frequency_penalty, -0.5);
  ASSERT_EQ(p->logit_bias.size(), 2u);
  EXPECT_EQ(p->logit_bias[0].first, 2);  // sorted by token id
  EXPECT_EQ(p->seed, 42u);
  EXPECT_EQ(p->min_tokens, 2);
  EXPECT_TRUE(p->ignore_eos);
  EXPECT_EQ(p->stop_token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(p->logprobs, 3);
  EXPECT_EQ(p->prompt_logprobs, 1);
  EXPECT_EQ(p->n, 4);
}

TEST(PrepareCompleteRequestTest, ErrorsNameTheField) {
  const auto text = ModelText::None();
  v1::CompleteRequest request;
  EXPECT_THAT(std::string(
                  PrepareCompleteRequest(request, *text, Limits(), ApiLimits()).status().message()),
              HasSubstr("prompt"));
  request.mutable_token_ids()->add_ids(3);
  request.mutable_sampling()->set_top_p(2);
  absl::Status status = PrepareCompleteRequest(request, *text, Limits(), ApiLimits()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sampling.top_p"));
  request.mutable_sampling()->clear_top_p();
  request.set_text("hello");
  status = PrepareCompleteRequest(request, *text, Limits(), ApiLimits()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  request.mutable_token_ids()->add_ids(3);
  request.set_request_id("r1");
  absl::StatusOr<PreparedRequest> prepared =
      PrepareCompleteRequest(request, *text, Limits(), ApiLimits());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->request.prompt_token_ids, std::vector<int32_t>{3});
  EXPECT_EQ(prepared->request_id, "r1");
}

}  // namespace
}  // namespace lmserve::server
