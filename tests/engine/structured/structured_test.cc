// Structured output: the front ends (JSON Schema, regex, GBNF) byte by byte, the token trie of the
// fixture tokenizers (byte-level and byte-fallback), the vocabulary mask against a brute-force
// check of every token, random walks that must end in parseable output, and hostile inputs refused
// with bounded work.

#include <random>
#include <string>
#include <vector>

#include "engine/structured/constraint.h"
#include "engine/structured/frontends.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_trie.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace lmserve::engine::structured {
namespace {

using ::testing::HasSubstr;

// A vocabulary of the 256 single bytes (token b is byte b) and EOS = 256.
const TokenTrie& ByteTrie() {
  static const TokenTrie* trie = [] {
    std::vector<std::string> bytes(257);
    for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
    std::vector<uint8_t> excluded(257, 0);
    excluded[256] = 1;
    return TokenTrie::FromBytes(bytes, excluded, 257, {256}).release();
  }();
  return *trie;
}

std::shared_ptr<CompiledGrammar> Compile(ConstraintKind kind, std::string text,
                                         const TokenTrie& trie = ByteTrie()) {
  absl::StatusOr<Grammar> grammar = CompileGrammar({kind, std::move(text)}, GrammarLimits{});
  EXPECT_TRUE(grammar.ok()) << grammar.status();
  if (!grammar.ok()) return nullptr;
  return std::make_shared<CompiledGrammar>(*std::move(grammar), &trie, "test");
}

// Whether `text` is a complete match.
bool Matches(const std::shared_ptr<CompiledGrammar>& grammar, std::string_view text) {
  GrammarMatcher matcher(grammar);
  return matcher.AcceptBytes(text) && matcher.CanEnd();
}

// The error message of compiling `text` ("" when it compiles).
std::string CompileError(ConstraintKind kind, std::string text) {
  return std::string(CompileGrammar({kind, std::move(text)}, GrammarLimits{}).status().message());
}

TEST(RegexTest, MatchesWholeStrings) {
  auto g = Compile(ConstraintKind::kRegex, R"(^[a-c]+\d{2,3}(x|yz)?$)");
  EXPECT_TRUE(Matches(g, "abc12"));
  EXPECT_TRUE(Matches(g, "a123yz"));
  EXPECT_TRUE(Matches(g, "cc99x"));
  EXPECT_FALSE(Matches(g, "abc1"));
  EXPECT_FALSE(Matches(g, "abc1234"));
  EXPECT_FALSE(Matches(g, "d12"));
  EXPECT_FALSE(Matches(g, "a12y"));
}

TEST(RegexTest, ClassesEscapesAndUnicode) {
  auto g = Compile(ConstraintKind::kRegex, R"([^a-z\s]{2}\.(?:é|\u00fc)+)");
  EXPECT_TRUE(Matches(g, "AB.é"));
  EXPECT_TRUE(Matches(g, "9€.üéü"));
  EXPECT_FALSE(Matches(g, "aB.é"));
  EXPECT_FALSE(Matches(g, "A .é"));
  EXPECT_FALSE(Matches(g, "AB.e"));
  auto dot = Compile(ConstraintKind::kRegex, "a.c");
  EXPECT_TRUE(Matches(dot, "a\xE2\x82\xAC" "c"));  // one character of three bytes
  EXPECT_FALSE(Matches(dot, "a\xE2\x82" "c"));     // not a character
  EXPECT_FALSE(Matches(dot, "a\nc"));
}

TEST(RegexTest, RefusesWhatItDoesNotSupport) {
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, R"((a)\1)"),
              HasSubstr("backreferences"));
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, "a(?=b)"), HasSubstr("lookaround"));
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, R"(\bword)"),
              HasSubstr("word boundaries"));
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, "(ab"), HasSubstr("unterminated"));
}

