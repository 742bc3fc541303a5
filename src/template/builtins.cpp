// The filters, tests, str/dict methods and globals (raise_exception, strftime_now, namespace,
// range) that real chat templates call, with the semantics of jinja2 and Python's str methods.
// Anything else is refused by name, with the template line, rather than guessed at.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "template/eval.hpp"

namespace llmq::tmpl {
namespace {

TemplateError error_at(const std::string& what, const Expr& at) { return TemplateError(what, at.line, at.col); }

// Python's str.isspace() for one UTF-8 character (the Unicode White_Space set plus \x1c-\x1f).
bool is_py_space(const std::string& ch) {
  if (ch.size() == 1) {
    const unsigned char c = static_cast<unsigned char>(ch[0]);
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
  }
  static const char* const kSpaces[] = {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                        "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (const char* s : kSpaces)
    if (ch == s) return true;
  // U+2000..U+200A: e2 80 80..8a
  return ch.size() == 3 && ch[0] == '\xe2' && ch[1] == '\x80' && static_cast<unsigned char>(ch[2]) >= 0x80 &&
         static_cast<unsigned char>(ch[2]) <= 0x8a;
}

// str.strip / lstrip / rstrip with Python's rules: no chars (or None) means whitespace. The string
// is walked by characters where it lies (trim runs on every message; a string per character cost
// 32 bytes and ~50 ns each).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const bool ws = !chars || chars->kind == Kind::kNone || chars->is_undefined();
  std::set<std::string> set;
  if (!ws)
    for (std::string& c : utf8_chars(chars->s)) set.insert(std::move(c));
  spend_work(kWorkPerByteWalked * static_cast<int64_t>(s.size()));
  size_t first_kept = std::string::npos, kept_end = 0;  // byte offsets of the first and last kept character
  for (size_t p = 0; p < s.size();) {
    const size_t n = utf8_char_bytes(s, p);
    const std::string c = s.substr(p, n);
    if (!(ws ? is_py_space(c) : set.count(c) > 0)) {
      if (first_kept == std::string::npos) first_kept = p;
      kept_end = p + n;
      if (!right) break;  // only the left end matters
    }
    p += n;
  }
  if (first_kept == std::string::npos) return "";
  const size_t b = left ? first_kept : 0, e = right ? kept_end : s.size();
  return s.substr(b, e - b);
}

std::vector<Value> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (!sep || sep->kind == Kind::kNone) {
    spend_work(kWorkPerByteWalked * static_cast<int64_t>(s.size()));
    const auto space_at = [&](size_t p, size_t* n) {
      *n = utf8_char_bytes(s, p);
      return is_py_space(s.substr(p, *n));
    };
    size_t k = 0, n = 0;
    while (k < s.size()) {
      while (k < s.size() && space_at(k, &n)) k += n;
      if (k == s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(k);
        while (!rest.empty() && is_py_space(std::string(1, rest.back()))) rest.pop_back();
        out.push_back(Value::string(rest));
        return out;
      }
      const size_t word = k;
      while (k < s.size() && !space_at(k, &n)) k += n;
      spend_work(kWorkPerItem);  // paid as it is made: "a b a b ..." is one item per two bytes
      out.push_back(Value::string(s.substr(word, k - word)));
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t p = s.find(sep->s, start);
    if (p == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) break;
    spend_work(kWorkPerItem);
    out.push_back(Value::string(s.substr(start, p - start)));
    start = p + sep->s.size();
  }
  out.push_back(Value::string(s.substr(start)));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        int64_t limit) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character and at both ends
    spend_work(kWorkPerByteWalked * static_cast<int64_t>(s.size()));
    int64_t done = 0;
    for (size_t p = 0; p < s.size();) {
      const size_t n = utf8_char_bytes(s, p);
      if (count < 0 || done < count) { out += to; ++done; }
      out.append(s, p, n);
      p += n;
      if (static_cast<int64_t>(out.size()) > limit) return out;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + to;
    start = p + from.size();
    ++done;
    if (static_cast<int64_t>(out.size()) > limit) return out;
  }
  return out + s.substr(start);
}

// Python's case mappings are Unicode's; these are ASCII's. Text with other bytes is refused where a
// template changes its case (cased_ascii), never mapped differently from jinja2.
bool is_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_case(s, false);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    c = static_cast<char>(alpha ? (prev_cased ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c))) : c);
    prev_cased = alpha;
  }
  return out;
}

