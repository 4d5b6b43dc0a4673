#include "engine/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/chat/jinja/pystr.h"

namespace lmserve::engine::jinja {

Value Value::Undefined(std::string hint) {
  return Value(Type::kUndefined, std::make_shared<const std::string>(std::move(hint)));
}
Value Value::None() { return Value(Type::kNone, std::monostate()); }
Value Value::Bool(bool value) { return Value(Type::kBool, value); }
Value Value::Int(int64_t value) { return Value(Type::kInt, value); }
Value Value::Float(double value) { return Value(Type::kFloat, value); }
Value Value::String(std::string value) {
  return Value(Type::kString, std::make_shared<const std::string>(std::move(value)));
}

const std::string& Value::undefined_hint() const {
  static const std::string* const kNoHint = new std::string();
  const Text* text = std::get_if<Text>(&data_);
  return text != nullptr && *text != nullptr ? **text : *kNoHint;
}
namespace {
uint16_t ChildHeight(int child) { return static_cast<uint16_t>(std::min(child + 1, 65535)); }
}  // namespace

Value Value::MakeList(List items) {
  int height = 0;
  for (const Value& item : items) height = std::max(height, item.height());
  Value value(Type::kList, std::make_shared<const List>(std::move(items)));
  value.height_ = ChildHeight(height);
  return value;
}
Value Value::MakeTuple(List items) {
  Value value = MakeList(std::move(items));
  value.tuple_ = true;
  return value;
}
Value Value::MakeDict(Dict dict) {
  int height = 0;
  for (const auto& [key, item] : dict.entries()) {
    height = std::max({height, key.height(), item.height()});
  }
  Value value(Type::kDict, std::make_shared<const Dict>(std::move(dict)));
  value.height_ = ChildHeight(height);
  return value;
}
Value Value::MakeNamespace() { return Value(Type::kNamespace, std::make_shared<Namespace>()); }
Value Value::MakeCallable(std::shared_ptr<const Callable> callable) {
  return Value(Type::kCallable, std::move(callable));
}

int64_t Value::AsInt() const {
  if (type_ == Type::kBool) return AsBool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::AsDouble() const {
  if (type_ == Type::kFloat) return std::get<double>(data_);
  return static_cast<double>(AsInt());
}

// ---- Dict --------------------------------------------------------------------------------------

const Value* Dict::Find(const Value& key) const {
  for (const Entry& entry : entries_) {
    if (Equals(entry.first, key)) return &entry.second;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const Entry& entry : entries_) {
    if (entry.first.is_string() && entry.first.AsString() == key) return &entry.second;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (Entry& entry : entries_) {
    if (Equals(entry.first, key)) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// ---- CallArgs ----------------------------------------------------------------------------------

absl::StatusOr<std::vector<std::optional<Value>>> CallArgs::Bind(
    std::string_view function, const std::vector<std::string_view>& names) const {
  if (positional.size() > names.size()) {
    return absl::InvalidArgumentError(StrCat(function, "() takes at most ", names.size(),
                                             " argument(s) (", positional.size(), " given)"));
  }
  std::vector<std::optional<Value>> bound(names.size());
  for (size_t i = 0; i < positional.size(); ++i) bound[i] = positional[i];
  for (const auto& [name, value] : keyword) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      return absl::InvalidArgumentError(
          StrCat(function, "() got an unexpected keyword argument '", name, "'"));
    }
    std::optional<Value>& slot = bound[it - names.begin()];
    if (slot.has_value()) {
      return absl::InvalidArgumentError(
          StrCat(function, "() got multiple values for argument '", name, "'"));
    }
    slot = value;
  }
  return bound;
}

// ---- Python semantics --------------------------------------------------------------------------

std::string_view TypeName(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kList:
      return value.is_tuple() ? "tuple" : "list";
    case Value::Type::kDict:
      return "dict";
    case Value::Type::kNamespace:
      return "Namespace";
    case Value::Type::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return value.AsBool();
    case Value::Type::kInt:
      return value.AsInt() != 0;
    case Value::Type::kFloat:
      return value.AsDouble() != 0.0;
    case Value::Type::kString:
      return !value.AsString().empty();
    case Value::Type::kList:
      return !value.AsList().empty();
    case Value::Type::kDict:
      return !value.AsDict().empty();
    case Value::Type::kNamespace:
    case Value::Type::kCallable:
      return true;
  }
  return false;
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    return a.AsInt() == b.AsInt();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.AsString() == b.AsString();
    case Value::Type::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List& x = a.AsList();
      const List& y = b.AsList();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      const Dict& x = a.AsDict();
      const Dict& y = b.AsDict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case Value::Type::kNamespace:
      return &a.AsNamespace() == &b.AsNamespace();
    case Value::Type::kCallable:
      return &a.AsCallable() == &b.AsCallable();
    default:
      return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.AsDouble();
      const double y = b.AsDouble();
      return x < y ? -1 : (y < x ? 1 : 0);
    }
    const int64_t x = a.AsInt();
    const int64_t y = b.AsInt();
    return x < y ? -1 : (y < x ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.AsString().compare(b.AsString());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List& x = a.AsList();
    const List& y = b.AsList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      StrCat("not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
}

std::string FloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string_view text(buffer, result.ptr - buffer);  // "-1.2345e+02"
  std::string out;
  size_t i = 0;
  if (text[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  const size_t e = text.find('e');
  std::string digits;
  for (size_t j = i; j < e; ++j) {
    if (text[j] != '.') digits.push_back(text[j]);
  }
  const int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      const size_t integer_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= integer_digits) {
        out += digits;
        out.append(integer_digits - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, integer_digits);
        out += '.';
        out += digits.substr(integer_digits);
      }
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof(exponent_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  out += exponent_text;
  return out;
}

namespace {

// Python's str.isprintable() for code points above ASCII, approximated: C1 controls, the
// no-break and other separators, format characters and unassigned-by-design code points are not.
bool IsPrintableNonAscii(char32_t c) {
  if (c == 0xFFFFFFFF) return true;  // an invalid byte, kept as it is
  if (c < 0xA1) return false;        // C1 controls and U+00A0
  if (c == 0xAD) return false;
  if (c >= 0x2000 && c <= 0x200F) return false;
  if (c >= 0x2028 && c <= 0x202F) return false;
  if (c >= 0x205F && c <= 0x206F) return false;
  if (c == 0x3000 || c == 0xFEFF || c == 0x1680) return false;
  if (c >= 0xFFF0 && c <= 0xFFFB) return false;
  if (c >= 0xD800 && c <= 0xDFFF) return false;
  if (c >= 0xE000 && c <= 0xF8FF) return false;  // private use
  return true;
}

void AppendHex(char32_t c, int width, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = (width - 1) * 4; shift >= 0; shift -= 4) out->push_back(kHex[(c >> shift) & 15]);
}

void AppendStringRepr(std::string_view text, std::string* out) {
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, offset, &length);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out->append("\\t");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c < 0x20 || c == 0x7F) {
      out->append("\\x");
      AppendHex(c, 2, out);
    } else if (c < 0x7F || IsPrintableNonAscii(c)) {
      out->append(text.substr(offset, length));
    } else if (c < 0x100) {
      out->append("\\x");
      AppendHex(c, 2, out);
    } else if (c < 0x10000) {
      out->append("\\u");
      AppendHex(c, 4, out);
    } else {
      out->append("\\U");
      AppendHex(c, 8, out);
    }
    offset += length;
  }
  out->push_back(quote);
}

void AppendRepr(const Value& value, std::string* out, int depth = 0);

void AppendStr(const Value& value, std::string* out) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return;
    case Value::Type::kNone:
      out->append("None");
      return;
    case Value::Type::kBool:
      out->append(value.AsBool() ? "True" : "False");
      return;
    case Value::Type::kInt:
      out->append(std::to_string(value.AsInt()));
      return;
    case Value::Type::kFloat:
      out->append(FloatRepr(value.AsDouble()));
      return;
    case Value::Type::kString:
      out->append(value.AsString());
      return;
    default:
      AppendRepr(value, out);
  }
}

