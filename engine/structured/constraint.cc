#include "engine/structured/constraint.h"

#include <algorithm>

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

namespace {

// The deepest nesting of arrays and objects in JSON text (strings skipped), checked before parsing:
// the parser's values are destroyed and written recursively.
int32_t JsonDepth(std::string_view text) {
  int32_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

absl::StatusOr<Grammar> FrontEndGrammar(const ConstraintSpec& spec, const GrammarLimits& limits) {
  if (static_cast<int64_t>(spec.text.size()) > limits.max_input_bytes) {
    return absl::InvalidArgumentError(StrCat(ConstraintKindName(spec.kind), ": ",
                                             spec.text.size(), " bytes, above the limit of ",
                                             limits.max_input_bytes));
  }
  switch (spec.kind) {
    case ConstraintKind::kJsonSchema: {
      // A schema level is at most a few JSON levels (properties, items, anyOf arrays).
      if (JsonDepth(spec.text) > 4 * limits.max_nesting) {
        return absl::InvalidArgumentError(StrCat("json_schema: nested deeper than ",
                                                 4 * limits.max_nesting, " JSON levels"));
      }
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

}  // namespace

absl::StatusOr<Grammar> CompileGrammar(const ConstraintSpec& spec, const GrammarLimits& limits) {
  absl::StatusOr<Grammar> grammar = FrontEndGrammar(spec, limits);
  if (!grammar.ok() || (spec.prefix.empty() && spec.suffix.empty())) return grammar;
  // root' ::= prefix root suffix, appended to the flat grammar.
  Grammar& g = *grammar;
  std::vector<int32_t> code;
  const auto byte_code = [&](uint8_t byte) {
    ByteSet set;
    set.Add(byte);
    for (size_t k = 0; k < g.byte_sets.size(); ++k) {
      if (g.byte_sets[k] == set) return static_cast<int32_t>(k);
    }
    g.byte_sets.push_back(set);
    return static_cast<int32_t>(g.byte_sets.size() - 1);
  };
  for (char c : spec.prefix) code.push_back(byte_code(static_cast<uint8_t>(c)));
  code.push_back(-(g.root + 2));
  for (char c : spec.suffix) code.push_back(byte_code(static_cast<uint8_t>(c)));
  code.push_back(Grammar::kEnd);
  g.rule_alternatives.push_back({static_cast<int32_t>(g.code.size())});
  g.rule_names.push_back("wrapped_root");
  g.code.insert(g.code.end(), code.begin(), code.end());
  g.root = static_cast<int32_t>(g.rule_alternatives.size() - 1);
  return grammar;
}

ConstraintCompiler::ConstraintCompiler(std::unique_ptr<TokenTrie> trie,
                                       const GrammarLimits& limits, size_t max_cached)
    : trie_(std::move(trie)), limits_(limits), max_cached_(std::max<size_t>(max_cached, 1)) {}

absl::StatusOr<std::shared_ptr<CompiledGrammar>> ConstraintCompiler::Compile(
    const ConstraintSpec& spec) {
  // Lengths first: no two specs share a key.
  std::string key = StrCat(ConstraintKindName(spec.kind), ":", spec.prefix.size(), ":",
                           spec.suffix.size(), ":", spec.prefix, spec.suffix, spec.text);
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
