// Which config group of a checkpoint's quantization_config quantizes a module, and whether its
// ignore list keeps it, read as vLLM and compressed-tensors read them; compiled once per checkpoint.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/status.hpp"
#include "model/quant/quant_recipe_targets.hpp"

namespace llmq {

class QuantizationTargets {
 public:
  // `q` is a quantization_config object (kept by reference: it must outlive this); `is_module`
  // says whether the checkpoint holds a linear of that name. compressed-tensors: every config
  // group's "targets" and the "ignore" list are compiled now, regular expressions as Python's
  // re.match reads them (from the start of the name), all bounded together. A bare target other
  // than "Linear" must be a module of the checkpoint: vLLM reads other bare strings as class names
  // (by substring), which llmq cannot tell apart, so such a checkpoint is refused rather than
  // guessed. The fp8 format: its ignored_layers and modules_to_not_convert, exact names.
  static Status parse(const nlohmann::json& q, const std::function<bool(const std::string&)>& is_module,
                      QuantizationTargets* out);

  // A module stored 8-bit: its config group (compressed-tensors; *group nullptr for fp8). Refused,
  // naming the module: the ignore list keeps it (a loader would run the codes as float weights),
  // no group takes it, or two do (loaders would disagree or guess its quantization).
  Status group_of(const std::string& module, std::string* name, const nlohmann::json** group);

 private:
  struct Group {
    std::string name;
    const nlohmann::json* config = nullptr;
    bool all_linear = false;  // the target "Linear"
    std::vector<RecipeTarget> targets;
  };
  bool compressed_tensors_ = false;
  std::vector<Group> groups_;
  std::vector<RecipeTarget> ignore_;
  RecipeTargetBudget budget_;
};

}  // namespace llmq
