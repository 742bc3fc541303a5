// RoPE in config.json, in either of transformers' spellings: rope_theta / rope_scaling (4.x) and
// rope_parameters (5.x), types default, llama3 and yarn; every other type or key is refused.
#include <set>
#include <utility>
#include <vector>

#include "model/checkpoint/hf_config_fields.hpp"

namespace llmq::hf_config {
namespace {


// One spelling's view of RoPE: rope_scaling (4.x) or rope_parameters (5.x).
struct RopeSpelling {
  std::string name;          // "rope_scaling" or "rope_parameters"
  std::string type;          // "default" or "llama3"
  bool has_theta = false;    // rope_theta inside the object
  double theta = 0.0;
  RopeScaling scaling;       // enabled for llama3
  YarnScaling yarn;          // enabled for yarn
};

// `type_required`: 4.x needs a rope_type (or type) in rope_scaling and fails without one; 5.x
// defaults rope_parameters' to "default".
Status read_rope_object(const json& obj, const std::string& name, bool type_required, RopeSpelling* out) {
  if (!obj.is_object()) return invalid_argument("config.json: " + name + ": expected an object, got " + obj.dump());
  const std::string parent = name + ".";
  RopeSpelling r;
  r.name = name;
  std::string rope_type, type;
  LLMQ_RETURN_IF_ERROR(read_string(obj, "rope_type", false, &rope_type, parent));
  LLMQ_RETURN_IF_ERROR(read_string(obj, "type", false, &type, parent));
  if (!rope_type.empty() && !type.empty() && rope_type != type)
    return invalid_argument("config.json: " + parent + "rope_type ('" + rope_type + "') and " + parent + "type ('" +
                            type + "') disagree; refusing to pick one");
  r.type = !rope_type.empty() ? rope_type : type;
  if (r.type.empty()) {
    if (type_required)
      return invalid_argument("config.json: " + name + ": no rope_type (or type): transformers 4 cannot load it");
    r.type = "default";
  }
  if (r.type != "default" && r.type != "llama3" && r.type != "yarn")
    return unsupported("config.json: " + parent + (rope_type.empty() ? "type" : "rope_type") + ": RoPE type '" +
                       r.type + "' is not supported (llmq implements 'default', 'llama3' and 'yarn'); refusing rather "
                       "than computing a different model");
  static const std::set<std::string> known = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                              "high_freq_factor", "original_max_position_embeddings",
                                              "partial_rotary_factor", "beta_fast", "beta_slow", "truncate",
                                              "attention_factor"};
  // Anything else (mrope_section, per-layer-type objects, attention scaling, ...) is a RoPE llmq
  // does not compute.
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!it->is_null() && known.count(it.key()) == 0) return not_understood(parent + it.key());
  LLMQ_RETURN_IF_ERROR(check_partial_rotary(obj, parent));
  if (field(obj, "rope_theta") != nullptr) {
    r.has_theta = true;
    LLMQ_RETURN_IF_ERROR(read_double(obj, "rope_theta", true, &r.theta, parent));
  }
  // Keys of one RoPE type only: present under another, they would be a RoPE llmq does not compute.
  for (const char* k : {"beta_fast", "beta_slow", "truncate", "attention_factor"})
    if (r.type != "yarn" && field(obj, k) != nullptr) return not_understood(parent + k);
  for (const char* k : {"low_freq_factor", "high_freq_factor"})
    if (r.type != "llama3" && field(obj, k) != nullptr) return not_understood(parent + k);
  if (r.type == "default" && (field(obj, "factor") != nullptr || field(obj, "original_max_position_embeddings") != nullptr))
    return not_understood(parent + (field(obj, "factor") != nullptr ? "factor" : "original_max_position_embeddings"));
  if (r.type == "yarn") {
    // transformers' _compute_yarn_parameters: factor and original_max_position_embeddings are
    // required (a missing factor would be max_position / original, which a config writes out);
    // beta_fast 32, beta_slow 1, truncate true by default; attention_factor 0.1 ln(factor) + 1
    // unless given. DeepSeek's mscale pair is not implemented (refused above as unknown keys).
    YarnScaling& y = r.yarn;
    y.enabled = true;
    LLMQ_RETURN_IF_ERROR(read_double(obj, "factor", true, &y.factor, parent));
    LLMQ_RETURN_IF_ERROR(read_int(obj, "original_max_position_embeddings", true, &y.original_max_position, parent));
    LLMQ_RETURN_IF_ERROR(read_double(obj, "beta_fast", false, &y.beta_fast, parent));
    LLMQ_RETURN_IF_ERROR(read_double(obj, "beta_slow", false, &y.beta_slow, parent));
    LLMQ_RETURN_IF_ERROR(read_bool(obj, "truncate", &y.truncate));
    if (!(y.factor > 0) || y.original_max_position <= 0 || !(y.beta_fast > 0) || !(y.beta_slow > 0))
      return invalid_argument("config.json: " + name + ": need factor, beta_fast, beta_slow > 0 and "
                              "original_max_position_embeddings > 0, got " + obj.dump());
    y.attention_factor = y.factor <= 1 ? 1.0 : 0.1 * std::log(y.factor) + 1.0;
    LLMQ_RETURN_IF_ERROR(read_double(obj, "attention_factor", false, &y.attention_factor, parent));
  }
  if (r.type == "llama3") {
    // Llama 3 configs give all four; transformers 4 refuses the type without them (5 would take
    // original_max_position_embeddings from max_position_embeddings, but it writes it out).
    RopeScaling& s = r.scaling;
    s.enabled = true;
    LLMQ_RETURN_IF_ERROR(read_double(obj, "factor", true, &s.factor, parent));
    LLMQ_RETURN_IF_ERROR(read_double(obj, "low_freq_factor", true, &s.low_freq_factor, parent));
    LLMQ_RETURN_IF_ERROR(read_double(obj, "high_freq_factor", true, &s.high_freq_factor, parent));
    LLMQ_RETURN_IF_ERROR(read_int(obj, "original_max_position_embeddings", true, &s.original_max_position, parent));
    // ModelConfig::validate checks the ranges again for every loader; here the message can name
    // the object the values came from.
    if (!(s.factor > 0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_position <= 0)
      return invalid_argument("config.json: " + name + ": need factor > 0, 0 < low_freq_factor < high_freq_factor, "
                              "original_max_position_embeddings > 0, got " + obj.dump());
  }
  *out = std::move(r);
  return {};
}

bool same_rope(const RopeSpelling& a, const RopeSpelling& b) {
  if (a.type != b.type) return false;
  if (a.type == "yarn")
    return a.yarn.factor == b.yarn.factor && a.yarn.beta_fast == b.yarn.beta_fast && a.yarn.beta_slow == b.yarn.beta_slow &&
           a.yarn.truncate == b.yarn.truncate && a.yarn.original_max_position == b.yarn.original_max_position &&
           a.yarn.attention_factor == b.yarn.attention_factor;
  if (a.type != "llama3") return true;
  const RopeScaling &x = a.scaling, &y = b.scaling;
  return x.factor == y.factor && x.low_freq_factor == y.low_freq_factor && x.high_freq_factor == y.high_freq_factor &&
         x.original_max_position == y.original_max_position;
}

}  // namespace

