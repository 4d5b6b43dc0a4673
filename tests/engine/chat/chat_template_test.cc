// ChatTemplate's surroundings: built-in templates, --chat-template resolution, messages from JSON,
// and reading a model's template and special tokens from its files.

#include "engine/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/chat/model_chat_template.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/chat/chat_testdata.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;
using testdata::ReadTestdata;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

fs::path FreshDir(const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(BuiltinChatTemplateTest, AreThePublishedTexts) {
  EXPECT_THAT(BuiltinChatTemplateNames(),
              ElementsAre("chatml", "llama2", "llama3", "mistral", "zephyr"));
  const std::vector<std::pair<std::string, std::string>> files = {
      {"chatml", "chatml.jinja"},        {"llama2", "llama2.jinja"}, {"llama3", "llama3.jinja"},
      {"mistral", "mistral_v0_2.jinja"}, {"zephyr", "zephyr.jinja"},
  };
  for (const auto& [name, file] : files) {
    std::optional<std::string_view> builtin = BuiltinChatTemplate(name);
    ASSERT_TRUE(builtin.has_value()) << name;
    EXPECT_EQ(std::string(*builtin), ReadTestdata("templates/" + file)) << name;
    EXPECT_TRUE(ChatTemplate::Parse(*builtin).ok()) << name;
  }
  EXPECT_FALSE(BuiltinChatTemplate("nope").has_value());
}

TEST(ResolveChatTemplateTest, ModelBuiltinOrFile) {
  // No override: the model's own template, or an error naming the way out.
  absl::StatusOr<std::string> resolved = ResolveChatTemplate("", "{{ model }}");
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, "{{ model }}");
  resolved = ResolveChatTemplate("", "");
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(resolved.status().message()), HasSubstr("--chat-template"));

  // A built-in name wins over the model's template.
  resolved = ResolveChatTemplate("llama3", "{{ model }}");
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, std::string(*BuiltinChatTemplate("llama3")));

  // A Jinja file, or a JSON file with a "chat_template" key.
  const fs::path dir = FreshDir("resolve");
  WriteFile(dir / "custom.jinja", "{{ 'custom' }}\n");
  resolved = ResolveChatTemplate((dir / "custom.jinja").string(), "{{ model }}");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, "{{ 'custom' }}\n");
  WriteFile(dir / "tokenizer_config.json", R"({"chat_template": "{{ 'from json' }}"})");
  resolved = ResolveChatTemplate((dir / "tokenizer_config.json").string(), "");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, "{{ 'from json' }}");
  WriteFile(dir / "bad.json", "{not json");
  EXPECT_EQ(ResolveChatTemplate((dir / "bad.json").string(), "").status().code(),
            absl::StatusCode::kInvalidArgument);

  resolved = ResolveChatTemplate("no-such-template", "{{ model }}");
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(resolved.status().message()), HasSubstr("chatml, llama2"));
}

TEST(ChatMessagesFromJsonTest, KeepsExtraFieldsAndNonStringContent) {
  const Json json = Json::parse(R"([
    {"role": "user", "content": "hi", "name": "bob"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
    {"role": "user", "content": [{"type": "text", "text": "part"}]},
    {"role": "tool"}
  ])");
  absl::StatusOr<std::vector<ChatMessage>> messages = ChatMessagesFromJson(json);
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 4u);
  EXPECT_EQ((*messages)[0].role, "user");
  EXPECT_EQ((*messages)[0].content, "hi");
  EXPECT_EQ((*messages)[0].extra.dump(), R"({"name":"bob"})");
  EXPECT_EQ((*messages)[1].extra.dump(), R"({"content":null,"tool_calls":[{"id":"1"}]})");
  EXPECT_EQ((*messages)[2].extra.dump(), R"({"content":[{"type":"text","text":"part"}]})");
  EXPECT_EQ((*messages)[3].content, "");

  // The template sees them as transformers would.
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(
      "{% for m in messages %}{{ m.role }}={{ m.content }}{{ m.name }}{{ m.tool_calls }};"
      "{% endfor %}");
  ASSERT_TRUE(chat_template.ok());
  absl::StatusOr<std::string> text = chat_template->Render(*messages, {});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(
      *text,
      "user=hibob;assistant=None[{'id': '1'}];user=[{'type': 'text', 'text': 'part'}];tool=;");
}

TEST(ChatMessagesFromJsonTest, RejectsMalformedMessages) {
  EXPECT_FALSE(ChatMessagesFromJson(Json::object()).ok());
  EXPECT_FALSE(ChatMessagesFromJson(Json::parse(R"([1])")).ok());
  absl::StatusOr<std::vector<ChatMessage>> missing_role =
      ChatMessagesFromJson(Json::parse(R"([{"role": "user"}, {"content": "x"}])"));
  ASSERT_FALSE(missing_role.ok());
  EXPECT_THAT(std::string(missing_role.status().message()), HasSubstr("messages[1]"));
}

TEST(ChatTemplateInputTest, RejectsHostileJsonNesting) {
  Json deep = Json::array();
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  ChatTemplateOptions options;
  options.extra_variables = {{"deep", deep}};
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse("x");
  ASSERT_TRUE(chat_template.ok());
  absl::StatusOr<std::string> text = chat_template->Render({}, options);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("nested deeper"));
}

