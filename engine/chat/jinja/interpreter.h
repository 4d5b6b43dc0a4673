// The Jinja interpreter: renders a parsed template against a dictionary of variables.
//
// Semantics follow jinja2 3.1 as transformers configures it for chat templates
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the default Undefined):
//   - an undefined variable or missing attribute/key is Undefined: falsy, renders as "", iterates
//     as empty, has length 0, equals only Undefined; arithmetic, attribute access, subscripting,
//     ordering and calls on it are errors naming it ("'tools' is undefined");
//   - {% set %} binds in the current scope; each for-loop iteration and each macro call is a new
//     scope, so assignments inside them are not seen outside (use a namespace());
//   - `obj.name` on a dict prefers the dict methods (items, keys, values, get), `obj['name']` the
//     key, as jinja2's getattr/getitem do.
//
// Hostile templates: nesting is bounded when parsing; rendering is bounded in steps (expressions
// evaluated plus statements executed), macro call depth, output bytes and the size of any one
// string or list a template builds. Past a bound, rendering stops with ResourceExhausted.
//
// Not supported (no published chat template we know of needs them): include/extends/import and
// blocks, recursive loops, loop.changed, {% with %}, {% do %}, *args/**kwargs at call sites,
// '%' string formatting and str.format specs, cycler/joiner/lipsum; case mapping is ASCII-only.
// Ints are 64-bit (overflow is an error, where Python would grow).
//
// Errors: syntax errors are InvalidArgument "line L, column C: ..."; runtime errors are
// InvalidArgument "line L, column C: ..." except raise_exception(message), which is
// InvalidArgument with exactly `message` (see IsRaisedByTemplate).

#ifndef LMSERVE_ENGINE_CHAT_JINJA_INTERPRETER_H_
#define LMSERVE_ENGINE_CHAT_JINJA_INTERPRETER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat/jinja/ast.h"
#include "engine/chat/jinja/value.h"

namespace lmserve::engine::jinja {

struct RenderLimits {
  int64_t max_steps = 2'000'000;        // expressions evaluated + statements executed
  int64_t max_output_bytes = 16 << 20;  // the rendered text, and any one string or list built
  int max_call_depth = 64;              // nested macro calls
  // Nested statements, expressions and calls at once: bounds the interpreter's C++ recursion
  // (about 1 KiB of stack per level).
  int max_depth = 600;
};

struct RenderOptions {
  RenderLimits limits;
  // The clock strftime_now() reads (local time, as Python's datetime.now()). Unset: the system
  // clock.
  std::function<std::chrono::system_clock::time_point()> now;
};

// A parsed template. Immutable, so one may render concurrently from many threads.
class Template {
 public:
  // Statement and expression nesting deeper than this is rejected when parsing.
  static constexpr int kMaxNesting = 128;

  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `variables` (and the globals range, namespace, dict, raise_exception and
  // strftime_now, which variables of the same name shadow).
  absl::StatusOr<std::string> Render(const Dict& variables, const RenderOptions& options) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

// Whether `status` came from the template calling raise_exception().
bool IsRaisedByTemplate(const absl::Status& status);

// ---- For the built-in filters, tests and functions (builtins.cc) -------------------------------

struct Frame;

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);
  ~Interpreter();

  absl::Status Run(const Body& body, const Dict& variables, std::string* out);

  const RenderOptions& options() const { return options_; }

  // Calls a function value (a macro, global or bound method).
  absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args);
  absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& subject,
                                    const CallArgs& args);
  absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& subject, const CallArgs& args);
  // jinja2's environment.getattr / getitem (see the header comment). Errors only for Undefined.
  absl::StatusOr<Value> GetAttr(const Value& object, std::string_view name);
  absl::StatusOr<Value> GetItem(const Value& object, const Value& key);

  // ResourceExhausted when a string or list of `bytes` would pass the output limit.
  absl::Status CheckSize(int64_t bytes) const;
  // Counts `count` steps of work done inside a built-in (one per element it visits).
  absl::Status Spend(int64_t count);

  // Renders a macro's body for a call (macros are Callables that call back here).
  absl::StatusOr<Value> CallMacro(const Stmt& macro, const std::shared_ptr<Frame>& closure,
                                  const CallArgs& args, const Value* caller);

  // Registers a namespace() made during this render; the interpreter empties it at the end so
  // that cycles through it (ns.self = ns) do not leak.
  void TrackNamespace(const Value& ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Counts the interpreter's recursion for RenderLimits::max_depth.
  class DepthGuard {
   public:
    explicit DepthGuard(Interpreter* interpreter) : interpreter_(interpreter) {
      ++interpreter_->depth_;
    }
    ~DepthGuard() { --interpreter_->depth_; }
    bool too_deep() const { return interpreter_->depth_ > interpreter_->options_.limits.max_depth; }
    absl::Status Error() const {
      return absl::ResourceExhaustedError("the chat template nests or recurses too deeply");
    }

   private:
    Interpreter* interpreter_;
  };

  std::shared_ptr<Frame> ChildFrame() const;
  // Binds `value` to `target` in `frame` (namespace attributes wherever the namespace is).
  absl::Status Store(Frame* frame, const Target& target, Value value);
  // Evaluates a filter chain parsed with the placeholder variable "" as its subject.
  absl::StatusOr<Value> ApplyChain(const Expr& chain, Value subject);

  absl::Status ExecBody(const Body& body);
  absl::Status Exec(const Stmt& stmt);
  absl::Status ExecFor(const Stmt& stmt);
  absl::Status ExecSet(const Target& target, Value value, SourcePos pos);
  absl::Status ExecCallBlock(const Stmt& stmt);
  // Renders `body` in a new scope into a string.
  absl::StatusOr<std::string> Capture(const Body& body, std::shared_ptr<Frame> frame);
  absl::Status Emit(std::string_view text);

  absl::StatusOr<Value> Eval(const Expr& expr);
  absl::StatusOr<Value> EvalInner(const Expr& expr);
  absl::StatusOr<CallArgs> EvalArgs(const ArgExprs& args);
  absl::StatusOr<Value> EvalCall(const Expr& expr);
  absl::StatusOr<Value> EvalBinary(const Expr& expr);
  absl::StatusOr<Value> EvalCompare(const Expr& expr);
  absl::StatusOr<Value> Slice(const Value& object, const Expr& expr);

  const RenderOptions options_;
  std::shared_ptr<Frame> frame_;  // the innermost scope
  std::string* out_ = nullptr;    // where output goes now
  Flow flow_ = Flow::kNormal;
  int64_t steps_ = 0;
  int64_t output_bytes_ = 0;  // everything emitted, captured blocks included
  int call_depth_ = 0;
  int depth_ = 0;
  std::vector<std::shared_ptr<Frame>> macro_frames_;  // scopes that define a macro
  std::vector<Value> namespaces_;
};

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_INTERPRETER_H_
