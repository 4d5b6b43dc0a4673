// Jinja's built-in filters, tests, global functions, and the str and dict methods that chat
// templates call, with jinja2's (and Python's) semantics. The interpreter looks them up by name.
// Errors carry no source position: the interpreter adds it.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_BUILTINS_H_
#define LMSERVE_ENGINE_CHAT_JINJA_BUILTINS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja/interpreter.h"
#include "engine/chat/jinja/value.h"

namespace lmserve::engine::jinja {

using FilterFunction = absl::StatusOr<Value> (*)(Interpreter& interpreter, const Value& subject,
                                                 const CallArgs& args);
using TestFunction = absl::StatusOr<bool> (*)(Interpreter& interpreter, const Value& subject,
                                              const CallArgs& args);

// nullptr when there is no filter or test of that name.
FilterFunction FindFilter(std::string_view name);
TestFunction FindTest(std::string_view name);

// Whether `object.name` is a method: str methods (strip, split, startswith, ...) on strings,
// items/keys/values/get on dicts.
bool HasMethod(const Value& object, std::string_view name);
// Calls method `name` of `object`. REQUIRES: HasMethod(object, name).
absl::StatusOr<Value> CallMethod(Interpreter& interpreter, const Value& object,
                                 std::string_view name, const CallArgs& args);
// The method as a value ('x'.strip without the call), for templates that pass methods around.
Value BoundMethod(const Value& object, std::string_view name);

// Python's `item in container` (substring for strings, keys for dicts; Undefined contains
// nothing). TypeError-like InvalidArgument for containers that do not support it.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// Python's a % b for numbers (the result takes the divisor's sign). REQUIRES: both numbers.
absl::StatusOr<Value> PyMod(const Value& a, const Value& b);

// Adds range, namespace, dict, raise_exception and strftime_now to `globals`.
void AddGlobals(Dict* globals);

// The payload type URL that marks a status as raised by raise_exception().
inline constexpr char kRaisedPayload[] = "lmserve.jinja/raise_exception";

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_BUILTINS_H_
