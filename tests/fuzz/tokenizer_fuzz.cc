// libFuzzer target: the tokenizers. Each input is encoded with each of the four fixture tokenizers
// (fixtures/tokenizers/*.json), decoded, streamed through the Detokenizer, and its bytes are also
// decoded as a sequence of token ids. Nothing may crash, hang or break these properties:
//  * every id Encode returns is inside the vocabulary;
//  * Decode and every Detokenizer chunk are valid UTF-8, and the chunks concatenate to Decode;
//  * for valid UTF-8 input, the byte-level tokenizers give decode(encode(x)) == x.
//
// Needs the fixtures directory: $LMSERVE_FIXTURES_DIR, else the build's LMSERVE_FIXTURES_DIR
// (tests/fuzz/CMakeLists.txt passes it; default: the repository's tests/fixtures), else
// tests/fixtures from the working directory (the repository root, where scripts/fuzz.sh runs them). Seeds: tests/fuzz/corpus/tokenizer_fuzz/.
// Example: scripts/fuzz.sh, or build-fuzz/bin/tokenizer_fuzz -max_len=512 -runs=100000

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using lmserve::engine::Detokenizer;
using lmserve::engine::Tokenizer;

struct FuzzTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  bool byte_level;
};

std::string FixturesDir() {
  if (const char* env = std::getenv("LMSERVE_FIXTURES_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
#ifdef LMSERVE_FIXTURES_DIR
  return LMSERVE_FIXTURES_DIR;
#else
  return "tests/fixtures";
#endif
}

const std::vector<FuzzTokenizer>& Tokenizers() {
  static const std::vector<FuzzTokenizer>* tokenizers = [] {
    auto* out = new std::vector<FuzzTokenizer>();
    for (const char* name :
         {"gpt2-bytelevel", "llama3-regex", "smollm-digits", "sentencepiece-bpe"}) {
      const std::string path = FixturesDir() + "/tokenizers/" + name + ".json";
      auto tokenizer = Tokenizer::Load(path);
      if (!tokenizer.ok()) {
        std::fprintf(stderr, "tokenizer_fuzz: %s: %s (set LMSERVE_FIXTURES_DIR)\n", path.c_str(),
                     std::string(tokenizer.status().message()).c_str());
        std::abort();
      }
      out->push_back({*std::move(tokenizer), std::string_view(name) != "sentencepiece-bpe"});
    }
    return out;
  }();
  return *tokenizers;
}

// Well-formed UTF-8, checked independently of the code under test.
bool IsUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t c;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF) {
      n = 1, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 2, c = b & 0x0F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 3, c = b & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    if ((n == 2 && c < 0x800) || (n == 3 && c < 0x10000) || c > 0x10FFFF ||
        (c >= 0xD800 && c <= 0xDFFF)) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void CheckStream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  Detokenizer detokenizer(tokenizer, skip_special);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string chunk = detokenizer.Add(id);
    Check(IsUtf8(chunk));
    streamed += chunk;
  }
  streamed += detokenizer.Flush();
  Check(streamed == tokenizer.Decode(ids, skip_special));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = IsUtf8(text);
  for (const FuzzTokenizer& t : Tokenizers()) {
    const Tokenizer& tokenizer = *t.tokenizer;
    for (const bool add_special : {false, true}) {
      const std::vector<int32_t> ids = tokenizer.Encode(text, add_special);
      for (const int32_t id : ids) Check(id >= 0 && id < tokenizer.vocab_size());
      const std::string decoded = tokenizer.Decode(ids, /*skip_special=*/false);
      Check(IsUtf8(decoded));
      if (!add_special && valid && t.byte_level) Check(decoded == text);
      CheckStream(tokenizer, ids, /*skip_special=*/add_special);
    }
    // The bytes as token ids (two bytes each, some out of range).
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) {
      ids.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) %
                    (tokenizer.vocab_size() + 8));
    }
    Check(IsUtf8(tokenizer.Decode(ids, false)));
    CheckStream(tokenizer, ids, false);
    CheckStream(tokenizer, ids, true);
  }
  return 0;
}