// theta and scaling from rope_theta, rope_scaling and rope_parameters. transformers 5 moves the
// 4.x keys into rope_parameters (rope_scaling replacing it, a top-level rope_theta filling in a
// missing one); transformers 4 reads only the top-level keys. Where the spellings disagree, one
// of the two versions computes something else: refused, naming both.
Status read_rope(const json& j, double default_theta, ModelConfig* c) {
  LLMQ_RETURN_IF_ERROR(check_partial_rotary(j, ""));
  std::vector<RopeSpelling> spellings;
  if (const json* rs = field(j, "rope_scaling")) {
    spellings.emplace_back();
    LLMQ_RETURN_IF_ERROR(read_rope_object(*rs, "rope_scaling", true, &spellings.back()));
  }
  if (const json* rp = field(j, "rope_parameters")) {
    spellings.emplace_back();
    LLMQ_RETURN_IF_ERROR(read_rope_object(*rp, "rope_parameters", false, &spellings.back()));
  }
  if (spellings.size() == 2 && !same_rope(spellings[0], spellings[1]))
    return invalid_argument("config.json: rope_scaling (" + field(j, "rope_scaling")->dump() + ") and rope_parameters (" +
                            field(j, "rope_parameters")->dump() + ") disagree; refusing to pick one");

  // theta: every place it is stated must agree.
  std::vector<std::pair<std::string, double>> thetas;
  if (field(j, "rope_theta") != nullptr) {
    double t = 0;
    LLMQ_RETURN_IF_ERROR(read_double(j, "rope_theta", true, &t));
    thetas.emplace_back("rope_theta", t);
  }
  for (const RopeSpelling& s : spellings) {
    if (!s.has_theta) continue;
    // transformers 4 never reads a theta inside rope_scaling; 5 does. Alone it means two models.
    if (s.name == "rope_scaling" && field(j, "rope_theta") == nullptr)
      return unsupported("config.json: rope_scaling.rope_theta without a top-level rope_theta: transformers 4 "
                         "ignores it, transformers 5 uses it; refusing to pick one");
    thetas.emplace_back(s.name + ".rope_theta", s.theta);
  }
  for (const auto& t : thetas)
    if (t.second != thetas.front().second)
      return invalid_argument("config.json: " + thetas.front().first + " (" + json(thetas.front().second).dump() +
                              ") and " + t.first + " (" + json(t.second).dump() + ") disagree; refusing to pick one");
  c->rope_theta = thetas.empty() ? default_theta : thetas.front().second;
  c->rope_scaling = RopeScaling{};
  c->yarn = YarnScaling{};
  if (!spellings.empty()) {
    c->rope_scaling = spellings.front().scaling;
    c->yarn = spellings.front().yarn;
  }
  c->rope_style = RopeStyle::kHalf;  // transformers' rotate_half
  return {};
}

}  // namespace llmq::hf_config