// `depth` bounds the recursion through namespaces, which may nest (or contain themselves).
void AppendRepr(const Value& value, std::string* out, int depth) {
  if (depth > 200) {
    out->append("...");
    return;
  }
  switch (value.type()) {
    case Value::Type::kString:
      AppendStringRepr(value.AsString(), out);
      return;
    case Value::Type::kList: {
      const List& items = value.AsList();
      out->push_back(value.is_tuple() ? '(' : '[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(", ");
        AppendRepr(items[i], out, depth + 1);
      }
      if (value.is_tuple() && items.size() == 1) out->push_back(',');
      out->push_back(value.is_tuple() ? ')' : ']');
      return;
    }
    case Value::Type::kDict: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.AsDict().entries()) {
        if (!first) out->append(", ");
        first = false;
        AppendRepr(key, out, depth + 1);
        out->append(": ");
        AppendRepr(item, out, depth + 1);
      }
      out->push_back('}');
      return;
    }
    case Value::Type::kNamespace: {
      out->append("<Namespace ");
      AppendRepr(Value::MakeDict(value.AsNamespace().attributes), out, depth + 1);
      out->push_back('>');
      return;
    }
    case Value::Type::kCallable:
      out->append(StrCat("<function ", value.AsCallable().name(), ">"));
      return;
    default:
      AppendStr(value, out);
  }
}

