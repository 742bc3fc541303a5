// The units `llmq recipe` assigns schemes to, and the cost model it minimises (bytes, and the
// decode time a bandwidth-bound batch-1 step spends reading them; see recipe_search.hpp).
#include "llmq/quantized_model.hpp"
#include "llmq/recipe_search.hpp"

namespace llmq {

Status parse_recipe_objective(const std::string& text, RecipeObjective* out) {
  if (text == "speed") *out = RecipeObjective::kSpeed;
  else if (text == "size") *out = RecipeObjective::kSize;
  else return invalid_argument("--objective: '" + text + "' (speed or size)");
  return {};
}

const char* recipe_objective_name(RecipeObjective objective) {
  return objective == RecipeObjective::kSpeed ? "speed" : "size";
}

Status recipe_units(const ModelConfig& config, bool include_lm_head, std::vector<RecipeUnit>* out) {
  if (include_lm_head && config.tie_embeddings)
    return invalid_argument("lm_head: tied to the embedding, it has no weight of its own to quantize");
  std::vector<RecipeUnit> units;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    RecipeUnit attention{"layers." + std::to_string(l) + ".attention", RecipeUnitKind::kAttention, l, {}, {}};
    RecipeUnit mlp{"layers." + std::to_string(l) + ".mlp", RecipeUnitKind::kMlp, l, {}, {}};
    units.push_back(std::move(attention));
    units.push_back(std::move(mlp));
  }
  RecipeUnit head{"lm_head", RecipeUnitKind::kLmHead, -1, {}, {}};
  for (const LinearId& id : linear_ids(config)) {
    RecipeUnit* unit = nullptr;
    switch (id.role) {
      case LinearRole::kQ:
      case LinearRole::kK:
      case LinearRole::kV:
      case LinearRole::kO: unit = &units[static_cast<size_t>(2 * id.layer)]; break;
      case LinearRole::kGate:
      case LinearRole::kUp:
      case LinearRole::kDown: unit = &units[static_cast<size_t>(2 * id.layer + 1)]; break;
      case LinearRole::kRouter: break;  // decides the routing, a few KB: always kept
      case LinearRole::kLmHead: unit = include_lm_head ? &head : nullptr; break;
    }
    if (unit == nullptr) continue;
    unit->linears.push_back(id);
    unit->modules.push_back(id.hf_name(config));
  }
  if (include_lm_head) units.push_back(std::move(head));
  *out = std::move(units);
  return {};
}

Status scheme_weight_bytes(const Scheme& scheme, int64_t rows, int64_t cols, int64_t* bytes) {
  if (rows <= 0 || cols <= 0)
    return invalid_argument("scheme " + scheme.name + ": weight shape " + std::to_string(rows) + " x " +
                            std::to_string(cols));
  BlockShape block;
  Status s = resolve_block_shape(scheme.weight, rows, cols, &block);
  if (!s.ok()) return invalid_argument("scheme " + scheme.name + ": " + s.message());
  const int64_t blocks = ((rows + block.rows - 1) / block.rows) * ((cols + block.cols - 1) / block.cols);
  int64_t total = dtype_storage_bytes(scheme.weight.format, rows * cols);
  total += blocks * 4;  // float32 scales, as both export formats store them
  if (!scheme.weight.symmetric) total += dtype_storage_bytes(scheme.weight.format, blocks);  // zero points
  if (scheme.quantize_activations && scheme.activation.source == ScaleSource::kStatic) total += 4;  // input_scale
  *bytes = total;
  return {};
}

Status unit_cost(const ModelConfig& config, const RecipeUnit& unit, const Scheme* scheme, UnitCost* out) {
  // Decode reads an expert only when the router picks it: on average k of n experts per token.
  const double expert_share = config.is_moe() && config.n_experts > 0
                                  ? static_cast<double>(config.n_experts_per_token) / static_cast<double>(config.n_experts)
                                  : 1.0;
  UnitCost cost;
  double streamed = 0.0;
  for (const LinearId& id : unit.linears) {
    const std::vector<int64_t> shape = linear_shape(config, id);
    int64_t bytes = shape[0] * shape[1] * kKeptBytesPerElement;
    if (scheme != nullptr) LLMQ_RETURN_IF_ERROR(scheme_weight_bytes(*scheme, shape[0], shape[1], &bytes));
    cost.bytes += bytes;
    streamed += static_cast<double>(bytes) * (id.expert >= 0 ? expert_share : 1.0);
  }
  cost.decode_seconds = streamed / kDecodeBandwidthBytesPerSecond;
  *out = cost;
  return {};
}

}  // namespace llmq
