#include "engine/chat/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/chat/jinja/builtins.h"
#include "engine/chat/jinja/parser.h"
#include "engine/chat/jinja/pystr.h"

namespace lmserve::engine::jinja {

// A scope: variables bound by set, for, macro parameters; lookups continue in the parent.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> variables;

  const Value* Find(std::string_view name) const {
    for (const Frame* frame = this; frame != nullptr; frame = frame->parent.get()) {
      for (const auto& [variable, value] : frame->variables) {
        if (variable == name) return &value;
      }
    }
    return nullptr;
  }

  void Set(std::string_view name, Value value) {
    for (auto& [variable, current] : variables) {
      if (variable == name) {
        current = std::move(value);
        return;
      }
    }
    variables.emplace_back(std::string(name), std::move(value));
  }
};

namespace {

// Marks a status whose message already names its source position.
constexpr char kLocatedPayload[] = "lmserve.jinja/located";

// Lists and dicts stored in variables may nest this deep: destroying, comparing and printing
// them recurse once per level.
constexpr int kMaxStoredValueHeight = 128;

// A list element counts as this many bytes against the size limit.
constexpr int64_t kBytesPerListItem = 16;

absl::Status Located(absl::Status status, SourcePos pos) {
  if (status.ok() || status.GetPayload(kLocatedPayload).has_value() ||
      status.GetPayload(kRaisedPayload).has_value()) {
    return status;
  }
  absl::Status located(status.code(),
                       StrCat("line ", pos.line, ", column ", pos.column, ": ", status.message()));
  located.SetPayload(kLocatedPayload, absl::Cord("1"));
  return located;
}

absl::Status UndefinedError(const Value& value) {
  return absl::InvalidArgumentError(value.undefined_hint().empty() ? "value is undefined"
                                                                   : value.undefined_hint());
}

// jinja2's object_type_repr, for "'dict object' has no attribute 'x'".
std::string ObjectTypeRepr(const Value& value) {
  if (value.is_none()) return "None";
  return StrCat(TypeName(value), " object");
}

Value MissingAttribute(const Value& object, std::string_view name) {
  return Value::Undefined(StrCat("'", ObjectTypeRepr(object), "' has no attribute '", name, "'"));
}

Value MissingElement(const Value& object, const Value& key) {
  if (key.is_string()) return MissingAttribute(object, key.AsString());
  return Value::Undefined(StrCat(ObjectTypeRepr(object), " has no element ", Repr(key)));
}

class MacroCallable : public Callable {
 public:
  MacroCallable(const Stmt* macro, std::shared_ptr<Frame> closure)
      : macro_(macro), closure_(std::move(closure)) {}
  std::string_view name() const override { return macro_->text; }
  absl::StatusOr<Value> Call(Interpreter& interpreter, const CallArgs& args) const override {
    return interpreter.CallMacro(*macro_, closure_, args, nullptr);
  }

 private:
  const Stmt* macro_;
  std::shared_ptr<Frame> closure_;
};

// caller() inside a macro invoked by {% call %}: renders the call block's body.
class CallerCallable : public Callable {
 public:
  CallerCallable(const Stmt* call_block, std::shared_ptr<Frame> frame)
      : call_block_(call_block), frame_(std::move(frame)) {}
  std::string_view name() const override { return "caller"; }
  absl::StatusOr<Value> Call(Interpreter& interpreter, const CallArgs& args) const override {
    return interpreter.CallMacro(*call_block_, frame_, args, nullptr);
  }

 private:
  const Stmt* call_block_;
  std::shared_ptr<Frame> frame_;
};

// loop.cycle(a, b, ...): the argument at the iteration's index, round robin.
class CycleCallable : public Callable {
 public:
  explicit CycleCallable(int64_t index0) : index0_(index0) {}
  std::string_view name() const override { return "cycle"; }
  absl::StatusOr<Value> Call(Interpreter&, const CallArgs& args) const override {
    if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
    return args.positional[static_cast<size_t>(index0_) % args.positional.size()];
  }