TEST(ModelChatTemplateTest, ReadsTokenizerConfigForms) {
  // A string template and AddedToken-style special tokens.
  absl::StatusOr<ModelChatTemplate> parsed = ParseTokenizerConfig(R"({
    "chat_template": "{{ bos_token }}",
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>"
  })");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->chat_template, "{{ bos_token }}");
  EXPECT_EQ(parsed->bos_token, "<s>");
  EXPECT_EQ(parsed->eos_token, "</s>");

  // A list of named templates: "default" is used; a null bos_token is unset.
  parsed = ParseTokenizerConfig(R"({
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    "bos_token": null, "eos_token": "<|im_end|>"
  })");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->chat_template, "D");
  EXPECT_FALSE(parsed->bos_token.has_value());
  EXPECT_EQ(parsed->eos_token, "<|im_end|>");

  // No template at all is not an error.
  parsed = ParseTokenizerConfig(R"({"eos_token": "</s>"})");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->chat_template, "");

  EXPECT_FALSE(ParseTokenizerConfig(R"({"chat_template": [{"name": "x", "template": "T"}]})").ok());
  EXPECT_FALSE(ParseTokenizerConfig(R"({"chat_template": 5})").ok());
  EXPECT_FALSE(ParseTokenizerConfig(R"({"bos_token": 5})").ok());
  EXPECT_FALSE(ParseTokenizerConfig("[]").ok());
  EXPECT_FALSE(ParseTokenizerConfig("{").ok());
}

TEST(ModelChatTemplateTest, LoadsFromDirectoryTokenizerJsonAndSideFiles) {
  const fs::path dir = FreshDir("model_dir");
  WriteFile(dir / "tokenizer.json", "{}");
  WriteFile(dir / "tokenizer_config.json",
            R"({"chat_template": "config", "bos_token": "<s>", "eos_token": "</s>"})");
  for (const fs::path& path : {dir, dir / "tokenizer.json", dir / "tokenizer_config.json"}) {
    absl::StatusOr<ModelChatTemplate> loaded = LoadModelChatTemplate(path.string());
    ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status();
    EXPECT_EQ(loaded->chat_template, "config");
    EXPECT_EQ(loaded->bos_token, "<s>");
    EXPECT_EQ(loaded->eos_token, "</s>");
  }
  // chat_template.json, then chat_template.jinja, take precedence over the config's template.
  WriteFile(dir / "chat_template.json", R"({"chat_template": "side json"})");
  absl::StatusOr<ModelChatTemplate> loaded = LoadModelChatTemplate(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "side json");
  WriteFile(dir / "chat_template.jinja", "side jinja\n");
  loaded = LoadModelChatTemplate(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "side jinja\n");
  EXPECT_EQ(loaded->eos_token, "</s>");

  // A directory without any of these files: no template, no tokens.
  const fs::path empty = FreshDir("empty_model_dir");
  loaded = LoadModelChatTemplate(empty.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "");
  EXPECT_FALSE(loaded->eos_token.has_value());

  EXPECT_EQ(LoadModelChatTemplate((dir / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
  WriteFile(dir / "broken" / "tokenizer_config.json", "{");
  loaded = LoadModelChatTemplate((dir / "broken").string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("tokenizer_config.json"));
}

TEST(ModelChatTemplateTest, ReadsGgufTemplateAndTokens) {
  const fs::path dir = FreshDir("gguf");
  GgufWriter writer;
  writer.Add("general.architecture", GgufValue::String("llama"));
  writer.Add("tokenizer.chat_template", GgufValue::String("{{ bos_token }}{{ eos_token }}"));
  writer.Add(
      "tokenizer.ggml.tokens",
      GgufValue::Array(GgufType::kString, {GgufValue::String("<unk>"), GgufValue::String("<s>"),
                                           GgufValue::String("</s>")}));
  writer.Add("tokenizer.ggml.bos_token_id", GgufValue::Uint(GgufType::kUint32, 1));
  writer.Add("tokenizer.ggml.eos_token_id", GgufValue::Uint(GgufType::kUint32, 2));
  ASSERT_TRUE(writer.WriteFile((dir / "model.gguf").string()).ok());
  absl::StatusOr<ModelChatTemplate> loaded = LoadModelChatTemplate((dir / "model.gguf").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "{{ bos_token }}{{ eos_token }}");
  EXPECT_EQ(loaded->bos_token, "<s>");
  EXPECT_EQ(loaded->eos_token, "</s>");

  // Without a template or token ids: nothing, and no error. An id outside the vocabulary is one.
  GgufWriter bare;
  bare.Add("general.architecture", GgufValue::String("llama"));
  ASSERT_TRUE(bare.WriteFile((dir / "bare.gguf").string()).ok());
  loaded = LoadModelChatTemplate((dir / "bare.gguf").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "");
  EXPECT_FALSE(loaded->bos_token.has_value());
  GgufWriter bad;
  bad.Add("tokenizer.ggml.tokens", GgufValue::Array(GgufType::kString, {GgufValue::String("a")}));
  bad.Add("tokenizer.ggml.eos_token_id", GgufValue::Uint(GgufType::kUint32, 7));
  ASSERT_TRUE(bad.WriteFile((dir / "bad.gguf").string()).ok());
  loaded = LoadModelChatTemplate((dir / "bad.gguf").string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("outside the vocabulary"));
}

TEST(ModelChatTemplateTest, DemoModelCarriesTheSmolLM2Template) {
  const std::optional<std::string> demo = testing::DemoModelPath();
  if (!demo.has_value()) GTEST_SKIP() << "demo model not present (scripts/fetch-demo-model.sh)";
  absl::StatusOr<ModelChatTemplate> loaded = LoadModelChatTemplate(*demo);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // testdata/templates/smollm2.jinja was extracted from this file with Python's gguf package.
  EXPECT_EQ(loaded->chat_template, ReadTestdata("templates/smollm2.jinja"));
  EXPECT_EQ(loaded->bos_token, "<|im_start|>");
  EXPECT_EQ(loaded->eos_token, "<|im_end|>");
}

}  // namespace
}  // namespace lmserve::engine
