#include "engine/chat/jinja/builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/chat/jinja/pystr.h"

namespace lmserve::engine::jinja {
namespace {

using Bound = std::vector<std::optional<Value>>;

absl::Status TypeError(std::string_view message) {
  return absl::InvalidArgumentError(std::string(message));
}

// Python's range() of the sandbox: at most 100000 items.
constexpr int64_t kMaxRange = 100000;

absl::StatusOr<std::string> RequireString(const Value& value, std::string_view what) {
  if (!value.is_string()) {
    return TypeError(StrCat(what, " must be str, not ", TypeName(value)));
  }
  return value.AsString();
}

absl::StatusOr<int64_t> RequireInt(const Value& value, std::string_view what) {
  if (!value.is_int() && !value.is_bool()) {
    return TypeError(StrCat(what, " must be an integer, not ", TypeName(value)));
  }
  return value.AsInt();
}

// An optional argument that Python would accept as None or a value of the given kind.
std::optional<Value> Given(const std::optional<Value>& value) {
  if (!value.has_value() || value->is_none()) return std::nullopt;
  return value;
}

// ---- Python number parsing (int("42"), float(" 1e3 ")) -----------------------------------------

std::optional<int64_t> ParsePyInt(std::string_view text) {
  std::string stripped = PyStrip(text, std::nullopt, StripSide::kBoth);
  std::string digits;
  size_t i = 0;
  bool negative = false;
  if (i < stripped.size() && (stripped[i] == '+' || stripped[i] == '-')) {
    negative = stripped[i] == '-';
    ++i;
  }
  for (; i < stripped.size(); ++i) {
    const char c = stripped[i];
    if (c >= '0' && c <= '9') {
      digits.push_back(c);
    } else if (c == '_' && !digits.empty() && i + 1 < stripped.size() && stripped[i + 1] >= '0' &&
               stripped[i + 1] <= '9') {
      continue;
    } else {
      return std::nullopt;
    }
  }
  if (digits.empty()) return std::nullopt;
  std::optional<int64_t> value = ParseInt<int64_t>(negative ? "-" + digits : digits);
  return value;
}

std::optional<double> ParsePyFloat(std::string_view text) {
  std::string stripped = PyStrip(text, std::nullopt, StripSide::kBoth);
  std::string lower = PyLower(stripped);
  std::string_view body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  const bool negative = !lower.empty() && lower[0] == '-';
  if (body == "inf" || body == "infinity") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (body == "nan") return std::numeric_limits<double>::quiet_NaN();
  // Digits, one '.', an exponent: what Python accepts besides inf/nan (hex floats are not).
  std::string clean;
  bool digit_seen = false;
  for (size_t i = 0; i < stripped.size(); ++i) {
    const char c = stripped[i];
    if (c >= '0' && c <= '9') {
      digit_seen = true;
      clean.push_back(c);
    } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
      clean.push_back(c);
    } else if (c == '_' && i > 0 && i + 1 < stripped.size() && isdigit(stripped[i - 1]) &&
               isdigit(stripped[i + 1])) {
      continue;
    } else {
      return std::nullopt;
    }
  }
  if (!digit_seen) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return value;
}

// Python's round(value, digits) for floats: correctly rounded, ties to even.
double PyRound(double value, int64_t digits) {
  if (!std::isfinite(value)) return value;
  if (digits < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(value / scale) * scale;
  }
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)),
                value);
  return std::strtod(buffer, nullptr);
}

// ---- Attribute getters (jinja2's make_attrgetter) ----------------------------------------------

// Looks up `attribute` ("a", "a.b", "0.name", or an int) on `item` with getitem semantics.
absl::StatusOr<Value> GetAttributePath(Interpreter& interpreter, const Value& item,
                                       const Value& attribute) {
  if (!attribute.is_string()) return interpreter.GetItem(item, attribute);
  Value current = item;
  for (std::string_view part : StrSplit(attribute.AsString(), '.')) {
    std::optional<int64_t> index = ParseInt<int64_t>(part);
    LMSERVE_ASSIGN_OR_RETURN(Value next,
                             index.has_value()
                                 ? interpreter.GetItem(current, Value::Int(*index))
                                 : interpreter.GetItem(current, Value::String(std::string(part))));
    current = std::move(next);
  }
  return current;
}

// The key sort, unique, min and max compare by: strings lower-cased unless case_sensitive.
Value SortKey(const Value& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return Value::String(PyLower(value.AsString()));
  return value;
}

// Stable sort of `items` by `keys` (parallel), like Python's sorted(key=..., reverse=...).
absl::Status SortByKeys(std::vector<std::pair<Value, Value>>* keyed, bool reverse) {
  absl::Status error;
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto& a, const auto& b) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = reverse ? Compare(b.first, a.first) : Compare(a.first, b.first);
    if (!c.ok()) {
      error = TypeError(StrCat("'<' ", c.status().message()));
      return false;
    }
    return *c < 0;
  });
  return error;
}

// ---- Filters -----------------------------------------------------------------------------------

absl::StatusOr<Value> FilterDefault(Interpreter&, const Value& value, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("default", {"default_value", "boolean"}));
  const Value fallback = bound[0].value_or(Value::String(""));
  const bool boolean = bound[1].has_value() && Truthy(*bound[1]);
  if (value.is_undefined() || (boolean && !Truthy(value))) return fallback;
  return value;
}

absl::StatusOr<Value> FilterLength(Interpreter&, const Value& value, const CallArgs& args) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    return TypeError("length() takes no arguments");
  }
  std::optional<int64_t> length = Length(value);
  if (value.is_namespace()) length.reset();
  if (!length.has_value()) {
    return TypeError(StrCat("object of type '", TypeName(value), "' has no len()"));
  }
  return Value::Int(*length);
}

template <std::string (*kMap)(std::string_view)>
absl::StatusOr<Value> FilterStringMap(Interpreter&, const Value& value, const CallArgs&) {
  return Value::String(kMap(ToStr(value)));
}