 private:
  int64_t index0_;
};

absl::StatusOr<Value> Arithmetic(Interpreter& interpreter, std::string_view op, const Value& a,
                                 const Value& b) {
  if (op == "~") {
    std::string text = ToStr(a);
    text += ToStr(b);
    LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(static_cast<int64_t>(text.size())));
    return Value::String(std::move(text));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const auto unsupported = [&]() {
    return absl::InvalidArgumentError(StrCat("unsupported operand type(s) for ", op, ": '",
                                             TypeName(a), "' and '", TypeName(b), "'"));
  };
  const auto overflow = []() { return absl::InvalidArgumentError("integer overflow"); };
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (floats) return Value::Float(a.AsDouble() + b.AsDouble());
    if (numbers) {
      int64_t sum = 0;
      if (__builtin_add_overflow(a.AsInt(), b.AsInt(), &sum)) return overflow();
      return Value::Int(sum);
    }
    if (a.is_string() && b.is_string()) {
      LMSERVE_RETURN_IF_ERROR(
          interpreter.CheckSize(static_cast<int64_t>(a.AsString().size() + b.AsString().size())));
      return Value::String(a.AsString() + b.AsString());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      const int64_t count = static_cast<int64_t>(a.AsList().size() + b.AsList().size());
      LMSERVE_RETURN_IF_ERROR(interpreter.CheckSize(count * kBytesPerListItem));
      LMSERVE_RETURN_IF_ERROR(interpreter.Spend(count));
      List items = a.AsList();
      items.insert(items.end(), b.AsList().begin(), b.AsList().end());
      return a.is_tuple() ? Value::MakeTuple(std::move(items)) : Value::MakeList(std::move(items));
    }
    if (a.is_string()) {
      return absl::InvalidArgumentError(
          StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
    }
    if (a.is_list()) {
      return absl::InvalidArgumentError(StrCat("can only concatenate ", TypeName(a), " (not \"",
                                               TypeName(b), "\") to ", TypeName(a)));
    }
    return unsupported();
  }
  if (op == "-") {
    if (floats) return Value::Float(a.AsDouble() - b.AsDouble());
    if (numbers) {
      int64_t difference = 0;
      if (__builtin_sub_overflow(a.AsInt(), b.AsInt(), &difference)) return overflow();
      return Value::Int(difference);
    }
    return unsupported();
  }
  if (op == "*") {
    if (floats) return Value::Float(a.AsDouble() * b.AsDouble());
    if (numbers) {
      int64_t product = 0;
      if (__builtin_mul_overflow(a.AsInt(), b.AsInt(), &product)) return overflow();
      return Value::Int(product);
    }
    // Repetition: str * int, int * str, list * int, int * list.
    const Value& sequence = (a.is_string() || a.is_list()) ? a : b;
    const Value& times = (a.is_string() || a.is_list()) ? b : a;
    if ((sequence.is_string() || sequence.is_list()) && (times.is_int() || times.is_bool())) {
      const int64_t count = std::max<int64_t>(times.AsInt(), 0);
      const int64_t unit = sequence.is_string()
                               ? static_cast<int64_t>(sequence.AsString().size())
                               : static_cast<int64_t>(sequence.AsList().size()) * kBytesPerListItem;
      if (unit > 0 && count > interpreter.options().limits.max_output_bytes / unit) {
        return interpreter.CheckSize(std::numeric_limits<int64_t>::max());
      }
      LMSERVE_RETURN_IF_ERROR(interpreter.Spend(count));
      if (sequence.is_string()) {
        std::string out;
        out.reserve(static_cast<size_t>(unit * count));
        for (int64_t i = 0; i < count; ++i) out += sequence.AsString();
        return Value::String(std::move(out));
      }
      List items;
      for (int64_t i = 0; i < count; ++i) {
        items.insert(items.end(), sequence.AsList().begin(), sequence.AsList().end());
      }
      return sequence.is_tuple() ? Value::MakeTuple(std::move(items))
                                 : Value::MakeList(std::move(items));
    }
    return unsupported();
  }
  if (!numbers) {
    if (op == "%" && a.is_string()) {
      return absl::InvalidArgumentError("string formatting with '%' is not supported");
    }
    return unsupported();
  }
  if (op == "/") {
    if (b.AsDouble() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.AsDouble() / b.AsDouble());
  }
  if (op == "//") {
    if (floats) {
      if (b.AsDouble() == 0) return absl::InvalidArgumentError("float floor division by zero");
      return Value::Float(std::floor(a.AsDouble() / b.AsDouble()));
    }
    const int64_t x = a.AsInt();
    const int64_t y = b.AsInt();
    if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) return overflow();
    int64_t quotient = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --quotient;
    return Value::Int(quotient);
  }
  if (op == "%") return PyMod(a, b);
  if (op == "**") {
    if (!floats && b.AsInt() >= 0) {
      int64_t result = 1;
      int64_t base = a.AsInt();
      int64_t exponent = b.AsInt();
      while (exponent > 0) {
        if (exponent & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return overflow();
        }
        exponent >>= 1;
        if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::Int(result);
    }
    const double x = a.AsDouble();
    const double y = b.AsDouble();
    if (x == 0 && y < 0) {
      return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
    }
    if (x < 0 && std::trunc(y) != y) {
      return absl::InvalidArgumentError("a negative number to a fractional power is complex");
    }
    return Value::Float(std::pow(x, y));
  }
  return absl::InternalError(StrCat("unknown operator ", op));
}

}  // namespace