TEST(GbnfTest, ParsesLlamaCppGrammars) {
  auto g = Compile(ConstraintKind::kGrammar, R"g(# arithmetic
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num  ::= [0-9]+
)g");
  EXPECT_TRUE(Matches(g, "1+2"));
  EXPECT_TRUE(Matches(g, "(1+23)-4"));
  EXPECT_FALSE(Matches(g, "1+"));
  EXPECT_FALSE(Matches(g, "(1"));
  auto multi = Compile(ConstraintKind::kGrammar,
                       "root ::= \"yes\"\n  | \"no\" \" \"{1,2} [^\\n]? \"\\u00e9\"\n");
  EXPECT_TRUE(Matches(multi, "yes"));
  EXPECT_TRUE(Matches(multi, "no  xé"));
  EXPECT_TRUE(Matches(multi, "no é"));
  EXPECT_FALSE(Matches(multi, "no    é"));
}

TEST(GbnfTest, RefusesLeftRecursionAndUndefinedRules) {
  EXPECT_THAT(CompileError(ConstraintKind::kGrammar, "root ::= root \"a\" | \"b\"\n"),
              HasSubstr("left recursion"));
  EXPECT_THAT(CompileError(ConstraintKind::kGrammar, "root ::= x? root \"a\"\nx ::= \"b\"\n"),
              HasSubstr("left recursion"));
  EXPECT_THAT(CompileError(ConstraintKind::kGrammar, "root ::= missing\n"),
              HasSubstr("'missing' is not defined"));
  EXPECT_THAT(CompileError(ConstraintKind::kGrammar, "start ::= \"a\"\n"),
              HasSubstr("no 'root'"));
}

TEST(JsonSchemaTest, ObjectsWithRequiredAndOptionalProperties) {
  auto g = Compile(ConstraintKind::kJsonSchema, R"({
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3},
                   "c": {"type": "boolean"}},
    "required": ["b"], "additionalProperties": false})");
  EXPECT_TRUE(Matches(g, R"({"b":"xy"})"));
  EXPECT_TRUE(Matches(g, R"({"a":-12,"b":"xyz","c":true})"));
  EXPECT_TRUE(Matches(g, R"({"a":0,"b":""})"));
  EXPECT_FALSE(Matches(g, R"({"a":1})"));           // b is required
  EXPECT_FALSE(Matches(g, R"({"b":"wxyz"})"));      // maxLength
  EXPECT_FALSE(Matches(g, R"({"b":"x","a":1})"));   // the schema's order
  EXPECT_FALSE(Matches(g, R"({"a":01,"b":"x"})"));  // no leading zeros
  EXPECT_FALSE(Matches(g, R"({,"b":"x"})"));
}

TEST(JsonSchemaTest, NumberBoundsAreExactForIntegers) {
  auto g = Compile(ConstraintKind::kJsonSchema,
                   R"({"type": "integer", "minimum": -17, "exclusiveMaximum": 250})");
  for (int value = -40; value <= 300; ++value) {
    EXPECT_EQ(Matches(g, std::to_string(value)), value >= -17 && value < 250) << value;
  }
  // One-sided bounds span 15-digit ranges: linear in the digits, not exponential.
  auto big = Compile(ConstraintKind::kJsonSchema, R"({"type": "integer", "minimum": 0})");
  EXPECT_TRUE(Matches(big, "0"));
  EXPECT_TRUE(Matches(big, "123456789012345"));
  EXPECT_FALSE(Matches(big, "-1"));
  EXPECT_FALSE(Matches(big, "007"));
  auto odd = Compile(ConstraintKind::kJsonSchema,
                     R"({"type": "integer", "minimum": 1037, "maximum": 982451})");
  for (int value : {1036, 1037, 1100, 9999, 10000, 98245, 982451, 982452, 999999}) {
    EXPECT_EQ(Matches(odd, std::to_string(value)), value >= 1037 && value <= 982451) << value;
  }
  auto n = Compile(ConstraintKind::kJsonSchema,
                   R"({"type": "number", "minimum": -1.5, "maximum": 2})");
  EXPECT_TRUE(Matches(n, "2"));
  EXPECT_TRUE(Matches(n, "1.25"));
  EXPECT_TRUE(Matches(n, "-0.5"));
  EXPECT_TRUE(Matches(n, "-1"));
  EXPECT_FALSE(Matches(n, "2.5"));
  EXPECT_FALSE(Matches(n, "-2"));
  EXPECT_FALSE(Matches(n, "3"));
}