absl::StatusOr<Value> FilterTrim(Interpreter&, const Value& value, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("trim", {"chars"}));
  std::optional<std::string> chars;
  if (std::optional<Value> given = Given(bound[0])) {
    LMSERVE_ASSIGN_OR_RETURN(std::string text, RequireString(*given, "trim() chars"));
    chars = text;
  }
  return Value::String(PyStrip(ToStr(value), chars, StripSide::kBoth));
}

absl::StatusOr<Value> FilterString(Interpreter&, const Value& value, const CallArgs&) {
  return Value::String(ToStr(value));
}

absl::StatusOr<Value> FilterSafe(Interpreter&, const Value& value, const CallArgs&) {
  return value;
}

absl::StatusOr<Value> FilterEscape(Interpreter& interpreter, const Value& value, const CallArgs&) {
  const std::string text = ToStr(value);
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(out.size())));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterJoin(Interpreter& interpreter, const Value& value,
                                 const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("join", {"d", "attribute"}));
  const std::string separator = bound[0].has_value() ? ToStr(*bound[0]) : "";
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(items->size())));
  std::string out;
  bool first = true;
  for (const Value& item : *items) {
    if (!first) out += separator;
    first = false;
    if (std::optional<Value> attribute = Given(bound[1])) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      out += ToStr(field);
    } else {
      out += ToStr(item);
    }
    LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(out.size())));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterFirst(Interpreter&, const Value& value, const CallArgs&) {
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  if (items->empty()) return Value::Undefined("No first item, sequence was empty.");
  return (items)->front();
}

absl::StatusOr<Value> FilterLast(Interpreter&, const Value& value, const CallArgs&) {
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  if (items->empty()) return Value::Undefined("No last item, sequence was empty.");
  return (items)->back();
}

absl::StatusOr<Value> FilterReplace(Interpreter& interpreter, const Value& value,
                                    const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("replace", {"old", "new", "count"}));
  if (!bound[0].has_value() || !bound[1].has_value()) {
    return TypeError("replace() needs the old and the new string");
  }
  int64_t count = -1;
  if (std::optional<Value> given = Given(bound[2])) {
    LMSERVE_ASSIGN_OR_RETURN(int64_t n, RequireInt(*given, "replace() count"));
    count = n;
  }
  const std::string text = ToStr(value);
  const std::string from = ToStr(*bound[0]);
  const std::string to = ToStr(*bound[1]);
  // Bound the result before building it.
  const int64_t occurrences = from.empty()
                                  ? CodePointCount(text) + 1
                                  : static_cast<int64_t>(PySplit(text, from, -1).size()) - 1;
  const int64_t replaced = count < 0 ? occurrences : std::min(count, occurrences);
  LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(
      static_cast<int64_t>(text.size()) +
      replaced * (static_cast<int64_t>(to.size()) - static_cast<int64_t>(from.size()))));
  return Value::String(PyReplace(text, from, to, count));
}

absl::StatusOr<Value> FilterToJson(Interpreter& interpreter, const Value& value,
                                   const CallArgs& args) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  LMSERVE_ASSIGN_OR_RETURN(
      Bound bound, args.Bind("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonFormat format;
  format.ensure_ascii = bound[0].has_value() && Truthy(*bound[0]);
  if (std::optional<Value> indent = Given(bound[1])) {
    if (indent->is_string()) {
      format.indent = indent->AsString();
    } else if (indent->is_int()) {
      format.indent =
          std::string(static_cast<size_t>(std::clamp<int64_t>(indent->AsInt(), 0, 64)), ' ');
    } else {
      return TypeError(StrCat("tojson() indent must be an int or a str, not ", TypeName(*indent)));
    }
  }
  if (std::optional<Value> separators = Given(bound[2])) {
    if (!separators->is_list() || separators->AsList().size() != 2 ||
        !separators->AsList()[0].is_string() || !separators->AsList()[1].is_string()) {
      return TypeError("tojson() separators must be a pair of strings");
    }
    format.separators = {separators->AsList()[0].AsString(), separators->AsList()[1].AsString()};
  }
  format.sort_keys = bound[3].has_value() && Truthy(*bound[3]);
  LMSERVE_ASSIGN_OR_RETURN(std::string json, ToJson(value, format));
  LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(json.size())));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> FilterInt(Interpreter&, const Value& value, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("int", {"default", "base"}));
  const Value fallback = bound[0].value_or(Value::Int(0));
  if (value.is_int() || value.is_bool()) return Value::Int(value.AsInt());
  if (value.is_float()) {
    const double truncated = std::trunc(value.AsDouble());
    if (!std::isfinite(truncated) || std::abs(truncated) > 9.2e18) {
      return TypeError("cannot convert float to integer");
    }
    return Value::Int(static_cast<int64_t>(truncated));
  }
  if (value.is_string()) {
    if (std::optional<int64_t> parsed = ParsePyInt(value.AsString())) return Value::Int(*parsed);
    if (std::optional<double> parsed = ParsePyFloat(value.AsString())) {
      if (std::isfinite(*parsed) && std::abs(*parsed) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(std::trunc(*parsed)));
      }
    }
  }
  return fallback;
}

absl::StatusOr<Value> FilterFloat(Interpreter&, const Value& value, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("float", {"default"}));
  const Value fallback = bound[0].value_or(Value::Float(0.0));
  if (value.is_number()) return Value::Float(value.AsDouble());
  if (value.is_string()) {
    if (std::optional<double> parsed = ParsePyFloat(value.AsString())) {
      return Value::Float(*parsed);
    }
  }
  return fallback;
}