// ---- Template ----------------------------------------------------------------------------------

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  LMSERVE_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source, LexerOptions()));
  LMSERVE_ASSIGN_OR_RETURN(Body body, jinja::Parse(tokens, kMaxNesting));
  return Template(std::make_shared<const Body>(std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const Dict& variables,
                                             const RenderOptions& options) const {
  Interpreter interpreter(options);
  std::string out;
  LMSERVE_RETURN_IF_ERROR(interpreter.Run(*body_, variables, &out));
  return out;
}

bool IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

// ---- Interpreter -------------------------------------------------------------------------------

Interpreter::Interpreter(const RenderOptions& options) : options_(options) {}

Interpreter::~Interpreter() {
  // Macros hold their defining scope and namespaces may hold anything (themselves included):
  // empty them so that no reference cycle outlives the render. Everything tracked stays alive
  // until the loops finish, so the clearing itself never recurses deeply.
  for (const std::shared_ptr<Frame>& frame : macro_frames_) frame->variables.clear();
  for (const Value& ns : namespaces_) ns.AsNamespace().attributes = Dict();
}

absl::Status Interpreter::Run(const Body& body, const Dict& variables, std::string* out) {
  auto globals = std::make_shared<Frame>();
  Dict builtins;
  AddGlobals(&builtins);
  for (const auto& [name, value] : builtins.entries()) globals->Set(name.AsString(), value);
  for (const auto& [name, value] : variables.entries()) {
    if (name.is_string()) globals->Set(name.AsString(), value);
  }
  frame_ = std::move(globals);
  out_ = out;
  return ExecBody(body);
}

absl::Status Interpreter::CheckSize(int64_t bytes) const {
  if (bytes > options_.limits.max_output_bytes) {
    return absl::ResourceExhaustedError(
        StrCat("the chat template built a value larger than the limit of ",
               options_.limits.max_output_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Spend(int64_t count) {
  steps_ += count;
  if (steps_ > options_.limits.max_steps) {
    return absl::ResourceExhaustedError(
        StrCat("the chat template ran more than ", options_.limits.max_steps, " steps"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Emit(std::string_view text) {
  output_bytes_ += static_cast<int64_t>(text.size());
  if (output_bytes_ > options_.limits.max_output_bytes) {
    return absl::ResourceExhaustedError(StrCat("the chat template's output passed the limit of ",
                                               options_.limits.max_output_bytes, " bytes"));
  }
  out_->append(text);
  return absl::OkStatus();
}

void Interpreter::TrackNamespace(const Value& ns) { namespaces_.push_back(ns); }

absl::Status Interpreter::Store(Frame* frame, const Target& target, Value value) {
  if (value.height() > kMaxStoredValueHeight) {
    return absl::ResourceExhaustedError(StrCat(
        "the chat template nested lists or dicts deeper than ", kMaxStoredValueHeight, " levels"));
  }
  switch (target.kind) {
    case Target::Kind::kName:
      frame->Set(target.name, std::move(value));
      return absl::OkStatus();
    case Target::Kind::kAttribute: {
      const Value* ns = frame->Find(target.name);
      if (ns == nullptr || !ns->is_namespace()) {
        return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
      }
      ns->AsNamespace().attributes.Set(target.attribute, std::move(value));
      return absl::OkStatus();
    }
    case Target::Kind::kTuple: {
      absl::StatusOr<std::shared_ptr<const List>> items = Iterate(value);
      if (!items.ok()) {
        return absl::InvalidArgumentError(
            StrCat("cannot unpack non-iterable ", TypeName(value), " object"));
      }
      const size_t expected = target.items.size();
      if ((*items)->size() > expected) {
        return absl::InvalidArgumentError(
            StrCat("too many values to unpack (expected ", expected, ")"));
      }
      if ((*items)->size() < expected) {
        return absl::InvalidArgumentError(StrCat("not enough values to unpack (expected ", expected,
                                                 ", got ", (*items)->size(), ")"));
      }
      for (size_t i = 0; i < expected; ++i) {
        LMSERVE_RETURN_IF_ERROR(Store(frame, target.items[i], (**items)[i]));
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecBody(const Body& body) {
  for (const StmtPtr& stmt : body) {
    LMSERVE_RETURN_IF_ERROR(Exec(*stmt));
    if (flow_ != Flow::kNormal) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Interpreter::Capture(const Body& body, std::shared_ptr<Frame> frame) {
  std::string captured;
  std::string* const saved_out = out_;
  std::shared_ptr<Frame> saved_frame = std::move(frame_);
  out_ = &captured;
  frame_ = std::move(frame);
  absl::Status status = ExecBody(body);
  out_ = saved_out;
  frame_ = std::move(saved_frame);
  if (!status.ok()) return status;
  return captured;
}

std::shared_ptr<Frame> Interpreter::ChildFrame() const {
  auto frame = std::make_shared<Frame>();
  frame->parent = frame_;
  return frame;
}

absl::Status Interpreter::Exec(const Stmt& stmt) {
  DepthGuard depth(this);
  if (depth.too_deep()) return Located(depth.Error(), stmt.pos);
  absl::Status spent = Spend(1);
  if (!spent.ok()) return Located(spent, stmt.pos);
  switch (stmt.kind) {
    case StmtKind::kText:
      return Located(Emit(stmt.text), stmt.pos);
    case StmtKind::kOutput: {
      LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr));
      if (value.is_string()) return Located(Emit(value.AsString()), stmt.pos);
      return Located(Emit(ToStr(value)), stmt.pos);
    }
    case StmtKind::kIf:
      for (const IfBranch& branch : stmt.branches) {
        LMSERVE_ASSIGN_OR_RETURN(Value condition, Eval(*branch.condition));
        if (Truthy(condition)) return ExecBody(branch.body);
      }
      return ExecBody(stmt.else_body);
    case StmtKind::kFor:
      return ExecFor(stmt);
    case StmtKind::kSet: {
      LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*stmt.expr));
      return Located(Store(frame_.get(), stmt.target, std::move(value)), stmt.pos);
    }
    case StmtKind::kSetBlock: {
      LMSERVE_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body, ChildFrame()));
      Value value = Value::String(std::move(text));
      if (stmt.expr != nullptr) {
        LMSERVE_ASSIGN_OR_RETURN(Value filtered, ApplyChain(*stmt.expr, std::move(value)));
        value = std::move(filtered);
      }
      return Located(Store(frame_.get(), stmt.target, std::move(value)), stmt.pos);
    }
    case StmtKind::kMacro:
      frame_->Set(stmt.text, Value::MakeCallable(std::make_shared<MacroCallable>(&stmt, frame_)));
      macro_frames_.push_back(frame_);
      return absl::OkStatus();
    case StmtKind::kCallBlock:
      return ExecCallBlock(stmt);
    case StmtKind::kFilterBlock: {
      LMSERVE_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body, ChildFrame()));
      LMSERVE_ASSIGN_OR_RETURN(Value filtered,
                               ApplyChain(*stmt.expr, Value::String(std::move(text))));
      return Located(Emit(ToStr(filtered)), stmt.pos);
    }
    case StmtKind::kBreak:
      flow_ = Flow::kBreak;
      return absl::OkStatus();
    case StmtKind::kContinue:
      flow_ = Flow::kContinue;
      return absl::OkStatus();
    case StmtKind::kGeneration:
      return ExecBody(stmt.body);
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::ApplyChain(const Expr& chain, Value subject) {
  // The chain's innermost operand is the placeholder variable "": bind it in a scope of its own.
  std::shared_ptr<Frame> saved = frame_;
  frame_ = ChildFrame();
  frame_->Set("", std::move(subject));
  absl::StatusOr<Value> result = Eval(chain);
  frame_ = std::move(saved);
  return result;
}

absl::Status Interpreter::ExecFor(const Stmt& stmt) {
  LMSERVE_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
  absl::StatusOr<std::shared_ptr<const List>> all = Iterate(iterable);
  if (!all.ok()) return Located(all.status(), stmt.expr->pos);
  std::shared_ptr<const List> items = *std::move(all);
  std::shared_ptr<Frame> outer = frame_;
  if (stmt.condition != nullptr) {
    // `for x in xs if cond`: filtered first, so that loop.length and loop.last count the kept.
    List kept;
    for (const Value& item : *items) {
      frame_ = ChildFrame();
      absl::Status bound = Store(frame_.get(), stmt.target, item);
      absl::StatusOr<Value> keep =
          bound.ok() ? Eval(*stmt.condition) : absl::StatusOr<Value>(bound);
      frame_ = outer;
      if (!keep.ok()) return Located(keep.status(), stmt.pos);
      if (Truthy(*keep)) kept.push_back(item);
    }
    items = std::make_shared<const List>(std::move(kept));
  }
  if (items->empty()) {
    frame_ = ChildFrame();
    absl::Status status = ExecBody(stmt.else_body);
    frame_ = outer;
    return status;
  }
  const int64_t length = static_cast<int64_t>(items->size());
  for (int64_t i = 0; i < length; ++i) {
    absl::Status spent = Spend(1);  // an empty body still costs an iteration
    if (!spent.ok()) return Located(spent, stmt.pos);
    auto frame = std::make_shared<Frame>();
    frame->variables.reserve(2);
    frame->parent = outer;
    absl::Status status = Store(frame.get(), stmt.target, (*items)[i]);
    if (!status.ok()) return Located(status, stmt.pos);
    // The loop object's keys are made once (strings are shared, so copies are cheap).
    enum LoopKey {
      kIndex,
      kIndex0,
      kRevindex,
      kRevindex0,
      kFirst,
      kLast,
      kLength,
      kDepth,
      kDepth0,
      kPrevitem,
      kNextitem,
      kCycle,
      kNumLoopKeys
    };
    static const Value* const kLoopKeys = [] {
      static const char* const kNames[] = {"index",  "index0",   "revindex", "revindex0",
                                           "first",  "last",     "length",   "depth",
                                           "depth0", "previtem", "nextitem", "cycle"};
      Value* keys = new Value[kNumLoopKeys];
      for (int k = 0; k < kNumLoopKeys; ++k) keys[k] = Value::String(kNames[k]);
      return keys;
    }();
    Dict loop;
    loop.Reserve(kNumLoopKeys);
    loop.Append(kLoopKeys[kIndex], Value::Int(i + 1));
    loop.Append(kLoopKeys[kIndex0], Value::Int(i));
    loop.Append(kLoopKeys[kRevindex], Value::Int(length - i));
    loop.Append(kLoopKeys[kRevindex0], Value::Int(length - i - 1));
    loop.Append(kLoopKeys[kFirst], Value::Bool(i == 0));
    loop.Append(kLoopKeys[kLast], Value::Bool(i == length - 1));
    loop.Append(kLoopKeys[kLength], Value::Int(length));
    loop.Append(kLoopKeys[kDepth], Value::Int(1));
    loop.Append(kLoopKeys[kDepth0], Value::Int(0));
    if (i > 0) loop.Append(kLoopKeys[kPrevitem], (*items)[i - 1]);
    if (i + 1 < length) loop.Append(kLoopKeys[kNextitem], (*items)[i + 1]);
    loop.Append(kLoopKeys[kCycle], Value::MakeCallable(std::make_shared<CycleCallable>(i)));
    frame->Set("loop", Value::MakeDict(std::move(loop)));
    frame_ = std::move(frame);
    status = ExecBody(stmt.body);
    frame_ = outer;
    if (!status.ok()) return status;
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecCallBlock(const Stmt& stmt) {
  const Expr& call = *stmt.expr;
  LMSERVE_ASSIGN_OR_RETURN(Value callee, Eval(*call.operands[0]));
  LMSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call.args));
  const Value caller = Value::MakeCallable(std::make_shared<CallerCallable>(&stmt, frame_));
  args.keyword.emplace_back("caller", caller);
  absl::StatusOr<Value> result = CallValue(callee, args);
  if (!result.ok()) return Located(result.status(), call.pos);
  return Located(Emit(ToStr(*result)), stmt.pos);
}

absl::StatusOr<Value> Interpreter::CallMacro(const Stmt& macro,
                                             const std::shared_ptr<Frame>& closure,
                                             const CallArgs& args, const Value* caller) {
  if (call_depth_ >= options_.limits.max_call_depth) {
    return absl::ResourceExhaustedError(StrCat("the chat template nested macro calls deeper than ",
                                               options_.limits.max_call_depth, " levels"));
  }
  auto frame = std::make_shared<Frame>();
  frame->parent = closure;
  const std::vector<std::string>& names = macro.parameters.names;
  List varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < names.size()) {
      frame->Set(names[i], args.positional[i]);
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  Dict kwargs;
  for (const auto& [name, value] : args.keyword) {
    if (name == "caller") {
      frame->Set("caller", value);
      continue;
    }
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      kwargs.Set(name, value);
      continue;
    }
    if (static_cast<size_t>(it - names.begin()) < args.positional.size()) {
      return absl::InvalidArgumentError(
          StrCat("macro '", macro.text, "' got multiple values for argument '", name, "'"));
    }
    frame->Set(name, value);
  }
  if (caller != nullptr) frame->Set("caller", *caller);
  frame->Set("varargs", Value::MakeTuple(std::move(varargs)));
  frame->Set("kwargs", Value::MakeDict(std::move(kwargs)));
  // Defaults are evaluated at call time, in the macro's scope (earlier parameters visible).
  std::shared_ptr<Frame> saved = std::move(frame_);
  frame_ = frame;
  for (size_t i = 0; i < names.size(); ++i) {
    bool given = i < args.positional.size();
    for (const auto& [name, value] : args.keyword) given = given || name == names[i];
    if (given) continue;
    if (macro.parameters.defaults[i] == nullptr) {
      frame->Set(names[i], Value::Undefined(StrCat("parameter '", names[i], "' was not provided")));
      continue;
    }
    absl::StatusOr<Value> value = Eval(*macro.parameters.defaults[i]);
    if (!value.ok()) {
      frame_ = std::move(saved);
      return value.status();
    }
    frame->Set(names[i], *std::move(value));
  }
  frame_ = std::move(saved);
  ++call_depth_;
  absl::StatusOr<std::string> text = Capture(macro.body, std::move(frame));
  --call_depth_;
  if (!text.ok()) return text.status();
  return Value::String(*std::move(text));
}

// ---- Expressions -------------------------------------------------------------------------------

absl::StatusOr<Value> Interpreter::Eval(const Expr& expr) {
  DepthGuard depth(this);
  if (depth.too_deep()) return Located(depth.Error(), expr.pos);
  absl::Status spent = Spend(1);
  if (!spent.ok()) return Located(spent, expr.pos);
  absl::StatusOr<Value> value = EvalInner(expr);
  if (!value.ok()) return Located(value.status(), expr.pos);
  return value;
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const ArgExprs& args) {
  CallArgs values;
  values.positional.reserve(args.positional.size());
  for (const ExprPtr& arg : args.positional) {
    LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*arg));
    values.positional.push_back(std::move(value));
  }
  for (const auto& [name, arg] : args.keyword) {
    LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*arg));
    values.keyword.emplace_back(name, std::move(value));
  }
  return values;
}

absl::StatusOr<Value> Interpreter::EvalInner(const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kLiteral:
      return expr.literal;
    case ExprKind::kName: {
      const Value* value = frame_->Find(expr.name);
      if (value == nullptr) return Value::Undefined(StrCat("'", expr.name, "' is undefined"));
      return *value;
    }
    case ExprKind::kGetAttr: {
      LMSERVE_ASSIGN_OR_RETURN(Value object, Eval(*expr.operands[0]));
      return GetAttr(object, expr.name);
    }
    case ExprKind::kGetItem: {
      LMSERVE_ASSIGN_OR_RETURN(Value object, Eval(*expr.operands[0]));
      LMSERVE_ASSIGN_OR_RETURN(Value key, Eval(*expr.operands[1]));
      return GetItem(object, key);
    }
    case ExprKind::kSlice: {
      LMSERVE_ASSIGN_OR_RETURN(Value object, Eval(*expr.operands[0]));
      return Slice(object, expr);
    }
    case ExprKind::kCall:
      return EvalCall(expr);
    case ExprKind::kFilter: {
      LMSERVE_ASSIGN_OR_RETURN(Value subject, Eval(*expr.operands[0]));
      LMSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args));
      return ApplyFilter(expr.name, subject, args);
    }
    case ExprKind::kTest: {
      LMSERVE_ASSIGN_OR_RETURN(Value subject, Eval(*expr.operands[0]));
      LMSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args));
      LMSERVE_ASSIGN_OR_RETURN(bool result, ApplyTest(expr.name, subject, args));
      return Value::Bool(result != expr.negated);
    }
    case ExprKind::kUnary: {
      LMSERVE_ASSIGN_OR_RETURN(Value operand, Eval(*expr.operands[0]));
      if (expr.op == "not") return Value::Bool(!Truthy(operand));
      if (operand.is_undefined()) return UndefinedError(operand);
      if (!operand.is_number()) {
        return absl::InvalidArgumentError(
            StrCat("bad operand type for unary ", expr.op, ": '", TypeName(operand), "'"));
      }
      if (expr.op == "+") return operand.is_float() ? operand : Value::Int(operand.AsInt());
      if (operand.is_float()) return Value::Float(-operand.AsDouble());
      if (operand.AsInt() == std::numeric_limits<int64_t>::min()) {
        return absl::InvalidArgumentError("integer overflow");
      }
      return Value::Int(-operand.AsInt());
    }
    case ExprKind::kBinary:
      return EvalBinary(expr);
    case ExprKind::kCompare:
      return EvalCompare(expr);
    case ExprKind::kCondExpr: {
      LMSERVE_ASSIGN_OR_RETURN(Value condition, Eval(*expr.operands[1]));
      if (Truthy(condition)) return Eval(*expr.operands[0]);
      if (expr.operands[2] == nullptr) {
        return Value::Undefined(
            "the inline if-expression evaluated to false and no else section was defined.");
      }
      return Eval(*expr.operands[2]);
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      items.reserve(expr.operands.size());
      for (const ExprPtr& operand : expr.operands) {
        LMSERVE_ASSIGN_OR_RETURN(Value item, Eval(*operand));
        items.push_back(std::move(item));
      }
      return expr.kind == ExprKind::kList ? Value::MakeList(std::move(items))
                                          : Value::MakeTuple(std::move(items));
    }
    case ExprKind::kDict: {
      Dict dict;
      for (size_t i = 0; i + 1 < expr.operands.size(); i += 2) {
        LMSERVE_ASSIGN_OR_RETURN(Value key, Eval(*expr.operands[i]));
        if (key.is_list() && !key.is_tuple()) {
          return absl::InvalidArgumentError("unhashable type: 'list'");
        }
        if (key.is_dict() || key.is_undefined()) {
          return absl::InvalidArgumentError(StrCat("unhashable type: '", TypeName(key), "'"));
        }
        LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*expr.operands[i + 1]));
        dict.Set(std::move(key), std::move(value));
      }
      return Value::MakeDict(std::move(dict));
    }
  }
  return absl::InternalError("unknown expression");
}

