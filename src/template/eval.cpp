// The chat-template evaluator: statements, expressions, scoping, attribute and item lookup with
// jinja2's fallbacks (obj.x tries an attribute then an item; obj['x'] an item then an attribute).
#include "template/eval.hpp"

#include <cmath>
#include <limits>

namespace llmq::tmpl {
namespace {

TemplateError error_at(const std::string& what, const Expr& at) { return TemplateError(what, at.line, at.col); }

// An error raised without a place (the work budget, a value's depth) is placed at `at`.
TemplateError placed(TemplateError err, const Expr& at) {
  if (err.line == 0) {
    err.line = at.line;
    err.col = at.col;
  }
  return err;
}

const Value* lookup(const Frame* f, const std::string& name) {
  for (; f; f = f->parent) {
    spend_work(kWorkPerFrame);  // 256 nested loops and macros deep, a name is looked for 256 times
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

std::string undefined_message(const Value& v) {
  return v.s.empty() ? "a value is undefined" : v.s + " is undefined";
}

int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i; }
double as_double(const Value& v) { return v.kind == Kind::kFloat ? v.f : static_cast<double>(as_int(v)); }

// Python's slice.indices(): clamp start/stop for the step's direction.
void slice_bounds(int64_t n, const Value* parts[3], int64_t* start, int64_t* stop, int64_t* step, const Expr& at) {
  *step = parts[2] && parts[2]->kind != Kind::kNone ? as_int(*parts[2]) : 1;
  if (*step == 0) throw error_at("slice step cannot be zero", at);
  auto clamp = [&](const Value* p, int64_t dflt) {
    if (!p || p->kind == Kind::kNone) return dflt;
    if (p->kind != Kind::kInt && p->kind != Kind::kBool) throw error_at("slice indices must be integers or None", at);
    int64_t x = as_int(*p);
    if (x < 0) x += n;
    if (*step > 0) return x < 0 ? int64_t{0} : (x > n ? n : x);
    return x < 0 ? int64_t{-1} : (x >= n ? n - 1 : x);
  };
  *start = clamp(parts[0], *step > 0 ? 0 : n - 1);
  *stop = clamp(parts[1], *step > 0 ? n : -1);
}

}  // namespace

void Evaluator::check_size(int64_t bytes, const Expr& at) const {
  if (bytes > limits_.max_output_bytes)
    throw error_at("output larger than " + std::to_string(limits_.max_output_bytes) + " bytes", at);
}

void Evaluator::count_iteration(const Expr& at) {
  if (++iterations_ > limits_.max_loop_iterations)
    throw error_at("more than " + std::to_string(limits_.max_loop_iterations) + " loop iterations", at);
}

void Evaluator::render(const Body& body, std::string* out) {
  if (exec(body, root_, out) != Flow::kNormal) throw TemplateError("break or continue outside a for loop");
}

Evaluator::Flow Evaluator::exec(const Body& body, Frame* frame, std::string* out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    spend_work(kWorkPerStatement, s.line, s.col);
    switch (s.kind) {
      case Stmt::kText:
        *out += s.text;
        break;
      case Stmt::kOutput: {
        const Value v = eval(*s.expr, frame);
        try {
          *out += to_str(v);  // printing a list may run out of budget or bounds
        } catch (const TemplateError& err) {
          throw placed(err, *s.expr);
        }
        break;
      }
      case Stmt::kIf: {
        size_t k = 0;
        for (; k < s.conds.size(); ++k)
          if (truthy(eval(*s.conds[k], frame))) break;
        if (k < s.bodies.size()) {
          const Flow f = exec(s.bodies[k], frame, out);
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case Stmt::kFor: {
        ++depth_;
        struct Leave { int64_t* d; ~Leave() { --*d; } } leave{&depth_};
        if (depth_ > limits_.max_nesting) throw error_at("for loops nested too deep", *s.expr);
        exec_for(s, frame, out);
        break;
      }
      case Stmt::kSet: {
        Value v = eval(*s.expr, frame);
        if (s.set_attr) {
          const Value* ns = lookup(frame, s.targets[0]);
          if (!ns || ns->kind != Kind::kNamespace)
            throw TemplateError("can only assign attributes of a namespace() object", s.line, s.col);
          ns->dict->set(s.targets[1], std::move(v));
        } else {
          frame->vars[s.targets[0]] = std::move(v);
        }
        break;
      }
      case Stmt::kSetBlock: {
        std::string captured;
        exec(s.bodies[0], frame, &captured);
        if (s.set_attr) {  // {% set ns.attr %}...{% endset %}
          const Value* ns = lookup(frame, s.targets[0]);
          if (!ns || ns->kind != Kind::kNamespace)
            throw TemplateError("can only assign attributes of a namespace() object", s.line, s.col);
          ns->dict->set(s.targets[1], Value::string(std::move(captured)));
        } else {
          frame->vars[s.targets[0]] = Value::string(std::move(captured));
        }
        break;
      }
      case Stmt::kMacro: {
        Value m;
        m.kind = Kind::kMacro;
        m.macro = s.macro.get();
        m.s = s.macro->name;
        frame->vars[s.macro->name] = m;
        break;
      }
      case Stmt::kBreak: return Flow::kBreak;
      case Stmt::kContinue: return Flow::kContinue;
      case Stmt::kBlock: {
        const Flow f = exec(s.bodies[0], frame, out);
        if (f != Flow::kNormal) return f;
        break;
      }
    }
    if (static_cast<int64_t>(out->size()) > limits_.max_output_bytes)
      throw TemplateError("output larger than " + std::to_string(limits_.max_output_bytes) + " bytes", s.line, s.col);
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, Frame* frame, std::string* out) {
  const Expr& at = *s.expr;
  auto bind = [&](Frame* f, const Value& item) {
    if (s.targets.size() == 1) {
      f->vars[s.targets[0]] = item;
      return;
    }
    const std::vector<Value> parts = iterate(item, at);
    if (parts.size() != s.targets.size())
      throw error_at("cannot unpack " + std::to_string(parts.size()) + " values into " +
                     std::to_string(s.targets.size()) + " loop variables", at);
    for (size_t k = 0; k < parts.size(); ++k) f->vars[s.targets[k]] = parts[k];
  };
  std::vector<Value> items = iterate(eval(at, frame), at);
  if (!s.conds.empty()) {  // `for x in y if cond`: filtered first, so loop.length counts what is kept
    std::vector<Value> kept;
    for (const Value& item : items) {
      count_iteration(at);
      Frame f;
      f.parent = frame;
      bind(&f, item);
      if (truthy(eval(*s.conds[0], &f))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    count_iteration(at);
    spend_work(kWorkPerIteration, at.line, at.col);
    Frame f;  // a fresh frame per iteration: jinja2 forgets a loop body's `set` at each iteration
    f.parent = frame;
    bind(&f, items[static_cast<size_t>(k)]);
    Value loop = Value::new_dict(Kind::kNamespace);
    Dict& d = *loop.dict;
    d.set("index", Value::integer(k + 1));
    d.set("index0", Value::integer(k));
    d.set("revindex", Value::integer(n - k));
    d.set("revindex0", Value::integer(n - k - 1));
    d.set("first", Value::boolean(k == 0));
    d.set("last", Value::boolean(k == n - 1));
    d.set("length", Value::integer(n));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("loop.previtem"));
    d.set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("loop.nextitem"));
    f.vars["loop"] = std::move(loop);
    if (exec(s.bodies[0], &f, out) == Flow::kBreak) return Flow::kNormal;
  }
  if (n == 0 && s.bodies.size() > 1) return exec(s.bodies[1], frame, out);
  return Flow::kNormal;
}

std::vector<Value> Evaluator::iterate(const Value& v, const Expr& at) {
  try {
    return iterate_items(v, at);
  } catch (const TemplateError& err) {
    throw placed(err, at);
  }
}

std::vector<Value> Evaluator::iterate_items(const Value& v, const Expr& at) {
  spend_work(copy_work(v));  // the items are copied (a string's characters: utf8_chars pays)
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: case Kind::kTuple: return *v.list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default: throw error_at(std::string("'") + kind_name(v.kind) + "' object is not iterable", at);
  }
}

Value Evaluator::get_attr(const Value& obj, const std::string& name, bool item_first, const Expr& at) {
  switch (obj.kind) {
    case Kind::kUndefined: throw error_at(undefined_message(obj) + " (reading '" + name + "')", at);
    case Kind::kNamespace: {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined("'" + name + "'");
    }
    case Kind::kDict: {
      static const char* const kMethods[] = {"items", "keys", "values", "get"};
      auto method = [&]() -> Value {
        for (const char* m : kMethods)
          if (name == m) {
            Value f;
            f.kind = Kind::kMethod;
            f.s = name;
            f.self = std::make_shared<Value>(obj);
            return f;
          }
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      };
      if (!item_first) {
        Value m = method();
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = obj.dict->find(name)) return *v;
      return item_first ? method() : Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kString: case Kind::kList: case Kind::kTuple: {
      Value f;
      f.kind = Kind::kMethod;
      f.s = name;
      f.self = std::make_shared<Value>(obj);
      return f;  // an unknown method is refused when called, naming it
    }
    default: return Value::undefined(std::string("'") + kind_name(obj.kind) + " object' has no attribute '" + name + "'");
  }
}

Value Evaluator::get_item(const Value& obj, const Value& key, const Expr& at) {
  if (obj.is_undefined()) throw error_at(undefined_message(obj), at);
  if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
    if (key.is_string()) return get_attr(obj, key.s, true, at);
    return Value::undefined("'dict object' has no item " + repr(key));
  }
  if ((obj.is_sequence() || obj.is_string()) && (key.kind == Kind::kInt || key.kind == Kind::kBool)) {
    int64_t k = as_int(key);
    if (obj.is_string()) {  // the k-th character, walked to (not a string made per character)
      spend_work(kWorkPerByteWalked * static_cast<int64_t>(obj.s.size()), at.line, at.col);
      if (k < 0) k += utf8_length(obj.s);
      size_t p = 0;
      for (int64_t c = 0; c < k && p < obj.s.size(); ++c) p += utf8_char_bytes(obj.s, p);
      if (k < 0 || p >= obj.s.size()) return Value::undefined("string index out of range");
      return Value::string(obj.s.substr(p, utf8_char_bytes(obj.s, p)));
    }
    const int64_t n = static_cast<int64_t>(obj.list->size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined("list index out of range");
    return (*obj.list)[static_cast<size_t>(k)];
  }
  if (key.is_string()) return get_attr(obj, key.s, true, at);
  return Value::undefined(std::string("'") + kind_name(obj.kind) + " object' has no item " + repr(key));
}

// Every value an expression yields is a copy (strings are held by value): its bytes are paid for,
// and so are the items of a list or dict it built (reading one, a name or an item, shares it).
// An error raised without a place is placed at the innermost expression.
Value Evaluator::eval(const Expr& e, Frame* frame) {
  try {
    Value v = eval_node(e, frame);
    const bool built = e.kind == Expr::kSlice || e.kind == Expr::kCall || e.kind == Expr::kFilter ||
                       e.kind == Expr::kBinary || e.kind == Expr::kList || e.kind == Expr::kTuple || e.kind == Expr::kDict;
    spend_work(kWorkPerExpression + (built ? copy_work(v) : static_cast<int64_t>(v.s.size())));
    return v;
  } catch (const TemplateError& err) {
    throw placed(err, e);
  }
}

Value Evaluator::eval_node(const Expr& e, Frame* frame) {
  switch (e.kind) {
    case Expr::kLiteral: return e.literal;
    case Expr::kName: {
      const Value* v = lookup(frame, e.name);
      return v ? *v : Value::undefined("'" + e.name + "'");
    }
    case Expr::kAttr: return get_attr(eval(*e.args[0], frame), e.name, false, e);
    case Expr::kItem: return get_item(eval(*e.args[0], frame), eval(*e.args[1], frame), e);
    case Expr::kSlice: {
      const Value obj = eval(*e.args[0], frame);
      Value parts_v[3];
      const Value* parts[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k)
        if (e.has_slice_part[k]) { parts_v[k] = eval(*e.args[static_cast<size_t>(k) + 1], frame); parts[k] = &parts_v[k]; }
      if (obj.is_undefined()) throw error_at(undefined_message(obj), e);
      if (!obj.is_string() && !obj.is_sequence())
        throw error_at(std::string("'") + kind_name(obj.kind) + "' object is not subscriptable", e);
      std::vector<std::string> chars;
      if (obj.is_string()) chars = utf8_chars(obj.s);
      const int64_t n = obj.is_string() ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.list->size());
      int64_t start, stop, step;
      slice_bounds(n, parts, &start, &stop, &step, e);
      std::string s;
      List l;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (obj.is_string()) s += chars[static_cast<size_t>(k)];
        else l.push_back((*obj.list)[static_cast<size_t>(k)]);
      }
      return obj.is_string() ? Value::string(std::move(s)) : Value::new_list(std::move(l), obj.kind);
    }
    case Expr::kCall: case Expr::kFilter: case Expr::kTest: {
      std::vector<Value> args, kw_values;
      const size_t n_pos = e.args.size() - e.kwarg_names.size();
      for (size_t k = 1; k < e.args.size(); ++k) {
        Value v = eval(*e.args[k], frame);
        (k < n_pos ? args : kw_values).push_back(std::move(v));
      }
      if (e.kind == Expr::kTest) {
        const Value target = eval(*e.args[0], frame);
        return Value::boolean(call_test(e.name, target, args, e) != e.negated);
      }
      const Value target = eval(*e.args[0], frame);
      if (e.kind == Expr::kFilter) return call_filter(e, target, std::move(args), e.kwarg_names, std::move(kw_values));
      return call_value(target, std::move(args), e.kwarg_names, std::move(kw_values), e);
    }
    case Expr::kNeg: case Expr::kPos: {
      const Value v = eval(*e.args[0], frame);
      if (!v.is_number()) throw error_at(std::string("bad operand type for unary ") + (e.kind == Expr::kNeg ? "-" : "+") +
                                         ": '" + kind_name(v.kind) + "'", e);
      if (e.kind == Expr::kPos) return v.kind == Kind::kBool ? Value::integer(as_int(v)) : v;
      if (v.kind == Kind::kFloat) return Value::number(-v.f);
      if (as_int(v) == std::numeric_limits<int64_t>::min()) throw error_at("integer overflow", e);
      return Value::integer(-as_int(v));
    }
    case Expr::kNot: return Value::boolean(!truthy(eval(*e.args[0], frame)));
    case Expr::kAnd: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? eval(*e.args[1], frame) : a;
    }
    case Expr::kOr: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? a : eval(*e.args[1], frame);
    }
    case Expr::kBinary: return eval_binary(e, eval(*e.args[0], frame), eval(*e.args[1], frame));
    case Expr::kCompare: {
      Value left = eval(*e.args[0], frame);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1], frame);
        if (!eval_compare(e.ops[k], left, right, e)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::kCond: {
      if (truthy(eval(*e.args[0], frame))) return eval(*e.args[1], frame);
      return e.args[2] ? eval(*e.args[2], frame) : Value::undefined("the else of an if-expression");
    }
    case Expr::kList: case Expr::kTuple: {
      List items;
      for (const auto& a : e.args) items.push_back(eval(*a, frame));
      return Value::new_list(std::move(items), e.kind == Expr::kList ? Kind::kList : Kind::kTuple);
    }
    case Expr::kDict: {
      Value d = Value::new_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        const Value key = eval(*e.args[k], frame);
        if (!key.is_string()) throw error_at("only string keys are supported in dict literals", e);
        d.dict->set(key.s, eval(*e.args[k + 1], frame));
      }
      d.update_depth();
      return d;
    }
  }
  throw error_at("unknown expression", e);
}

