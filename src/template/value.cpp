// Python's semantics for template values: str(), repr(), ==, <, bool(), json.dumps (see value.hpp).
#include "template/value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "template/work_budget.hpp"

namespace llmq::tmpl {

const Value* Dict::find(const std::string& key) const {
  spend_work(4 * static_cast<int64_t>(items.size()));  // a key compared: a few nanoseconds
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
Value* Dict::find(const std::string& key) {
  spend_work(4 * static_cast<int64_t>(items.size()));
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void Dict::set(const std::string& key, Value v) {
  if (Value* old = find(key)) *old = std::move(v);
  else items.emplace_back(key, std::move(v));
}

int64_t copy_work(const Value& v) {
  int64_t units = static_cast<int64_t>(v.s.size());
  if (v.list)
    for (const Value& x : *v.list) units += kWorkPerItem + static_cast<int64_t>(x.s.size());
  if (v.dict)
    for (const auto& kv : v.dict->items) units += kWorkPerItem + static_cast<int64_t>(kv.first.size() + kv.second.s.size());
  return units;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kMacro: return "Macro";
    case Kind::kBuiltin: return "function";
    case Kind::kMethod: return "method";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: case Kind::kTuple: return !v.list->empty();
    case Kind::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

// Python's float.__repr__: the shortest digits that read back to the same double, positional for
// exponents in [-4, 16), else d.ddde+XX.
std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf: [-]d.ddde[+-]XX with prec significant digits
  std::string s = buf;
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  const int exp10 = std::atoi(s.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp10 >= -5 + 1 && exp10 < 16) {
    if (exp10 >= 0) {
      if (static_cast<int64_t>(digits.size()) <= exp10 + 1) {
        out = digits + std::string(static_cast<size_t>(exp10 + 1) - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, static_cast<size_t>(exp10 + 1)) + "." + digits.substr(static_cast<size_t>(exp10 + 1));
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return neg ? "-" + out : out;
}

static std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(q)) { out += '\\'; out += static_cast<char>(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out + q;
}

namespace {
// repr and tojson walk values recursively; a namespace can hold a list that holds the namespace
// (a cycle no depth count at construction sees), so the walk itself is bounded too.
thread_local int32_t walk_depth = 0;
struct WalkGuard {
  WalkGuard() {
    if (++walk_depth > 2 * kMaxValueDepth) {
      --walk_depth;
      throw TemplateError("a value nested deeper than " + std::to_string(2 * kMaxValueDepth) + " levels (or holding itself)");
    }
  }
  ~WalkGuard() { --walk_depth; }
};
}  // namespace

// Appends repr(v): one string grows (a nested value is not built level by level and copied up),
// each item is paid for, and the text is checked against the bound as it grows.
static void repr_into(const Value& v, std::string* out) {
  const WalkGuard guard;
  spend_work(kWorkPerPrintedItem);
  switch (v.kind) {
    case Kind::kString:
      *out += repr_string(v.s);
      spend_work(static_cast<int64_t>(v.s.size()));
      break;
    case Kind::kUndefined: *out += "Undefined"; break;
    case Kind::kList: case Kind::kTuple: {
      *out += v.kind == Kind::kList ? "[" : "(";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += ", ";
        repr_into((*v.list)[k], out);
      }
      if (v.kind == Kind::kTuple && v.list->size() == 1) *out += ",";
      *out += v.kind == Kind::kList ? "]" : ")";
      break;
    }
    case Kind::kDict: {
      *out += "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        *out += (first ? "" : ", ") + repr_string(kv.first) + ": ";
        spend_work(static_cast<int64_t>(kv.first.size()));
        repr_into(kv.second, out);
        first = false;
      }
      *out += "}";
      break;
    }
    case Kind::kNamespace: {
      Value d = v;
      d.kind = Kind::kDict;
      *out += "<Namespace ";
      repr_into(d, out);
      *out += ">";
      break;
    }
    default: *out += to_str(v);
  }
  check_printed_size(static_cast<int64_t>(out->size()));
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(v, &out);
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return python_float_repr(v.f);
    case Kind::kString: return v.s;
    case Kind::kMacro: return "<Macro>";
    case Kind::kBuiltin: case Kind::kMethod: return "<function " + v.s + ">";
    default: return repr(v);
  }
}

static double as_double(const Value& v) {
  return v.kind == Kind::kFloat ? v.f : static_cast<double>(v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i);
}

bool equals(const Value& a, const Value& b) {
  spend_work(kWorkPerItem);  // deep: two lists that share their items 2^40 ways compare in 2^40 steps
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) return as_double(a) == as_double(b) &&
        (a.kind == Kind::kBool ? (a.b ? 1 : 0) : a.i) == (b.kind == Kind::kBool ? (b.b ? 1 : 0) : b.i);
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) {
    if (a.is_sequence() && b.is_sequence()) return false;  // [1] != (1,) in Python
    return false;
  }
  switch (a.kind) {
    case Kind::kUndefined: case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList: case Kind::kTuple: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* other = b.dict->find(kv.first);
        if (!other || !equals(kv.second, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    default: return a.macro == b.macro && a.s == b.s;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return as_double(a) < as_double(b);
  if (a.is_string() && b.is_string()) return a.s < b.s;
  throw TemplateError(std::string("'<' not supported between instances of '") + kind_name(a.kind) +
                      "' and '" + kind_name(b.kind) + "'");
}

static void json_string(const std::string& s, std::string* out) {
  spend_work(static_cast<int64_t>(s.size()));
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          *out += b;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

static void json_value(const Value& v, int64_t indent, int64_t level, std::string* out) {
  const WalkGuard guard;
  if (level > 512) throw TemplateError("tojson: nesting deeper than 512");
  spend_work(kWorkPerPrintedItem);
  check_printed_size(static_cast<int64_t>(out->size()));
  const std::string item_sep = indent > 0 ? "," : ", ";
  auto newline = [&](int64_t lv) {
    if (indent <= 0) return;
    int64_t pad = 0;  // checked before it is made: indent may be any int64
    if (__builtin_mul_overflow(indent, lv, &pad) || pad > INT64_MAX - static_cast<int64_t>(out->size()) - 1)
      pad = INT64_MAX - static_cast<int64_t>(out->size()) - 1;
    check_printed_size(static_cast<int64_t>(out->size()) + 1 + pad);
    spend_work(pad);
    *out += "\n" + std::string(static_cast<size_t>(pad), ' ');
  };
  switch (v.kind) {
    case Kind::kNone: *out += "null"; return;
    case Kind::kBool: *out += v.b ? "true" : "false"; return;
    case Kind::kInt: *out += std::to_string(v.i); return;
    case Kind::kFloat:
      if (std::isnan(v.f)) *out += "NaN";
      else if (std::isinf(v.f)) *out += v.f > 0 ? "Infinity" : "-Infinity";
      else *out += python_float_repr(v.f);
      return;
    case Kind::kString: json_string(v.s, out); return;
    case Kind::kList: case Kind::kTuple: {
      if (v.list->empty()) { *out += "[]"; return; }
      *out += "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) *out += item_sep;
        newline(level + 1);
        json_value((*v.list)[k], indent, level + 1, out);
      }
      newline(level);
      *out += "]";
      return;
    }
    case Kind::kDict: {
      if (v.dict->items.empty()) { *out += "{}"; return; }
      *out += "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) *out += item_sep;
        first = false;
        newline(level + 1);
        json_string(kv.first, out);
        *out += ": ";
        json_value(kv.second, indent, level + 1, out);
      }
      newline(level);
      *out += "}";
      return;
    }
    default:
      throw TemplateError(std::string("Object of type ") + kind_name(v.kind) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, int64_t indent) {
  std::string out;
  json_value(v, indent, 0, &out);
  check_printed_size(static_cast<int64_t>(out.size()));
  return out;
}

template <typename Json>
Value from_json_any(const Json& j) {
  switch (j.type()) {
    case nlohmann::detail::value_t::null: return Value::none();
    case nlohmann::detail::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::detail::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::detail::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::detail::value_t::number_float: return Value::number(j.template get<double>());
    case nlohmann::detail::value_t::string: return Value::string(j.template get_ref<const std::string&>());
    case nlohmann::detail::value_t::array: {
      Value out = Value::new_list();
      for (const auto& e : j) out.list->push_back(from_json_any(e));
      out.update_depth();
      return out;
    }
    case nlohmann::detail::value_t::object: {
      Value out = Value::new_dict();
      for (auto it = j.begin(); it != j.end(); ++it) out.dict->items.emplace_back(it.key(), from_json_any(it.value()));
      out.update_depth();
      return out;
    }
    default: return Value::none();
  }
}

Value from_json(const nlohmann::json& j) { return from_json_any(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_any(j); }

size_t utf8_char_bytes(const std::string& s, size_t p) {
  const auto c = static_cast<unsigned char>(s[p]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (p + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[p + k]) & 0xc0) != 0x80) return 1;
  return n;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  const int64_t count = utf8_length(s);
  spend_work(kWorkPerChar * count);  // before the allocation: 32 bytes or more per character
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(count));
  for (size_t p = 0; p < s.size();) {
    const size_t n = utf8_char_bytes(s, p);
    out.push_back(s.substr(p, n));
    p += n;
  }
  return out;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (size_t p = 0; p < s.size(); p += utf8_char_bytes(s, p)) ++n;
  return n;
}

}  // namespace llmq::tmpl
