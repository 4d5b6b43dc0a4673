// The Jinja interpreter's contracts that a reference render cannot show: error positions,
// resource limits against hostile templates, thread safety and the injected clock. (Rendering
// semantics are compared with jinja2 in reference_test.cc.)

#include "engine/chat/jinja/interpreter.h"

#include <pthread.h>

#include <string>
#include <thread>
#include <vector>

#include "engine/chat/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<std::string> Render(const std::string& source,
                                   const ChatTemplateOptions& options = {}) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(source);
  if (!chat_template.ok()) return chat_template.status();
  return chat_template->Render({}, options);
}

std::string Repeat(std::string_view text, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out += text;
  return out;
}

// ---- Errors ------------------------------------------------------------------------------------

TEST(InterpreterErrorTest, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    std::string source;
    std::string position;
    std::string what;
  };
  const std::vector<Case> cases = {
      {"line1\n{% if true %}\nx", "line 3, column 2", "the 'if' block opened at line 2"},
      {"a\n\n  {% frobnicate %}", "line 3, column 6", "unknown tag 'frobnicate'"},
      {"{{ 1 + }}", "line 1, column 8", "expected an expression"},
      {"ok\n{{ x ", "line 2, column 1", "unterminated '{{'"},
      {"{% for x in y %}{% break %}{% endfor %}{% continue %}", "line 1, column 43",
       "'continue' outside of a loop"},
      {"{{ 'abc }}", "line 1, column 4", "unterminated string literal"},
      {"{# comment", "line 1, column 1", "unterminated comment"},
      {"{{ a ) }}", "line 1, column 6", "unexpected ')'"},
      {"{% include 'x' %}", "line 1, column 4", "not supported"},
      {"{% for x in y recursive %}{% endfor %}", "line 1, column 15", "recursive loops"},
      {"\n\n{{ x | }}", "line 3, column 8", "expected a name"},
      {"{% set x %}no end", "line 1, column 18", "expected 'endset'"},
      {"{{ a $ b }}", "line 1, column 6", "unexpected character '$'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(parsed.ok()) << c.source;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_THAT(std::string(parsed.status().message()),
                StartsWith("chat template: " + c.position + ": "))
        << c.source;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.what)) << c.source;
  }
}

TEST(InterpreterErrorTest, RuntimeErrorsNameTheExpression) {
  absl::StatusOr<std::string> result = Render("line 1\n{% set x = 1 %}\n  {{ x + 'a' }}");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(),
            "chat template: line 3, column 8: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_FALSE(IsRaisedByChatTemplate(result.status()));

  result = Render("{% for m in messages %}{% endfor %}\n{{ messages[0]['role'] }}");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "chat template: line 2, column 15: list object has no element 0");

  // An attribute of None is Undefined (jinja2's getattr), not an error; of Undefined it is.
  result = Render("[{{ tools.name }}]");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "[]");
  result = Render("\n\n{{ tools.name.first }}");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "chat template: line 3, column 14: 'None' has no attribute 'name'");
}

TEST(InterpreterErrorTest, RaiseExceptionCarriesTheMessageVerbatim) {
  absl::StatusOr<std::string> result =
      Render("{% if true %}\n  {{ raise_exception('Roles must alternate: ' ~ 2) }}{% endif %}");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "Roles must alternate: 2");
  EXPECT_TRUE(IsRaisedByChatTemplate(result.status()));
}

TEST(InterpreterErrorTest, UnknownFiltersAndTestsFailOnlyWhenReached) {
  EXPECT_TRUE(Render("{% if false %}{{ x|nosuchfilter }}{{ x is nosuchtest }}{% endif %}ok").ok());
  absl::StatusOr<std::string> result = Render("{{ 'x'|nosuchfilter }}");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no filter named 'nosuchfilter'"));
  result = Render("{{ 1 is nosuchtest }}");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no test named 'nosuchtest'"));
}

// ---- Variables the template sees ---------------------------------------------------------------

TEST(ChatTemplateRenderTest, SeesMessagesTokensAndExtras) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.name }};"
      "{% endfor %}{{ add_generation_prompt }}{{ eos_token }}|{{ tools|length }}|{{ flag }}"
      "|{{ messages[1].content is none }}|{{ messages[2].content[0].text }}");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  std::vector<ChatMessage> messages(3);
  messages[0] = {"system", "be brief", {{"name", "sys"}}};
  messages[1] = {"assistant", "ignored", {{"content", nullptr}}};
  messages[2] = {"user", "", {{"content", {{{"type", "text"}, {"text", "part"}}}}}};
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.extra_variables = {{"tools", {1, 2}}, {"flag", true}};
  absl::StatusOr<std::string> text = chat_template->Render(messages, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<s>system:be brief:sys;assistant:None:;user:[{'type': 'text', 'text': 'part'}]:;"
            "False</s>|2|True|True|part");
}