Value Evaluator::eval_binary(const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a);
    check_size(static_cast<int64_t>(s.size()) + static_cast<int64_t>(to_str(b).size()), e);
    return Value::string(s + to_str(b));
  }
  if (a.is_undefined()) throw error_at(undefined_message(a), e);
  if (b.is_undefined()) throw error_at(undefined_message(b), e);
  const auto type_error = [&]() {
    return error_at("unsupported operand type(s) for " + op + ": '" + kind_name(a.kind) + "' and '" +
                    kind_name(b.kind) + "'", e);
  };
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(static_cast<int64_t>(a.s.size() + b.s.size()), e);
      return Value::string(a.s + b.s);
    }
    if (a.is_sequence() && a.kind == b.kind) {
      check_size(static_cast<int64_t>(a.list->size() + b.list->size()), e);
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::new_list(std::move(l), a.kind);
    }
    if (a.is_string() || b.is_string())
      throw error_at(a.is_string() ? std::string("can only concatenate str (not \"") + kind_name(b.kind) + "\") to str"
                                   : type_error().what(), e);
  }
  if (op == "*" && (a.is_string() || a.is_sequence() || b.is_string() || b.is_sequence())) {
    const Value& seq = (a.is_string() || a.is_sequence()) ? a : b;
    const Value& count = (a.is_string() || a.is_sequence()) ? b : a;
    if (count.kind != Kind::kInt && count.kind != Kind::kBool) throw type_error();
    const int64_t n = std::max<int64_t>(0, as_int(count));
    // A repeated list copies its items: strings count their bytes, anything else a small size.
    int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.s.size()) : 0;
    if (!seq.is_string())
      for (const Value& x : *seq.list) unit += x.is_string() ? static_cast<int64_t>(x.s.size()) + 16 : 16;
    if (unit == 0) return seq.is_string() ? Value::string("") : Value::new_list(List{}, seq.kind);  // not n empty rounds
    if (n > limits_.max_output_bytes / unit) check_size(limits_.max_output_bytes + 1, e);
    int64_t items_work = 0;  // paid before the items are made
    if (!seq.is_string() && __builtin_mul_overflow(n, copy_work(seq), &items_work)) items_work = std::numeric_limits<int64_t>::max();
    spend_work(items_work, e.line, e.col);
    if (seq.is_string()) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += seq.s;
      return Value::string(std::move(s));
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq.list->begin(), seq.list->end());
    return Value::new_list(std::move(l), seq.kind);
  }
  if (!a.is_number() || !b.is_number()) throw type_error();
  const bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
  const int64_t x = as_int(a), y = as_int(b);
  const double fx = as_double(a), fy = as_double(b);
  int64_t r = 0;
  if (op == "+") return ints ? (__builtin_add_overflow(x, y, &r) ? throw error_at("integer overflow", e) : Value::integer(r)) : Value::number(fx + fy);
  if (op == "-") return ints ? (__builtin_sub_overflow(x, y, &r) ? throw error_at("integer overflow", e) : Value::integer(r)) : Value::number(fx - fy);
  if (op == "*") return ints ? (__builtin_mul_overflow(x, y, &r) ? throw error_at("integer overflow", e) : Value::integer(r)) : Value::number(fx * fy);
  if (op == "/") {
    if (fy == 0.0) throw error_at("division by zero", e);
    return Value::number(fx / fy);
  }
  if (op == "//" || op == "%") {
    if (ints) {
      if (y == 0) throw error_at("integer division or modulo by zero", e);
      if (x == std::numeric_limits<int64_t>::min() && y == -1) throw error_at("integer overflow", e);
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) { --q; m += y; }  // Python floors
      return Value::integer(op == "//" ? q : m);
    }
    if (fy == 0.0) throw error_at("float division by zero", e);
    double m = std::fmod(fx, fy);
    if (m != 0.0 && ((m < 0) != (fy < 0))) m += fy;
    return Value::number(op == "//" ? std::floor(fx / fy) : m);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      // By squaring: log2(y) steps, whatever y is (a linear loop would run 2^63 times).
      int64_t acc = 1, base = x, k = y;
      while (k > 0) {
        if ((k & 1) != 0 && __builtin_mul_overflow(acc, base, &acc)) throw error_at("integer overflow", e);
        k >>= 1;
        if (k > 0 && __builtin_mul_overflow(base, base, &base)) throw error_at("integer overflow", e);
      }
      return Value::integer(acc);
    }
    return Value::number(std::pow(fx, fy));
  }
  throw type_error();
}

