// The chat-template evaluator: runs parse_template's tree over a context of values, with jinja2's
// scoping (a for-loop iteration and a macro call each get their own frame: a `set` inside them is
// gone when they end, which is why templates use namespace()), and limits on nesting, loop
// iterations and output size. builtins.cpp holds the filters, tests, methods and globals.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "template/parser.hpp"
#include "template/value.hpp"
#include "template/work_budget.hpp"

namespace llmq::tmpl {

struct EvalLimits {
  int64_t max_nesting = 256;          // macro calls (and their recursion) deep
  int64_t max_loop_iterations = 1000000;
  int64_t max_output_bytes = int64_t{64} << 20;
  int64_t max_work = int64_t{1} << 30;  // WorkBudget units (value.hpp)
  int date_year = 1970, date_month = 1, date_day = 1;  // what strftime_now formats, at midnight
};

struct Frame {
  std::map<std::string, Value> vars;
  Frame* parent = nullptr;
};

class Evaluator {
 public:
  Evaluator(const EvalLimits& limits, Frame* root)
      : limits_(limits), root_(root), budget_{limits.max_work, 0, limits.max_output_bytes}, work_scope_(&budget_) {}
  // Renders body into *out (appending). Throws TemplateError.
  void render(const Body& body, std::string* out);

  // ---- used by builtins.cpp ----
  Value call_filter(const Expr& e, const Value& target, std::vector<Value> args, std::vector<std::string> kw_names,
                    std::vector<Value> kw_values);
  bool call_test(const std::string& name, const Value& v, const std::vector<Value>& args, const Expr& at);
  Value call_value(const Value& fn, std::vector<Value> args, std::vector<std::string> kw_names,
                   std::vector<Value> kw_values, const Expr& at);
  Value get_attr(const Value& obj, const std::string& name, bool item_first, const Expr& at);
  Value get_item(const Value& obj, const Value& key, const Expr& at);
  std::vector<Value> iterate(const Value& v, const Expr& at);
  std::vector<Value> iterate_items(const Value& v, const Expr& at);  // iterate, errors not yet placed
  void check_size(int64_t bytes, const Expr& at) const;
  void count_iteration(const Expr& at);
  const EvalLimits& limits() const { return limits_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body, Frame* frame, std::string* out);
  Flow exec_for(const Stmt& s, Frame* frame, std::string* out);
  Value eval(const Expr& e, Frame* frame);  // eval_node, paid for
  Value eval_node(const Expr& e, Frame* frame);
  Value eval_binary(const Expr& e, const Value& a, const Value& b);
  bool eval_compare(const std::string& op, const Value& a, const Value& b, const Expr& at);
  Value call_macro(const MacroDef& m, std::vector<Value> args, std::vector<std::string> kw_names,
                   std::vector<Value> kw_values, const Expr& at);
  Value call_method(const Value& self, const std::string& name, const std::vector<Value>& args,
                    const std::vector<std::string>& kw_names, const std::vector<Value>& kw_values, const Expr& at);
  Value call_global(const std::string& name, const std::vector<Value>& args, const std::vector<std::string>& kw_names,
                    const std::vector<Value>& kw_values, const Expr& at);

  EvalLimits limits_;
  Frame* root_;
  WorkBudget budget_;
  WorkScope work_scope_;  // installs budget_ for this thread while the evaluator lives
  // Every namespace() made while rendering: a namespace can hold itself through a list (a
  // reference cycle shared_ptr never frees), so their contents are dropped when the evaluator goes.
  std::vector<std::shared_ptr<Dict>> namespaces_;

 public:
  ~Evaluator() {
    for (const auto& d : namespaces_) d->items.clear();
  }
  int64_t depth_ = 0;
  int64_t iterations_ = 0;
};

// strftime for the one day limits names, at 00:00:00 (what strftime_now returns for that day).
std::string format_date(const std::string& fmt, int year, int month, int day);

}  // namespace llmq::tmpl