TEST(ChatTemplateRenderTest, UnsetSpecialTokensAreUndefined) {
  absl::StatusOr<std::string> text =
      Render("{{ bos_token is defined }} {{ eos_token is defined }} [{{ bos_token }}]");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "False False []");
}

TEST(ChatTemplateRenderTest, StrftimeNowReadsTheInjectedClock) {
  ChatTemplateOptions options;
  // 2021-03-04 12:00:00 UTC: the same date in every time zone within 11 hours of UTC.
  options.now = [] {
    return std::chrono::system_clock::time_point(std::chrono::seconds(1614859200));
  };
  absl::StatusOr<std::string> text = Render("{{ strftime_now('%d %B %Y') }}", options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "04 March 2021");
}

TEST(ChatTemplateRenderTest, RendersConcurrentlyFromOneTemplate) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content|upper }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(chat_template.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<ChatMessage> messages;
      for (int i = 0; i <= t; ++i) messages.push_back({"user", std::string(1, 'a' + i)});
      for (int repeat = 0; repeat < 200; ++repeat) {
        absl::StatusOr<std::string> text = chat_template->Render(messages, {});
        results[t] = text.ok() ? *text : std::string(text.status().message());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(results[0], "A1");
  EXPECT_EQ(results[3], "ABCD4");
  EXPECT_EQ(results[7], "ABCDEFGH8");
}

// ---- Limits: a hostile template gets an error, never a hang or a crash -------------------------

void ExpectExhausted(const std::string& source, const std::string& what,
                     const ChatTemplateOptions& options = {}) {
  absl::StatusOr<std::string> result = Render(source, options);
  ASSERT_FALSE(result.ok()) << source.substr(0, 80);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted)
      << source.substr(0, 80) << ": " << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr(what)) << source.substr(0, 80);
}

TEST(InterpreterLimitTest, StepsBoundLoops) {
  ChatTemplateOptions options;
  options.limits.max_steps = 100000;
  // 10^10 iterations of an empty body: each iteration counts.
  nlohmann::ordered_json thousand = nlohmann::ordered_json::array();
  for (int i = 0; i < 1000; ++i) thousand.push_back(i);
  options.extra_variables = {{"xs", thousand}};
  // A million iterations of an empty body: each iteration counts.
  ExpectExhausted("{% for i in xs %}{% for j in xs %}{% endfor %}{% endfor %}",
                  "more than 100000 steps", options);
  options.extra_variables = nlohmann::ordered_json::object();
  ExpectExhausted("{% for i in range(100000) %}{{ range(100000)|length }}{% endfor %}",
                  "more than 100000 steps", options);
  options.limits.max_steps = 1000;
  ExpectExhausted("{% for i in range(600) %}{{ i }}{% endfor %}", "more than 1000 steps", options);
  EXPECT_TRUE(Render("{% for i in range(100) %}{{ i }}{% endfor %}", options).ok());
}

