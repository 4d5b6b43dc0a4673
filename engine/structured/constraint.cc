#include "engine/structured/constraint.h"

#include "common/strings.h"
#include "engine/structured/frontends.h"

namespace lmserve::engine::structured {

std::string_view ConstraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
      return "json_schema";
    case ConstraintKind::kJsonObject:
      return "json_object";
    case ConstraintKind::kRegex:
      return "regex";
    case ConstraintKind::kGrammar:
      return "grammar";
  }
  return "unknown";
}

absl::StatusOr<Grammar> CompileGrammar(const ConstraintSpec& spec, const GrammarLimits& limits) {
  if (static_cast<int64_t>(spec.text.size()) > limits.max_input_bytes) {
    return absl::InvalidArgumentError(StrCat(ConstraintKindName(spec.kind), ": ",
                                             spec.text.size(), " bytes, above the limit of ",
                                             limits.max_input_bytes));
  }
  switch (spec.kind) {
    case ConstraintKind::kJsonSchema: {
      nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) {
        return absl::InvalidArgumentError("json_schema: the schema is not valid JSON");
      }
      return JsonSchemaGrammar(schema, limits);
    }
    case ConstraintKind::kJsonObject:
      return JsonObjectGrammar(limits);
    case ConstraintKind::kRegex:
      return RegexGrammar(spec.text, limits);
    case ConstraintKind::kGrammar:
      return GbnfGrammar(spec.text, limits);
  }
  return absl::InvalidArgumentError("unknown constraint kind");
}

ConstraintCompiler::ConstraintCompiler(std::unique_ptr<TokenTrie> trie,
                                       const GrammarLimits& limits, size_t max_cached)
    : trie_(std::move(trie)), limits_(limits), max_cached_(std::max<size_t>(max_cached, 1)) {}

absl::StatusOr<std::shared_ptr<CompiledGrammar>> ConstraintCompiler::Compile(
    const ConstraintSpec& spec) {
  std::string key = StrCat(ConstraintKindName(spec.kind), ":", spec.text);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: a slow compile does not hold up cache hits.
  absl::StatusOr<Grammar> grammar = CompileGrammar(spec, limits_);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<CompiledGrammar>(*std::move(grammar), trie_.get(),
                                                    std::string(ConstraintKindName(spec.kind)));
  if (compiled->Initial().empty()) {
    return absl::InvalidArgumentError(
        StrCat(ConstraintKindName(spec.kind), ": the constraint matches nothing"));
  }
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  lru_.emplace_front(key, compiled);
  index_.emplace(std::move(key), lru_.begin());
  while (lru_.size() > max_cached_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace lmserve::engine::structured
