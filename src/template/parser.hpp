// The chat-template syntax tree and its parser: jinja2's grammar and operator precedence
// (or < and < not < comparisons < + - < ~ < * / // % < ** < unary - < filters, tests, calls),
// limited to the statements chat templates use: if/elif/else, for (with else, a filter, tuple
// targets), set (names and ns.attr), macro, break/continue, generation (transformers' tag).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "template/lexer.hpp"
#include "template/value.hpp"

namespace llmq::tmpl {

struct Expr {
  enum Kind { kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNeg, kPos, kNot, kBinary,
              kCompare, kAnd, kOr, kCond, kList, kTuple, kDict };
  Kind kind = kLiteral;
  int64_t line = 0, col = 0;
  Value literal;                               // kLiteral
  std::string name;                            // kName, kAttr; kFilter/kTest: which; kBinary: the op
  std::vector<std::string> ops;                // kCompare: one op per right operand ("in", "notin", ...)
  std::vector<std::unique_ptr<Expr>> args;     // operands; kCall/kFilter/kTest: target first, then args
  std::vector<std::string> kwarg_names;        // kCall/kFilter/kTest: names of the trailing keyword args
  bool negated = false;                        // kTest: "is not"
  bool has_slice_part[3] = {false, false, false};  // kSlice: which of start, stop, step were written
  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  ~Expr();  // iterative (parser.cpp)
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<std::unique_ptr<Expr>> defaults;  // one per param; null: required
  Body body;
};

struct Stmt {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kBlock };
  Kind kind = kText;
  int64_t line = 0, col = 0;
  std::string text;                           // kText
  std::unique_ptr<Expr> expr;                 // kOutput, kSet (the value), kFor (the iterable)
  std::vector<std::unique_ptr<Expr>> conds;   // kIf: one per branch; kFor: [filter] or empty
  std::vector<Body> bodies;                   // kIf: one per cond (+1 for else); kFor: body (+ else)
  std::vector<std::string> targets;           // kFor: loop names; kSet: the name (and attr)
  bool set_attr = false;                      // kSet: targets = {ns, attr}
  std::unique_ptr<MacroDef> macro;            // kMacro
};

struct ParseLimits {
  int64_t max_nesting = 256;
};

// Throws TemplateError naming the line and column of a syntax error.
Body parse_template(const std::vector<Token>& tokens, const ParseLimits& limits);

}  // namespace llmq::tmpl