TEST(InterpreterLimitTest, OutputAndValueSizesAreBounded) {
  ChatTemplateOptions options;
  options.limits.max_output_bytes = 1 << 20;
  ExpectExhausted("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "output", options);
  ExpectExhausted("{{ 'x' * 1000000000000 }}", "larger than the limit", options);
  ExpectExhausted("{{ [1, 2] * 1000000000000 }}", "larger than the limit", options);
  ExpectExhausted(
      "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "larger than the limit", options);
  ExpectExhausted(
      "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      "larger than the limit", options);
  ExpectExhausted(
      "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",
      "larger than the limit", options);
  ExpectExhausted("{{ ('x' * 1000)|replace('x', 'y' * 10000) }}", "larger than the limit", options);
  // Captured blocks count too: a macro cannot build a huge string out of sight.
  ExpectExhausted(
      "{% macro big() %}{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}{% endmacro %}"
      "{% set s = big() %}",
      "output", options);
}

TEST(InterpreterLimitTest, RecursionIsBounded) {
  ExpectExhausted("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                  "macro calls deeper than 64");
  ChatTemplateOptions options;
  options.limits.max_call_depth = 5;
  ExpectExhausted("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "deeper than 5",
                  options);
  EXPECT_TRUE(Render("{% macro f(n) %}{% if n < 4 %}{{ f(n + 1) }}{% endif %}{{ n }}{% endmacro %}"
                     "{{ f(0) }}",
                     options)
                  .ok());
}

TEST(InterpreterLimitTest, DeepNestingIsASyntaxErrorNotACrash) {
  const std::vector<std::string> sources = {
      "{{ " + Repeat("(", 100000) + "1" + Repeat(")", 100000) + " }}",
      "{{ 1" + Repeat(" + 1", 100000) + " }}",
      "{{ x" + Repeat("|trim", 100000) + " }}",
      "{{ x" + Repeat(".a", 100000) + " }}",
      "{{ " + Repeat("not ", 100000) + "x }}",
      "{{ " + Repeat("-", 100000) + "1 }}",
      "{{ " + Repeat("[", 100000) + Repeat("]", 100000) + " }}",
      "{{ 1" + Repeat(" if 1", 100000) + " }}",
      Repeat("{% if true %}", 100000) + Repeat("{% endif %}", 100000),
      Repeat("{% for x in y %}", 100000) + Repeat("{% endfor %}", 100000),
  };
  for (const std::string& source : sources) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
    ASSERT_FALSE(parsed.ok()) << source.substr(0, 40);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("deeper than"))
        << source.substr(0, 40);
  }
  // Nesting that real templates use parses.
  EXPECT_TRUE(Render(Repeat("{% if true %}", 30) + "ok" + Repeat("{% endif %}", 30)).ok());
  EXPECT_TRUE(Render("{{ " + Repeat("(", 30) + "1" + Repeat(")", 30) + " }}").ok());
}

TEST(InterpreterLimitTest, DeeplyNestedValuesAreRefused) {
  ExpectExhausted(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}",
      "nested lists or dicts deeper than");
  ExpectExhausted(
      "{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}"
      "{% endfor %}",
      "nested lists or dicts deeper than");
  ExpectExhausted(
      "{% set ns = namespace(x={'k': 1}) %}{% for i in range(100000) %}"
      "{% set ns.x = {'k': ns.x}|items|list %}{% endfor %}",
      "nested lists or dicts deeper than");
}

TEST(InterpreterLimitTest, NamespaceCyclesAndChainsAreSafe) {
  // A namespace that holds itself prints (bounded) and is freed (LeakSanitizer checks).
  absl::StatusOr<std::string> text =
      Render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns|string|length > 0 }}");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "True");
  // A long chain of namespaces is freed without deep recursion.
  text = Render(
      "{% set ns = namespace(next=none) %}{% for i in range(50000) %}"
      "{% set ns.next = namespace(next=ns.next) %}{% endfor %}done");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "done");
  // Macros refer to their own scope (a reference cycle the interpreter breaks afterwards).
  text = Render(
      "{% macro m() %}x{% endmacro %}{% for i in range(3) %}{% macro n() %}{{ m() }}"
      "{% endmacro %}{{ n() }}{% endfor %}");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "xxx");
}

// The deepest recursion the limits allow fits in a small thread stack.
void* RenderDeep(void* result) {
  jinja::RenderOptions options;
  options.limits.max_call_depth = 1000;  // let max_depth be the bound
  absl::StatusOr<jinja::Template> deep = jinja::Template::Parse(
      "{% macro f(n) %}{% if true %}{% for i in [n] %}{{ f((((i + 1)))) }}{% endfor %}{% endif %}"
      "{% endmacro %}{{ f(0) }}");
  if (!deep.ok()) {
    *static_cast<absl::Status*>(result) = deep.status();
    return nullptr;
  }
  *static_cast<absl::Status*>(result) = deep->Render(jinja::Dict(), options).status();
  return nullptr;
}

TEST(InterpreterLimitTest, MaxDepthFitsInASmallStack) {
#if defined(__SANITIZE_ADDRESS__)
  constexpr size_t kStackBytes = 32 << 20;  // AddressSanitizer's redzones multiply frame sizes
#elif !defined(NDEBUG)
  constexpr size_t kStackBytes = 4 << 20;  // unoptimized frames
#else
  constexpr size_t kStackBytes = 1 << 20;
#endif
  pthread_attr_t attributes;
  ASSERT_EQ(pthread_attr_init(&attributes), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attributes, kStackBytes), 0);
  absl::Status result;
  pthread_t thread;
  ASSERT_EQ(pthread_create(&thread, &attributes, RenderDeep, &result), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attributes);
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted) << result;
  EXPECT_THAT(std::string(result.message()), HasSubstr("too deeply"));
}

}  // namespace
}  // namespace lmserve::engine