// Random integer bounds (exclusive or not, negative or not) against the values around them.
TEST(JsonSchemaTest, RandomIntegerBoundsAreExact) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> bound(-30000, 30000);
  for (int trial = 0; trial < 40; ++trial) {
    int lo = bound(rng), hi = bound(rng);
    if (lo > hi) std::swap(lo, hi);
    const bool lo_exclusive = trial % 3 == 1, hi_exclusive = trial % 4 == 2;
    const std::string schema =
        "{\"type\": \"integer\", \"" +
        std::string(lo_exclusive ? "exclusiveMinimum" : "minimum") + "\": " + std::to_string(lo) +
        ", \"" + std::string(hi_exclusive ? "exclusiveMaximum" : "maximum") +
        "\": " + std::to_string(hi) + "}";
    const int first = lo + (lo_exclusive ? 1 : 0), last = hi - (hi_exclusive ? 1 : 0);
    if (first > last) continue;  // refused: nothing satisfies the bounds
    auto g = Compile(ConstraintKind::kJsonSchema, schema);
    ASSERT_NE(g, nullptr) << schema;
    std::vector<int> probes = {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0, -1, 1};
    for (int k = 0; k < 30; ++k) probes.push_back(lo + static_cast<int>(rng() % (hi - lo + 1)));
    for (int value : probes) {
      EXPECT_EQ(Matches(g, std::to_string(value)), value >= first && value <= last)
          << schema << " value " << value;
    }
  }
}

TEST(JsonSchemaTest, ArraysEnumsRefsAndAnyOf) {
  auto g = Compile(ConstraintKind::kJsonSchema, R"({
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"enum": ["x", 1, null]},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
      "required": ["v"], "additionalProperties": false}},
    "anyOf": [{"$ref": "#/$defs/node"}, {"type": "array", "items": {"const": "k"},
                                          "minItems": 1, "maxItems": 2}]})");
  EXPECT_TRUE(Matches(g, R"({"v":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"v":1,"kids":[{"v":null},{"v":"x","kids":[]}]})"));
  EXPECT_TRUE(Matches(g, R"(["k","k"])"));
  EXPECT_FALSE(Matches(g, R"([])"));
  EXPECT_FALSE(Matches(g, R"(["k","k","k"])"));
  EXPECT_FALSE(Matches(g, R"({"v":2})"));
  EXPECT_FALSE(Matches(g, R"({"v":1,"kids":[{"v":1},{"v":1},{"v":1}]})"));
}

TEST(JsonSchemaTest, PatternsAreEscapedInsideStrings) {
  auto g = Compile(ConstraintKind::kJsonSchema, R"({"type": "string", "pattern": "^a[\"\\\\]b$"})");
  EXPECT_TRUE(Matches(g, R"("a\"b")"));
  EXPECT_TRUE(Matches(g, R"("a\\b")"));
  EXPECT_FALSE(Matches(g, R"("a"b")"));
}

TEST(JsonSchemaTest, RefusesUnsupportedKeywordsByName) {
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema,
                           R"({"type": "number", "multipleOf": 3})"),
              HasSubstr("'multipleOf'"));
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema,
                           R"({"type": "object", "patternProperties": {}})"),
              HasSubstr("'patternProperties'"));
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema, R"({"$ref": "http://x/y"})"),
              HasSubstr("not supported"));
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema,
                           R"({"required": ["x"], "additionalProperties": false})"),
              HasSubstr("no value can match"));
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema, "{not json"),
              HasSubstr("not valid JSON"));
}

TEST(HostileTest, DeepNestingHugeEnumsAndBlowUpsAreRefused) {
  std::string deep = "{\"type\": \"string\"}";
  for (int k = 0; k < 200; ++k) deep = "{\"type\": \"array\", \"items\": " + deep + "}";
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema, deep), HasSubstr("nested"));
  nlohmann::json huge = {{"enum", nlohmann::json::array()}};
  for (int k = 0; k < 100'000; ++k) huge["enum"].push_back(k);
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema, huge.dump()),
              HasSubstr("'enum' has 100000 values"));
  // Nested counted repetitions multiply the states of a match: refused before building.
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, "((a{1,1000}){1,1000}){1,1000}"),
              HasSubstr("multiply to 1000000"));
  // Many alternatives: refused by the element bound.
  std::string many;
  for (int k = 0; k < 60'000; ++k) many += "abcd|";
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, many + "x"), HasSubstr("exceeds 200000"));
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, "a{100000}"), HasSubstr("too large"));
  const std::string deep_json = std::string(100'000, '[') + std::string(100'000, ']');
  EXPECT_THAT(CompileError(ConstraintKind::kJsonSchema, "{\"const\": " + deep_json + "}"),
              HasSubstr("JSON levels"));
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, "a\xff"), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(CompileError(ConstraintKind::kGrammar, "root ::= \"\\U00110000\"\n"),
              HasSubstr("U+10FFFF"));
  std::string groups(500, '(');
  groups += "a" + std::string(500, ')');
  EXPECT_THAT(CompileError(ConstraintKind::kRegex, groups), HasSubstr("nested"));
}

