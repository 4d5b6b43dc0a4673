// The OpenAI-compatible API's bodies (server/openai_api.h): JSON into the API's requests, field
// names in errors, and the shapes of errors. The HTTP layer over it is tested end to end
// (tests/e2e/openai_http_test.py, with the official openai package).

#include "server/openai_api.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/request_convert.h"

namespace lmserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<GenerationRequest> Completions(const std::string& body) {
  return ParseGenerationRequest(OpenAiEndpoint::kCompletions, body);
}
absl::StatusOr<GenerationRequest> Chat(const std::string& body) {
  return ParseGenerationRequest(OpenAiEndpoint::kChatCompletions, body);
}

TEST(OpenAiApiTest, CompletionsCarriesEveryField) {
  absl::StatusOr<GenerationRequest> request = Completions(R"({
      "model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "top_k": -1, "min_p": 0.1, "n": 2, "best_of": 2, "stop": ["a", "b"], "seed": 42,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
      "logit_bias": {"5": -100, "6": 2.5}, "logprobs": 3, "echo": true, "user": "u",
      "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
      "min_tokens": 2, "stop_token_ids": [9, 10], "return_token_ids": true, "priority": -1,
      "request_id": "r1", "add_special_tokens": false, "unknown_field": {"ignored": 1}})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->model, "m");
  EXPECT_TRUE(request->stream);
  EXPECT_TRUE(request->include_usage);
  EXPECT_TRUE(request->return_token_ids);
  EXPECT_TRUE(request->echo);
  EXPECT_EQ(request->logprobs, 3);
  ASSERT_EQ(request->prompts.size(), 1u);
  const v1::CompleteRequest& prompt = request->prompts[0];
  EXPECT_EQ(prompt.text(), "Hello");
  EXPECT_TRUE(prompt.echo());
  EXPECT_EQ(prompt.priority(), -1);
  EXPECT_EQ(prompt.request_id(), "r1");
  EXPECT_FALSE(prompt.add_special_tokens());
  const v1::SamplingParams& s = prompt.sampling();
  EXPECT_EQ(s.max_tokens(), 7);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 0);  // -1: all, as vLLM
  EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
  EXPECT_EQ(s.n(), 2);
  ASSERT_EQ(s.stop_size(), 2);
  EXPECT_EQ(s.stop(1), "b");
  EXPECT_EQ(s.seed(), 42u);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(5), -100.0f);
  EXPECT_FLOAT_EQ(s.logit_bias().at(6), 2.5f);
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_EQ(s.prompt_logprobs(), 3);  // echo with logprobs: the prompt's too
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_EQ(s.min_tokens(), 2);
  EXPECT_THAT(s.stop_token_ids(), ::testing::ElementsAre(9, 10));
}

