// A context-free grammar over bytes: what every structured-output front end (JSON Schema, regular
// expressions, GBNF) compiles into, and what GrammarMatcher (matcher.h) walks.
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of
// elements, each a byte set (one byte from the set) or a reference to a rule. Characters are UTF-8:
// a character class becomes a rule whose alternatives are sequences of byte ranges
// (AddCodepointClass), so the matcher never decodes UTF-8 itself. Repetition is right recursion
// (`r ::= item r | ""`), which the matcher runs as a tail call, so it never deepens the stack.
//
// Bounds (GrammarLimits): the number of elements and rules, repetition counts and the nesting of
// the front ends' inputs. Exceeding one is an InvalidArgument naming the bound, never a hang: a
// hostile schema or pattern costs at most the bounded work of building what fits under them.
// Left recursion (a rule that can reach itself without consuming a byte) is refused at Build(), so
// the matcher's closure always terminates.

#ifndef LMSERVE_ENGINE_STRUCTURED_GRAMMAR_H_
#define LMSERVE_ENGINE_STRUCTURED_GRAMMAR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lmserve::engine::structured {

// The code point of the UTF-8 sequence at text[*pos], advancing *pos past it; 0 bytes on a lead
// byte that starts no sequence, a truncated sequence, a bad continuation byte or a value past
// U+10FFFF (the pattern and grammar readers' "invalid UTF-8"). REQUIRES: *pos < text.size().
inline int DecodeUtf8(std::string_view text, size_t* pos, uint32_t* value) {
  const auto lead = static_cast<uint8_t>(text[*pos]);
  const int length = lead < 0x80           ? 1
                     : (lead >> 5) == 6    ? 2
                     : (lead >> 4) == 14   ? 3
                     : (lead >> 3) == 30   ? 4
                                           : 0;
  if (length == 0 || *pos + length > text.size()) return 0;
  uint32_t v = length == 1 ? lead : lead & (0x7F >> length);
  for (int k = 1; k < length; ++k) {
    const auto byte = static_cast<uint8_t>(text[*pos + k]);
    if ((byte & 0xC0) != 0x80) return 0;
    v = (v << 6) | (byte & 0x3F);
  }
  if (v > 0x10FFFF) return 0;
  *pos += length;
  *value = v;
  return length;
}

struct GrammarLimits {
  int64_t max_elements = 200'000;  // elements over all alternatives
  int32_t max_rules = 50'000;
  int32_t max_repeat = 10'000;     // bound on {m,n} counts, minLength/maxLength, min/maxItems
  int32_t max_nesting = 64;        // schema / pattern / GBNF group nesting
  int32_t max_enum_values = 1024;  // enum values (JSON Schema)
  int64_t max_input_bytes = 1 << 20;
};

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void Add(uint8_t byte) { bits[byte >> 6] |= uint64_t{1} << (byte & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool Has(uint8_t byte) const { return (bits[byte >> 6] >> (byte & 63)) & 1; }
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t id = 0;  // a byte set's index, or a rule's
};

// The built grammar, flattened for the matcher: every alternative is a run of `code` ending in
// kEnd; a position in `code` is what a matcher's stack frame holds.
struct Grammar {
  static constexpr int32_t kEnd = -1;
  // code[pos] >= 0: byte set code[pos]; kEnd: end of the alternative; <= -2: rule -(code + 2).
  std::vector<int32_t> code;
  std::vector<std::vector<int32_t>> rule_alternatives;  // [rule] -> start positions in code
  std::vector<std::string> rule_names;
  std::vector<ByteSet> byte_sets;
  int32_t root = 0;

  static bool IsRule(int32_t code_value) { return code_value <= -2; }
  static int32_t RuleOf(int32_t code_value) { return -(code_value + 2); }
};

// Builds a Grammar under GrammarLimits. The first bound exceeded is kept as status() and every
// later call becomes a no-op, so front ends check once at the end (or early, to stop work).
class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarLimits& limits) : limits_(limits) {}

  const GrammarLimits& limits() const { return limits_; }
  const absl::Status& status() const { return status_; }
  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  // A new rule without alternatives (a forward declaration; give it at least one before Build).
  int32_t NewRule(std::string_view name);
  void AddAlternative(int32_t rule, std::vector<Element> sequence);
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  bool HasAlternatives(int32_t rule) const { return !rules_[rule].empty(); }
  const std::string& RuleName(int32_t rule) const { return names_[rule]; }

  static Element Ref(int32_t rule) { return {Element::Kind::kRule, rule}; }
  Element Bytes(const ByteSet& set);
  Element Byte(uint8_t byte);
  // `bytes` as a sequence of single-byte elements, appended to `out`.
  void AppendLiteral(std::string_view bytes, std::vector<Element>* out);
  // A rule matching exactly `bytes` ("" allowed).
  int32_t Literal(std::string_view bytes);
  // One UTF-8 character whose code point is in `ranges` (inclusive; surrogates never match), or
  // not in them when `negated`. Deduplicated by content. An empty class yields a rule with no
  // alternatives, which matches nothing.
  Element CodepointClass(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated);
  // A rule with the given alternatives.
  int32_t Choice(std::string_view name, std::vector<std::vector<Element>> alternatives);
  // A rule matching `item` between min_count and max_count times (max_count < 0: unbounded).
  int32_t Repeat(std::string_view name, std::vector<Element> item, int32_t min_count,
                 int32_t max_count);
  // `sequence` wrapped into one element (itself if it is one element already).
  Element Group(std::string_view name, std::vector<Element> sequence);

  // The grammar rooted at `root`. InvalidArgument for a bound exceeded (status()), a rule without
  // alternatives that is reachable from the root, or left recursion.
  absl::StatusOr<Grammar> Build(int32_t root) &&;

 private:
  bool Charge(int64_t elements);

  const GrammarLimits limits_;
  absl::Status status_;
  std::vector<std::vector<std::vector<Element>>> rules_;
  std::vector<std::string> names_;
  std::vector<ByteSet> byte_sets_;
  absl::flat_hash_map<std::string, int32_t> byte_set_ids_;
  absl::flat_hash_map<std::string, Element> class_cache_;
  int64_t num_elements_ = 0;
};

// Appends the UTF-8 encoding of `codepoint` to `out`.
void AppendUtf8(uint32_t codepoint, std::string* out);

// [lo, hi] of code points (lo <= hi <= 0x10FFFF, surrogates removed by the caller or skipped here)
// as sequences of byte ranges, each sequence the UTF-8 encodings of one sub-range.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8Sequences(uint32_t lo, uint32_t hi);

}  // namespace lmserve::engine::structured

#endif  // LMSERVE_ENGINE_STRUCTURED_GRAMMAR_H_
