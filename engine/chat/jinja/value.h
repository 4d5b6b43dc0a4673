// The values a Jinja template computes with, and the Python semantics Jinja gives them.
//
// Jinja is Python underneath: a chat template that transformers renders sees Python strings, ints,
// floats, lists, dicts and None, plus Jinja's Undefined. This header models exactly those, with
// Python's rules for truth, equality, ordering, str() and repr(), so that a template renders here
// the same bytes it renders under jinja2.
//
// Ownership: lists and dicts are immutable once built and shared between copies (copying a Value
// is cheap). A namespace() is the one mutable object; copies of it alias, as in Python.
// Strings are UTF-8; operations that Python defines on code points (len, indexing, slicing) decode.
// Internal to engine/chat: the public interface is engine/chat/chat_template.h.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_VALUE_H_
#define LMSERVE_ENGINE_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::engine::jinja {

class Value;
class Dict;
class Callable;
struct Namespace;

using List = std::vector<Value>;

class Value {
 public:
  enum class Type : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // also tuples (is_tuple()), which differ only in repr
    kDict,
    kNamespace,
    kCallable,
  };

  // Undefined. `hint` is the message an operation on it reports ("'tools' is undefined").
  Value() = default;
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  static Value String(std::string value);
  static Value MakeList(List items);
  static Value MakeTuple(List items);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace();
  static Value MakeCallable(std::shared_ptr<const Callable> callable);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  // Python's numbers.Number: bool, int and float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_tuple() const { return type_ == Type::kList && tuple_; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_namespace() const { return type_ == Type::kNamespace; }
  bool is_callable() const { return type_ == Type::kCallable; }

  // REQUIRES: the matching is_*() (AsInt also accepts bool, AsDouble any number).
  bool AsBool() const { return std::get<bool>(data_); }
  int64_t AsInt() const;
  double AsDouble() const;
  const std::string& AsString() const { return std::get<std::string>(data_); }
  const List& AsList() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const std::shared_ptr<const List>& ListPointer() const {
    return std::get<std::shared_ptr<const List>>(data_);
  }
  const Dict& AsDict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& AsNamespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Callable& AsCallable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  // REQUIRES: is_undefined().
  const std::string& undefined_hint() const { return std::get<std::string>(data_); }

  // How deeply lists and dicts nest in this value: 0 for scalars, 1 for a flat list. Saturates at
  // 65535. Namespaces count as 0 (the interpreter bounds what is stored in them).
  int height() const { return height_; }

 private:
  using Data = std::variant<std::monostate, bool, int64_t, double, std::string,
                            std::shared_ptr<const List>, std::shared_ptr<const Dict>,
                            std::shared_ptr<Namespace>, std::shared_ptr<const Callable>>;
  Value(Type type, Data data) : type_(type), data_(std::move(data)) {}

  Type type_ = Type::kUndefined;
  bool tuple_ = false;
  uint16_t height_ = 0;
  Data data_ = std::string();
};

// An insertion-ordered dictionary with Python's key equality (1 == 1.0 == True). Lookups are
// linear: template dicts are small.
class Dict {
 public:
  using Entry = std::pair<Value, Value>;

  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Replaces the value of an existing key (keeping its position) or appends.
  void Set(Value key, Value value);
  void Set(std::string_view key, Value value) {
    Set(Value::String(std::string(key)), std::move(value));
  }
  // Appends without looking for the key. REQUIRES: `key` is not in the dict.
  void Append(std::string_view key, Value value) {
    entries_.emplace_back(Value::String(std::string(key)), std::move(value));
  }
  void Reserve(size_t size) { entries_.reserve(size); }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

// The object namespace() makes: attributes assignable with {% set ns.name = ... %}.
struct Namespace {
  Dict attributes;
};

// Positional and keyword arguments of a call, evaluated.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Binds the arguments to `names` the way a Python signature with defaults would: argument i is
  // positional[i], or the keyword of that name, or nullopt when neither was given. Errors on
  // too many positionals, unknown keywords and a parameter given twice; `function` names the
  // callee in the message.
  absl::StatusOr<std::vector<std::optional<Value>>> Bind(
      std::string_view function, const std::vector<std::string_view>& names) const;
};

class Interpreter;

// A function value: a global (range, namespace, ...), a bound method ('x'.strip) or a macro.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual std::string_view name() const = 0;
  virtual absl::StatusOr<Value> Call(Interpreter& interpreter, const CallArgs& args) const = 0;
};

// Python's type name, as error messages say it: "str", "int", "dict", "NoneType", "Undefined"...
std::string_view TypeName(const Value& value);

// Python's truth value (Undefined is false).
bool Truthy(const Value& value);

// Python's ==, with Jinja's Undefined (equal only to Undefined).
bool Equals(const Value& a, const Value& b);

// Python's ordering (<): numbers with numbers, strings by code point, lists and tuples
// lexicographically. Returns -1, 0 or 1; a TypeError-like InvalidArgument for other pairs.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// str(value) as Jinja renders it: Undefined renders empty, None as "None", floats as repr().
std::string ToStr(const Value& value);
// repr(value): strings quoted and escaped, containers as Python prints them.
std::string Repr(const Value& value);
// repr() of a float, the shortest text that reads back the same ("1.0", "1e-05", "1e+16").
std::string FloatRepr(double value);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys), as transformers' tojson filter
// calls it. `indent` nullopt: one line with ", " and ": " (unless `separators`); an indent puts
// each element on its own line. Undefined, namespaces and functions are not serializable.
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& value, const JsonFormat& format);

// iter(value) as a list: a list's items, a dict's keys, a string's code points (as strings),
// nothing for Undefined; a TypeError-like InvalidArgument for other types.
absl::StatusOr<std::shared_ptr<const List>> Iterate(const Value& value);

// len(value) for strings (code points), lists, dicts and Undefined (0); nullopt for the rest.
std::optional<int64_t> Length(const Value& value);

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_VALUE_H_
