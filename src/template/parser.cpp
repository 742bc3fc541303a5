// The chat-template parser (see parser.hpp): recursive descent over lex_template's tokens, one
// function per jinja2 precedence level so that `a ~ b + c` and `x | trim + y` group as in jinja2.
#include "template/parser.hpp"

#include <algorithm>
#include <initializer_list>

namespace llmq::tmpl {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const ParseLimits& limits) : t_(tokens), limits_(limits) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().type != Tok::kEof) throw fail("unexpected '" + cur().text + "'");
    return body;
  }

 private:
  // Every nested body and expression level passes through here: 10,000 nested ifs or parentheses
  // are a TemplateError, not a stack overflow.
  struct Depth {
    explicit Depth(Parser* p) : p_(p) {
      if (++p_->depth_ > p_->limits_.max_nesting)
        throw p_->fail("template nested deeper than " + std::to_string(p_->limits_.max_nesting) + " levels");
    }
    ~Depth() { --p_->depth_; }
    Parser* p_;
  };

  const Token& cur() const { return t_[std::min(pos_, t_.size() - 1)]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  const Token& next() { const Token& t = cur(); if (pos_ < t_.size() - 1) ++pos_; return t; }
  TemplateError fail(const std::string& what) const { return TemplateError(what, cur().line, cur().col); }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  bool skip_op(const char* op) { if (!is_op(op)) return false; next(); return true; }
  bool skip_name(const char* name) { if (!is_name(name)) return false; next(); return true; }
  void expect_op(const char* op) {
    if (!skip_op(op)) throw fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kVarEnd: return "end of print statement";
      case Tok::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) throw fail("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) throw fail("expected end of statement block, got " + describe(cur()));
    next();
  }

  std::unique_ptr<Expr> node(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // ---- statements ----
  Body parse_body(std::initializer_list<const char*> end_names) {
    Depth depth(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (end_names.size() == 0) return body;
        throw fail(std::string("unexpected end of template: missing {% ") + *end_names.begin() + " %}");
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::kText;
        s->line = t.line;
        s->col = t.col;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::kOutput;
        s->line = t.line;
        s->col = t.col;
        next();
        s->expr = parse_tuple(true);
        if (cur().type != Tok::kVarEnd) throw fail("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.type == Tok::kName)
          for (const char* end : end_names)
            if (name.text == end) { next(); return body; }  // the caller reads the end tag's name
        body.push_back(parse_statement());
      } else {
        throw fail("unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    next();  // {%
    const Token& at = cur();
    auto s = std::make_unique<Stmt>();
    s->line = at.line;
    s->col = at.col;
    const std::string tag = expect_name();
    if (tag == "if") {
      s->kind = Stmt::kIf;
      s->conds.push_back(parse_tuple(false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
        const std::string end = expect_name();
        if (end == "elif") {
          s->conds.push_back(parse_tuple(false));
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}));
          expect_name();
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::kFor;
      s->targets.push_back(expect_name());
      while (skip_op(",")) s->targets.push_back(expect_name());
      if (!skip_name("in")) throw fail("expected 'in', got " + describe(cur()));
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->conds.push_back(parse_expression(true));
      if (skip_name("recursive")) throw fail("recursive for loops are not supported");
      expect_block_end();
      s->bodies.push_back(parse_body({"endfor", "else"}));
      if (expect_name() == "else") {
        expect_block_end();
        s->bodies.push_back(parse_body({"endfor"}));
        expect_name();
      }
      expect_block_end();
    } else if (tag == "set") {
      s->kind = Stmt::kSet;
      s->targets.push_back(expect_name());
      if (skip_op(".")) {
        s->targets.push_back(expect_name());
        s->set_attr = true;
      }
      if (skip_op("=")) {
        s->expr = parse_tuple(true);
        expect_block_end();
      } else {
        expect_block_end();
        s->kind = Stmt::kSetBlock;
        s->bodies.push_back(parse_body({"endset"}));
        expect_name();
        expect_block_end();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::kMacro;
      s->macro = std::make_unique<MacroDef>();
      s->macro->name = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->macro->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        s->macro->params.push_back(expect_name());
        s->macro->defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
      }
      expect_block_end();
      s->macro->body = parse_body({"endmacro"});
      expect_name();
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::kBreak : Stmt::kContinue;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' AssistantTracker tag: it marks assistant tokens and prints its body as is.
      s->kind = Stmt::kBlock;
      expect_block_end();
      s->bodies.push_back(parse_body({"endgeneration"}));
      expect_name();
      expect_block_end();
    } else {
      throw TemplateError("unknown tag '" + tag + "'", at.line, at.col);
    }
    return s;
  }

  // ---- expressions ----
  std::unique_ptr<Expr> parse_tuple(bool with_condexpr) {
    const Token& at = cur();
    auto first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = node(Expr::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) break;
      tuple->args.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  std::unique_ptr<Expr> parse_expression(bool with_condexpr) {
    Depth depth(this);
    auto e = with_condexpr ? parse_condexpr() : parse_or();
    // Chains (a + b + ..., a.b.c..., x|f|g...) grow a tree one level per link without nesting the
    // parser: their height is bounded here, since evaluating it recurses.
    if (expr_height(*e) > limits_.max_nesting)
      throw fail("expression nested deeper than " + std::to_string(limits_.max_nesting) + " levels");
    return e;
  }

  // The tree's height, by an explicit stack (the tree may be deeper than the call stack allows).
  static int64_t expr_height(const Expr& root) {
    int64_t height = 0;
    std::vector<std::pair<const Expr*, int64_t>> stack = {{&root, 1}};
    while (!stack.empty()) {
      const auto [e, h] = stack.back();
      stack.pop_back();
      height = std::max(height, h);
      for (const auto& a : e->args)
        if (a) stack.emplace_back(a.get(), h + 1);
    }
    return height;
  }

  std::unique_ptr<Expr> parse_condexpr() {
    auto e = parse_or();
    while (is_name("if")) {
      auto c = node(Expr::kCond, next());
      auto test = parse_or();
      std::unique_ptr<Expr> otherwise;
      if (skip_name("else")) {
        Depth depth(this);  // `a if b else c if d else ...` recurses once per else
        otherwise = parse_condexpr();
      }
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  std::unique_ptr<Expr> binary(Expr::Kind kind, const Token& at, std::unique_ptr<Expr> a, std::unique_ptr<Expr> b,
                               const std::string& op = "") {
    auto e = node(kind, at);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  std::unique_ptr<Expr> parse_or() {
    auto e = parse_and();
    while (is_name("or")) { const Token& at = next(); e = binary(Expr::kOr, at, std::move(e), parse_and()); }
    return e;
  }
  std::unique_ptr<Expr> parse_and() {
    auto e = parse_not();
    while (is_name("and")) { const Token& at = next(); e = binary(Expr::kAnd, at, std::move(e), parse_not()); }
    return e;
  }
  std::unique_ptr<Expr> parse_not() {
    if (is_name("not")) {
      Depth depth(this);
      auto e = node(Expr::kNot, next());
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  std::unique_ptr<Expr> parse_compare() {
    const Token& at = cur();
    auto first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::kCompare, at);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  std::unique_ptr<Expr> parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      e = binary(Expr::kBinary, at, std::move(e), parse_concat(), at.text);
    }
    return e;
  }
  std::unique_ptr<Expr> parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) { const Token& at = next(); e = binary(Expr::kBinary, at, std::move(e), parse_math2(), "~"); }
    return e;
  }
  std::unique_ptr<Expr> parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      e = binary(Expr::kBinary, at, std::move(e), parse_pow(), at.text);
    }
    return e;
  }
  std::unique_ptr<Expr> parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) { const Token& at = next(); e = binary(Expr::kBinary, at, std::move(e), parse_unary(true), "**"); }
    return e;
  }
  std::unique_ptr<Expr> parse_unary(bool with_filter) {
    Depth depth(this);
    std::unique_ptr<Expr> e;
    if (is_op("-") || is_op("+")) {
      const Expr::Kind kind = is_op("-") ? Expr::kNeg : Expr::kPos;
      e = node(kind, next());
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  std::unique_ptr<Expr> parse_primary() {
    const Token& at = cur();
    if (at.type == Tok::kName) {
      next();
      if (at.text == "true" || at.text == "True") return literal(at, Value::boolean(true));
      if (at.text == "false" || at.text == "False") return literal(at, Value::boolean(false));
      if (at.text == "none" || at.text == "None") return literal(at, Value::none());
      auto e = node(Expr::kName, at);
      e->name = at.text;
      return e;
    }
    if (at.type == Tok::kString) {
      std::string s = next().text;
      while (cur().type == Tok::kString) s += next().text;  // 'a' 'b' is 'ab', as in Python
      return literal(at, Value::string(std::move(s)));
    }
    if (at.type == Tok::kInt) { next(); return literal(at, Value::integer(at.i)); }
    if (at.type == Tok::kFloat) { next(); return literal(at, Value::number(at.f)); }
    if (skip_op("(")) {
      if (skip_op(")")) return node(Expr::kTuple, at);
      auto e = parse_tuple(true);
      if (e->kind != Expr::kTuple && is_op(",")) next();
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(Expr::kList, at);
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    if (skip_op("{")) {
      auto e = node(Expr::kDict, at);
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    throw fail("unexpected " + describe(at));
  }

  std::unique_ptr<Expr> literal(const Token& at, Value v) {
    auto e = node(Expr::kLiteral, at);
    e->literal = std::move(v);
    return e;
  }

  std::unique_ptr<Expr> parse_postfix(std::unique_ptr<Expr> e) {
    while (true) {
      if (is_op(".")) {
        const Token& at = next();
        if (cur().type == Tok::kInt) {
          e = binary(Expr::kItem, at, std::move(e), literal(cur(), Value::integer(cur().i)));
          next();
        } else {
          auto a = node(Expr::kAttr, at);
          a->name = expect_name();
          a->args.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(Expr::kCall, std::move(e), "");
      } else {
        return e;
      }
    }
  }

  std::unique_ptr<Expr> parse_subscript(std::unique_ptr<Expr> target) {
    const Token& at = next();  // [
    std::unique_ptr<Expr> parts[3];
    bool written[3] = {false, false, false};
    if (!is_op(":")) {
      parts[0] = parse_expression(true);
      written[0] = true;
      if (skip_op("]")) return binary(Expr::kItem, at, std::move(target), std::move(parts[0]));
    }
    expect_op(":");
    if (!is_op("]") && !is_op(":")) { parts[1] = parse_expression(true); written[1] = true; }
    if (skip_op(":") && !is_op("]")) { parts[2] = parse_expression(true); written[2] = true; }
    expect_op("]");
    auto e = node(Expr::kSlice, at);
    e->args.push_back(std::move(target));
    for (int k = 0; k < 3; ++k) {
      e->has_slice_part[k] = written[k];
      e->args.push_back(std::move(parts[k]));
    }
    return e;
  }

  // target(args, name=value, ...): positional args first, keyword args after (names kept apart).
  std::unique_ptr<Expr> parse_call(Expr::Kind kind, std::unique_ptr<Expr> target, const std::string& name) {
    const Token& at = cur();
    auto e = node(kind, at);
    e->name = name;
    if (kind == Expr::kCall) {  // an error in a call names where the callee was written
      e->line = target->line;
      e->col = target->col;
    }
    e->args.push_back(std::move(target));
    if (!skip_op("(")) return e;
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        e->kwarg_names.push_back(next().text);
        next();
        e->args.push_back(parse_expression(true));
      } else {
        if (!e->kwarg_names.empty()) throw fail("positional argument after a keyword argument");
        e->args.push_back(parse_expression(true));
      }
    }
    return e;
  }

  std::unique_ptr<Expr> parse_filter_expr(std::unique_ptr<Expr> e) {
    while (true) {
      if (skip_op("|")) {
        const Token& at = cur();
        const std::string name = expect_name();
        e = parse_call(Expr::kFilter, std::move(e), name);
        e->line = at.line;  // an unknown filter is named where its name was written
        e->col = at.col;
      } else if (is_name("is")) {
        next();
        const bool negated = skip_name("not");
        const std::string name = expect_name();
        if (is_op("(")) {
          e = parse_call(Expr::kTest, std::move(e), name);
        } else {
          auto t = node(Expr::kTest, cur());
          t->name = name;
          t->args.push_back(std::move(e));
          const Token& c = cur();
          const bool arg_follows = (c.type == Tok::kName && c.text != "else" && c.text != "or" && c.text != "and" &&
                                    c.text != "if" && c.text != "is") ||
                                   c.type == Tok::kString || c.type == Tok::kInt || c.type == Tok::kFloat ||
                                   is_op("[") || is_op("{");
          if (arg_follows) t->args.push_back(parse_postfix(parse_primary()));
          e = std::move(t);
        }
        e->negated = negated;
      } else if (is_op("(")) {
        e = parse_call(Expr::kCall, std::move(e), "");
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  ParseLimits limits_;
  size_t pos_ = 0;
  int64_t depth_ = 0;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens, const ParseLimits& limits) {
  return Parser(tokens, limits).parse_all();
}

Expr::~Expr() {
  // Children are taken apart by a worklist: a chain of a million links must not recurse.
  std::vector<std::unique_ptr<Expr>> pending;
  for (auto& a : args) pending.push_back(std::move(a));
  while (!pending.empty()) {
    std::unique_ptr<Expr> e = std::move(pending.back());
    pending.pop_back();
    if (e)
      for (auto& a : e->args) pending.push_back(std::move(a));
  }
}

}  // namespace llmq::tmpl
