// Shared helpers of the tokenizer tests: the fixture tokenizers and their reference cases.

#ifndef LMSERVE_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_
#define LMSERVE_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {

// The four tokenizers in fixtures/tokenizers (file name without .json).
inline const std::vector<std::string>& FixtureTokenizerNames() {
  static const std::vector<std::string> kNames = {"gpt2-bytelevel", "llama3-regex", "smollm-digits",
                                                  "sentencepiece-bpe"};
  return kNames;
}

// The byte-level ones (decode(encode(x)) == x for any text).
inline bool IsByteLevelFixture(const std::string& name) { return name != "sentencepiece-bpe"; }

inline std::string FixtureTokenizerPath(const std::string& name) {
  return FixturesDir() + "/tokenizers/" + name + ".json";
}

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Loads (once per process) and returns a fixture tokenizer; fails the test when it does not load.
inline const engine::Tokenizer& FixtureTokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<engine::Tokenizer>>* cache =
      new std::map<std::string, std::unique_ptr<engine::Tokenizer>>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    auto loaded = engine::Tokenizer::Load(FixtureTokenizerPath(name));
    if (!loaded.ok()) {
      ADD_FAILURE() << name << ": " << loaded.status();
      std::abort();
    }
    it = cache->emplace(name, *std::move(loaded)).first;
  }
  return *it->second;
}

struct TokenizerCase {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<int32_t> ids_with_special;
  std::string decoded;
  std::string decoded_skip_special;
};

// fixtures/tokenizers/tokenizer_cases.json, by tokenizer name.
inline const std::map<std::string, std::vector<TokenizerCase>>& TokenizerCases() {
  static const auto* cases = [] {
    auto* out = new std::map<std::string, std::vector<TokenizerCase>>();
    const nlohmann::json j =
        nlohmann::json::parse(ReadTextFile(FixturesDir() + "/tokenizers/tokenizer_cases.json"));
    for (const auto& [name, rows] : j.items()) {
      for (const auto& row : rows) {
        out->operator[](name).push_back({row.at("text").get<std::string>(),
                                         row.at("ids").get<std::vector<int32_t>>(),
                                         row.at("ids_with_special").get<std::vector<int32_t>>(),
                                         row.at("decoded").get<std::string>(),
                                         row.at("decoded_skip_special").get<std::string>()});
      }
    }
    return out;
  }();
  return *cases;
}

// Whether `text` is well-formed UTF-8 (an independent check: no surrogates, overlongs or values
// past U+10FFFF).
inline bool IsWellFormedUtf8(std::string_view text) {
  size_t i = 0;
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < text.size()) {
    const unsigned char b = byte(i);
    size_t n;
    uint32_t c;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 1, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 2, c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 3, c = b & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= text.size() || (byte(i + k) & 0xC0) != 0x80) return false;
      c = (c << 6) | (byte(i + k) & 0x3F);
    }
    if ((n == 2 && c < 0x800) || (n == 3 && c < 0x10000) || c > 0x10FFFF ||
        (c >= 0xD800 && c <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_ENGINE_TOKENIZER_TOKENIZER_TEST_UTIL_H_
