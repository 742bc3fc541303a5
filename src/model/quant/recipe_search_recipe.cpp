// An assignment of the recipe search written as a QuantRecipe (quant_recipe.hpp), the form that
// quantize_model, export and `llmq eval --recipe` read.
#include "llmq/recipe_search.hpp"

namespace llmq {

Status recipe_from_assignment(const std::vector<RecipeUnit>& units, const std::vector<std::string>& scheme_names,
                              const RecipeAssignment& assignment, QuantRecipe* out) {
  if (assignment.size() != units.size())
    return invalid_argument("recipe: an assignment of " + std::to_string(assignment.size()) + " units for " +
                            std::to_string(units.size()));
  QuantRecipe recipe;
  std::vector<int> group_of(scheme_names.size(), -1);  // scheme index -> group index
  for (size_t u = 0; u < units.size(); ++u) {
    const int option = assignment[u];
    if (option == kKeptOption) {
      recipe.ignore.insert(recipe.ignore.end(), units[u].modules.begin(), units[u].modules.end());
      continue;
    }
    if (option < 0 || static_cast<size_t>(option) >= scheme_names.size())
      return invalid_argument("recipe: unit " + units[u].name + " has option " + std::to_string(option) + " of " +
                              std::to_string(scheme_names.size()) + " schemes");
    int& g = group_of[static_cast<size_t>(option)];
    if (g < 0) {
      g = static_cast<int>(recipe.groups.size());
      recipe.groups.push_back({scheme_names[static_cast<size_t>(option)], scheme_names[static_cast<size_t>(option)], {}});
    }
    std::vector<std::string>& targets = recipe.groups[static_cast<size_t>(g)].targets;
    targets.insert(targets.end(), units[u].modules.begin(), units[u].modules.end());
  }
  *out = std::move(recipe);
  return {};
}

}  // namespace llmq