absl::StatusOr<Value> Interpreter::EvalCall(const Expr& expr) {
  const Expr& callee_expr = *expr.operands[0];
  Value callee;
  if (callee_expr.kind == ExprKind::kGetAttr) {
    // obj.method(...): call the method directly, without making a bound method value.
    LMSERVE_ASSIGN_OR_RETURN(Value object, Eval(*callee_expr.operands[0]));
    if (HasMethod(object, callee_expr.name)) {
      LMSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args));
      return CallMethod(*this, object, callee_expr.name, args);
    }
    LMSERVE_ASSIGN_OR_RETURN(Value attribute, GetAttr(object, callee_expr.name));
    callee = std::move(attribute);
  } else {
    LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(callee_expr));
    callee = std::move(value);
  }
  LMSERVE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(expr.args));
  return CallValue(callee, args);
}

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return absl::InvalidArgumentError(StrCat("'", TypeName(callee), "' object is not callable"));
  }
  return callee.AsCallable().Call(*this, args);
}

absl::StatusOr<Value> Interpreter::ApplyFilter(std::string_view name, const Value& subject,
                                               const CallArgs& args) {
  const FilterFunction filter = FindFilter(name);
  if (filter == nullptr) return absl::InvalidArgumentError(StrCat("no filter named '", name, "'"));
  return filter(*this, subject, args);
}