absl::StatusOr<Value> FilterRound(Interpreter&, const Value& value, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("round", {"precision", "method"}));
  int64_t precision = 0;
  if (bound[0].has_value()) {
    LMSERVE_ASSIGN_OR_RETURN(int64_t p, RequireInt(*bound[0], "round() precision"));
    precision = p;
  }
  const std::string method = bound[1].has_value() ? ToStr(*bound[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return TypeError("round() method must be 'common', 'ceil' or 'floor'");
  }
  if (!value.is_number()) {
    return TypeError(StrCat("type ", TypeName(value), " doesn't define __round__ method"));
  }
  if (method == "common") {
    // round(int, n) stays an int in Python.
    if (!value.is_float()) return Value::Int(value.AsInt());
    return Value::Float(PyRound(value.AsDouble(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = value.AsDouble() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

absl::StatusOr<Value> FilterAbs(Interpreter&, const Value& value, const CallArgs&) {
  if (value.is_float()) return Value::Float(std::abs(value.AsDouble()));
  if (value.is_int() || value.is_bool()) {
    if (value.AsInt() == std::numeric_limits<int64_t>::min()) return TypeError("integer overflow");
    return Value::Int(std::abs(value.AsInt()));
  }
  return TypeError(StrCat("bad operand type for abs(): '", TypeName(value), "'"));
}

absl::StatusOr<Value> FilterList(Interpreter&, const Value& value, const CallArgs&) {
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  return Value::MakeList(*items);
}

absl::StatusOr<Value> DictItems(const Value& value) {
  List items;
  for (const auto& [key, item] : value.AsDict().entries()) {
    items.push_back(Value::MakeTuple({key, item}));
  }
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FilterItems(Interpreter&, const Value& value, const CallArgs&) {
  if (value.is_undefined()) return Value::MakeList({});
  if (!value.is_dict()) return TypeError("Can only get item pairs from a mapping.");
  return DictItems(value);
}

absl::StatusOr<Value> FilterReverse(Interpreter&, const Value& value, const CallArgs&) {
  if (value.is_string()) {
    const std::string& text = value.AsString();
    const std::vector<size_t> offsets = CodePointOffsets(text);
    std::string out;
    out.reserve(text.size());
    for (size_t i = offsets.size() - 1; i > 0; --i) {
      out.append(text, offsets[i - 1], offsets[i] - offsets[i - 1]);
    }
    return Value::String(std::move(out));
  }
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  List reversed(items->rbegin(), items->rend());
  return Value::MakeList(std::move(reversed));
}

absl::StatusOr<Value> FilterUnique(Interpreter& interpreter, const Value& value,
                                   const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("unique", {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  const size_t n = items->size();
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(n * n / 16 + n)));
  List out;
  List seen;
  for (const Value& item : *items) {
    Value key = item;
    if (std::optional<Value> attribute = Given(bound[1])) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      key = field;
    }
    key = SortKey(key, case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      continue;
    }
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterSort(Interpreter& interpreter, const Value& value,
                                 const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound,
                           args.Bind("sort", {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = bound[0].has_value() && Truthy(*bound[0]);
  const bool case_sensitive = bound[1].has_value() && Truthy(*bound[1]);
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(items->size()) * 16));
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : *items) {
    Value key = item;
    if (std::optional<Value> attribute = Given(bound[2])) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      key = field;
    }
    keyed.emplace_back(SortKey(key, case_sensitive), item);
  }
  LMSERVE_RETURN_IF_ERROR(SortByKeys(&keyed, reverse));
  List out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterDictSort(Interpreter& interpreter, const Value& value,
                                     const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("dictsort", {"case_sensitive", "by", "reverse"}));
  if (!value.is_dict()) return TypeError("dictsort() needs a mapping");
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  const std::string by = bound[1].has_value() ? ToStr(*bound[1]) : "key";
  if (by != "key" && by != "value")
    return TypeError("You can only sort by either 'key' or 'value'");
  const bool reverse = bound[2].has_value() && Truthy(*bound[2]);
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(value.AsDict().size()) * 16));
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, item] : value.AsDict().entries()) {
    keyed.emplace_back(SortKey(by == "key" ? key : item, case_sensitive),
                       Value::MakeTuple({key, item}));
  }
  LMSERVE_RETURN_IF_ERROR(SortByKeys(&keyed, reverse));
  List out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> MinMax(Interpreter& interpreter, const Value& value, const CallArgs& args,
                             bool want_max) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound,
                           args.Bind(want_max ? "max" : "min", {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && Truthy(*bound[0]);
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  std::optional<Value> best;
  std::optional<Value> best_key;
  for (const Value& item : *items) {
    Value key = item;
    if (std::optional<Value> attribute = Given(bound[1])) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      key = field;
    }
    key = SortKey(key, case_sensitive);
    if (best_key.has_value()) {
      absl::StatusOr<int> c = Compare(key, *best_key);
      if (!c.ok()) return TypeError(StrCat("'<' ", c.status().message()));
      if (want_max ? *c <= 0 : *c >= 0) continue;
    }
    best = item;
    best_key = std::move(key);
  }
  if (!best.has_value()) return Value::Undefined("No aggregated item, sequence was empty.");
  return *best;
}

absl::StatusOr<Value> FilterMin(Interpreter& interpreter, const Value& value,
                                const CallArgs& args) {
  return MinMax(interpreter, value, args, false);
}
absl::StatusOr<Value> FilterMax(Interpreter& interpreter, const Value& value,
                                const CallArgs& args) {
  return MinMax(interpreter, value, args, true);
}

// Python's sum without its bigints: ints stay ints until a float joins, overflow is an error.
absl::StatusOr<Value> Add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value::Float(a.AsDouble() + b.AsDouble());
    int64_t sum = 0;
    if (__builtin_add_overflow(a.AsInt(), b.AsInt(), &sum)) return TypeError("integer overflow");
    return Value::Int(sum);
  }
  return TypeError(
      StrCat("unsupported operand type(s) for +: '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<Value> FilterSum(Interpreter& interpreter, const Value& value,
                                const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("sum", {"attribute", "start"}));
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  Value total = bound[1].value_or(Value::Int(0));
  for (const Value& item : *items) {
    Value term = item;
    if (std::optional<Value> attribute = Given(bound[0])) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      term = field;
    }
    LMSERVE_ASSIGN_OR_RETURN(Value next, Add(total, term));
    total = std::move(next);
  }
  return total;
}

