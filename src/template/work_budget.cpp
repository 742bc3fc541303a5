// The work budget of a render (work_budget.hpp): one per thread at a time, installed by the
// evaluator for as long as it renders.
#include "template/work_budget.hpp"

#include <string>

#include "template/value.hpp"

namespace llmq::tmpl {
namespace {
thread_local WorkBudget* current_budget = nullptr;
}  // namespace

WorkScope::WorkScope(WorkBudget* budget) : previous_(current_budget) { current_budget = budget; }
WorkScope::~WorkScope() { current_budget = previous_; }

void spend_work(int64_t units, int64_t line, int64_t col) {
  WorkBudget* b = current_budget;
  if (!b) return;
  if (units > b->max_work - b->spent)  // spent <= max_work always, so this cannot overflow
    throw TemplateError("the render needs more than max_work = " + std::to_string(b->max_work) +
                            " units of work (each statement, expression, item and byte copied, compared or printed counts)",
                        line, col);
  b->spent += units;
}

void check_printed_size(int64_t bytes) {
  if (current_budget && bytes > current_budget->max_text_bytes)
    throw TemplateError("a value printed longer than " + std::to_string(current_budget->max_text_bytes) + " bytes");
}

}  // namespace llmq::tmpl