absl::StatusOr<bool> Interpreter::ApplyTest(std::string_view name, const Value& subject,
                                            const CallArgs& args) {
  const TestFunction test = FindTest(name);
  if (test == nullptr) return absl::InvalidArgumentError(StrCat("no test named '", name, "'"));
  return test(*this, subject, args);
}

absl::StatusOr<Value> Interpreter::GetAttr(const Value& object, std::string_view name) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      return UndefinedError(object);
    case Value::Type::kDict: {
      if (HasMethod(object, name)) return BoundMethod(object, name);
      const Value* found = object.AsDict().Find(name);
      if (found != nullptr) return *found;
      return MissingAttribute(object, name);
    }
    case Value::Type::kNamespace: {
      const Value* found = object.AsNamespace().attributes.Find(name);
      if (found != nullptr) return *found;
      return MissingAttribute(object, name);
    }
    case Value::Type::kString:
      if (HasMethod(object, name)) return BoundMethod(object, name);
      return MissingAttribute(object, name);
    default:
      return MissingAttribute(object, name);
  }
}

absl::StatusOr<Value> Interpreter::GetItem(const Value& object, const Value& key) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      return UndefinedError(object);
    case Value::Type::kDict: {
      const Value* found = object.AsDict().Find(key);
      if (found != nullptr) return *found;
      if (key.is_string() && HasMethod(object, key.AsString())) {
        return BoundMethod(object, key.AsString());
      }
      return MissingElement(object, key);
    }
    case Value::Type::kList:
    case Value::Type::kString: {
      if (key.is_string()) return GetAttr(object, key.AsString());
      if (!key.is_int() && !key.is_bool()) return MissingElement(object, key);
      int64_t index = key.AsInt();
      if (object.is_list()) {
        const int64_t size = static_cast<int64_t>(object.AsList().size());
        if (index < 0) index += size;
        if (index < 0 || index >= size) return MissingElement(object, key);
        return object.AsList()[static_cast<size_t>(index)];
      }
      const std::string& text = object.AsString();
      const std::vector<size_t> offsets = CodePointOffsets(text);
      const int64_t size = static_cast<int64_t>(offsets.size()) - 1;
      if (index < 0) index += size;
      if (index < 0 || index >= size) return MissingElement(object, key);
      return Value::String(text.substr(offsets[index], offsets[index + 1] - offsets[index]));
    }
    case Value::Type::kNamespace:
      if (key.is_string()) return GetAttr(object, key.AsString());
      return MissingElement(object, key);
    default:
      return MissingElement(object, key);
  }
}