const Value* arg(const std::vector<Value>& args, size_t k, const std::vector<std::string>& kw_names,
                 const std::vector<Value>& kw_values, const char* name) {
  if (k < args.size()) return &args[k];
  for (size_t j = 0; j < kw_names.size(); ++j)
    if (kw_names[j] == name) return &kw_values[j];
  return nullptr;
}

const std::string& need_string(const Value* v, const char* what, const Expr& at) {
  if (!v || !v->is_string()) throw error_at(std::string(what) + " must be a string", at);
  return v->s;
}

}  // namespace

bool Evaluator::call_test(const std::string& name, const Value& v, const std::vector<Value>& args, const Expr& at) {
  const Kind k = v.kind;
  if (name == "defined") return k != Kind::kUndefined;
  if (name == "undefined") return k == Kind::kUndefined;
  if (name == "none") return k == Kind::kNone;
  if (name == "string") return k == Kind::kString;
  if (name == "number") return k == Kind::kInt || k == Kind::kFloat || k == Kind::kBool;
  if (name == "integer") return k == Kind::kInt;
  if (name == "float") return k == Kind::kFloat;
  if (name == "boolean") return k == Kind::kBool;
  if (name == "true") return k == Kind::kBool && v.b;
  if (name == "false") return k == Kind::kBool && !v.b;
  if (name == "mapping") return k == Kind::kDict;
  // jinja2 asks Python: Undefined iterates (empty) and has a length, so it is both.
  if (name == "iterable") return k == Kind::kString || k == Kind::kList || k == Kind::kTuple || k == Kind::kDict || k == Kind::kUndefined;
  if (name == "sequence") return k == Kind::kString || k == Kind::kList || k == Kind::kTuple || k == Kind::kDict || k == Kind::kUndefined;
  if (name == "callable") return k == Kind::kMacro || k == Kind::kBuiltin || k == Kind::kMethod;
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    if (args.size() != 1) throw error_at("test '" + name + "' takes one argument", at);
    if (name == "sameas" && (k == Kind::kNone || k == Kind::kBool)) return k == args[0].kind && (k == Kind::kNone || v.b == args[0].b);
    return equals(v, args[0]);
  }
  if (name == "ne" || name == "!=") { if (args.size() != 1) throw error_at("test 'ne' takes one argument", at); return !equals(v, args[0]); }
  if (name == "in") {
    if (args.size() != 1) throw error_at("test 'in' takes one argument", at);
    return eval_compare("in", v, args[0], at);
  }
  if (name == "lower" || name == "upper") return k == Kind::kString && ascii_case(v.s, name == "upper") == v.s;
  if (name == "odd" || name == "even") {
    if (k != Kind::kInt) throw error_at("test '" + name + "' needs an integer", at);
    return ((v.i % 2) != 0) == (name == "odd");
  }
  throw error_at("unknown test '" + name + "'", at);
}

