// String helpers that take std::string_view.
//
// Debian's Abseil (20220623) is built with its own absl::string_view rather than an alias of
// std::string_view, so absl::StrCat and friends reject std::string_view arguments. These few helpers
// take anything string-like or numeric; use them wherever std::string_view meets message building.

#ifndef LMSERVE_COMMON_STRINGS_H_
#define LMSERVE_COMMON_STRINGS_H_

#include <charconv>
#include <limits>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"

namespace lmserve {

namespace strings_internal {

inline void Append(std::string* out, std::string_view s) { out->append(s); }
inline void Append(std::string* out, const std::string& s) { out->append(s); }
inline void Append(std::string* out, absl::string_view s) { out->append(s.data(), s.size()); }
inline void Append(std::string* out, const char* s) { out->append(s); }
inline void Append(std::string* out, char c) { out->push_back(c); }
inline void Append(std::string* out, bool b) { out->append(b ? "true" : "false"); }

template <typename T>
  requires(std::is_arithmetic_v<T> && !std::same_as<T, char> && !std::same_as<T, bool>)
void Append(std::string* out, T value) {
  char buffer[64];
  std::to_chars_result result;
  if constexpr (std::is_floating_point_v<T>) {
    result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general,
                           std::numeric_limits<T>::max_digits10 - 2);
  } else {
    result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  }
  out->append(buffer, result.ptr);
}

}  // namespace strings_internal

// Concatenates strings, string views, characters, booleans and numbers.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (strings_internal::Append(&out, args), ...);
  return out;
}

// Joins the elements of `items` (each accepted by StrCat) with `separator`.
template <typename Range>
std::string StrJoin(const Range& items, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out.append(separator);
    first = false;
    strings_internal::Append(&out, item);
  }
  return out;
}

// Parses the whole of `text` as a base-10 integer; nullopt on any other character or overflow.
template <typename T>
std::optional<T> ParseInt(std::string_view text) {
  T value{};
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// Splits `text` at every `separator` (empty pieces kept).
inline std::vector<std::string_view> StrSplit(std::string_view text, char separator) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    if (end == std::string_view::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
}

}  // namespace lmserve

#endif  // LMSERVE_COMMON_STRINGS_H_