absl::StatusOr<Value> Interpreter::Slice(const Value& object, const Expr& expr) {
  std::optional<int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    const ExprPtr& bound = expr.operands[i + 1];
    if (bound == nullptr) continue;
    LMSERVE_ASSIGN_OR_RETURN(Value value, Eval(*bound));
    if (value.is_none()) continue;
    if (!value.is_int() && !value.is_bool()) {
      return absl::InvalidArgumentError(
          "slice indices must be integers or None or have an __index__ method");
    }
    bounds[i] = value.AsInt();
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (object.is_undefined()) return UndefinedError(object);
  if (object.is_list()) {
    const List& items = object.AsList();
    List out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(items.size()), bounds[0], bounds[1], step)) {
      out.push_back(items[static_cast<size_t>(i)]);
    }
    LMSERVE_RETURN_IF_ERROR(Spend(static_cast<int64_t>(out.size())));
    return object.is_tuple() ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
  }
  if (object.is_string()) {
    const std::string& text = object.AsString();
    const std::vector<size_t> offsets = CodePointOffsets(text);
    std::string out;
    for (int64_t i :
         SliceIndices(static_cast<int64_t>(offsets.size()) - 1, bounds[0], bounds[1], step)) {
      out.append(text, offsets[i], offsets[i + 1] - offsets[i]);
    }
    return Value::String(std::move(out));
  }
  return absl::InvalidArgumentError(StrCat("'", TypeName(object), "' object is not subscriptable"));
}

