// The syntax tree of a parsed Jinja template. Built by the parser, read by the interpreter;
// immutable after parsing. Every node carries its source position for error messages.

#ifndef LMSERVE_ENGINE_CHAT_JINJA_AST_H_
#define LMSERVE_ENGINE_CHAT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/jinja/lexer.h"
#include "engine/chat/jinja/value.h"

namespace lmserve::engine::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// Arguments as written at a call, filter or test.
struct ArgExprs {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kGetAttr,   // operands[0].name
  kGetItem,   // operands[0][operands[1]]
  kSlice,     // operands[0][operands[1]:operands[2]:operands[3]], absent bounds are nullptr
  kCall,      // operands[0](args)
  kFilter,    // operands[0] | name(args)
  kTest,      // operands[0] is [not] name(args); `negated`
  kUnary,     // op operands[0]: "-", "+", "not"
  kBinary,    // operands[0] op operands[1]: + - * / // % ** ~ and or
  kCompare,   // operands[0] compare_ops[0] operands[1] compare_ops[1] operands[2] ...
  kCondExpr,  // operands[0] if operands[1] else operands[2] (nullptr: no else)
  kList,      // [operands...]
  kTuple,     // (operands...)
  kDict,      // {operands[0]: operands[1], operands[2]: operands[3], ...}
};

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  SourcePos pos;
  Value literal;     // kLiteral
  std::string name;  // kName, kGetAttr, kFilter, kTest
  std::string op;    // kUnary, kBinary
  std::vector<ExprPtr> operands;
  std::vector<std::string> compare_ops;  // kCompare: == != < > <= >= in "not in"
  ArgExprs args;                         // kCall, kFilter, kTest
  bool negated = false;                  // kTest
  int height = 1;                        // of this subtree; the parser bounds it
};

// The left side of {% set %} and the variables of {% for %}.
struct Target {
  enum class Kind { kName, kAttribute, kTuple };
  Kind kind = Kind::kName;
  std::string name;           // kName: the variable; kAttribute: the namespace variable
  std::string attribute;      // kAttribute: ns.attribute
  std::vector<Target> items;  // kTuple
};

// A macro's (or a call block's caller's) parameters.
struct Parameters {
  std::vector<std::string> names;
  std::vector<ExprPtr> defaults;  // one per name; nullptr when none
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // if/elif branches, else_body
  kFor,          // for target in expr [if condition] body [else else_body]
  kSet,          // set target = expr
  kSetBlock,     // set target; body; endset (expr: optional filter chain applied, on a kName
                 // placeholder named "")
  kMacro,        // macro name(parameters) body
  kCallBlock,    // call[(parameters)] expr body: expr is the call, body is caller()
  kFilterBlock,  // filter chain body: expr applies the chain to a placeholder named ""
  kBreak,
  kContinue,
  kGeneration,  // transformers' {% generation %}: renders its body
};

struct IfBranch {
  ExprPtr condition;
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  SourcePos pos;
  std::string text;                // kText; kMacro: the macro's name
  ExprPtr expr;                    // see StmtKind
  ExprPtr condition;               // kFor: the loop filter
  Target target;                   // kFor, kSet, kSetBlock
  std::vector<IfBranch> branches;  // kIf
  Body body;
  Body else_body;         // kIf, kFor
  Parameters parameters;  // kMacro, kCallBlock
};

}  // namespace lmserve::engine::jinja

#endif  // LMSERVE_ENGINE_CHAT_JINJA_AST_H_
