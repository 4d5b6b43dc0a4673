// Tool calls: the format a chat template implies, the parser of each format, and the constraint of
// a forced call (compiled and matched byte by byte).

#include "server/tool_calls.h"

#include "engine/structured/matcher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lmserve::server {
namespace {

TEST(ToolCallsTest, FormatFromTheTemplate) {
  EXPECT_EQ(DetectToolCallFormat("{% for tool in tools %}<tool_call>{% endfor %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("Environment: ipython"), ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("<|im_start|>"), ToolCallFormat::kHermes);  // the default
}

TEST(ToolCallsTest, ParsesEachFormat) {
  std::string content;
  auto hermes = ParseToolCalls(
      "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [2]}\"}</tool_call>",
      ToolCallFormat::kHermes, &content);
  ASSERT_TRUE(hermes.has_value());
  ASSERT_EQ(hermes->size(), 2u);
  EXPECT_EQ((*hermes)[0].name, "add");
  EXPECT_EQ((*hermes)[0].arguments, R"({"a":1})");
  EXPECT_EQ((*hermes)[1].arguments, R"({"x":[2]})");
  EXPECT_EQ(content, "Sure.");

  auto llama = ParseToolCalls(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": "
      "{\"k\": true}}",
      ToolCallFormat::kLlama3, &content);
  ASSERT_TRUE(llama.has_value());
  ASSERT_EQ(llama->size(), 2u);
  EXPECT_EQ((*llama)[1].name, "b");
  EXPECT_EQ((*llama)[1].arguments, R"({"k":true})");

  auto mistral = ParseToolCalls("[TOOL_CALLS][{\"name\": \"m\", \"arguments\": {\"q\": \"x\"}}]",
                                ToolCallFormat::kMistral, &content);
  ASSERT_TRUE(mistral.has_value());
  EXPECT_EQ((*mistral)[0].name, "m");
  // Without the tag (a forced call cannot write the special token).
  EXPECT_TRUE(ParseToolCalls(R"([{"name":"m","arguments":{}}])", ToolCallFormat::kMistral,
                             &content)
                  .has_value());

  // Text that is no call, or a call that does not parse, is content.
  EXPECT_FALSE(ParseToolCalls("Just text.", ToolCallFormat::kHermes, &content).has_value());
  EXPECT_FALSE(ParseToolCalls("<tool_call>{broken</tool_call>", ToolCallFormat::kHermes, &content)
                   .has_value());
  EXPECT_FALSE(ParseToolCalls("{\"no_name\": 1}", ToolCallFormat::kLlama3, &content).has_value());
}

TEST(ToolCallsTest, ForcedCallsAreConstrainedByTheParameters) {
  const std::vector<ToolSpec> tools = {
      {"add", "", R"({"type": "object", "properties": {"a": {"type": "integer"},
                      "b": {"type": "integer"}}, "required": ["a", "b"],
                      "additionalProperties": false})"},
      {"ping", "", ""}};
  absl::StatusOr<engine::structured::ConstraintSpec> spec =
      ForcedToolCallSpec(tools, "add", ToolCallFormat::kHermes);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<engine::structured::Grammar> grammar =
      engine::structured::CompileGrammar(*spec, engine::structured::GrammarLimits{});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  // A vocabulary of single bytes is enough to match text.
  std::vector<std::string> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
  auto trie = engine::structured::TokenTrie::FromBytes(bytes, {}, 256, {});
  auto compiled = std::make_shared<engine::structured::CompiledGrammar>(*std::move(grammar),
                                                                        trie.get(), "tool");
  const auto matches = [&](std::string_view text) {
    engine::structured::GrammarMatcher matcher(compiled);
    return matcher.AcceptBytes(text) && matcher.CanEnd();
  };
  const std::string call = "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":-2}}\n</tool_call>";
  EXPECT_TRUE(matches(call));
  EXPECT_FALSE(matches("<tool_call>\n{\"name\":\"ping\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(matches("<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>"));
  std::string content;
  auto parsed = ParseToolCalls(call, ToolCallFormat::kHermes, &content);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ((*parsed)[0].arguments, R"({"a":1,"b":-2})");

  EXPECT_FALSE(ForcedToolCallSpec(tools, "missing", ToolCallFormat::kHermes).ok());
  auto any = ForcedToolCallSpec(tools, "", ToolCallFormat::kLlama3);
  ASSERT_TRUE(any.ok());
  EXPECT_NE(any->text.find("anyOf"), std::string::npos);
  EXPECT_NE(any->text.find("\"parameters\""), std::string::npos);
}

}  // namespace
}  // namespace lmserve::server