void AppendJsonString(std::string_view text, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, offset, &length);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
          out->append("\\u");
          AppendHex(c, 4, out);
        } else if (!ensure_ascii || c < 0x80 || c == 0xFFFFFFFF) {
          out->append(text.substr(offset, length));
        } else if (c < 0x10000) {
          out->append("\\u");
          AppendHex(c, 4, out);
        } else {
          const char32_t v = c - 0x10000;
          out->append("\\u");
          AppendHex(0xD800 + (v >> 10), 4, out);
          out->append("\\u");
          AppendHex(0xDC00 + (v & 0x3FF), 4, out);
        }
    }
    offset += length;
  }
  out->push_back('"');
}

std::string JsonFloat(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  return FloatRepr(value);
}

absl::StatusOr<std::string> JsonKey(const Value& key) {
  switch (key.type()) {
    case Value::Type::kString:
      return key.AsString();
    case Value::Type::kInt:
      return std::to_string(key.AsInt());
    case Value::Type::kFloat:
      return JsonFloat(key.AsDouble());
    case Value::Type::kBool:
      return std::string(key.AsBool() ? "true" : "false");
    case Value::Type::kNone:
      return std::string("null");
    default:
      return absl::InvalidArgumentError(
          StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
  }
}

absl::Status AppendJson(const Value& value, const JsonFormat& format, int depth, std::string* out) {
  if (depth > 256) return absl::InvalidArgumentError("tojson: nesting too deep");
  const std::string item_separator =
      format.separators ? format.separators->first : (format.indent ? "," : ", ");
  const std::string key_separator = format.separators ? format.separators->second : ": ";
  const auto newline = [&](int level) {
    if (!format.indent) return;
    out->push_back('\n');
    for (int i = 0; i < level; ++i) out->append(*format.indent);
  };
  switch (value.type()) {
    case Value::Type::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Type::kBool:
      out->append(value.AsBool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Type::kInt:
      out->append(std::to_string(value.AsInt()));
      return absl::OkStatus();
    case Value::Type::kFloat:
      out->append(JsonFloat(value.AsDouble()));
      return absl::OkStatus();
    case Value::Type::kString:
      AppendJsonString(value.AsString(), format.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Type::kList: {
      const List& items = value.AsList();
      if (items.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(item_separator);
        newline(depth + 1);
        LMSERVE_RETURN_IF_ERROR(AppendJson(items[i], format, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Type::kDict: {
      const Dict& dict = value.AsDict();
      if (dict.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, item] : dict.entries()) {
        LMSERVE_ASSIGN_OR_RETURN(std::string text, JsonKey(key));
        entries.emplace_back(std::move(text), &item);
      }
      if (format.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out->append(item_separator);
        newline(depth + 1);
        AppendJsonString(entries[i].first, format.ensure_ascii, out);
        out->append(key_separator);
        LMSERVE_RETURN_IF_ERROR(AppendJson(*entries[i].second, format, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          StrCat("Object of type ", TypeName(value), " is not JSON serializable"));
  }
}

}  // namespace

std::string ToStr(const Value& value) {
  if (value.is_string()) return value.AsString();
  std::string out;
  AppendStr(value, &out);
  return out;
}

std::string Repr(const Value& value) {
  std::string out;
  AppendRepr(value, &out);
  return out;
}

absl::StatusOr<std::string> ToJson(const Value& value, const JsonFormat& format) {
  std::string out;
  LMSERVE_RETURN_IF_ERROR(AppendJson(value, format, 0, &out));
  return out;
}

absl::StatusOr<std::shared_ptr<const List>> Iterate(const Value& value) {
  switch (value.type()) {
    case Value::Type::kList:
      return value.ListPointer();
    case Value::Type::kUndefined:
      return std::make_shared<const List>();
    case Value::Type::kDict: {
      List keys;
      keys.reserve(value.AsDict().size());
      for (const auto& [key, item] : value.AsDict().entries()) keys.push_back(key);
      return std::make_shared<const List>(std::move(keys));
    }
    case Value::Type::kString: {
      const std::string& text = value.AsString();
      const std::vector<size_t> offsets = CodePointOffsets(text);
      List chars;
      chars.reserve(offsets.size() - 1);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(Value::String(text.substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return std::make_shared<const List>(std::move(chars));
    }
    default:
      return absl::InvalidArgumentError(StrCat("'", TypeName(value), "' object is not iterable"));
  }
}

std::optional<int64_t> Length(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return 0;
    case Value::Type::kString:
      return CodePointCount(value.AsString());
    case Value::Type::kList:
      return static_cast<int64_t>(value.AsList().size());
    case Value::Type::kDict:
      return static_cast<int64_t>(value.AsDict().size());
    default:
      return std::nullopt;
  }
}

}  // namespace lmserve::engine::jinja
