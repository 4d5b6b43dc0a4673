#include "engine/chat/jinja/parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"

namespace lmserve::engine::jinja {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, int max_nesting)
      : tokens_(tokens), max_nesting_(max_nesting) {}

  absl::StatusOr<Body> ParseTemplate() {
    Body body;
    std::string found;
    LMSERVE_RETURN_IF_ERROR(ParseBody({}, "", SourcePos{}, &body, &found));
    return body;
  }

 private:
  // RAII depth counter that bounds the parser's recursion.
  class Nesting {
   public:
    explicit Nesting(Parser* parser) : parser_(parser) { ++parser_->nesting_; }
    ~Nesting() { --parser_->nesting_; }
    bool too_deep() const { return parser_->nesting_ > parser_->max_nesting_; }

   private:
    Parser* parser_;
  };

  const Token& Current() const { return tokens_[index_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  void Advance() {
    if (Current().kind != TokenKind::kEnd) ++index_;
  }

  bool IsOperator(std::string_view op) const {
    return Current().kind == TokenKind::kOperator && Current().text == op;
  }
  bool IsName(std::string_view name) const {
    return Current().kind == TokenKind::kName && Current().text == name;
  }

  static std::string Describe(const Token& token) {
    switch (token.kind) {
      case TokenKind::kText:
        return "template text";
      case TokenKind::kVariableBegin:
        return "'{{'";
      case TokenKind::kVariableEnd:
        return "'}}'";
      case TokenKind::kBlockBegin:
        return "'{%'";
      case TokenKind::kBlockEnd:
        return "'%}'";
      case TokenKind::kName:
        return StrCat("'", token.text, "'");
      case TokenKind::kString:
        return "a string";
      case TokenKind::kInteger:
      case TokenKind::kFloat:
        return "a number";
      case TokenKind::kOperator:
        return StrCat("'", token.text, "'");
      case TokenKind::kEnd:
        return "the end of the template";
    }
    return "a token";
  }

  absl::Status ErrorAt(SourcePos pos, std::string_view message) const {
    return absl::InvalidArgumentError(
        StrCat("line ", pos.line, ", column ", pos.column, ": ", message));
  }
  absl::Status Unexpected(std::string_view expected) const {
    return ErrorAt(Current().pos, StrCat("expected ", expected, ", got ", Describe(Current())));
  }
  absl::Status TooDeep() const {
    return ErrorAt(Current().pos, StrCat("nesting deeper than ", max_nesting_, " levels"));
  }

  absl::Status ExpectOperator(std::string_view op) {
    if (!IsOperator(op)) return Unexpected(StrCat("'", op, "'"));
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Current().kind != TokenKind::kBlockEnd) return Unexpected("'%}'");
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Current().kind != TokenKind::kName) return Unexpected("a name");
    std::string name = Current().text;
    Advance();
    return name;
  }

  // Computes the height of a composite node and bounds it: evaluating and destroying the tree
  // recurse once per level, so a long chain ("1+1+...+1", "x|f|f|...|f") must be refused here.
  absl::StatusOr<ExprPtr> Finish(ExprPtr expr) {
    int height = 0;
    const auto visit = [&](const ExprPtr& child) {
      if (child != nullptr) height = std::max(height, child->height);
    };
    for (const ExprPtr& child : expr->operands) visit(child);
    for (const ExprPtr& child : expr->args.positional) visit(child);
    for (const auto& [name, child] : expr->args.keyword) visit(child);
    expr->height = height + 1;
    if (expr->height > max_nesting_) {
      return ErrorAt(expr->pos, StrCat("expression nested deeper than ", max_nesting_, " levels"));
    }
    return expr;
  }

  ExprPtr NewExpr(ExprKind kind, SourcePos pos) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->pos = pos;
    return expr;
  }

  // ---- Statements ------------------------------------------------------------------------------

  // Parses statements until "{% word" for a word of `end_words` (consumed up to the word; the
  // rest of that tag is the caller's) or the end of the template (an error when `end_words` is
  // not empty). `opener` and `opened_at` describe the enclosing block for that error.
  absl::Status ParseBody(std::initializer_list<std::string_view> end_words, std::string_view opener,
                         SourcePos opened_at, Body* body, std::string* found) {
    Nesting nesting(this);
    if (nesting.too_deep()) return TooDeep();
    while (true) {
      const Token& token = Current();
      switch (token.kind) {
        case TokenKind::kText: {
          auto stmt = std::make_unique<Stmt>();
          stmt->kind = StmtKind::kText;
          stmt->pos = token.pos;
          stmt->text = token.text;
          body->push_back(std::move(stmt));
          Advance();
          break;
        }
        case TokenKind::kVariableBegin: {
          auto stmt = std::make_unique<Stmt>();
          stmt->kind = StmtKind::kOutput;
          stmt->pos = token.pos;
          Advance();
          LMSERVE_ASSIGN_OR_RETURN(ExprPtr expr, ParseTuple(/*with_condexpr=*/true, false));
          if (Current().kind != TokenKind::kVariableEnd) return Unexpected("'}}'");
          Advance();
          stmt->expr = std::move(expr);
          body->push_back(std::move(stmt));
          break;
        }
        case TokenKind::kBlockBegin: {
          const Token& word = Peek();
          if (word.kind == TokenKind::kName) {
            for (std::string_view end_word : end_words) {
              if (word.text == end_word) {
                *found = word.text;
                Advance();
                Advance();
                return absl::OkStatus();
              }
            }
          }
          LMSERVE_RETURN_IF_ERROR(ParseStatement(body));
          break;
        }
        case TokenKind::kEnd: {
          if (end_words.size() == 0) return absl::OkStatus();
          std::vector<std::string> quoted;
          for (std::string_view end_word : end_words) quoted.push_back(StrCat("'", end_word, "'"));
          return ErrorAt(token.pos, StrCat("unexpected end of template: the '", opener,
                                           "' block opened at "
                                           "line ",
                                           opened_at.line, " is not closed (expected ",
                                           StrJoin(quoted, " or "), ")"));
        }
        default:
          return Unexpected("template text or a tag");
      }
    }
  }

  absl::Status ParseStatement(Body* body) {
    const SourcePos pos = Current().pos;  // the "{%"
    Advance();
    if (Current().kind != TokenKind::kName) return Unexpected("a statement name");
    const std::string word = Current().text;
    const SourcePos word_pos = Current().pos;
    Advance();
    auto stmt = std::make_unique<Stmt>();
    stmt->pos = pos;
    absl::Status status;
    if (word == "if") {
      status = ParseIf(stmt.get());
    } else if (word == "for") {
      status = ParseFor(stmt.get());
    } else if (word == "set") {
      status = ParseSet(stmt.get());
    } else if (word == "macro") {
      status = ParseMacro(stmt.get());
    } else if (word == "call") {
      status = ParseCallBlock(stmt.get());
    } else if (word == "filter") {
      status = ParseFilterBlock(stmt.get());
    } else if (word == "generation") {
      stmt->kind = StmtKind::kGeneration;
      status = ExpectBlockEnd();
      if (status.ok()) status = ParseEnd(stmt.get(), "generation", "endgeneration");
    } else if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) return ErrorAt(word_pos, StrCat("'", word, "' outside of a loop"));
      stmt->kind = word == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      status = ExpectBlockEnd();
    } else if (word == "include" || word == "extends" || word == "import" || word == "from" ||
               word == "block" || word == "with" || word == "do" || word == "autoescape" ||
               word == "trans") {
      return ErrorAt(word_pos, StrCat("the '", word, "' tag is not supported in chat templates"));
    } else {
      return ErrorAt(word_pos, StrCat("unknown tag '", word, "'"));
    }
    if (!status.ok()) return status;
    body->push_back(std::move(stmt));
    return absl::OkStatus();
  }

  // Parses the body of a block whose only end word is `end_word`, and the end tag.
  absl::Status ParseEnd(Stmt* stmt, std::string_view opener, std::string_view end_word) {
    std::string found;
    LMSERVE_RETURN_IF_ERROR(ParseBody({end_word}, opener, stmt->pos, &stmt->body, &found));
    return ExpectBlockEnd();
  }

  absl::Status ParseIf(Stmt* stmt) {
    stmt->kind = StmtKind::kIf;
    while (true) {
      IfBranch branch;
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr condition, ParseTuple(/*with_condexpr=*/false, false));
      branch.condition = std::move(condition);
      LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string found;
      LMSERVE_RETURN_IF_ERROR(
          ParseBody({"elif", "else", "endif"}, "if", stmt->pos, &branch.body, &found));
      stmt->branches.push_back(std::move(branch));
      if (found == "elif") continue;
      LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
      if (found == "else") {
        LMSERVE_RETURN_IF_ERROR(ParseBody({"endif"}, "if", stmt->pos, &stmt->else_body, &found));
        return ExpectBlockEnd();
      }
      return absl::OkStatus();
    }
  }

  absl::Status ParseFor(Stmt* stmt) {
    stmt->kind = StmtKind::kFor;
    LMSERVE_ASSIGN_OR_RETURN(Target target, ParseTargetList(/*allow_attribute=*/false));
    stmt->target = std::move(target);
    if (!IsName("in")) return Unexpected("'in'");
    Advance();
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr iterable, ParseTuple(/*with_condexpr=*/false, false));
    stmt->expr = std::move(iterable);
    if (IsName("if")) {
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr condition, ParseExpression(/*with_condexpr=*/true));
      stmt->condition = std::move(condition);
    }
    if (IsName("recursive")) {
      return ErrorAt(Current().pos, "recursive loops are not supported in chat templates");
    }
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string found;
    ++loop_depth_;
    absl::Status status = ParseBody({"else", "endfor"}, "for", stmt->pos, &stmt->body, &found);
    --loop_depth_;
    if (!status.ok()) return status;
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    if (found == "else") {
      // The else body runs outside the loop: break and continue are not allowed there.
      const int saved = loop_depth_;
      loop_depth_ = 0;
      status = ParseBody({"endfor"}, "for", stmt->pos, &stmt->else_body, &found);
      loop_depth_ = saved;
      if (!status.ok()) return status;
      return ExpectBlockEnd();
    }
    return absl::OkStatus();
  }

  absl::Status ParseSet(Stmt* stmt) {
    LMSERVE_ASSIGN_OR_RETURN(Target target, ParseTargetList(/*allow_attribute=*/true));
    stmt->target = std::move(target);
    if (IsOperator("=")) {
      Advance();
      stmt->kind = StmtKind::kSet;
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseTuple(/*with_condexpr=*/true, false));
      stmt->expr = std::move(value);
      return ExpectBlockEnd();
    }
    // {% set name [| filters] %}...{% endset %}
    stmt->kind = StmtKind::kSetBlock;
    if (stmt->target.kind == Target::Kind::kTuple) return Unexpected("'='");
    if (IsOperator("|")) {
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr chain, ParseFilterChain());
      stmt->expr = std::move(chain);
    }
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    return ParseEnd(stmt, "set", "endset");
  }

  absl::Status ParseParameters(Parameters* parameters) {
    LMSERVE_RETURN_IF_ERROR(ExpectOperator("("));
    while (!IsOperator(")")) {
      if (!parameters->names.empty()) {
        LMSERVE_RETURN_IF_ERROR(ExpectOperator(","));
        if (IsOperator(")")) break;
      }
      LMSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
      ExprPtr default_value;
      if (IsOperator("=")) {
        Advance();
        LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
        default_value = std::move(value);
      } else if (!parameters->defaults.empty() && parameters->defaults.back() != nullptr) {
        return ErrorAt(Current().pos, "non-default argument follows default argument");
      }
      parameters->names.push_back(std::move(name));
      parameters->defaults.push_back(std::move(default_value));
    }
    Advance();
    return absl::OkStatus();
  }

  absl::Status ParseMacro(Stmt* stmt) {
    stmt->kind = StmtKind::kMacro;
    LMSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    stmt->text = std::move(name);
    LMSERVE_RETURN_IF_ERROR(ParseParameters(&stmt->parameters));
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    const int saved = loop_depth_;
    loop_depth_ = 0;
    const absl::Status status = ParseEnd(stmt, "macro", "endmacro");
    loop_depth_ = saved;
    return status;
  }

  absl::Status ParseCallBlock(Stmt* stmt) {
    stmt->kind = StmtKind::kCallBlock;
    if (IsOperator("(")) {
      LMSERVE_RETURN_IF_ERROR(ParseParameters(&stmt->parameters));
    }
    const SourcePos pos = Current().pos;
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr call, ParseExpression(/*with_condexpr=*/true));
    if (call->kind != ExprKind::kCall) return ErrorAt(pos, "expected a call after 'call'");
    stmt->expr = std::move(call);
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    const int saved = loop_depth_;
    loop_depth_ = 0;
    const absl::Status status = ParseEnd(stmt, "call", "endcall");
    loop_depth_ = saved;
    return status;
  }

  absl::Status ParseFilterBlock(Stmt* stmt) {
    stmt->kind = StmtKind::kFilterBlock;
    // The chain is written without the leading '|': "{% filter upper | trim %}".
    ExprPtr subject = NewExpr(ExprKind::kName, Current().pos);
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr chain, ParseFilter(std::move(subject)));
    ExprPtr expr = std::move(chain);
    while (IsOperator("|")) {
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr next, ParseFilter(std::move(expr)));
      expr = std::move(next);
    }
    stmt->expr = std::move(expr);
    LMSERVE_RETURN_IF_ERROR(ExpectBlockEnd());
    return ParseEnd(stmt, "filter", "endfilter");
  }

  // "| f(args) | g" applied to a placeholder kName "".
  absl::StatusOr<ExprPtr> ParseFilterChain() {
    ExprPtr expr = NewExpr(ExprKind::kName, Current().pos);
    while (IsOperator("|")) {
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr next, ParseFilter(std::move(expr)));
      expr = std::move(next);
    }
    return expr;
  }

  absl::StatusOr<Target> ParseTargetItem(bool allow_attribute) {
    if (IsOperator("(")) {
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(Target inner, ParseTargetList(allow_attribute));
      LMSERVE_RETURN_IF_ERROR(ExpectOperator(")"));
      return inner;
    }
    Target target;
    LMSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    target.name = std::move(name);
    if (allow_attribute && IsOperator(".")) {
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(std::string attribute, ExpectName());
      target.kind = Target::Kind::kAttribute;
      target.attribute = std::move(attribute);
    }
    return target;
  }

  absl::StatusOr<Target> ParseTargetList(bool allow_attribute) {
    absl::StatusOr<Target> first = ParseTargetItem(allow_attribute);
    if (!first.ok() || !IsOperator(",")) return first;
    Target tuple;
    tuple.kind = Target::Kind::kTuple;
    tuple.items.push_back(*std::move(first));
    while (IsOperator(",")) {
      Advance();
      if (IsName("in") || IsOperator("=") || IsOperator(")") ||
          Current().kind == TokenKind::kBlockEnd) {
        break;
      }
      LMSERVE_ASSIGN_OR_RETURN(Target item, ParseTargetItem(allow_attribute));
      tuple.items.push_back(std::move(item));
    }
    return tuple;
  }

  // ---- Expressions -----------------------------------------------------------------------------

  bool AtTupleEnd() const {
    const TokenKind kind = Current().kind;
    return kind == TokenKind::kVariableEnd || kind == TokenKind::kBlockEnd || IsOperator(")") ||
           IsName("in") || IsName("if") || IsName("recursive");
  }

  // An expression, or a tuple when commas follow ("a, b"). `explicit_parens`: inside "( )",
  // where "()" is the empty tuple and "(a)" is just a.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
    const SourcePos pos = Current().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        LMSERVE_RETURN_IF_ERROR(ExpectOperator(","));
      }
      if (AtTupleEnd()) break;
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      items.push_back(std::move(item));
      if (IsOperator(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) return Unexpected("an expression");
    }
    ExprPtr tuple = NewExpr(ExprKind::kTuple, pos);
    tuple->operands = std::move(items);
    return Finish(std::move(tuple));
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Nesting nesting(this);
    if (nesting.too_deep()) return TooDeep();
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (IsName("if")) {
      const SourcePos pos = Current().pos;
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr condition, ParseOr());
      ExprPtr otherwise;
      if (IsName("else")) {
        Advance();
        LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseCondExpr());
        otherwise = std::move(value);
      }
      ExprPtr cond = NewExpr(ExprKind::kCondExpr, pos);
      cond->operands.push_back(std::move(expr));
      cond->operands.push_back(std::move(condition));
      cond->operands.push_back(std::move(otherwise));
      LMSERVE_ASSIGN_OR_RETURN(expr, Finish(std::move(cond)));
    }
    return expr;
  }

  ExprPtr Binary(std::string op, SourcePos pos, ExprPtr left, ExprPtr right) {
    ExprPtr expr = NewExpr(ExprKind::kBinary, pos);
    expr->op = std::move(op);
    expr->operands.push_back(std::move(left));
    expr->operands.push_back(std::move(right));
    return expr;
  }

  // Left-associative binary operators: `ops` (operator tokens, or names for and/or) between
  // operands parsed by `next`.
  template <typename Next>
  absl::StatusOr<ExprPtr> ParseBinary(std::initializer_list<std::string_view> ops, bool names,
                                      Next next) {
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      std::string_view matched;
      for (std::string_view op : ops) {
        if (names ? IsName(op) : IsOperator(op)) matched = op;
      }
      if (matched.empty()) return left;
      const SourcePos pos = Current().pos;
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      LMSERVE_ASSIGN_OR_RETURN(
          left, Finish(Binary(std::string(matched), pos, std::move(left), std::move(right))));
    }
  }

  absl::StatusOr<ExprPtr> ParseOr() { return ParseBinary({"or"}, true, &Parser::ParseAnd); }
  absl::StatusOr<ExprPtr> ParseAnd() { return ParseBinary({"and"}, true, &Parser::ParseNot); }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Nesting nesting(this);
      if (nesting.too_deep()) return TooDeep();
      const SourcePos pos = Current().pos;
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr expr = NewExpr(ExprKind::kUnary, pos);
      expr->op = "not";
      expr->operands.push_back(std::move(operand));
      return Finish(std::move(expr));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const SourcePos pos = Current().pos;
    LMSERVE_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr compare;
    while (true) {
      std::string op;
      if (Current().kind == TokenKind::kOperator &&
          (Current().text == "==" || Current().text == "!=" || Current().text == "<" ||
           Current().text == ">" || Current().text == "<=" || Current().text == ">=")) {
        op = Current().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Peek().kind == TokenKind::kName && Peek().text == "in") {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (compare == nullptr) {
        compare = NewExpr(ExprKind::kCompare, pos);
        compare->operands.push_back(std::move(first));
      }
      compare->compare_ops.push_back(std::move(op));
      compare->operands.push_back(std::move(operand));
    }
    if (compare != nullptr) return Finish(std::move(compare));
    return first;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseBinary({"+", "-"}, false, &Parser::ParseConcat);
  }
  absl::StatusOr<ExprPtr> ParseConcat() { return ParseBinary({"~"}, false, &Parser::ParseMath2); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinary({"*", "/", "//", "%"}, false, &Parser::ParsePow);
  }
  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseBinary({"**"}, false, &Parser::ParseUnaryWithFilter);
  }
  absl::StatusOr<ExprPtr> ParseUnaryWithFilter() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nesting nesting(this);
    if (nesting.too_deep()) return TooDeep();
    const SourcePos pos = Current().pos;
    absl::StatusOr<ExprPtr> node;
    if (IsOperator("-") || IsOperator("+")) {
      std::string op = Current().text;
      Advance();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      ExprPtr expr = NewExpr(ExprKind::kUnary, pos);
      expr->op = std::move(op);
      expr->operands.push_back(std::move(operand));
      node = Finish(std::move(expr));
    } else {
      node = ParsePrimary();
    }
    if (!node.ok()) return node;
    node = ParsePostfix(*std::move(node));
    if (node.ok() && with_filter) node = ParseFilterExpr(*std::move(node));
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Current();
    const SourcePos pos = token.pos;
    switch (token.kind) {
      case TokenKind::kName: {
        ExprPtr expr;
        const std::string& name = token.text;
        if (name == "true" || name == "True") {
          expr = NewExpr(ExprKind::kLiteral, pos);
          expr->literal = Value::Bool(true);
        } else if (name == "false" || name == "False") {
          expr = NewExpr(ExprKind::kLiteral, pos);
          expr->literal = Value::Bool(false);
        } else if (name == "none" || name == "None") {
          expr = NewExpr(ExprKind::kLiteral, pos);
          expr->literal = Value::None();
        } else {
          expr = NewExpr(ExprKind::kName, pos);
          expr->name = name;
        }
        Advance();
        return expr;
      }
      case TokenKind::kString: {
        // Adjacent literals concatenate: 'a' 'b' is 'ab'.
        std::string text;
        while (Current().kind == TokenKind::kString) {
          text += Current().text;
          Advance();
        }
        ExprPtr expr = NewExpr(ExprKind::kLiteral, pos);
        expr->literal = Value::String(std::move(text));
        return expr;
      }
      case TokenKind::kInteger: {
        ExprPtr expr = NewExpr(ExprKind::kLiteral, pos);
        expr->literal = Value::Int(token.integer);
        Advance();
        return expr;
      }
      case TokenKind::kFloat: {
        ExprPtr expr = NewExpr(ExprKind::kLiteral, pos);
        expr->literal = Value::Float(token.number);
        Advance();
        return expr;
      }
      case TokenKind::kOperator:
        if (token.text == "(") {
          Advance();
          LMSERVE_ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(/*with_condexpr=*/true, true));
          LMSERVE_RETURN_IF_ERROR(ExpectOperator(")"));
          return inner;
        }
        if (token.text == "[") return ParseList();
        if (token.text == "{") return ParseDict();
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<ExprPtr> ParseList() {
    ExprPtr list = NewExpr(ExprKind::kList, Current().pos);
    Advance();  // [
    while (!IsOperator("]")) {
      if (!list->operands.empty()) {
        LMSERVE_RETURN_IF_ERROR(ExpectOperator(","));
        if (IsOperator("]")) break;
      }
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(/*with_condexpr=*/true));
      list->operands.push_back(std::move(item));
    }
    Advance();
    return Finish(std::move(list));
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    ExprPtr dict = NewExpr(ExprKind::kDict, Current().pos);
    Advance();  // {
    while (!IsOperator("}")) {
      if (!dict->operands.empty()) {
        LMSERVE_RETURN_IF_ERROR(ExpectOperator(","));
        if (IsOperator("}")) break;
      }
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(/*with_condexpr=*/true));
      LMSERVE_RETURN_IF_ERROR(ExpectOperator(":"));
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
      dict->operands.push_back(std::move(key));
      dict->operands.push_back(std::move(value));
    }
    Advance();
    return Finish(std::move(dict));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      absl::StatusOr<ExprPtr> next;
      if (IsOperator(".") || IsOperator("[")) {
        next = ParseSubscript(std::move(node));
      } else if (IsOperator("(")) {
        next = ParseCall(std::move(node));
      } else {
        return node;
      }
      if (!next.ok()) return next;
      node = *std::move(next);
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      absl::StatusOr<ExprPtr> next;
      if (IsOperator("|")) {
        Advance();
        next = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        next = ParseTest(std::move(node));
      } else if (IsOperator("(")) {
        next = ParseCall(std::move(node));
      } else {
        return node;
      }
      if (!next.ok()) return next;
      node = *std::move(next);
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const SourcePos pos = Current().pos;
    if (IsOperator(".")) {
      Advance();
      if (Current().kind == TokenKind::kName) {
        ExprPtr expr = NewExpr(ExprKind::kGetAttr, pos);
        expr->name = Current().text;
        expr->operands.push_back(std::move(node));
        Advance();
        return Finish(std::move(expr));
      }
      if (Current().kind == TokenKind::kInteger) {
        ExprPtr index = NewExpr(ExprKind::kLiteral, Current().pos);
        index->literal = Value::Int(Current().integer);
        Advance();
        ExprPtr expr = NewExpr(ExprKind::kGetItem, pos);
        expr->operands.push_back(std::move(node));
        expr->operands.push_back(std::move(index));
        return Finish(std::move(expr));
      }
      return Unexpected("an attribute name");
    }
    Advance();  // [
    // Index or slice: [a], [a:b], [a:b:c], [:], [::-1] ...
    std::vector<ExprPtr> parts(3);
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (IsOperator(":")) {
        is_slice = true;
        if (++part > 2) return Unexpected("']'");
        Advance();
        continue;
      }
      if (IsOperator("]")) break;
      if (parts[part] != nullptr) return Unexpected("':' or ']'");
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
      parts[part] = std::move(value);
    }
    Advance();  // ]
    if (!is_slice) {
      if (parts[0] == nullptr) return ErrorAt(pos, "expected an index inside '[]'");
      ExprPtr expr = NewExpr(ExprKind::kGetItem, pos);
      expr->operands.push_back(std::move(node));
      expr->operands.push_back(std::move(parts[0]));
      return Finish(std::move(expr));
    }
    ExprPtr expr = NewExpr(ExprKind::kSlice, pos);
    expr->operands.push_back(std::move(node));
    for (ExprPtr& bound : parts) expr->operands.push_back(std::move(bound));
    return Finish(std::move(expr));
  }

  // "(" [arg {"," arg}] [","] ")" where arg is an expression or name=expression.
  absl::Status ParseArgs(ArgExprs* args) {
    LMSERVE_RETURN_IF_ERROR(ExpectOperator("("));
    bool first = true;
    while (!IsOperator(")")) {
      if (!first) {
        LMSERVE_RETURN_IF_ERROR(ExpectOperator(","));
        if (IsOperator(")")) break;
      }
      first = false;
      if (Current().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator &&
          Peek().text == "=") {
        std::string name = Current().text;
        Advance();
        Advance();
        LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
        args->keyword.emplace_back(std::move(name), std::move(value));
        continue;
      }
      if (!args->keyword.empty()) {
        return ErrorAt(Current().pos, "positional argument follows keyword argument");
      }
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(/*with_condexpr=*/true));
      args->positional.push_back(std::move(value));
    }
    Advance();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr expr = NewExpr(ExprKind::kCall, Current().pos);
    expr->operands.push_back(std::move(callee));
    LMSERVE_RETURN_IF_ERROR(ParseArgs(&expr->args));
    return Finish(std::move(expr));
  }

  // After the '|': name [args].
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr subject) {
    const SourcePos pos = Current().pos;
    LMSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    ExprPtr expr = NewExpr(ExprKind::kFilter, pos);
    expr->name = std::move(name);
    expr->operands.push_back(std::move(subject));
    if (IsOperator("(")) {
      LMSERVE_RETURN_IF_ERROR(ParseArgs(&expr->args));
    }
    return Finish(std::move(expr));
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr subject) {
    const SourcePos pos = Current().pos;
    Advance();  // is
    ExprPtr expr = NewExpr(ExprKind::kTest, pos);
    if (IsName("not")) {
      expr->negated = true;
      Advance();
    }
    LMSERVE_ASSIGN_OR_RETURN(std::string name, ExpectName());
    expr->name = std::move(name);
    expr->operands.push_back(std::move(subject));
    if (IsOperator("(")) {
      LMSERVE_RETURN_IF_ERROR(ParseArgs(&expr->args));
      return Finish(std::move(expr));
    }
    // One argument without parentheses: "is divisibleby 3", "is sameas none".
    const Token& token = Current();
    const bool starts_argument =
        token.kind == TokenKind::kName || token.kind == TokenKind::kString ||
        token.kind == TokenKind::kInteger || token.kind == TokenKind::kFloat || IsOperator("(") ||
        IsOperator("[") || IsOperator("{");
    if (starts_argument && !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
        !IsName("is") && !IsName("in") && !IsName("not")) {
      Nesting nesting(this);
      if (nesting.too_deep()) return TooDeep();
      LMSERVE_ASSIGN_OR_RETURN(ExprPtr argument, ParsePrimary());
      LMSERVE_ASSIGN_OR_RETURN(argument, ParsePostfix(std::move(argument)));
      expr->args.positional.push_back(std::move(argument));
    }
    return Finish(std::move(expr));
  }

  const std::vector<Token>& tokens_;
  const int max_nesting_;
  size_t index_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens, int max_nesting) {
  return Parser(tokens, max_nesting).ParseTemplate();
}

}  // namespace lmserve::engine::jinja