TEST(OpenAiApiTest, PromptShapes) {
  absl::StatusOr<GenerationRequest> ids = Completions(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_THAT(ids->prompts[0].token_ids().ids(), ::testing::ElementsAre(1, 2, 3));

  absl::StatusOr<GenerationRequest> many =
      Completions(R"({"prompt": ["a", [4, 5]], "request_id": "x"})");
  ASSERT_TRUE(many.ok()) << many.status();
  ASSERT_EQ(many->prompts.size(), 2u);
  EXPECT_EQ(many->prompts[0].text(), "a");
  EXPECT_THAT(many->prompts[1].token_ids().ids(), ::testing::ElementsAre(4, 5));
  EXPECT_EQ(many->prompts[1].request_id(), "x-1");
  EXPECT_FALSE(many->prompts[0].has_add_special_tokens());  // the API's default
}

TEST(OpenAiApiTest, ChatMessages) {
  absl::StatusOr<GenerationRequest> request = Chat(R"({
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": null}],
      "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2,
      "add_generation_prompt": false, "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_TRUE(request.ok()) << request.status();
  const v1::ChatRequest& chat = request->chat;
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "a\nb");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(chat.sampling().max_tokens(), 5);
  EXPECT_TRUE(request->uses_max_completion_tokens);
  EXPECT_EQ(request->logprobs, 2);
  EXPECT_EQ(chat.sampling().logprobs(), 2);
  EXPECT_FALSE(chat.add_generation_prompt());
  EXPECT_FALSE(chat.chat_template_kwargs().fields().at("enable_thinking").bool_value());
}

TEST(OpenAiApiTest, LogprobsZeroAsksTheEngineForOne) {
  absl::StatusOr<GenerationRequest> completions = Completions(R"({"prompt": "a", "logprobs": 0})");
  ASSERT_TRUE(completions.ok());
  EXPECT_EQ(completions->logprobs, 0);
  EXPECT_EQ(completions->prompts[0].sampling().logprobs(), 1);
  absl::StatusOr<GenerationRequest> chat =
      Chat(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true})");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->logprobs, 0);
  absl::StatusOr<GenerationRequest> none =
      Chat(R"({"messages": [{"role": "user", "content": "a"}], "logprobs": false})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->logprobs.has_value());
  EXPECT_EQ(none->chat.sampling().logprobs(), 0);
}

struct BadBody {
  OpenAiEndpoint endpoint;
  std::string body;
  std::string field;    // the error's param
  std::string message;  // a part of the message
};

TEST(OpenAiApiTest, BadBodiesNameTheField) {
  const OpenAiEndpoint kC = OpenAiEndpoint::kCompletions;
  const OpenAiEndpoint kChat = OpenAiEndpoint::kChatCompletions;
  const BadBody kCases[] = {
      {kC, "{", "body", "not valid JSON"},
      {kC, "[1]", "body", "must be a JSON object"},
      {kC, "{\"prompt\": \"\xff\"}", "body", "not valid JSON"},
      {kC, std::string(100, '[') + std::string(100, ']'), "body", "nested deeper"},
      {kC, R"({})", "prompt", "missing"},
      {kC, R"({"prompt": 5})", "prompt", "must be a string"},
      {kC, R"({"prompt": []})", "prompt", "empty"},
      {kC, R"({"prompt": [1, "a"]})", "prompt", "element 1 must be a token id"},
      {kC, R"({"prompt": [-1]})", "prompt[0]", "must be in [0, 2147483647]"},
      {kC, R"({"prompt": ["a", 3]})", "prompt[1]", "must be a string or an array"},
      {kC, R"({"prompt": "a", "max_tokens": "5"})", "max_tokens",
       "must be an integer, got a string"},
      {kC, R"({"prompt": "a", "max_tokens": 1.5})", "max_tokens", "must be an integer"},
      {kC, R"({"prompt": "a", "max_tokens": 1e12})", "max_tokens", "must be in"},
      {kC, R"({"prompt": "a", "temperature": "hot"})", "temperature", "must be a number"},
      {kC, R"({"prompt": "a", "stream": 1})", "stream", "must be a boolean"},
      {kC, R"({"prompt": "a", "stop": [1]})", "stop", "element 0 must be a string"},
      {kC, R"({"prompt": "a", "logit_bias": {"x": 1}})", "logit_bias", "not a token id"},
      {kC, R"({"prompt": "a", "logit_bias": {"1": "x"}})", "logit_bias", "must be a number"},
      {kC, R"({"prompt": "a", "seed": 1.5})", "seed", "must be an integer"},
      {kC, R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed with"},
      {kC, R"({"prompt": "a", "suffix": "z"})", "suffix", "not supported"},
      {kC, R"({"prompt": "a", "best_of": 3})", "best_of", "equal to n"},
      {kC, R"({"prompt": "a", "response_format": {"type": "xml"}})", "response_format.type",
       "must be text, json_object or json_schema"},
      {kC, R"({"prompt": "a", "response_format": {"type": "json_object"}, "guided_regex": "a"})",
       "guided_regex", "only one of"},
      {kC, R"({"prompt": "a", "tools": []})", "tools", "only for chat completions"},
      {kC, R"({"prompt": "a", "logprobs": -1})", "logprobs", "must be >= 0"},
      {kChat, R"({"messages": "hi"})", "messages", "must be an array"},
      {kChat, R"({})", "messages", "missing"},
      {kChat, R"({"messages": [{"content": "a"}]})", "messages[0].role", "missing"},
      {kChat, R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0].type", "text only"},
      {kChat, R"({"messages": [{"role": "function", "content": "1"}]})", "messages[0].role",
       "legacy"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]})",
       "messages[0].tool_calls[0].function", "missing"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})",
       "tools[0].function", "missing"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required"})",
       "tool_choice", "needs tools"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "sometimes"})",
       "tool_choice", "must be auto, none, required"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})",
       "top_logprobs", "needs \"logprobs\": true"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "echo": true})", "echo",
       "not supported"},
  };
  for (const BadBody& bad : kCases) {
    SCOPED_TRACE(bad.body);
    absl::StatusOr<GenerationRequest> request = ParseGenerationRequest(bad.endpoint, bad.body);
    ASSERT_FALSE(request.ok());
    const ApiError error = ToApiError(request.status());
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.param, bad.field);
    EXPECT_THAT(error.message, HasSubstr(bad.message));
  }
}

