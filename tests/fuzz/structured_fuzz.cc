// libFuzzer target: the structured-output front ends and matcher. The first byte picks the kind
// (JSON Schema, regex, GBNF); the rest up to the first NUL is the constraint, the bytes after it
// are fed to a matcher of the compiled grammar over a vocabulary of single bytes, with a mask
// computed at each step. Nothing may crash, throw or hang: a constraint compiles or is refused with
// InvalidArgument, and every byte the mask allows is accepted.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/structured/constraint.h"
#include "engine/structured/matcher.h"

namespace structured = lmserve::engine::structured;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const structured::TokenTrie* trie = [] {
    std::vector<std::string> bytes(257);
    for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
    std::vector<uint8_t> excluded(257, 0);
    return structured::TokenTrie::FromBytes(bytes, excluded, 257, {256}).release();
  }();
  const auto kind = static_cast<structured::ConstraintKind>(data[0] % 4);
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t split = rest.find('\0');
  structured::GrammarLimits limits;
  limits.max_elements = 20'000;  // keep each input quick
  absl::StatusOr<structured::Grammar> grammar =
      structured::CompileGrammar({kind, rest.substr(0, split)}, limits);
  if (!grammar.ok()) {
    if (grammar.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  auto compiled = std::make_shared<structured::CompiledGrammar>(*std::move(grammar), trie, "fuzz");
  structured::GrammarMatcher matcher(compiled);
  std::vector<uint32_t> mask(static_cast<size_t>(trie->mask_words()));
  if (split == std::string::npos) return 0;
  for (size_t i = split + 1; i < rest.size() && i < split + 65; ++i) {
    matcher.FillMask(mask);
    const auto byte = static_cast<uint8_t>(rest[i]);
    const bool allowed = (mask[byte >> 5] >> (byte & 31)) & 1;
    const bool accepted = matcher.AcceptToken(byte);
    if (allowed != accepted && !matcher.Failed()) __builtin_trap();
    if (!accepted) break;
  }
  return 0;
}
