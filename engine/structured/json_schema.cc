// JSON Schema into a grammar (frontends.h lists what is supported).

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/structured/frontends.h"

namespace lmserve::engine::structured {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kMaxInteger = 999'999'999'999'999;  // 15 digits: what an unbounded side allows

const absl::flat_hash_set<std::string_view>& Annotations() {
  static const auto* const kSet = new absl::flat_hash_set<std::string_view>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *kSet;
}

const absl::flat_hash_set<std::string_view>& Supported() {
  static const auto* const kSet = new absl::flat_hash_set<std::string_view>{
      "type",      "properties", "required",  "additionalProperties", "enum",
      "const",     "items",      "prefixItems", "minItems",           "maxItems",
      "minLength", "maxLength",  "pattern",   "format",               "minimum",
      "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf", "allOf", "$ref"};
  return *kSet;
}

int Digits(int64_t value) {
  int digits = 1;
  while (value >= 10) {
    value /= 10;
    ++digits;
  }
  return digits;
}

int64_t Pow10(int digits) {
  int64_t value = 1;
  for (int k = 0; k < digits; ++k) value *= 10;
  return value;
}

// A regex for the decimal strings from `a` to `b` (equal lengths, a <= b). Each level recurses
// only into a part bounded on one side, whose other side is full ("0...0" or "9...9"), so the
// result is linear in the digit count.
std::string SameLengthRange(std::string_view a, std::string_view b) {
  if (a.empty()) return "";
  if (a == b) return std::string(a);
  if (a.size() == 1) return StrCat("[", a, "-", b, "]");
  if (a[0] == b[0]) return StrCat(a.substr(0, 1), SameLengthRange(a.substr(1), b.substr(1)));
  const size_t rest = a.size() - 1;
  const std::string nines(rest, '9');
  const std::string zeros(rest, '0');
  const bool low_full = a.substr(1) == zeros;
  const bool high_full = b.substr(1) == nines;
  std::vector<std::string> parts;
  if (!low_full) parts.push_back(StrCat(a.substr(0, 1), SameLengthRange(a.substr(1), nines)));
  const char first = low_full ? a[0] : static_cast<char>(a[0] + 1);
  const char last = high_full ? b[0] : static_cast<char>(b[0] - 1);
  if (first <= last) {
    parts.push_back(StrCat("[", std::string(1, first), "-", std::string(1, last), "][0-9]{",
                           rest, "}"));
  }
  if (!high_full) parts.push_back(StrCat(b.substr(0, 1), SameLengthRange(zeros, b.substr(1))));
  std::string out = "(";
  for (size_t k = 0; k < parts.size(); ++k) out += StrCat(k > 0 ? "|" : "", parts[k]);
  return out + ")";
}

// A regex for the decimal integers in [lo, hi], 0 <= lo <= hi (no sign, no leading zeros).
std::string NonNegativeRange(int64_t lo, int64_t hi) {
  std::string out;
  while (lo <= hi) {
    const int64_t top = std::min(hi, Pow10(Digits(lo)) - 1);
    if (!out.empty()) out += "|";
    out += SameLengthRange(std::to_string(lo), std::to_string(top));
    lo = top + 1;
  }
  return StrCat("(", out, ")");
}

// Integers in [lo, hi] (either side may be kMaxInteger-capped), or "" when empty.
std::string IntegerRange(int64_t lo, int64_t hi) {
  std::vector<std::string> parts;
  if (lo < 0) {
    const int64_t negative_hi = std::min<int64_t>(hi, -1);
    if (lo <= negative_hi) parts.push_back(StrCat("-", NonNegativeRange(-negative_hi, -lo)));
  }
  if (hi >= 0) {
    const int64_t positive_lo = std::max<int64_t>(lo, 0);
    if (positive_lo <= hi) parts.push_back(NonNegativeRange(positive_lo, hi));
  }
  if (parts.empty()) return "";
  std::string out = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) out = StrCat("(", out, "|", parts[k], ")");
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, GrammarBuilder* builder) : root_(root), b_(builder) {}

  absl::StatusOr<Element> Compile() { return Schema(root_, "$", 0); }

  Element AnyValue() {
    if (any_value_ >= 0) return GrammarBuilder::Ref(any_value_);
    any_value_ = b_->NewRule("value");
    const Element value = GrammarBuilder::Ref(any_value_);
    const Element string = String(0, -1);
    std::vector<Element> member = {string, b_->Byte(':'), value};
    const Element object = GrammarBuilder::Ref(Sequence('{', '}', member, 0, -1));
    const Element array = GrammarBuilder::Ref(Sequence('[', ']', {value}, 0, -1));
    b_->AddAlternative(any_value_, {object});
    b_->AddAlternative(any_value_, {array});
    b_->AddAlternative(any_value_, {string});
    b_->AddAlternative(any_value_, {Number()});
    for (std::string_view literal : {"true", "false", "null"}) {
      std::vector<Element> sequence;
      b_->AppendLiteral(literal, &sequence);
      b_->AddAlternative(any_value_, std::move(sequence));
    }
    return value;
  }

  Element AnyObject() {
    AnyValue();
    std::vector<Element> member = {String(0, -1), b_->Byte(':'), GrammarBuilder::Ref(any_value_)};
    return GrammarBuilder::Ref(Sequence('{', '}', member, 0, -1));
  }

 private:
  static absl::Status Error(std::string_view path, std::string_view message) {
    return absl::InvalidArgumentError(StrCat("schema ", path, ": ", message));
  }

  // open item ("," item){...} close, between min_count and max_count items (max < 0: any).
  int32_t Sequence(char open, char close, std::vector<Element> item, int32_t min_count,
                   int32_t max_count) {
    const Element one = b_->Group("item", std::move(item));
    const int32_t rule = b_->NewRule("sequence");
    if (max_count == 0) {
      b_->AddAlternative(rule, {b_->Byte(static_cast<uint8_t>(open)),
                                b_->Byte(static_cast<uint8_t>(close))});
      return rule;
    }
    const int32_t more = b_->Repeat("more_items", {b_->Byte(','), one}, std::max(0, min_count - 1),
                                    max_count < 0 ? -1 : max_count - 1);
    if (min_count == 0) {
      b_->AddAlternative(rule, {b_->Byte(static_cast<uint8_t>(open)),
                                b_->Byte(static_cast<uint8_t>(close))});
    }
    b_->AddAlternative(rule, {b_->Byte(static_cast<uint8_t>(open)), one,
                              GrammarBuilder::Ref(more), b_->Byte(static_cast<uint8_t>(close))});
    return rule;
  }

  Element StringChar() {
    if (string_char_ >= 0) return GrammarBuilder::Ref(string_char_);
    string_char_ = b_->NewRule("string_char");
    // Any character but '"', '\' and control characters; or an escape.
    b_->AddAlternative(string_char_,
                       {b_->CodepointClass({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true)});
    ByteSet escaped;
    for (char c : std::string_view("\"\\/bfnrt")) escaped.Add(static_cast<uint8_t>(c));
    b_->AddAlternative(string_char_, {b_->Byte('\\'), b_->Bytes(escaped)});
    ByteSet hex;
    hex.AddRange('0', '9');
    hex.AddRange('a', 'f');
    hex.AddRange('A', 'F');
    const Element h = b_->Bytes(hex);
    b_->AddAlternative(string_char_, {b_->Byte('\\'), b_->Byte('u'), h, h, h, h});
    return GrammarBuilder::Ref(string_char_);
  }

  Element String(int32_t min_length, int32_t max_length) {
    const int32_t chars = b_->Repeat("string_chars", {StringChar()}, min_length, max_length);
    return b_->Group("string", {b_->Byte('"'), GrammarBuilder::Ref(chars), b_->Byte('"')});
  }

  Element Number() {
    if (number_ >= 0) return GrammarBuilder::Ref(number_);
    absl::StatusOr<Element> element = AddRegex(
        b_, "-?(0|[1-9][0-9]{0,14})(\\.[0-9]{1,15})?([eE][+-]?[1-9][0-9]{0,2})?", false);
    number_ = b_->NewRule("number");
    b_->AddAlternative(number_, {*element});
    return GrammarBuilder::Ref(number_);
  }

  Element Literal(const Json& value) {
    std::vector<Element> sequence;
    b_->AppendLiteral(value.dump(), &sequence);
    return b_->Group("literal", std::move(sequence));
  }

  absl::StatusOr<int32_t> Count(const Json& schema, std::string_view key, std::string_view path) {
    const Json& value = schema[std::string(key)];
    if (!value.is_number_integer() && !value.is_number_unsigned()) {
      return Error(path, StrCat("'", key, "' must be a non-negative integer"));
    }
    const int64_t count = value.get<int64_t>();
    if (count < 0) return Error(path, StrCat("'", key, "' must be a non-negative integer"));
    if (count > b_->limits().max_repeat) {
      return Error(path, StrCat("'", key, "' ", count, " is above the limit of ",
                                b_->limits().max_repeat));
    }
    return static_cast<int32_t>(count);
  }

  absl::StatusOr<const Json*> ResolveRef(const std::string& ref, std::string_view path) {
    if (ref == "#") return &root_;
    for (std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) == 0) {
        const std::string name = ref.substr(prefix.size());
        const std::string container(prefix.substr(2, prefix.size() - 3));
        auto defs = root_.find(container);
        if (defs == root_.end() || !defs->is_object() || !defs->contains(name)) {
          return Error(path, StrCat("$ref '", ref.substr(0, 200), "' does not resolve"));
        }
        return &(*defs)[name];
      }
    }
    return Error(path, StrCat("$ref '", ref.substr(0, 200),
                              "' is not supported (only \"#\", \"#/$defs/NAME\" and "
                              "\"#/definitions/NAME\")"));
  }

  absl::StatusOr<Element> Schema(const Json& schema, const std::string& path, int depth) {
    if (depth > b_->limits().max_nesting) {
      return Error(path, StrCat("nested deeper than ", b_->limits().max_nesting, " levels"));
    }
    LMSERVE_RETURN_IF_ERROR(b_->status());
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return AnyValue();
      return Error(path, "the schema false matches nothing");
    }
    if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : schema.items()) {
      if (!Supported().contains(key) && !Annotations().contains(key)) {
        return Error(path, StrCat("unsupported JSON Schema keyword '", key.substr(0, 100), "'"));
      }
    }
    if (auto ref = schema.find("$ref"); ref != schema.end()) {
      if (!ref->is_string()) return Error(path, "'$ref' must be a string");
      const std::string target = ref->get<std::string>();
      if (auto it = refs_.find(target); it != refs_.end()) return GrammarBuilder::Ref(it->second);
      LMSERVE_ASSIGN_OR_RETURN(const Json* resolved, ResolveRef(target, path));
      const int32_t rule = b_->NewRule(StrCat("ref ", target));
      refs_.emplace(target, rule);
      LMSERVE_ASSIGN_OR_RETURN(Element element, Schema(*resolved, target, depth + 1));
      b_->AddAlternative(rule, {element});
      return GrammarBuilder::Ref(rule);
    }
    if (auto values = schema.find("enum"); values != schema.end()) {
      if (!values->is_array() || values->empty()) {
        return Error(path, "'enum' must be a non-empty array");
      }
      if (static_cast<int32_t>(values->size()) > b_->limits().max_enum_values) {
        return Error(path, StrCat("'enum' has ", values->size(), " values, above the limit of ",
                                  b_->limits().max_enum_values));
      }
      std::vector<std::vector<Element>> alternatives;
      for (const Json& value : *values) alternatives.push_back({Literal(value)});
      return GrammarBuilder::Ref(b_->Choice("enum", std::move(alternatives)));
    }
    if (auto value = schema.find("const"); value != schema.end()) return Literal(*value);
    if (auto any_of = schema.find("anyOf"); any_of != schema.end()) {
      if (!any_of->is_array() || any_of->empty()) {
        return Error(path, "'anyOf' must be a non-empty array");
      }
      for (std::string_view key : {"type", "properties", "items", "allOf"}) {
        if (schema.contains(std::string(key))) {
          return Error(path, StrCat("'anyOf' beside '", key, "' is not supported"));
        }
      }
      std::vector<std::vector<Element>> alternatives;
      for (size_t k = 0; k < any_of->size(); ++k) {
        LMSERVE_ASSIGN_OR_RETURN(Element element,
                                 Schema((*any_of)[k], StrCat(path, ".anyOf[", k, "]"), depth + 1));
        alternatives.push_back({element});
      }
      return GrammarBuilder::Ref(b_->Choice("any_of", std::move(alternatives)));
    }
    if (auto all_of = schema.find("allOf"); all_of != schema.end()) {
      if (!all_of->is_array() || all_of->size() != 1 || schema.contains("type")) {
        return Error(path, "'allOf' is supported only with exactly one schema and no 'type'");
      }
      return Schema((*all_of)[0], StrCat(path, ".allOf[0]"), depth + 1);
    }

    std::vector<std::string> types;
    if (auto type = schema.find("type"); type != schema.end()) {
      if (type->is_string()) {
        types.push_back(type->get<std::string>());
      } else if (type->is_array() && !type->empty()) {
        for (const Json& t : *type) {
          if (!t.is_string()) return Error(path, "'type' must be a string or strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Error(path, "'type' must be a string or a non-empty array of strings");
      }
    } else if (schema.contains("properties") || schema.contains("required") ||
               schema.contains("additionalProperties")) {
      types.push_back("object");
    } else if (schema.contains("items") || schema.contains("prefixItems") ||
               schema.contains("minItems") || schema.contains("maxItems")) {
      types.push_back("array");
    } else if (schema.contains("minLength") || schema.contains("maxLength") ||
               schema.contains("pattern") || schema.contains("format")) {
      types.push_back("string");
    } else if (schema.contains("minimum") || schema.contains("maximum") ||
               schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return AnyValue();
    }
    std::vector<std::vector<Element>> alternatives;
    for (const std::string& type : types) {
      LMSERVE_ASSIGN_OR_RETURN(Element element, Typed(schema, type, path, depth));
      alternatives.push_back({element});
    }
    if (alternatives.size() == 1) return alternatives[0][0];
    return GrammarBuilder::Ref(b_->Choice("types", std::move(alternatives)));
  }

  absl::StatusOr<Element> Typed(const Json& schema, const std::string& type,
                                const std::string& path, int depth) {
    if (type == "object") return Object(schema, path, depth);
    if (type == "array") return Array(schema, path, depth);
    if (type == "string") return StringSchema(schema, path);
    if (type == "integer" || type == "number") return NumberSchema(schema, path, type == "integer");
    if (type == "boolean") {
      return GrammarBuilder::Ref(
          b_->Choice("boolean", {{Literal(Json(true))}, {Literal(Json(false))}}));
    }
    if (type == "null") return Literal(Json(nullptr));
    return Error(path, StrCat("unknown type '", type.substr(0, 100), "'"));
  }

  absl::StatusOr<Element> Object(const Json& schema, const std::string& path, int depth) {
    std::vector<std::pair<std::string, Element>> members;  // key literal (JSON), value
    std::vector<bool> required_flags;
    absl::flat_hash_set<std::string> required;
    if (auto list = schema.find("required"); list != schema.end()) {
      if (!list->is_array()) return Error(path, "'required' must be an array of strings");
      for (const Json& name : *list) {
        if (!name.is_string()) return Error(path, "'required' must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    absl::flat_hash_set<std::string> declared;
    if (auto properties = schema.find("properties"); properties != schema.end()) {
      if (!properties->is_object()) return Error(path, "'properties' must be an object");
      for (const auto& [name, property] : properties->items()) {
        LMSERVE_ASSIGN_OR_RETURN(
            Element value, Schema(property, StrCat(path, ".properties.", name), depth + 1));
        members.emplace_back(Json(name).dump(), value);
        required_flags.push_back(required.contains(name));
        declared.insert(name);
      }
    }
    // Required names without a property schema take any value, unless extra keys are refused.
    const auto closed = schema.find("additionalProperties");
    const bool no_extra = closed != schema.end() && closed->is_boolean() && !closed->get<bool>();
    if (auto list = schema.find("required"); list != schema.end()) {
      for (const Json& name : *list) {
        if (no_extra && !declared.contains(name.get<std::string>())) {
          return Error(path, StrCat("required property '", name.get<std::string>().substr(0, 100),
                                    "' is not in 'properties' and 'additionalProperties' is false:"
                                    " no value can match"));
        }
        if (declared.insert(name.get<std::string>()).second) {
          members.emplace_back(name.dump(), AnyValue());
          required_flags.push_back(true);
        }
      }
    }
    const Json* additional = nullptr;
    if (auto it = schema.find("additionalProperties"); it != schema.end()) {
      if (!it->is_boolean() && !it->is_object()) {
        return Error(path, "'additionalProperties' must be a boolean or a schema");
      }
      if (it->is_object()) additional = &*it;
    }
    if (members.empty()) {
      if (additional == nullptr) {
        // additionalProperties false (or an object with nothing declared, generated empty).
        const bool closed = schema.contains("additionalProperties");
        if (closed || schema.contains("properties")) return Literal(Json::object());
        return AnyObject();
      }
      LMSERVE_ASSIGN_OR_RETURN(
          Element value, Schema(*additional, StrCat(path, ".additionalProperties"), depth + 1));
      return GrammarBuilder::Ref(
          Sequence('{', '}', {String(0, -1), b_->Byte(':'), value}, 0, -1));
    }
    // first[i]: members i.. when none was written yet; after[i]: when one was (a comma first).
    const auto n = static_cast<int32_t>(members.size());
    std::vector<int32_t> first(n + 1), after(n + 1);
    first[n] = b_->Literal("");
    after[n] = first[n];
    for (int32_t i = n - 1; i >= 0; --i) {
      std::vector<Element> member;
      b_->AppendLiteral(members[i].first, &member);
      member.push_back(b_->Byte(':'));
      member.push_back(members[i].second);
      const Element kv = b_->Group("member", std::move(member));
      first[i] = b_->NewRule("members");
      after[i] = b_->NewRule("more_members");
      b_->AddAlternative(first[i], {kv, GrammarBuilder::Ref(after[i + 1])});
      b_->AddAlternative(after[i], {b_->Byte(','), kv, GrammarBuilder::Ref(after[i + 1])});
      if (!required_flags[i]) {
        b_->AddAlternative(first[i], {GrammarBuilder::Ref(first[i + 1])});
        b_->AddAlternative(after[i], {GrammarBuilder::Ref(after[i + 1])});
      }
    }
    return b_->Group("object", {b_->Byte('{'), GrammarBuilder::Ref(first[0]), b_->Byte('}')});
  }

  absl::StatusOr<Element> Array(const Json& schema, const std::string& path, int depth) {
    int32_t min_items = 0, max_items = -1;
    if (schema.contains("minItems")) {
      LMSERVE_ASSIGN_OR_RETURN(min_items, Count(schema, "minItems", path));
    }
    if (schema.contains("maxItems")) {
      LMSERVE_ASSIGN_OR_RETURN(max_items, Count(schema, "maxItems", path));
    }
    if (max_items >= 0 && max_items < min_items) {
      return Error(path, "'maxItems' is below 'minItems'");
    }
    const Json* prefix = nullptr;
    const Json* items = nullptr;
    if (auto it = schema.find("prefixItems"); it != schema.end()) {
      if (!it->is_array()) return Error(path, "'prefixItems' must be an array");
      prefix = &*it;
    }
    if (auto it = schema.find("items"); it != schema.end()) {
      if (it->is_array()) {
        if (prefix != nullptr) return Error(path, "'items' as an array beside 'prefixItems'");
        prefix = &*it;
      } else {
        items = &*it;
      }
    }
    if (prefix == nullptr || prefix->empty()) {
      Element item;
      if (items == nullptr) {
        item = AnyValue();
      } else {
        LMSERVE_ASSIGN_OR_RETURN(item, Schema(*items, StrCat(path, ".items"), depth + 1));
      }
      return GrammarBuilder::Ref(Sequence('[', ']', {item}, min_items, max_items));
    }
    // Every prefix item is written (in order), then more of `items` within the bounds.
    const auto k = static_cast<int32_t>(prefix->size());
    if (max_items >= 0 && max_items < k) {
      return Error(path, "'maxItems' is below the number of 'prefixItems'");
    }
    std::vector<Element> sequence = {b_->Byte('[')};
    for (int32_t i = 0; i < k; ++i) {
      if (i > 0) sequence.push_back(b_->Byte(','));
      LMSERVE_ASSIGN_OR_RETURN(
          Element element, Schema((*prefix)[i], StrCat(path, ".prefixItems[", i, "]"), depth + 1));
      sequence.push_back(element);
    }
    const bool extra = items != nullptr && !(items->is_boolean() && !items->get<bool>());
    if (extra) {
      LMSERVE_ASSIGN_OR_RETURN(Element item, Schema(*items, StrCat(path, ".items"), depth + 1));
      sequence.push_back(GrammarBuilder::Ref(
          b_->Repeat("more_items", {b_->Byte(','), item}, std::max(0, min_items - k),
                     max_items < 0 ? -1 : max_items - k)));
    } else if (min_items > k) {
      return Error(path, "'minItems' is above the number of 'prefixItems' and 'items' is false");
    }
    sequence.push_back(b_->Byte(']'));
    return b_->Group("tuple", std::move(sequence));
  }

  absl::StatusOr<Element> StringSchema(const Json& schema, const std::string& path) {
    int32_t min_length = 0, max_length = -1;
    if (schema.contains("minLength")) {
      LMSERVE_ASSIGN_OR_RETURN(min_length, Count(schema, "minLength", path));
    }
    if (schema.contains("maxLength")) {
      LMSERVE_ASSIGN_OR_RETURN(max_length, Count(schema, "maxLength", path));
    }
    if (max_length >= 0 && max_length < min_length) {
      return Error(path, "'maxLength' is below 'minLength'");
    }
    std::string pattern;
    if (auto it = schema.find("pattern"); it != schema.end()) {
      if (!it->is_string()) return Error(path, "'pattern' must be a string");
      pattern = it->get<std::string>();
    }
    if (auto it = schema.find("format"); it != schema.end()) {
      if (!it->is_string()) return Error(path, "'format' must be a string");
      if (!pattern.empty()) return Error(path, "'format' beside 'pattern' is not supported");
      const std::string format = it->get<std::string>();
      static const std::pair<std::string_view, std::string_view> kFormats[] = {
          {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"},
          {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-][0-1][0-9]:[0-5][0-9])"},
          {"date-time",
           "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
           "(\\.[0-9]{1,6})?(Z|[+-][0-1][0-9]:[0-5][0-9])"},
          {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
          {"email", "[a-zA-Z0-9._%+-]{1,32}@[a-zA-Z0-9-]{1,32}(\\.[a-zA-Z]{2,8}){1,2}"},
          {"ipv4",
           "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|"
           "[1-9]?[0-9])"},
      };
      for (const auto& [name, regex] : kFormats) {
        if (format == name) pattern = std::string(regex);
      }
      if (pattern.empty()) {
        return Error(path, StrCat("unsupported 'format' '", format.substr(0, 100), "'"));
      }
    }
    if (pattern.empty()) return String(min_length, max_length);
    if (schema.contains("minLength") || schema.contains("maxLength")) {
      return Error(path, "'pattern' or 'format' beside 'minLength'/'maxLength' is not supported");
    }
    // A schema pattern is a search; matching all of the string satisfies it.
    absl::StatusOr<Element> body = AddRegex(b_, pattern, /*json_string=*/true);
    if (!body.ok()) return Error(path, std::string(body.status().message()));
    return b_->Group("pattern_string", {b_->Byte('"'), *body, b_->Byte('"')});
  }

  absl::StatusOr<Element> NumberSchema(const Json& schema, const std::string& path,
                                       bool integer) {
    std::optional<double> lo, hi;
    bool lo_exclusive = false, hi_exclusive = false;
    for (std::string_view key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      auto it = schema.find(std::string(key));
      if (it == schema.end()) continue;
      if (it->is_boolean()) {
        return Error(path, StrCat("'", key, "' as a boolean (draft 4) is not supported"));
      }
      if (!it->is_number() || !std::isfinite(it->get<double>())) {
        return Error(path, StrCat("'", key, "' must be a number"));
      }
      const double value = it->get<double>();
      const bool exclusive = key.rfind("exclusive", 0) == 0;
      if (key.find("inimum") != std::string_view::npos) {
        if (!lo.has_value() || value > *lo || (value == *lo && exclusive)) {
          lo = value;
          lo_exclusive = exclusive;
        }
      } else if (!hi.has_value() || value < *hi || (value == *hi && exclusive)) {
        hi = value;
        hi_exclusive = exclusive;
      }
    }
    if (!lo.has_value() && !hi.has_value()) {
      if (!integer) return Number();
      absl::StatusOr<Element> element = AddRegex(b_, "-?(0|[1-9][0-9]{0,14})", false);
      return *element;
    }
    const double cap = static_cast<double>(kMaxInteger);
    const double lo_value = std::max(lo.value_or(-cap), -cap);
    const double hi_value = std::min(hi.value_or(cap), cap);
    // The integers within the bounds.
    auto int_lo = static_cast<int64_t>(std::ceil(lo_value));
    if (lo_exclusive && static_cast<double>(int_lo) == lo_value) ++int_lo;
    auto int_hi = static_cast<int64_t>(std::floor(hi_value));
    if (hi_exclusive && static_cast<double>(int_hi) == hi_value) --int_hi;
    std::string regex;
    if (int_lo <= int_hi) regex = IntegerRange(int_lo, int_hi);
    if (!integer) {
      // i.f for 0 <= i with [i, i + 1] inside the bounds; -(k.f) likewise.
      const std::string fraction = "\\.[0-9]{0,14}[1-9]";
      const int64_t p_lo = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(lo_value)));
      const int64_t p_hi = static_cast<int64_t>(std::floor(hi_value)) - 1;
      if (p_lo <= p_hi) {
        regex = StrCat(regex.empty() ? "" : StrCat(regex, "|"), "(",
                       NonNegativeRange(p_lo, p_hi), fraction, ")");
      }
      const int64_t n_lo = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(-hi_value)));
      const int64_t n_hi = static_cast<int64_t>(std::floor(-lo_value)) - 1;
      if (n_lo <= n_hi) {
        regex = StrCat(regex.empty() ? "" : StrCat(regex, "|"), "(-",
                       NonNegativeRange(n_lo, n_hi), fraction, ")");
      }
    }
    if (regex.empty()) return Error(path, "no number satisfies the bounds");
    absl::StatusOr<Element> element = AddRegex(b_, regex, false);
    if (!element.ok()) return Error(path, std::string(element.status().message()));
    return *element;
  }

  const Json& root_;
  GrammarBuilder* b_;
  absl::flat_hash_map<std::string, int32_t> refs_;
  int32_t any_value_ = -1;
  int32_t string_char_ = -1;
  int32_t number_ = -1;
};

}  // namespace

absl::StatusOr<Grammar> JsonSchemaGrammar(const Json& schema, const GrammarLimits& limits) {
  GrammarBuilder builder(limits);
  SchemaCompiler compiler(schema, &builder);
  LMSERVE_ASSIGN_OR_RETURN(Element element, compiler.Compile());
  const int32_t root = builder.NewRule("root");
  builder.AddAlternative(root, {element});
  return std::move(builder).Build(root);
}

absl::StatusOr<Grammar> JsonObjectGrammar(const GrammarLimits& limits) {
  GrammarBuilder builder(limits);
  SchemaCompiler compiler(Json::object(), &builder);
  const Element object = compiler.AnyObject();
  const int32_t root = builder.NewRule("root");
  builder.AddAlternative(root, {object});
  return std::move(builder).Build(root);
}

}  // namespace lmserve::engine::structured