// Python's str.splitlines().
std::vector<std::string> SplitLines(std::string_view text) {
  std::vector<std::string> lines;
  std::string line;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, offset, &length);
    const bool breaks = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                        c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (breaks) {
      lines.push_back(std::move(line));
      line.clear();
      if (c == '\r' && offset + 1 < text.size() && text[offset + 1] == '\n') ++length;
    } else {
      line.append(text.substr(offset, length));
    }
    offset += length;
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

absl::StatusOr<Value> FilterIndent(Interpreter& interpreter, const Value& value,
                                   const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("indent", {"width", "first", "blank"}));
  std::string indention = "    ";
  if (bound[0].has_value()) {
    const Value& width = *bound[0];
    if (width.is_string()) {
      indention = width.AsString();
    } else {
      LMSERVE_ASSIGN_OR_RETURN(int64_t n, RequireInt(width, "indent() width"));
      indention = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 1024)), ' ');
    }
  }
  const bool first = bound[1].has_value() && Truthy(*bound[1]);
  const bool blank = bound[2].has_value() && Truthy(*bound[2]);
  std::vector<std::string> lines = SplitLines(ToStr(value) + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
    LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(out.size())));
  }
  if (first) out = indention + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterWordCount(Interpreter&, const Value& value, const CallArgs&) {
  // len(re.findall(r"\w+", s)) with ASCII word characters; other code points count as letters.
  const std::string text = ToStr(value);
  int64_t words = 0;
  bool in_word = false;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool word = std::isalnum(u) || c == '_' || u >= 0x80;
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::Int(words);
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(Interpreter& interpreter, const Value& value,
                                     const CallArgs& args, bool by_attribute, bool select) {
  std::vector<Value> positional = args.positional;
  std::optional<Value> attribute;
  if (by_attribute) {
    if (positional.empty()) return TypeError("Missing parameter for attribute name");
    attribute = positional.front();
    positional.erase(positional.begin());
  }
  std::optional<std::string> test;
  if (!positional.empty()) {
    LMSERVE_ASSIGN_OR_RETURN(std::string name, RequireString(positional.front(), "test name"));
    test = name;
    positional.erase(positional.begin());
  }
  CallArgs test_args;
  test_args.positional = std::move(positional);
  test_args.keyword = args.keyword;
  // jinja2 iterates only a truthy sequence: none|selectattr(...) is empty, not an error.
  if (!Truthy(value)) return Value::MakeList({});
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(items->size())));
  List out;
  for (const Value& item : *items) {
    Value subject = item;
    if (attribute.has_value()) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      subject = std::move(field);
    }
    bool passes;
    if (test.has_value()) {
      LMSERVE_ASSIGN_OR_RETURN(bool result, interpreter.ApplyTest(*test, subject, test_args));
      passes = result;
    } else {
      passes = Truthy(subject);
    }
    if (passes == select) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterSelect(Interpreter& i, const Value& v, const CallArgs& a) {
  return SelectOrReject(i, v, a, false, true);
}
absl::StatusOr<Value> FilterReject(Interpreter& i, const Value& v, const CallArgs& a) {
  return SelectOrReject(i, v, a, false, false);
}
absl::StatusOr<Value> FilterSelectAttr(Interpreter& i, const Value& v, const CallArgs& a) {
  return SelectOrReject(i, v, a, true, true);
}
absl::StatusOr<Value> FilterRejectAttr(Interpreter& i, const Value& v, const CallArgs& a) {
  return SelectOrReject(i, v, a, true, false);
}

absl::StatusOr<Value> FilterMap(Interpreter& interpreter, const Value& value,
                                const CallArgs& args) {
  if (!Truthy(value)) return Value::MakeList({});  // as select: none|map(...) is empty
  LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(value));
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(items->size())));
  List out;
  if (args.positional.empty()) {
    // map(attribute=..., default=...)
    std::optional<Value> attribute;
    std::optional<Value> fallback;
    for (const auto& [name, argument] : args.keyword) {
      if (name == "attribute") {
        attribute = argument;
      } else if (name == "default") {
        fallback = argument;
      } else {
        return TypeError(StrCat("Unexpected keyword argument '", name, "'"));
      }
    }
    if (!attribute.has_value()) return TypeError("map requires a filter argument");
    for (const Value& item : *items) {
      LMSERVE_ASSIGN_OR_RETURN(Value field, GetAttributePath(interpreter, item, *attribute));
      if (field.is_undefined() && fallback.has_value() && !fallback->is_none()) {
        field = *fallback;
      }
      out.push_back(std::move(field));
    }
    return Value::MakeList(std::move(out));
  }
  LMSERVE_ASSIGN_OR_RETURN(std::string filter,
                           RequireString(args.positional.front(), "filter name"));
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const Value& item : *items) {
    LMSERVE_ASSIGN_OR_RETURN(Value mapped, interpreter.ApplyFilter(filter, item, filter_args));
    out.push_back(std::move(mapped));
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterAttr(Interpreter& interpreter, const Value& value,
                                 const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("attr", {"name"}));
  if (!bound[0].has_value()) return TypeError("attr() needs a name");
  // Python's getattr only: a dict's keys are not its attributes (its methods are).
  const std::string name = ToStr(*bound[0]);
  if (value.is_undefined()) return TypeError(value.undefined_hint());
  if (HasMethod(value, name)) return BoundMethod(value, name);
  if (value.is_namespace()) return interpreter.GetAttr(value, name);
  return Value::Undefined(StrCat("'", TypeName(value), " object' has no attribute '", name, "'"));
}

struct NamedFilter {
  std::string_view name;
  FilterFunction function;
};

