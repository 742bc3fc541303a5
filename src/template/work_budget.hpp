// The work one chat-template render may do (ChatTemplateOptions::max_work), counted where the
// work is done: running a statement, evaluating an expression, making, copying or comparing a
// value, printing one. Loop iterations and the output are bounded on their own, but a small
// template could still run for hours without this: each of a million iterations may copy a 64 MB
// string, and a list that holds another list twice, 40 levels down, prints as 2^40 items. The
// evaluator installs a budget for its thread while it renders (WorkScope); outside a render
// nothing is counted.
#pragma once

#include <cstdint>

namespace llmq::tmpl {

struct WorkBudget {
  int64_t max_work = 0;        // units of about a nanosecond (kWorkPer* below; a byte copied is 1)
  int64_t spent = 0;
  int64_t max_text_bytes = 0;  // the longest text printing a value (repr, tojson) may make
};

class WorkScope {
 public:
  explicit WorkScope(WorkBudget* budget);
  ~WorkScope();
  WorkScope(const WorkScope&) = delete;
  WorkScope& operator=(const WorkScope&) = delete;

 private:
  WorkBudget* previous_;
};

// Spends `units` of the installed budget: a TemplateError (at line, col where given) once more
// than max_work would be spent.
void spend_work(int64_t units, int64_t line = 0, int64_t col = 0);
// A TemplateError when text a value prints (repr, tojson) has grown past max_text_bytes: a list
// that shares its items prints far longer than it is, and tojson's indent may ask for any number
// of spaces.
void check_printed_size(int64_t bytes);

// What each kind of work costs, in units of about a nanosecond of the release build (measured on
// a 2-core Xeon VM shared with other builds: a byte copied ~1, walked by character ~15, an item
// compared ~12, made or copied up to ~350, printed ~100, a character made a string ~100 to ~400
// with its item, an expression ~200, a statement ~400, a loop iteration 1-2.5 us, most of it making
// its frame).
constexpr int64_t kWorkPerItem = 256;         // making, copying or comparing one item (its string's bytes apart)
constexpr int64_t kWorkPerChar = 128;         // one character made a string of its own (utf8_chars)
constexpr int64_t kWorkPerByteWalked = 16;    // a string walked character by character (strip, split, s[k])
constexpr int64_t kWorkPerPrintedItem = 128;  // one item printed by repr or tojson
constexpr int64_t kWorkPerExpression = 256;
constexpr int64_t kWorkPerStatement = 256;
constexpr int64_t kWorkPerIteration = 2048;
constexpr int64_t kWorkPerFrame = 64;         // looking a name up in one frame

}  // namespace llmq::tmpl