absl::StatusOr<Value> Interpreter::EvalBinary(const Expr& expr) {
  absl::StatusOr<Value> left = Eval(*expr.operands[0]);
  if (!left.ok()) return left;
  if (expr.op == "and") return Truthy(*left) ? Eval(*expr.operands[1]) : left;
  if (expr.op == "or") return Truthy(*left) ? left : Eval(*expr.operands[1]);
  LMSERVE_ASSIGN_OR_RETURN(Value right, Eval(*expr.operands[1]));
  return Arithmetic(*this, expr.op, *left, right);
}

absl::StatusOr<Value> Interpreter::EvalCompare(const Expr& expr) {
  LMSERVE_ASSIGN_OR_RETURN(Value left, Eval(*expr.operands[0]));
  for (size_t i = 0; i < expr.compare_ops.size(); ++i) {
    LMSERVE_ASSIGN_OR_RETURN(Value right, Eval(*expr.operands[i + 1]));
    const std::string& op = expr.compare_ops[i];
    bool holds;
    if (op == "==") {
      holds = Equals(left, right);
    } else if (op == "!=") {
      holds = !Equals(left, right);
    } else if (op == "in" || op == "not in") {
      LMSERVE_ASSIGN_OR_RETURN(bool contained, Contains(right, left));
      holds = contained == (op == "in");
    } else {
      if (left.is_undefined()) return UndefinedError(left);
      if (right.is_undefined()) return UndefinedError(right);
      absl::StatusOr<int> order = Compare(left, right);
      if (!order.ok()) {
        return absl::InvalidArgumentError(StrCat("'", op, "' ", order.status().message()));
      }
      holds = op == "<"    ? *order < 0
              : op == "<=" ? *order <= 0
              : op == ">"  ? *order > 0
                           : *order >= 0;
    }
    if (!holds) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

}  // namespace lmserve::engine::jinja