constexpr NamedFilter kFilters[] = {
    {"abs", FilterAbs},
    {"attr", FilterAttr},
    {"capitalize", FilterStringMap<PyCapitalize>},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictSort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"forceescape", FilterEscape},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterStringMap<PyLower>},
    {"map", FilterMap},
    {"max", FilterMax},
    {"min", FilterMin},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectAttr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectAttr},
    {"sort", FilterSort},
    {"string", FilterString},
    {"sum", FilterSum},
    {"title", FilterStringMap<JinjaTitle>},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"unique", FilterUnique},
    {"upper", FilterStringMap<PyUpper>},
    {"wordcount", FilterWordCount},
};

// ---- Tests -------------------------------------------------------------------------------------

absl::StatusOr<Value> OneArgument(std::string_view test, const CallArgs& args) {
  if (args.positional.size() + args.keyword.size() != 1) {
    return TypeError(StrCat("test '", test, "' takes one argument"));
  }
  return args.positional.empty() ? args.keyword.front().second : args.positional.front();
}

absl::StatusOr<bool> TestDefined(Interpreter&, const Value& v, const CallArgs&) {
  return !v.is_undefined();
}
absl::StatusOr<bool> TestUndefined(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_undefined();
}
absl::StatusOr<bool> TestNone(Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); }
absl::StatusOr<bool> TestBoolean(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_bool();
}
absl::StatusOr<bool> TestTrue(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_bool() && v.AsBool();
}
absl::StatusOr<bool> TestFalse(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_bool() && !v.AsBool();
}
absl::StatusOr<bool> TestInteger(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_int();
}
absl::StatusOr<bool> TestFloat(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_float();
}
absl::StatusOr<bool> TestNumber(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_number();
}
absl::StatusOr<bool> TestString(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string();
}
absl::StatusOr<bool> TestMapping(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_dict();
}
// Undefined iterates (as empty) and has a length, so jinja2 calls it iterable and a sequence.
absl::StatusOr<bool> TestIterable(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
absl::StatusOr<bool> TestSequence(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
absl::StatusOr<bool> TestCallable(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_callable();
}
absl::StatusOr<bool> TestEscaped(Interpreter&, const Value&, const CallArgs&) { return false; }

absl::StatusOr<bool> TestSameAs(Interpreter&, const Value& v, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Value other, OneArgument("sameas", args));
  if (v.type() != other.type()) return false;
  switch (v.type()) {
    case Value::Type::kNone:
    case Value::Type::kUndefined:
      return v.is_none();
    case Value::Type::kBool:
      return v.AsBool() == other.AsBool();
    case Value::Type::kInt:  // CPython caches small ints
      return v.AsInt() == other.AsInt() && v.AsInt() >= -5 && v.AsInt() <= 256;
    case Value::Type::kList:
      return v.ListPointer() == other.ListPointer();
    case Value::Type::kDict:
      return &v.AsDict() == &other.AsDict();
    case Value::Type::kNamespace:
      return &v.AsNamespace() == &other.AsNamespace();
    case Value::Type::kCallable:
      return &v.AsCallable() == &other.AsCallable();
    default:
      return false;
  }
}

absl::StatusOr<bool> TestIn(Interpreter&, const Value& v, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Value container, OneArgument("in", args));
  return Contains(container, v);
}

template <int kOp>  // 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >=
absl::StatusOr<bool> TestCompare(Interpreter&, const Value& v, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Value other, OneArgument("comparison", args));
  if (kOp == 0) return Equals(v, other);
  if (kOp == 1) return !Equals(v, other);
  if (v.is_undefined()) return TypeError(v.undefined_hint());
  absl::StatusOr<int> c = Compare(v, other);
  if (!c.ok()) return TypeError(StrCat("'<' ", c.status().message()));
  if (kOp == 2) return *c < 0;
  if (kOp == 3) return *c <= 0;
  if (kOp == 4) return *c > 0;
  return *c >= 0;
}

absl::StatusOr<bool> DivisibleBy(const Value& v, const Value& divisor) {
  if (!v.is_number() || !divisor.is_number()) {
    return TypeError(StrCat("unsupported operand type(s) for %: '", TypeName(v), "' and '",
                            TypeName(divisor), "'"));
  }
  LMSERVE_ASSIGN_OR_RETURN(Value remainder, PyMod(v, divisor));
  return Equals(remainder, Value::Int(0));
}

absl::StatusOr<bool> TestEven(Interpreter&, const Value& v, const CallArgs&) {
  return DivisibleBy(v, Value::Int(2));
}
absl::StatusOr<bool> TestOdd(Interpreter&, const Value& v, const CallArgs&) {
  LMSERVE_ASSIGN_OR_RETURN(bool even, DivisibleBy(v, Value::Int(2)));
  return !even;
}
absl::StatusOr<bool> TestDivisibleBy(Interpreter&, const Value& v, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Value divisor, OneArgument("divisibleby", args));
  return DivisibleBy(v, divisor);
}

// str.islower() / isupper(): some cased character, and none of the other case.
absl::StatusOr<bool> TestLower(Interpreter&, const Value& v, const CallArgs&) {
  const std::string text = ToStr(v);
  bool cased = false;
  for (const char c : text) {
    if (c >= 'A' && c <= 'Z') return false;
    if (c >= 'a' && c <= 'z') cased = true;
  }
  return cased;
}
absl::StatusOr<bool> TestUpper(Interpreter&, const Value& v, const CallArgs&) {
  const std::string text = ToStr(v);
  bool cased = false;
  for (const char c : text) {
    if (c >= 'a' && c <= 'z') return false;
    if (c >= 'A' && c <= 'Z') cased = true;
  }
  return cased;
}

struct NamedTest {
  std::string_view name;
  TestFunction function;
};

