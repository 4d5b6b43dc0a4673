// Renders real chat templates and a table of interpreter cases, and compares every output (or
// error) with what Python's jinja2 produced for the same input, configured as transformers does
// (testdata/*_expected.json, written by make_testdata.py).

#include <string>
#include <vector>

#include "engine/chat/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/chat/chat_testdata.h"

namespace lmserve::engine {
namespace {

using testdata::ReadTestdata;
using testdata::ReadTestdataJson;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::ordered_json;

// Python's error text without the exception type ("TypeError: x" -> "x").
std::string PythonMessage(const std::string& error) {
  static const char* const kPrefixes[] = {
      "TypeError: ", "ValueError: ", "ZeroDivisionError: ", "OverflowError: "};
  for (const char* prefix : kPrefixes) {
    if (error.rfind(prefix, 0) == 0) return error.substr(std::string(prefix).size());
  }
  return error;
}

// Checks a render against jinja2's result: the same text, or an error of the same kind.
void ExpectMatchesReference(const absl::StatusOr<std::string>& rendered, const Json& expected,
                            const std::string& label) {
  if (expected.contains("text")) {
    ASSERT_TRUE(rendered.ok()) << label << ": " << rendered.status();
    EXPECT_EQ(*rendered, expected["text"].get<std::string>()) << label;
    return;
  }
  ASSERT_FALSE(rendered.ok()) << label << ": rendered " << Json(*rendered).dump()
                              << " but jinja2 failed with: " << expected["error"];
  const std::string error = expected["error"].get<std::string>();
  const std::string message(rendered.status().message());
  if (expected["raised"].get<bool>()) {
    // raise_exception(): exactly the template's message.
    EXPECT_TRUE(IsRaisedByChatTemplate(rendered.status())) << label << ": " << rendered.status();
    EXPECT_EQ(message, error) << label;
    return;
  }
  EXPECT_FALSE(IsRaisedByChatTemplate(rendered.status())) << label;
  EXPECT_THAT(message, StartsWith("chat template: line ")) << label;
  if (!expected.contains("syntax")) {
    EXPECT_THAT(message, HasSubstr(PythonMessage(error))) << label;
  }
}

TEST(ChatTemplateReferenceTest, RealTemplatesMatchJinja2) {
  const Json cases = ReadTestdataJson("chat_cases.json");
  const Json expected = ReadTestdataJson("chat_expected.json");
  int compared = 0;
  for (const auto& [template_name, spec] : cases["templates"].items()) {
    const std::string source = ReadTestdata("templates/" + spec["file"].get<std::string>());
    absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(source);
    ASSERT_TRUE(chat_template.ok()) << template_name << ": " << chat_template.status();
    for (const auto& [conversation_name, conversation] : cases["conversations"].items()) {
      const std::string label = template_name + "/" + conversation_name;
      absl::StatusOr<std::vector<ChatMessage>> messages =
          ChatMessagesFromJson(conversation["messages"]);
      ASSERT_TRUE(messages.ok()) << label << ": " << messages.status();
      ChatTemplateOptions options;
      options.add_generation_prompt = conversation["add_generation_prompt"].get<bool>();
      if (spec["bos_token"].is_string()) options.bos_token = spec["bos_token"].get<std::string>();
      if (spec["eos_token"].is_string()) options.eos_token = spec["eos_token"].get<std::string>();
      if (conversation.contains("extra_variables")) {
        options.extra_variables = conversation["extra_variables"];
      }
      options.now = testdata::ReferenceNow;
      ASSERT_TRUE(expected.contains(label)) << label << " missing: run make_testdata.py";
      ExpectMatchesReference(chat_template->Render(*messages, options), expected[label], label);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 21 * 22);
}

TEST(ChatTemplateReferenceTest, InterpreterCasesMatchJinja2) {
  const Json cases = ReadTestdataJson("interpreter_expected.json");
  ASSERT_GT(cases.size(), 140u);
  for (const Json& test_case : cases) {
    const std::string name = test_case["name"].get<std::string>();
    absl::StatusOr<ChatTemplate> chat_template =
        ChatTemplate::Parse(test_case["template"].get<std::string>());
    absl::StatusOr<std::string> rendered;
    if (chat_template.ok()) {
      ChatTemplateOptions options;
      options.extra_variables = test_case["variables"];
      options.now = testdata::ReferenceNow;
      rendered = chat_template->Render({}, options);
    } else {
      rendered = chat_template.status();
      EXPECT_TRUE(test_case.contains("syntax")) << name << ": " << chat_template.status();
    }
    ExpectMatchesReference(rendered, test_case, name);
  }
}

}  // namespace
}  // namespace lmserve::engine
