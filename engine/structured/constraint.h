// Structured output: what a request asks its output to match, compiled once per tokenizer and
// cached by content.
//
// A ConstraintSpec (a JSON Schema, "any JSON object", a regular expression or a GBNF grammar) is
// compiled by its front end (frontends.h) into a Grammar, then bound to the tokenizer's TokenTrie as
// a CompiledGrammar (matcher.h), which every request with the same spec shares (its memo tables
// make later requests cheaper). The engine gives each constrained sequence a GrammarMatcher and
// masks the logits with its bitmask before sampling (engine_core.cc).
//
// Thread safety: ConstraintCompiler::Compile may be called from any thread.

#ifndef LMSERVE_ENGINE_STRUCTURED_CONSTRAINT_H_
#define LMSERVE_ENGINE_STRUCTURED_CONSTRAINT_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/structured/grammar.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_trie.h"

namespace lmserve::engine::structured {

enum class ConstraintKind : uint8_t { kJsonSchema, kJsonObject, kRegex, kGrammar };
std::string_view ConstraintKindName(ConstraintKind kind);

struct ConstraintSpec {
  ConstraintSpec() = default;
  ConstraintSpec(ConstraintKind kind_in, std::string text_in)
      : kind(kind_in), text(std::move(text_in)) {}

  ConstraintKind kind = ConstraintKind::kJsonObject;
  std::string text;  // the schema (JSON text), the pattern or the GBNF grammar; "" for kJsonObject
  // Literal text before and after the match (a tool call's tags).
  std::string prefix;
  std::string suffix;
};

// The front end's grammar for `spec`, without a tokenizer (tests, tools).
absl::StatusOr<Grammar> CompileGrammar(const ConstraintSpec& spec, const GrammarLimits& limits);

class ConstraintCompiler {
 public:
  ConstraintCompiler(std::unique_ptr<TokenTrie> trie, const GrammarLimits& limits,
                     size_t max_cached = 128);

  // The compiled constraint, from the cache when the same spec was compiled before.
  // InvalidArgument naming the problem for a spec that is invalid, unsupported or over the limits.
  absl::StatusOr<std::shared_ptr<CompiledGrammar>> Compile(const ConstraintSpec& spec);

  const TokenTrie& trie() const { return *trie_; }
  const GrammarLimits& limits() const { return limits_; }

 private:
  const std::unique_ptr<TokenTrie> trie_;
  const GrammarLimits limits_;
  const size_t max_cached_;
  absl::Mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<CompiledGrammar>>> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lmserve::engine::structured

#endif  // LMSERVE_ENGINE_STRUCTURED_CONSTRAINT_H_