constexpr NamedTest kTests[] = {
    {"!=", TestCompare<1>},     {"<", TestCompare<2>},
    {"<=", TestCompare<3>},     {"==", TestCompare<0>},
    {">", TestCompare<4>},      {">=", TestCompare<5>},
    {"boolean", TestBoolean},   {"callable", TestCallable},
    {"defined", TestDefined},   {"divisibleby", TestDivisibleBy},
    {"eq", TestCompare<0>},     {"equalto", TestCompare<0>},
    {"escaped", TestEscaped},   {"even", TestEven},
    {"false", TestFalse},       {"float", TestFloat},
    {"ge", TestCompare<5>},     {"greaterthan", TestCompare<4>},
    {"gt", TestCompare<4>},     {"in", TestIn},
    {"integer", TestInteger},   {"iterable", TestIterable},
    {"le", TestCompare<3>},     {"lessthan", TestCompare<2>},
    {"lower", TestLower},       {"lt", TestCompare<2>},
    {"mapping", TestMapping},   {"ne", TestCompare<1>},
    {"none", TestNone},         {"number", TestNumber},
    {"odd", TestOdd},           {"sameas", TestSameAs},
    {"sequence", TestSequence}, {"string", TestString},
    {"true", TestTrue},         {"undefined", TestUndefined},
    {"upper", TestUpper},
};

// ---- Methods -----------------------------------------------------------------------------------

constexpr std::string_view kStringMethods[] = {
    "capitalize", "count",      "endswith",   "find",  "format", "isalnum", "isalpha", "isdigit",
    "islower",    "isspace",    "isupper",    "join",  "lower",  "lstrip",  "replace", "rstrip",
    "split",      "splitlines", "startswith", "strip", "title",  "upper",
};
constexpr std::string_view kDictMethods[] = {"get", "items", "keys", "values"};

absl::StatusOr<std::optional<std::string>> OptionalStringArg(const std::optional<Value>& arg,
                                                             std::string_view what) {
  std::optional<Value> given = Given(arg);
  if (!given.has_value()) return std::optional<std::string>();
  LMSERVE_ASSIGN_OR_RETURN(std::string text, RequireString(*given, what));
  return std::optional<std::string>(text);
}

// startswith / endswith with a str or a tuple of str.
absl::StatusOr<bool> AffixMatch(const std::string& text, const Value& affix, bool prefix) {
  const auto matches = [&](const std::string& candidate) {
    if (candidate.size() > text.size()) return false;
    return prefix ? text.compare(0, candidate.size(), candidate) == 0
                  : text.compare(text.size() - candidate.size(), candidate.size(), candidate) == 0;
  };
  if (affix.is_string()) return matches(affix.AsString());
  if (affix.is_list()) {
    for (const Value& candidate : affix.AsList()) {
      if (!candidate.is_string()) return TypeError("tuple for startswith must only contain str");
      if (matches(candidate.AsString())) return true;
    }
    return false;
  }
  return TypeError(StrCat(prefix ? "startswith" : "endswith",
                          " first arg must be str or a tuple of str, not ", TypeName(affix)));
}

template <typename Predicate>
bool AllCodePoints(const std::string& text, Predicate predicate) {
  if (text.empty()) return false;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    if (!predicate(DecodeUtf8At(text, offset, &length))) return false;
    offset += length;
  }
  return true;
}

