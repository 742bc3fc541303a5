// The values a chat template computes with, with Python's semantics where jinja2 inherits them:
// truthiness, == between int and float, repr() of lists and dicts when a template prints one,
// json.dumps for `tojson`, and jinja2's Undefined (a missing attribute or variable: renders empty,
// is falsy, and is an error to compute with).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmq::tmpl {

// Why a render stopped; turned into a Status (with the template line and column) at the API edge.
// Exceptions never leave src/template: render_chat_template catches them all.
struct TemplateError : std::runtime_error {
  TemplateError(const std::string& what, int64_t l = 0, int64_t c = 0, bool raised = false)
      : std::runtime_error(what), line(l), col(c), from_raise_exception(raised) {}
  int64_t line, col;
  bool from_raise_exception;  // raise_exception(msg) in the template: the message is the template's
};

// Lists, tuples and dicts nest at most this deep: printing, comparing, tojson and freeing them
// recurse, and a template can nest one more level per loop turn ({% set ns.x = [ns.x] %}).
constexpr int32_t kMaxValueDepth = 256;

struct Value;
using List = std::vector<Value>;
struct Dict {
  // Insertion order, as Python dicts keep it (tojson and items() print in this order).
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};
struct MacroDef;  // parser.hpp

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace,
                  kMacro, kBuiltin, kMethod };

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                 // kString; kUndefined: what was missing; kBuiltin/kMethod: the name
  std::shared_ptr<List> list;    // kList, kTuple (shared: Python lists are references)
  std::shared_ptr<Dict> dict;    // kDict, kNamespace
  const MacroDef* macro = nullptr;
  std::shared_ptr<Value> self;   // kMethod: the receiver
  int32_t depth = 0;             // containers: 1 + their deepest item (kMaxValueDepth at most)

  static Value undefined(std::string what = "") { Value v; v.s = std::move(what); return v; }
  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  static Value new_list(List items = {}, Kind k = Kind::kList) {
    Value v; v.kind = k; v.list = std::make_shared<List>(std::move(items)); v.update_depth(); return v;
  }
  // depth from the items held now; a TemplateError past kMaxValueDepth.
  void update_depth() {
    int32_t d = 0;
    if (list)
      for (const Value& x : *list) d = x.depth > d ? x.depth : d;
    if (dict)
      for (const auto& kv : dict->items) d = kv.second.depth > d ? kv.second.depth : d;
    depth = d + 1;
    if (depth > kMaxValueDepth) throw TemplateError("a value nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  static Value new_dict(Kind k = Kind::kDict) {
    Value v; v.kind = k; v.dict = std::make_shared<Dict>(); return v;
  }

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict; }
};

// What copying v's own items costs (not of the containers they hold, which are shared): each item
// and the bytes of each string item (keys included).
int64_t copy_work(const Value& v);
const char* kind_name(Kind k);       // Python's type name: 'str', 'int', 'dict', ...
bool truthy(const Value& v);         // Python's bool()
std::string to_str(const Value& v);  // Python's str(): what {{ }} prints
std::string repr(const Value& v);    // Python's repr(): 'a', True, None, [1, 'b'], {'k': 1}
bool equals(const Value& a, const Value& b);  // Python's ==
// Python's <, for sort-free comparisons: numbers with numbers, strings with strings (bytewise:
// UTF-8 order is code point order); anything else is a TemplateError.
bool less_than(const Value& a, const Value& b);
std::string python_float_repr(double x);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=(',', ': ') if indent else default).
std::string to_json(const Value& v, int64_t indent);

Value from_json(const nlohmann::json& j);  // strings are kept as bytes; no UTF-8 check
// The same keeping objects' key order (nlohmann::json sorts keys; Python's dicts keep theirs, and
// a template's tojson or items() shows the order).
Value from_json(const nlohmann::ordered_json& j);

// UTF-8 code points, for len() and slicing of str (Python counts characters, not bytes). Bytes that
// are not valid UTF-8 count one each, so invalid content passes through slicing unchanged.
std::vector<std::string> utf8_chars(const std::string& s);  // paid for per character (kWorkPerChar)
int64_t utf8_length(const std::string& s);
// The bytes of the character at byte p (1 for a byte that does not start a valid sequence): walks a
// string by characters without making one string per character.
size_t utf8_char_bytes(const std::string& s, size_t p);

}  // namespace llmq::tmpl
