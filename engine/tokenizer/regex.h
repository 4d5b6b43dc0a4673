// A compiled PCRE2 regular expression in UTF + Unicode-property mode, JIT-compiled where the
// platform allows, with the find-all iteration the pre-tokenizers need. The PCRE2 headers stay out
// of this header (PCRE2 is a private dependency of lmserve_engine).
//
// Thread safety: a compiled Regex is immutable; FindAll may be called from many threads at once
// (match data and JIT stacks are per thread).

#ifndef LMSERVE_ENGINE_TOKENIZER_REGEX_H_
#define LMSERVE_ENGINE_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace lmserve::engine::tokenizer_internal {

class Regex {
 public:
  // Compiles `pattern` (PCRE2 syntax, which accepts the Oniguruma/Rust-regex patterns that
  // tokenizer.json and llama.cpp use: \p{L}, \p{N}, (?i:...), look-ahead). InvalidArgument with the
  // PCRE2 message and offset on a bad pattern.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern matching `literal` exactly (for Split/Replace with a String pattern).
  static std::string Escape(std::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the successive non-overlapping, non-empty matches in `text`,
  // leftmost first. REQUIRES: `text` is valid UTF-8 (it is not checked again).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, pcre2_real_code_8* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;
  pcre2_real_code_8* code_;  // owned
};

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_REGEX_H_