TEST(OpenAiApiTest, ConverterErrorsGetOpenAiNames) {
  absl::StatusOr<GenerationRequest> chat =
      Chat(R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0,
               "logprobs": true, "top_logprobs": 50})");
  ASSERT_TRUE(chat.ok());
  const absl::Status renamed = ToOpenAiFieldNames(
      absl::InvalidArgumentError("sampling.max_tokens: must be >= 1, got 0"), *chat, 0);
  EXPECT_EQ(renamed.message(), "max_completion_tokens: must be >= 1, got 0");
  EXPECT_EQ(ToOpenAiFieldNames(absl::InvalidArgumentError("sampling.logprobs: must be in [0, 20]"),
                               *chat, 0)
                .message(),
            "top_logprobs: must be in [0, 20]");
  absl::StatusOr<GenerationRequest> many = Completions(R"({"prompt": ["a", "b"]})");
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(
      ToOpenAiFieldNames(absl::InvalidArgumentError("prompt.text: empty"), *many, 1).message(),
      "prompt[1]: empty");
  EXPECT_EQ(
      ToOpenAiFieldNames(absl::InvalidArgumentError("sampling.n: must be in [1, 16]"), *many, 0)
          .message(),
      "n: must be in [1, 16]");
  // Field names the API shares with OpenAI stay.
  EXPECT_EQ(ToOpenAiFieldNames(absl::InvalidArgumentError("messages[0].content: not valid UTF-8"),
                               *many, 0)
                .message(),
            "messages[0].content: not valid UTF-8");
}

TEST(OpenAiApiTest, ErrorStatuses) {
  EXPECT_EQ(ToApiError(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ToApiError(absl::UnauthenticatedError("x")).code, "invalid_api_key");
  const ApiError model = ToApiError(absl::NotFoundError("model: the model 'x' does not exist"));
  EXPECT_EQ(model.http_status, 404);
  EXPECT_EQ(model.param, "model");
  EXPECT_EQ(model.code, "model_not_found");
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("full")).http_status, 429);
  EXPECT_EQ(ToApiError(absl::UnavailableError("draining")).http_status, 503);
  EXPECT_EQ(ToApiError(absl::FailedPreconditionError("prompt.text: no tokenizer")).http_status,
            400);
  EXPECT_EQ(ToApiError(absl::InternalError("engine")).http_status, 500);
  // A message that does not start with a field has no param.
  EXPECT_EQ(ToApiError(absl::InvalidArgumentError("the prompt is too long: 5")).param, "");

  const nlohmann::json body = ErrorJson(HttpError(413, "too large"));
  EXPECT_EQ(body["error"]["message"], "too large");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["code"], "request_too_large");
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  absl::StatusOr<TokenizeRequest> text = ParseTokenizeRequest(R"({"prompt": "hi"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->prompt, "hi");
  EXPECT_TRUE(text->add_special_tokens);
  absl::StatusOr<TokenizeRequest> chat =
      ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(chat.ok());
  EXPECT_FALSE(chat->prompt.has_value());
  EXPECT_EQ(chat->chat.messages_size(), 1);
  EXPECT_FALSE(ParseTokenizeRequest(R"({})").ok());
  absl::StatusOr<DetokenizeRequest> ids = ParseDetokenizeRequest(R"({"tokens": [1, 2]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_THAT(ids->tokens, ::testing::ElementsAre(1, 2));
  EXPECT_THAT(std::string(ParseDetokenizeRequest(R"({"tokens": "x"})").status().message()),
              StartsWith("tokens: "));
}

TEST(OpenAiApiTest, SseFraming) {
  EXPECT_EQ(SseEvent(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // Invalid UTF-8 in a value is replaced, never thrown.
  EXPECT_EQ(DumpJson(nlohmann::json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace lmserve::server