TEST(HostileTest, CatastrophicBacktrackingPatternsRunInBoundedStates) {
  // (a+)+b and (a|aa)*c take exponential time in a backtracking matcher; here each byte's state
  // is a small set of stacks, and the pool of stacks stops growing.
  for (const char* pattern : {"(a+)+b", "(a|aa)*c", "(a*)*b", "(x+x+)+y"}) {
    auto g = Compile(ConstraintKind::kRegex, pattern);
    GrammarMatcher matcher(g);
    const char letter = pattern[1] == 'x' ? 'x' : 'a';
    for (int k = 0; k < 2000; ++k) ASSERT_TRUE(matcher.AcceptBytes(std::string(1, letter)));
    EXPECT_FALSE(matcher.CanEnd());
    EXPECT_LT(g->num_pool_nodes(), 64) << pattern;
    EXPECT_FALSE(matcher.Failed());
  }
}

// ---- The token trie and the mask on the fixture tokenizers.

class FixtureTrieTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTrieTest, TokenBytesSpellTheText) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  absl::StatusOr<std::unique_ptr<TokenTrie>> trie =
      TokenTrie::FromTokenizer(tokenizer, tokenizer.vocab_size(), {});
  ASSERT_TRUE(trie.ok()) << trie.status();
  // Multi-byte characters, digits, spaces and text no merge covers (byte fallback).
  const std::string text = "Hello wörld 123 \xE2\x82\xAC{\"k\": [1, 2]} \xF0\x9F\x98\x80 ZQX";
  std::string spelled;
  for (int32_t id : tokenizer.Encode(text, /*add_special=*/false)) {
    spelled += (*trie)->TokenBytes(id);
  }
  if (testing::IsByteLevelFixture(GetParam())) {
    EXPECT_EQ(spelled, text);
  } else {
    // SentencePiece adds a leading space ("▁") that its decoder strips at the text's start.
    EXPECT_EQ(spelled, " " + text);
  }
  // Every trie node's tokens spell its path.
  const auto& nodes = (*trie)->nodes();
  std::string path;
  for (size_t i = 1; i < nodes.size(); ++i) {
    path.resize(static_cast<size_t>(nodes[i].depth - 1));
    path.push_back(static_cast<char>(nodes[i].byte));
    for (int32_t k = 0; k < nodes[i].num_tokens; ++k) {
      ASSERT_EQ((*trie)->TokenBytes((*trie)->node_tokens()[nodes[i].first_token + k]), path);
    }
  }
}

TEST_P(FixtureTrieTest, ByteFallbackTokensAreSingleBytes) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  auto trie = TokenTrie::FromTokenizer(tokenizer, tokenizer.vocab_size(), {});
  ASSERT_TRUE(trie.ok());
  int byte_tokens = 0;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsByteFallback(id)) continue;
    ++byte_tokens;
    EXPECT_EQ((*trie)->TokenBytes(id).size(), 1u) << tokenizer.IdToPiece(id);
  }
  if (GetParam() == "sentencepiece-bpe") {
    EXPECT_EQ(byte_tokens, 256);
  }
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) {
      EXPECT_TRUE((*trie)->Excluded(id)) << id;
    }
  }
}

