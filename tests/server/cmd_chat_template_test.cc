// Runs the built `bin/lmserve chat-template` and checks its output against the jinja2 renders of
// tests/engine/chat/testdata (the outside reference), and its errors.

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/run_lmserve.h"

namespace lmserve::server {
namespace {

using testing::RunLmserve;
using testing::RunResult;

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

std::string ChatTestdata(const std::string& name) {
  return StrCat(LMSERVE_SOURCE_DIR, "/tests/engine/chat/testdata/", name);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const fs::path path = fs::path(testing::TempDir()) / name;
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

// The "text" of the command's JSON output.
std::string OutputText(const RunResult& result) {
  const Json out = Json::parse(result.out, nullptr, /*allow_exceptions=*/false);
  if (!out.is_object() || !out.contains("text") || !out["text"].is_string()) {
    ADD_FAILURE() << "not {\"text\": ...}: " << result.out;
    return "";
  }
  return out["text"].get<std::string>();
}

TEST(CliChatTemplateTest, RendersTheDemoModelsTemplateLikeJinja2) {
  const std::optional<std::string> demo = testing::DemoModelPath();
  if (!demo.has_value()) GTEST_SKIP() << "demo model not present (scripts/fetch-demo-model.sh)";
  const Json cases = ReadJson(ChatTestdata("chat_cases.json"));
  const Json expected = ReadJson(ChatTestdata("chat_expected.json"));
  for (const char* conversation : {"multi_turn", "special_characters", "assistant_last"}) {
    const Json& spec = cases["conversations"][conversation];
    const std::string messages =
        WriteFile(StrCat("chat_", conversation, ".json"), spec["messages"].dump());
    const RunResult result = RunLmserve(
        StrCat("chat-template --model ", *demo, " --messages ", messages,
               spec["add_generation_prompt"].get<bool>() ? "" : " --no-generation-prompt"));
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_EQ(OutputText(result),
              expected[StrCat("smollm2/", conversation)]["text"].get<std::string>())
        << conversation;
  }
}

TEST(CliChatTemplateTest, HfDirectoryBuiltinOverrideAndVariables) {
  const Json cases = ReadJson(ChatTestdata("chat_cases.json"));
  const Json expected = ReadJson(ChatTestdata("chat_expected.json"));
  // An HF directory whose tokenizer_config.json carries Qwen2.5's template and tokens.
  std::ifstream qwen_file(ChatTestdata("templates/qwen2_5.jinja"));
  std::stringstream qwen;
  qwen << qwen_file.rdbuf();
  const Json config = {{"chat_template", qwen.str()}, {"eos_token", "<|im_end|>"}};
  const std::string dir =
      fs::path(WriteFile("qwen_model/tokenizer_config.json", config.dump())).parent_path().string();
  // Messages as an object: the other keys (tools) are template variables.
  Json input = cases["conversations"]["tool_calls"]["extra_variables"];
  input["messages"] = cases["conversations"]["tool_calls"]["messages"];
  const std::string messages = WriteFile("chat_tool_calls.json", input.dump());
  RunResult result = RunLmserve(StrCat("chat-template --model ", dir, " --messages ", messages));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(OutputText(result), expected["qwen2_5/tool_calls"]["text"].get<std::string>());

  // --chat-template picks a built-in instead of the model's; tokens can be given.
  const std::string plain =
      WriteFile("chat_no_system.json", cases["conversations"]["no_system"]["messages"].dump());
  result = RunLmserve(StrCat("chat-template --model ", dir, " --messages ", plain,
                             " --chat-template llama2 --bos-token '<s>' --eos-token '</s>'"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(OutputText(result), expected["llama2/no_system"]["text"].get<std::string>());

  // A template file, without a model.
  const std::string file =
      WriteFile("custom.jinja", "{% for m in messages %}{{ m.role }} {% endfor %}");
  result = RunLmserve(StrCat("chat-template --chat-template ", file, " --messages ", plain));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(OutputText(result), "user assistant user ");
}

TEST(CliChatTemplateTest, Errors) {
  const std::string alternating =
      WriteFile("chat_bad_roles.json",
                R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  RunResult result =
      RunLmserve(StrCat("chat-template --chat-template mistral --messages ", alternating));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("Conversation roles must alternate"));

  result = RunLmserve(StrCat("chat-template --chat-template no-such --messages ", alternating));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("neither a built-in"));

  const std::string empty_dir =
      fs::path(WriteFile("no_template_model/tokenizer_config.json", "{}")).parent_path().string();
  result = RunLmserve(StrCat("chat-template --model ", empty_dir, " --messages ", alternating));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("has no chat template"));

  const std::string not_json = WriteFile("chat_not_json.json", "[{");
  result = RunLmserve(StrCat("chat-template --chat-template chatml --messages ", not_json));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("not valid JSON"));

  result = RunLmserve("chat-template --chat-template chatml");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--messages is required"));
  result = RunLmserve(StrCat("chat-template --messages ", alternating));
  EXPECT_EQ(result.exit_code, 2);
}

}  // namespace
}  // namespace lmserve::server