// str.format with "{}", "{0}", "{name}", "{{" and "}}"; format specs and conversions unsupported.
absl::StatusOr<Value> StringFormat(Interpreter& interpreter, const std::string& text,
                                   const CallArgs& args) {
  std::string out;
  size_t next_auto = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '}') {
      if (i + 1 < text.size() && text[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return TypeError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = text.find('}', i);
    if (close == std::string::npos) return TypeError("Single '{' encountered in format string");
    const std::string field = text.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      return TypeError("str.format() specs and conversions are not supported");
    }
    const Value* argument = nullptr;
    if (field.empty()) {
      if (next_auto >= args.positional.size()) return TypeError("Replacement index out of range");
      argument = &args.positional[next_auto++];
    } else if (std::optional<int64_t> index = ParseInt<int64_t>(field)) {
      if (*index < 0 || *index >= static_cast<int64_t>(args.positional.size())) {
        return TypeError("Replacement index out of range");
      }
      argument = &args.positional[*index];
    } else {
      for (const auto& [name, value] : args.keyword) {
        if (name == field) argument = &value;
      }
      if (argument == nullptr) return TypeError(StrCat("KeyError: '", field, "'"));
    }
    out += ToStr(*argument);
    LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(out.size())));
    i = close;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> CallStringMethod(Interpreter& interpreter, const std::string& text,
                                       std::string_view name, const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind(name, {"chars"}));
    LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> chars,
                             OptionalStringArg(bound[0], StrCat(name, " arg")));
    const StripSide side = name == "strip"
                               ? StripSide::kBoth
                               : (name == "lstrip" ? StripSide::kLeft : StripSide::kRight);
    return Value::String(PyStrip(text, chars, side));
  }
  if (name == "split") {
    LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind(name, {"sep", "maxsplit"}));
    LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> separator,
                             OptionalStringArg(bound[0], "split() separator"));
    if (separator.has_value() && separator->empty()) return TypeError("empty separator");
    int64_t max_split = -1;
    if (bound[1].has_value()) {
      LMSERVE_ASSIGN_OR_RETURN(int64_t n, RequireInt(*bound[1], "split() maxsplit"));
      max_split = n;
    }
    std::optional<std::string_view> separator_view;
    if (separator.has_value()) separator_view = *separator;
    List parts;
    for (std::string& part : PySplit(text, separator_view, max_split)) {
      parts.push_back(Value::String(std::move(part)));
    }
    LMSERVE_RETURN_IF_ERROR(interpreter.Spend(static_cast<int64_t>(parts.size())));
    return Value::MakeList(std::move(parts));
  }
  if (name == "splitlines") {
    List parts;
    for (std::string& part : SplitLines(text)) parts.push_back(Value::String(std::move(part)));
    return Value::MakeList(std::move(parts));
  }
  if (name == "startswith" || name == "endswith") {
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      return TypeError(StrCat(name, "() takes exactly one argument"));
    }
    LMSERVE_ASSIGN_OR_RETURN(bool matches,
                             AffixMatch(text, args.positional.front(), name == "startswith"));
    return Value::Bool(matches);
  }
  if (name == "upper") return Value::String(PyUpper(text));
  if (name == "lower") return Value::String(PyLower(text));
  if (name == "title") return Value::String(PyTitle(text));
  if (name == "capitalize") return Value::String(PyCapitalize(text));
  if (name == "replace") {
    LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind(name, {"old", "new", "count"}));
    if (!bound[0].has_value() || !bound[1].has_value()) {
      return TypeError("replace() needs the old and the new string");
    }
    LMSERVE_ASSIGN_OR_RETURN(std::string from, RequireString(*bound[0], "replace() argument 1"));
    LMSERVE_ASSIGN_OR_RETURN(std::string to, RequireString(*bound[1], "replace() argument 2"));
    CallArgs filter_args;
    filter_args.positional = {Value::String(from), Value::String(to)};
    if (bound[2].has_value()) filter_args.positional.push_back(*bound[2]);
    return FilterReplace(interpreter, Value::String(text), filter_args);
  }
  if (name == "find" || name == "count") {
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      return TypeError(StrCat(name, "() takes exactly one argument"));
    }
    LMSERVE_ASSIGN_OR_RETURN(std::string needle,
                             RequireString(args.positional.front(), "argument"));
    if (name == "find") {
      const size_t found = text.find(needle);
      if (found == std::string::npos) return Value::Int(-1);
      return Value::Int(CodePointCount(std::string_view(text).substr(0, found)));
    }
    if (needle.empty()) return Value::Int(CodePointCount(text) + 1);
    return Value::Int(static_cast<int64_t>(PySplit(text, needle, -1).size()) - 1);
  }
  if (name == "join") {
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      return TypeError("join() takes exactly one argument");
    }
    LMSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const List> items, Iterate(args.positional.front()));
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      const Value& item = (*items)[i];
      if (!item.is_string()) {
        return TypeError(
            StrCat("sequence item ", i, ": expected str instance, ", TypeName(item), " found"));
      }
      if (i > 0) out += text;
      out += item.AsString();
      LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(out.size())));
    }
    return Value::String(std::move(out));
  }
  if (name == "format") return StringFormat(interpreter, text, args);
  if (name == "isdigit") {
    return Value::Bool(AllCodePoints(text, [](char32_t c) { return c >= '0' && c <= '9'; }));
  }
  if (name == "isalpha" || name == "isalnum") {
    const bool digits = name == "isalnum";
    return Value::Bool(AllCodePoints(text, [digits](char32_t c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (digits && c >= '0' && c <= '9') ||
             (c >= 0xC0 && c != 0xD7 && c != 0xF7 && c != 0xFFFFFFFF && !IsPySpace(c));
    }));
  }
  if (name == "isspace") return Value::Bool(AllCodePoints(text, IsPySpace));
  if (name == "islower" || name == "isupper") {
    CallArgs none;
    LMSERVE_ASSIGN_OR_RETURN(bool result, name == "islower"
                                              ? TestLower(interpreter, Value::String(text), none)
                                              : TestUpper(interpreter, Value::String(text), none));
    return Value::Bool(result);
  }
  return TypeError(StrCat("'str' object has no attribute '", name, "'"));
}

absl::StatusOr<Value> CallDictMethod(const Value& dict, std::string_view name,
                                     const CallArgs& args) {
  if (name == "get") {
    LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("get", {"key", "default"}));
    if (!bound[0].has_value()) return TypeError("get expected at least 1 argument, got 0");
    const Value* found = dict.AsDict().Find(*bound[0]);
    if (found != nullptr) return *found;
    return (bound)[1].value_or(Value::None());
  }
  if (!args.positional.empty() || !args.keyword.empty()) {
    return TypeError(StrCat(name, "() takes no arguments"));
  }
  if (name == "items") return DictItems(dict);
  List out;
  for (const auto& [key, item] : dict.AsDict().entries())
    out.push_back(name == "keys" ? key : item);
  return Value::MakeList(std::move(out));
}

class MethodCallable : public Callable {
 public:
  MethodCallable(Value object, std::string name)
      : object_(std::move(object)), name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  absl::StatusOr<Value> Call(Interpreter& interpreter, const CallArgs& args) const override {
    return CallMethod(interpreter, object_, name_, args);
  }

 private:
  Value object_;
  std::string name_;
};

// ---- Globals -----------------------------------------------------------------------------------

using GlobalFunction = absl::StatusOr<Value> (*)(Interpreter&, const CallArgs&);

class GlobalCallable : public Callable {
 public:
  GlobalCallable(std::string_view name, GlobalFunction function)
      : name_(name), function_(function) {}
  std::string_view name() const override { return name_; }
  absl::StatusOr<Value> Call(Interpreter& interpreter, const CallArgs& args) const override {
    return function_(interpreter, args);
  }

 private:
  std::string_view name_;
  GlobalFunction function_;
};