// The mask equals a brute-force check of every token, at every step of a random walk.
TEST_P(FixtureTrieTest, MaskEqualsBruteForceAlongRandomWalks) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer(GetParam());
  const int32_t eos = tokenizer.eos_id().value_or(0);
  auto trie = TokenTrie::FromTokenizer(tokenizer, tokenizer.vocab_size() + 7, {eos});
  ASSERT_TRUE(trie.ok());
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "n": {"type": "integer", "minimum": 0, "maximum": 500},
      "tags": {"type": "array", "items": {"enum": ["a b", "é", "\u20ac1"]}, "maxItems": 3}},
      "required": ["name", "n"], "additionalProperties": false})";
  for (auto [kind, text] : std::vector<std::pair<ConstraintKind, std::string>>{
           {ConstraintKind::kJsonSchema, schema},
           {ConstraintKind::kRegex, R"(( [a-z]+| \d{1,3}){1,6}\.)"},
           {ConstraintKind::kGrammar, "root ::= \"€\" [0-9]+ (\" \" [a-zé]+)*\n"}}) {
    auto grammar = Compile(kind, text, **trie);
    std::mt19937 rng(7);
    for (int walk = 0; walk < 3; ++walk) {
      GrammarMatcher matcher(grammar);
      std::vector<uint32_t> mask((*trie)->mask_words());
      for (int step = 0; step < 60; ++step) {
        matcher.FillMask(mask);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < (*trie)->vocab_size(); ++id) {
          GrammarMatcher probe = matcher;
          const bool ok = probe.AcceptToken(id);
          const bool bit = (mask[id >> 5] >> (id & 31)) & 1;
          ASSERT_EQ(bit, ok) << "token " << id << " '" << (*trie)->TokenBytes(id) << "' step "
                             << step;
          if (ok) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty());
        const int32_t token = allowed[rng() % allowed.size()];
        ASSERT_TRUE(matcher.AcceptToken(token));
        if (token == eos) break;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTrieTest,
                         ::testing::ValuesIn(testing::FixtureTokenizerNames()));

// Random walks under a JSON schema always end in parseable JSON when the walk prefers EOS.
TEST(JsonSchemaTest, RandomWalksEndInValidJson) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer("smollm-digits");
  const int32_t eos = 0;
  auto trie = TokenTrie::FromTokenizer(tokenizer, tokenizer.vocab_size(), {eos});
  ASSERT_TRUE(trie.ok());
  auto grammar = Compile(ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {
      "id": {"type": "string", "format": "uuid"}, "ok": {"type": "boolean"},
      "xs": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 9},
             "minItems": 1, "maxItems": 4}}, "required": ["id", "ok", "xs"]})",
                         **trie);
  std::mt19937 rng(11);
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher matcher(grammar);
    std::vector<uint32_t> mask((*trie)->mask_words());
    std::string text;
    for (int step = 0; step < 400 && !matcher.MustEnd(); ++step) {
      matcher.FillMask(mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < (*trie)->vocab_size(); ++id) {
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      const int32_t token = allowed[rng() % allowed.size()];
      if (token == eos) break;
      ASSERT_TRUE(matcher.AcceptToken(token));
      text += (*trie)->TokenBytes(token);
    }
    ASSERT_TRUE(matcher.CanEnd()) << text;
    nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text;
    EXPECT_EQ(parsed["id"].get<std::string>().size(), 36u);
    EXPECT_TRUE(parsed["ok"].is_boolean());
    EXPECT_GE(parsed["xs"].size(), 1u);
    for (const auto& x : parsed["xs"]) EXPECT_TRUE(x.get<double>() >= 0 && x.get<double>() <= 9);
  }
}

TEST(ConstraintCompilerTest, CachesByContentAndRefusesWhatMatchesNothing) {
  const Tokenizer& tokenizer = testing::FixtureTokenizer("gpt2-bytelevel");
  auto trie = TokenTrie::FromTokenizer(tokenizer, tokenizer.vocab_size(), {0});
  ASSERT_TRUE(trie.ok());
  ConstraintCompiler compiler(*std::move(trie), GrammarLimits{}, 2);
  auto a = compiler.Compile({ConstraintKind::kRegex, "[ab]+"});
  auto b = compiler.Compile({ConstraintKind::kRegex, "[ab]+"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  auto c = compiler.Compile({ConstraintKind::kGrammar, "[ab]+"});
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(std::string(compiler.Compile({ConstraintKind::kRegex, "a{2,1}"}).status().message()),
              HasSubstr("pattern"));
}

}  // namespace
}  // namespace lmserve::engine::structured
