// Exception-free accessors for nlohmann::json objects read from tokenizer files. Each checks the
// type before reading; errors name the member. Internal to engine/tokenizer.

#ifndef LMSERVE_ENGINE_TOKENIZER_JSON_UTIL_H_
#define LMSERVE_ENGINE_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine::tokenizer_internal {

// The member `key` of object `j`; nullptr when `j` is not an object or has no such member.
inline const nlohmann::json* JsonMember(const nlohmann::json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// The string member `key`; `fallback` when absent or null; an error when of another type.
inline absl::StatusOr<std::string> JsonString(const nlohmann::json& j, std::string_view key,
                                              std::optional<std::string> fallback = std::nullopt) {
  const nlohmann::json* member = JsonMember(j, key);
  if (member == nullptr || member->is_null()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(StrCat("missing string \"", key, "\""));
  }
  if (!member->is_string()) {
    return absl::InvalidArgumentError(StrCat("\"", key, "\" is not a string"));
  }
  return member->get<std::string>();
}

// The boolean member `key`; `fallback` when absent or null; an error when of another type.
inline absl::StatusOr<bool> JsonBool(const nlohmann::json& j, std::string_view key, bool fallback) {
  const nlohmann::json* member = JsonMember(j, key);
  if (member == nullptr || member->is_null()) return fallback;
  if (!member->is_boolean()) {
    return absl::InvalidArgumentError(StrCat("\"", key, "\" is not a boolean"));
  }
  return member->get<bool>();
}

// The integer member `key`; `fallback` when absent or null; an error when of another type.
inline absl::StatusOr<int64_t> JsonInt(const nlohmann::json& j, std::string_view key,
                                       int64_t fallback) {
  const nlohmann::json* member = JsonMember(j, key);
  if (member == nullptr || member->is_null()) return fallback;
  if (!member->is_number_integer()) {
    return absl::InvalidArgumentError(StrCat("\"", key, "\" is not an integer"));
  }
  return member->get<int64_t>();
}

}  // namespace lmserve::engine::tokenizer_internal

// Evaluates `expr` (an absl::StatusOr); returns its status on error, else assigns its value to
// `lhs` (which may be a declaration).
#define LMSERVE_TOK_CONCAT_INNER(a, b) a##b
#define LMSERVE_TOK_CONCAT(a, b) LMSERVE_TOK_CONCAT_INNER(a, b)
#define LMSERVE_TOK_ASSIGN_OR_RETURN(lhs, expr)                          \
  auto LMSERVE_TOK_CONCAT(status_or_, __LINE__) = (expr);                \
  if (!LMSERVE_TOK_CONCAT(status_or_, __LINE__).ok()) {                  \
    return std::move(LMSERVE_TOK_CONCAT(status_or_, __LINE__)).status(); \
  }                                                                      \
  lhs = *std::move(LMSERVE_TOK_CONCAT(status_or_, __LINE__))

#endif  // LMSERVE_ENGINE_TOKENIZER_JSON_UTIL_H_
