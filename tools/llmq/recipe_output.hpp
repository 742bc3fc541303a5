// What `llmq recipe` prints and writes about its search: the table of every uniform scheme against
// the recipe, the JSON of --json, and the QuantReport (quant_report.hpp) of --report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/calibration.hpp"
#include "llmq/quant_report.hpp"
#include "llmq/recipe_search.hpp"

namespace llmq::cli {

// One model measured against the unquantized one: a uniform scheme, the recipe, the checkpoint
// written. Bytes and decode time cover every linear layer (what is not a unit counted in BF16).
struct RecipeCandidate {
  std::string name;
  EvalAccumulator::Summary summary;
  int64_t bytes = 0;
  double decode_seconds = 0.0;  // the bytes model (recipe_search.hpp), not a measurement
  bool is_recipe = false;
  bool is_checkpoint = false;  // the written checkpoint, reloaded
  double measured_ms = -1.0;   // --device cuda: a batch-1 decode step on the GPU; < 0: not measured
  std::string measure_error{};  // why the GPU could not time it (then measured_ms < 0)
};

struct RecipeRun {
  std::string model;              // --model as given
  std::string model_description;  // what load_model says it is
  std::string data;               // the evaluation data, named
  int64_t context = 0;
  AccuracyBudget budget;
  RecipeObjective objective = RecipeObjective::kSpeed;
  std::vector<RecipeUnit> units;
  std::vector<std::string> scheme_names;  // the candidates
  std::vector<std::string> always_kept;   // linears that are no unit (lm_head, routers)
  RecipeSearchResult search;
  QuantRecipe recipe;                     // the chosen one
  std::vector<RecipeCandidate> candidates;  // the uniform schemes, then the recipe, then the checkpoint
  int64_t kept_bytes = 0;                 // every linear in BF16
  double kept_decode_seconds = 0.0;
  double kept_measured_ms = -1.0;         // the BF16 model on the GPU (--device cuda)
  std::string measured_on;                // "" unless --device cuda: the GPU and how decode was timed
  std::string out_dir;                    // the checkpoint (recipe.json inside it)
  std::string report_html, report_markdown;  // "" when no --report
  const CalibrationStats* stats = nullptr;   // for the report's outliers; may be null
};

// The unit's chosen scheme, or "bf16 (kept)".
std::string unit_choice(const RecipeRun& run, size_t unit);
// The recipe's row name: "recipe", or "recipe (uniform int8-w8a8)" when the chosen point puts every
// unit under one scheme (then the checkpoint is just that scheme's).
std::string recipe_row_name(const RecipeRun& run);

// The summary a person reads: the budget, the table, the assignment, what the costs are.
std::string recipe_text(const RecipeRun& run);
nlohmann::ordered_json recipe_json(const RecipeRun& run);
QuantReport recipe_quant_report(const RecipeRun& run, const std::string& date, const std::string& version);

}  // namespace llmq::cli