Value Evaluator::call_method(const Value& self, const std::string& name, const std::vector<Value>& args,
                             const std::vector<std::string>& kw_names, const std::vector<Value>& kw_values,
                             const Expr& at) {
  auto a = [&](size_t k, const char* n) { return arg(args, k, kw_names, kw_values, n); };
  if (self.kind == Kind::kDict) {
    if (name == "items") {
      List out;
      for (const auto& kv : self.dict->items) out.push_back(Value::new_list({Value::string(kv.first), kv.second}, Kind::kTuple));
      return Value::new_list(std::move(out));
    }
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& kv : self.dict->items) out.push_back(name == "keys" ? Value::string(kv.first) : kv.second);
      return Value::new_list(std::move(out));
    }
    if (name == "get") {
      const Value* key = a(0, "key");
      if (!key) throw error_at("get() needs a key", at);
      if (key->is_string())
        if (const Value* v = self.dict->find(key->s)) return *v;
      const Value* dflt = a(1, "default");
      return dflt ? *dflt : Value::none();
    }
  }
  if (self.kind == Kind::kString) {
    const std::string& s = self.s;
    if (name == "strip") return Value::string(py_strip(s, a(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(py_strip(s, a(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(py_strip(s, a(0, "chars"), false, true));
    if ((name == "lower" || name == "upper" || name == "title" || name == "capitalize") && !is_ascii(s))
      throw TemplateError("." + name + "() of non-ASCII text is not supported (Python maps Unicode case)", at.line, at.col);
    if (name == "lower" || name == "upper") return Value::string(ascii_case(s, name == "upper"));
    if (name == "title") return Value::string(title(s));
    if (name == "capitalize") return Value::string(capitalize(s));
    if (name == "split") {
      const Value* sep = a(0, "sep");
      if (sep && sep->is_string() && sep->s.empty()) throw error_at("empty separator", at);
      if (sep && !sep->is_string() && sep->kind != Kind::kNone) throw error_at("split(): sep must be a string", at);
      const Value* maxsplit = a(1, "maxsplit");
      return Value::new_list(py_split(s, sep, maxsplit && maxsplit->kind == Kind::kInt ? maxsplit->i : -1));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* p = a(0, "prefix");
      if (!p) throw error_at(name + "() takes at least 1 argument", at);
      std::vector<Value> options = p->kind == Kind::kTuple ? *p->list : std::vector<Value>{*p};
      for (const Value& o : options) {
        const std::string& x = need_string(&o, (name + "() argument").c_str(), at);
        if (x.size() <= s.size() && (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                                          : s.compare(s.size() - x.size(), x.size(), x) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "replace") {
      const Value* count = a(2, "count");
      return Value::string(replace_all(s, need_string(a(0, "old"), "replace() old", at), need_string(a(1, "new"), "replace() new", at),
                                       count && count->kind == Kind::kInt ? count->i : -1, limits_.max_output_bytes));
    }
    if (name == "find" || name == "count") {
      const std::string& x = need_string(a(0, "sub"), (name + "() argument").c_str(), at);
      if (name == "find") {
        const size_t p = s.find(x);
        return Value::integer(p == std::string::npos ? -1 : utf8_length(s.substr(0, p)));
      }
      if (x.empty()) return Value::integer(utf8_length(s) + 1);
      int64_t n = 0;
      for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
      return Value::integer(n);
    }
  }
  throw error_at(std::string("'") + kind_name(self.kind) + "' object has no method '" + name + "'", at);
}

Value Evaluator::call_global(const std::string& name, const std::vector<Value>& args,
                             const std::vector<std::string>& kw_names, const std::vector<Value>& kw_values,
                             const Expr& at) {
  if (name == "raise_exception") {
    throw TemplateError(args.empty() ? std::string() : to_str(args[0]), at.line, at.col, true);
  }
  if (name == "strftime_now") {
    if (args.empty() || !args[0].is_string()) throw error_at("strftime_now() needs a format string", at);
    return Value::string(format_date(args[0].s, limits_.date_year, limits_.date_month, limits_.date_day));
  }
  if (name == "namespace") {
    Value ns = Value::new_dict(Kind::kNamespace);
    for (const Value& a : args) {
      if (a.kind != Kind::kDict) throw error_at("namespace() takes a dict or keyword arguments", at);
      for (const auto& kv : a.dict->items) ns.dict->set(kv.first, kv.second);
    }
    for (size_t k = 0; k < kw_names.size(); ++k) ns.dict->set(kw_names[k], kw_values[k]);
    namespaces_.push_back(ns.dict);
    return ns;
  }
  if (name == "range") {
    if (args.empty() || args.size() > 3) throw error_at("range() takes 1 to 3 integers", at);
    for (const Value& a : args)
      if (a.kind != Kind::kInt && a.kind != Kind::kBool) throw error_at("range() takes integers", at);
    const int64_t start = args.size() > 1 ? args[0].i : 0;
    const int64_t stop = args.size() > 1 ? args[1].i : args[0].i;
    const int64_t step = args.size() > 2 ? args[2].i : 1;
    if (step == 0) throw error_at("range() arg 3 must not be zero", at);
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      count_iteration(at);  // range(10**12) is a hostile loop, counted before it is built
      spend_work(kWorkPerItem);
      out.push_back(Value::integer(k));
      if ((step > 0 && k > INT64_MAX - step) || (step < 0 && k < INT64_MIN - step)) break;
    }
    return Value::new_list(std::move(out));
  }
  throw error_at("unknown function '" + name + "'", at);
}

Value Evaluator::call_filter(const Expr& e, const Value& v, std::vector<Value> args, std::vector<std::string> kw_names,
                             std::vector<Value> kw_values) {
  const std::string& name = e.name;
  auto a = [&](size_t k, const char* n) { return arg(args, k, kw_names, kw_values, n); };
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::kString: return Value::integer(utf8_length(v.s));
      case Kind::kList: case Kind::kTuple: return Value::integer(static_cast<int64_t>(v.list->size()));
      case Kind::kDict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      case Kind::kUndefined: return Value::integer(0);
      default: throw error_at(std::string("object of type '") + kind_name(v.kind) + "' has no len()", e);
    }
  }
  if (name == "trim") return Value::string(py_strip(to_str(v), a(0, "chars"), true, true));
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    // the defaults and indent > 0 are what it renders; any other choice is refused by name.
    const Value* ensure_ascii = a(0, "ensure_ascii");
    const Value* indent = a(1, "indent");
    const Value* separators = a(2, "separators");
    const Value* sort_keys = a(3, "sort_keys");
    if ((ensure_ascii && truthy(*ensure_ascii)) || (separators && separators->kind != Kind::kNone && !separators->is_undefined()) ||
        (sort_keys && truthy(*sort_keys)) || (indent && indent->kind == Kind::kInt && indent->i <= 0) ||
        (indent && indent->kind != Kind::kInt && indent->kind != Kind::kNone && !indent->is_undefined()))
      throw error_at("tojson: only indent > 0 is supported besides the defaults", e);
    return Value::string(to_json(v, indent && indent->kind == Kind::kInt ? indent->i : 0));
  }
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe") return v;
  if ((name == "upper" || name == "lower" || name == "capitalize" || name == "title") && !is_ascii(to_str(v)))
    throw error_at("filter '" + name + "' of non-ASCII text is not supported (Python maps Unicode case)", e);
  if (name == "upper" || name == "lower") return Value::string(ascii_case(to_str(v), name == "upper"));
  if (name == "capitalize") return Value::string(capitalize(to_str(v)));
  if (name == "title") return Value::string(title(to_str(v)));
  if (name == "replace") {
    const Value* count = a(2, "count");
    return Value::string(replace_all(to_str(v), to_str(args.size() > 0 ? args[0] : Value()), to_str(args.size() > 1 ? args[1] : Value()),
                                     count && count->kind == Kind::kInt ? count->i : -1, limits_.max_output_bytes));
  }
  if (name == "default" || name == "d") {
    const Value* boolean = a(1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    if (!use_default) return v;
    const Value* dflt = a(0, "default_value");
    return dflt ? *dflt : Value::string("");
  }
  if (name == "join") {
    const Value* sep = a(0, "d");
    const Value* attribute = a(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v, e)) {
      if (!first) out += sep ? to_str(*sep) : "";
      first = false;
      out += to_str(attribute ? get_item(item, *attribute, e) : item);
      check_size(static_cast<int64_t>(out.size()), e);
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    const std::vector<Value> items = iterate(v, e);
    if (items.empty()) return Value::undefined("no first item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::new_list(iterate(v, e));
  if (name == "unique") {
    List out;
    for (const Value& item : iterate(v, e))
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equals(o, item); })) out.push_back(item);
    return Value::new_list(std::move(out));
  }
  if (name == "int") {
    if (v.kind == Kind::kInt) return v;
    if (v.kind == Kind::kBool) return Value::integer(v.b ? 1 : 0);
    if (v.kind == Kind::kFloat && std::isfinite(v.f) && std::fabs(v.f) < 9.2e18) return Value::integer(static_cast<int64_t>(v.f));
    if (v.is_string()) {
      // jinja2: int(value), else int(float(value)); Python's int() and float() allow surrounding
      // whitespace.
      const std::string t = py_strip(v.s, nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end && *end == '\0' && errno == 0) return Value::integer(x);
      end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
    }
    return args.empty() ? Value::integer(0) : args[0];
  }
  if (name == "float") {
    if (v.is_number()) return Value::number(v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? v.b : v.i));
    if (v.is_string()) {
      char* end = nullptr;
      const double x = std::strtod(v.s.c_str(), &end);
      if (end && *end == '\0' && !v.s.empty()) return Value::number(x);
    }
    return args.empty() ? Value::number(0.0) : args[0];
  }
  if (name == "abs") {
    if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
    if (v.kind == Kind::kInt && v.i != INT64_MIN) return Value::integer(v.i < 0 ? -v.i : v.i);
    throw error_at("bad operand type for abs()", e);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::new_list();
    if (v.kind != Kind::kDict) throw error_at("items filter needs a mapping", e);
    return call_method(v, "items", {}, {}, {}, e);
  }
  if (name == "map") {
    const Value* attribute = a(99, "attribute");
    List out;
    for (const Value& item : iterate(v, e)) {
      if (attribute) {
        Value got = get_item(item, *attribute, e);
        const Value* dflt = a(99, "default");
        out.push_back(got.is_undefined() && dflt ? *dflt : got);
      } else {
        if (args.empty() || !args[0].is_string()) throw error_at("map() needs attribute= or a filter name", e);
        Expr inner;
        inner.name = args[0].s;
        inner.line = e.line;
        inner.col = e.col;
        out.push_back(call_filter(inner, item, std::vector<Value>(args.begin() + 1, args.end()), {}, {}));
      }
    }
    return Value::new_list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "selectattr" || name == "select";
    const size_t test_at = by_attr ? 1 : 0;
    if (by_attr && args.empty()) throw error_at(name + "() needs an attribute", e);
    List out;
    for (const Value& item : iterate(v, e)) {
      count_iteration(e);
      const Value subject = by_attr ? get_item(item, args[0], e) : item;
      bool pass;
      if (args.size() > test_at) {
        if (!args[test_at].is_string()) throw error_at(name + "(): the test name must be a string", e);
        pass = call_test(args[test_at].s, subject, std::vector<Value>(args.begin() + static_cast<std::ptrdiff_t>(test_at) + 1, args.end()), e);
      } else {
        pass = truthy(subject);
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "dictsort") {
    if (v.kind != Kind::kDict) throw error_at("dictsort needs a mapping", e);
    auto items = v.dict->items;
    std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) {
      return ascii_case(x.first, false) < ascii_case(y.first, false);
    });
    List out;
    for (auto& kv : items) out.push_back(Value::new_list({Value::string(kv.first), kv.second}, Kind::kTuple));
    return Value::new_list(std::move(out));
  }
  if (name == "indent") {
    const Value* width_v = a(0, "width");
    const int64_t width = width_v && width_v->kind == Kind::kInt ? std::clamp<int64_t>(width_v->i, 0, 1024) : 4;
    const Value* first_v = a(1, "first");
    const Value* blank_v = a(2, "blank");
    const std::string pad(static_cast<size_t>(width), ' ');
    const std::string s = to_str(v);
    std::vector<Value> lines = py_split(s, nullptr, -1);
    std::string out;
    size_t start = 0;
    bool first_line = true;
    while (true) {
      const size_t p = s.find('\n', start);
      std::string line = s.substr(start, p == std::string::npos ? std::string::npos : p - start);
      const bool blank = py_strip(line, nullptr, true, true).empty();
      if ((first_line ? (first_v && truthy(*first_v)) : true) && (!blank || (blank_v && truthy(*blank_v)))) out += pad;
      out += line;
      check_size(static_cast<int64_t>(out.size()), e);
      if (p == std::string::npos) break;
      out += '\n';
      start = p + 1;
      first_line = false;
    }
    return Value::string(std::move(out));
  }
  throw error_at("unknown filter '" + name + "'", e);
}

}  // namespace llmq::tmpl