bool Evaluator::eval_compare(const std::string& op, const Value& a, const Value& b, const Expr& at) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) throw error_at(std::string("'in <string>' requires string as left operand, not ") + kind_name(a.kind), at);
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.kind == Kind::kDict) {
      found = a.is_string() && b.dict->find(a.s) != nullptr;
    } else if (b.is_sequence()) {
      for (const Value& item : *b.list) if (equals(a, item)) { found = true; break; }
    } else if (!b.is_undefined()) {
      throw error_at(std::string("argument of type '") + kind_name(b.kind) + "' is not iterable", at);
    }
    return op == "in" ? found : !found;
  }
  try {
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    if (op == "<=") return less_than(a, b) || equals(a, b);
    if (op == ">=") return less_than(b, a) || equals(a, b);
  } catch (const TemplateError& err) {
    throw error_at(err.what(), at);
  }
  throw error_at("unknown comparison " + op, at);
}

Value Evaluator::call_macro(const MacroDef& m, std::vector<Value> args, std::vector<std::string> kw_names,
                            std::vector<Value> kw_values, const Expr& at) {
  if (args.size() > m.params.size())
    throw error_at("macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)", at);
  if (++depth_ > limits_.max_nesting) {
    --depth_;
    throw error_at("macro calls nested deeper than " + std::to_string(limits_.max_nesting), at);
  }
  struct Leave { int64_t* d; ~Leave() { --*d; } } leave{&depth_};
  Frame f;  // a macro sees its arguments and the template's top level, as jinja2's macros do
  f.parent = root_;
  for (size_t k = 0; k < m.params.size(); ++k) {
    if (k < args.size()) { f.vars[m.params[k]] = args[k]; continue; }
    bool given = false;
    for (size_t j = 0; j < kw_names.size(); ++j)
      if (kw_names[j] == m.params[k]) { f.vars[m.params[k]] = kw_values[j]; given = true; }
    if (!given) f.vars[m.params[k]] = m.defaults[k] ? eval(*m.defaults[k], &f) : Value::undefined("'" + m.params[k] + "'");
  }
  std::string out;
  if (exec(m.body, &f, &out) != Flow::kNormal) throw error_at("break or continue outside a for loop", at);
  return Value::string(std::move(out));
}

Value Evaluator::call_value(const Value& fn, std::vector<Value> args, std::vector<std::string> kw_names,
                            std::vector<Value> kw_values, const Expr& at) {
  switch (fn.kind) {
    case Kind::kMacro: return call_macro(*fn.macro, std::move(args), std::move(kw_names), std::move(kw_values), at);
    case Kind::kBuiltin: return call_global(fn.s, args, kw_names, kw_values, at);
    case Kind::kMethod: return call_method(*fn.self, fn.s, args, kw_names, kw_values, at);
    case Kind::kUndefined: throw error_at(undefined_message(fn) + " (called as a function)", at);
    default: throw error_at(std::string("'") + kind_name(fn.kind) + "' object is not callable", at);
  }
}

}  // namespace llmq::tmpl
