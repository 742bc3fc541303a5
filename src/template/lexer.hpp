// The chat-template lexer: template text and the tokens inside {{ }}, {% %}, with jinja2's
// whitespace rules applied here (trim_blocks, lstrip_blocks, the - and + markers, one trailing
// newline dropped), so the parser sees only text that is printed as is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llmq::tmpl {

enum class Tok { kText, kBlockBegin, kBlockEnd, kVarBegin, kVarEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // kText: the data; kName/kOp: the name or operator; kString: the decoded value
  int64_t i = 0;
  double f = 0.0;
  int64_t line = 1, col = 1;
};

// Throws TemplateError (value.hpp) naming the line and column of a lexical error.
std::vector<Token> lex_template(const std::string& source);

}  // namespace llmq::tmpl