absl::StatusOr<Value> GlobalRange(Interpreter& interpreter, const CallArgs& args) {
  if (!args.keyword.empty()) return TypeError("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) {
    return TypeError("range expected 1 to 3 arguments");
  }
  std::vector<int64_t> numbers;
  for (const Value& argument : args.positional) {
    LMSERVE_ASSIGN_OR_RETURN(int64_t n, RequireInt(argument, "range() argument"));
    numbers.push_back(n);
  }
  int64_t start = 0;
  int64_t stop = numbers[0];
  int64_t step = 1;
  if (numbers.size() >= 2) {
    start = numbers[0];
    stop = numbers[1];
  }
  if (numbers.size() == 3) step = numbers[2];
  if (step == 0) return TypeError("range() arg 3 must not be zero");
  // Length without overflow: ceil((stop - start) / step) when positive.
  const long double span = static_cast<long double>(stop) - static_cast<long double>(start);
  const long double count_estimate = std::ceil(span / static_cast<long double>(step));
  if (count_estimate > kMaxRange) {
    return absl::InvalidArgumentError(
        "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  const int64_t count = count_estimate > 0 ? static_cast<int64_t>(count_estimate) : 0;
  LMSERVE_RETURN_IF_ERROR(interpreter.Spend(count));
  List items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) items.push_back(Value::Int(start + i * step));
  return Value::MakeList(std::move(items));
}

// dict(mapping) / dict(**kwargs) as the attributes of a namespace or a new dict.
absl::StatusOr<Dict> DictFromArgs(std::string_view function, const CallArgs& args) {
  Dict dict;
  if (args.positional.size() > 1) {
    return TypeError(StrCat(function, "() takes at most one positional argument"));
  }
  if (!args.positional.empty()) {
    const Value& source = args.positional.front();
    if (source.is_dict()) {
      dict = source.AsDict();
    } else if (source.is_list()) {
      for (const Value& pair : source.AsList()) {
        if (!pair.is_list() || pair.AsList().size() != 2) {
          return TypeError(StrCat(function, "() sequence elements must be pairs"));
        }
        dict.Set(pair.AsList()[0], pair.AsList()[1]);
      }
    } else if (!source.is_undefined()) {
      return TypeError(StrCat("'", TypeName(source), "' object is not iterable"));
    }
  }
  for (const auto& [name, value] : args.keyword) dict.Set(name, value);
  return dict;
}

absl::StatusOr<Value> GlobalNamespace(Interpreter& interpreter, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Dict attributes, DictFromArgs("namespace", args));
  Value ns = Value::MakeNamespace();
  ns.AsNamespace().attributes = std::move(attributes);
  interpreter.TrackNamespace(ns);
  return ns;
}

absl::StatusOr<Value> GlobalDict(Interpreter&, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Dict dict, DictFromArgs("dict", args));
  return Value::MakeDict(std::move(dict));
}

absl::StatusOr<Value> GlobalRaiseException(Interpreter&, const CallArgs& args) {
  std::string message;
  if (!args.positional.empty()) message = ToStr(args.positional.front());
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kRaisedPayload, absl::Cord("1"));
  return status;
}

absl::StatusOr<Value> GlobalStrftimeNow(Interpreter& interpreter, const CallArgs& args) {
  LMSERVE_ASSIGN_OR_RETURN(Bound bound, args.Bind("strftime_now", {"format"}));
  if (!bound[0].has_value()) return TypeError("strftime_now() needs a format");
  LMSERVE_ASSIGN_OR_RETURN(std::string format, RequireString(*bound[0], "strftime_now() format"));
  if (format.size() > 1024) return TypeError("strftime_now() format too long");
  const auto& clock = interpreter.options().now;
  const std::chrono::system_clock::time_point now =
      clock ? clock() : std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm local{};
  localtime_r(&seconds, &local);
  if (format.empty()) return Value::String("");
  // strftime returns 0 both for "too small" and for an empty result: grow a few times.
  for (size_t capacity = 256; capacity <= 65536; capacity *= 4) {
    std::string buffer(capacity, '\0');
    const size_t written = std::strftime(buffer.data(), buffer.size(), format.c_str(), &local);
    if (written > 0) {
      buffer.resize(written);
      return Value::String(std::move(buffer));
    }
  }
  return Value::String("");
}

struct NamedGlobal {
  std::string_view name;
  GlobalFunction function;
};

constexpr NamedGlobal kGlobals[] = {
    {"dict", GlobalDict},
    {"namespace", GlobalNamespace},
    {"raise_exception", GlobalRaiseException},
    {"range", GlobalRange},
    {"strftime_now", GlobalStrftimeNow},
};

}  // namespace

// ---- Shared with the interpreter -------------------------------------------------

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kString:
      if (!item.is_string()) {
        return TypeError(
            StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.AsString().find(item.AsString()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& element : container.AsList()) {
        if (Equals(element, item)) return true;
      }
      return false;
    case Value::Type::kDict:
      return container.AsDict().Find(item) != nullptr;
    case Value::Type::kUndefined:
      return false;
    default:
      return TypeError(StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<Value> PyMod(const Value& a, const Value& b) {
  if (a.is_float() || b.is_float()) {
    const double x = a.AsDouble();
    const double y = b.AsDouble();
    if (y == 0) return TypeError("float modulo");
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Float(r);
  }
  const int64_t x = a.AsInt();
  const int64_t y = b.AsInt();
  if (y == 0) return TypeError("integer division or modulo by zero");
  if (y == -1) return Value::Int(0);
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value::Int(r);
}

FilterFunction FindFilter(std::string_view name) {
  for (const NamedFilter& filter : kFilters) {
    if (filter.name == name) return filter.function;
  }
  return nullptr;
}

TestFunction FindTest(std::string_view name) {
  for (const NamedTest& test : kTests) {
    if (test.name == name) return test.function;
  }
  return nullptr;
}

bool HasMethod(const Value& object, std::string_view name) {
  if (object.is_string()) {
    return std::find(std::begin(kStringMethods), std::end(kStringMethods), name) !=
           std::end(kStringMethods);
  }
  if (object.is_dict()) {
    return std::find(std::begin(kDictMethods), std::end(kDictMethods), name) !=
           std::end(kDictMethods);
  }
  return false;
}

absl::StatusOr<Value> CallMethod(Interpreter& interpreter, const Value& object,
                                 std::string_view name, const CallArgs& args) {
  if (object.is_string()) return CallStringMethod(interpreter, object.AsString(), name, args);
  return CallDictMethod(object, name, args);
}

Value BoundMethod(const Value& object, std::string_view name) {
  return Value::MakeCallable(std::make_shared<MethodCallable>(object, std::string(name)));
}

void AddGlobals(Dict* globals) {
  for (const NamedGlobal& global : kGlobals) {
    globals->Set(global.name, Value::MakeCallable(
                                  std::make_shared<GlobalCallable>(global.name, global.function)));
  }
}

}  // namespace lmserve::engine::jinja
