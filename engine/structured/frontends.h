// The structured-output front ends: each compiles its input into a Grammar (grammar.h) under
// GrammarLimits, or returns InvalidArgument saying what is wrong or unsupported (and where).
//
// JSON Schema (the subset OpenAI's strict mode and vLLM accept): type (one or a list), properties,
// required, additionalProperties (false or true: no extra keys are generated; a schema without
// properties: a map of it), enum, const, items, prefixItems, minItems, maxItems, minLength,
// maxLength, pattern, format (date, time, date-time, uuid, email, ipv4), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, anyOf, allOf of one schema, $ref to "#", "#/$defs/..." or
// "#/definitions/...", and the annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly). Any other keyword is refused by name. Output is
// compact JSON (no whitespace), properties in the schema's order, optional ones possibly left out.
// Numbers: integers have at most 15 digits, fractions at most 15; bounds are kept exactly for
// integers and as a subset for fractional numbers (a fraction is generated only between integers
// inside the bounds).
//
// Regular expressions: literals, escapes (\d \w \s \D \W \S \n \t \r \f \v \xHH \uHHHH and
// escaped punctuation), ".", classes with ranges and negation, groups ((...), (?:...), named),
// alternation, the quantifiers * + ? {m} {m,} {m,n} (lazy forms alike); ^ and $ only at the ends
// (a pattern always matches the whole output). Backreferences, lookaround and \b are refused.
//
// GBNF (llama.cpp's grammar syntax): `name ::= alternatives` rules, the root rule `root`,
// "literals" with escapes, [character classes], rule references, (groups), . (any character), the
// quantifiers * + ? {m} {m,} {m,n}, and # comments.

#ifndef LMSERVE_ENGINE_STRUCTURED_FRONTENDS_H_
#define LMSERVE_ENGINE_STRUCTURED_FRONTENDS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/structured/grammar.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine::structured {

absl::StatusOr<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema,
                                          const GrammarLimits& limits);
// Any JSON object (OpenAI's response_format json_object).
absl::StatusOr<Grammar> JsonObjectGrammar(const GrammarLimits& limits);
absl::StatusOr<Grammar> RegexGrammar(std::string_view pattern, const GrammarLimits& limits);
absl::StatusOr<Grammar> GbnfGrammar(std::string_view text, const GrammarLimits& limits);

// Adds `pattern` to `builder` as one element. With `json_string`, what the pattern matches is
// written as the content of a JSON string (quotes, backslashes and control characters escaped).
absl::StatusOr<Element> AddRegex(GrammarBuilder* builder, std::string_view pattern,
                                 bool json_string);

}  // namespace lmserve::engine::structured

#endif  // LMSERVE_ENGINE_STRUCTURED_FRONTENDS_H_
