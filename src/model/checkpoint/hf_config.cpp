// config.json of a Hugging Face Llama-family checkpoint <-> ModelConfig. Read as transformers reads
// it, in both of its formats (<= 4: top-level rope_theta / rope_scaling; >= 5: rope_parameters),
// with every key either implemented, known not to change the forward pass, or refused by name:
// a key llmq does not understand could make transformers compute another model, and running that
// model silently as a plain Llama is the one outcome a quantizer must not have. Also
// quantization_config's weight block size, and hf_config_json, the writer of the same format.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

// vLLM / DeepSeek block FP8 quantizes 128 x 128 tiles unless quantization_config says otherwise.
constexpr int64_t kDefaultWeightBlock = 128;

// ---- Which keys mean what. A key in none of these lists is refused.

// Keys transformers' PretrainedConfig (4.x) serialized for every model, and the bookkeeping keys
// of 4.x and 5.x: none changes what a causal LM's forward pass computes. The generation defaults
// (max_length .. begin_suppress_tokens, PretrainedConfig._get_generation_defaults) steer
// transformers' generate(); llmq's sampler takes its own options. Dropout rates do nothing at
// inference; initializer_range only seeds fresh weights; use_cache, attention implementations,
// output_* and return_* pick what is kept or returned, not the numbers; dtype / torch_dtype name
// the checkpoint's storage type, which the loader reads from the tensors themselves.
const std::set<std::string>& ignored_keys() {
  static const std::set<std::string> keys = {
      // PretrainedConfig.__init__ (4.x)
      "return_dict", "output_hidden_states", "output_attentions", "torchscript", "torch_dtype", "dtype",
      "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward", "is_decoder", "finetuning_task", "id2label",
      "label2id", "num_labels", "problem_type", "tokenizer_class", "prefix", "pad_token_id", "sep_token_id",
      "decoder_start_token_id", "task_specific_params", "xla_device", "gradient_checkpointing",
      "_name_or_path", "name_or_path", "_commit_hash", "attn_implementation", "_attn_implementation",
      "_attn_implementation_autoset", "transformers_version",
      // PretrainedConfig._get_generation_defaults (4.x)
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
      "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
      "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
      "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
      // The Llama-family configs' own training / runtime switches; Mixtral's router ones (the aux
      // loss and router-logit outputs are training-only, the jitter noise applies only in training
      // mode), harmless on any model type.
      "use_cache", "initializer_range", "attention_dropout", "router_aux_loss_coef", "output_router_logits",
      "router_jitter_noise",
      // SmolLM / SmolLM2 (llama) configs carry this marker of their conversion; no class reads it.
      "is_llama_config"};
  return keys;
}

// Keys parse_hf_config reads (and checks the value of) below.
const std::set<std::string>& read_keys() {
  static const std::set<std::string> keys = {
      "model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
      "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor",
      "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "bos_token_id", "eos_token_id",
      "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "num_local_experts",
      "num_experts_per_tok", "pretraining_tp", "pruned_heads", "is_encoder_decoder", "add_cross_attention",
      "tie_encoder_decoder", "quantization_config", "max_sequence_length", "use_mrope", "rope_interleaved"};
  return keys;
}

// Keys read only for some model types; elsewhere transformers' config class has no such field.
bool key_belongs_to(const std::string& key, const std::string& model_type) {
  static const std::set<std::string> mixtral = {"num_local_experts", "num_experts_per_tok"};
  static const std::set<std::string> qwen2 = {"max_window_layers"};
  if (mixtral.count(key) != 0) return model_type == "mixtral";
  if (qwen2.count(key) != 0) return model_type == "qwen2";
  return true;
}

Status not_understood(const std::string& key, const std::string& model_type = "") {
  return unsupported("config.json: field '" + key + "' is not understood by llmq" +
                     (model_type.empty() ? "" : " for model_type '" + model_type + "'") +
                     "; refusing rather than computing a different model");
}

// ---- config.json field readers. A null value counts as absent: configs write "head_dim": null,
// ---- "rope_scaling": null, "sliding_window": null.

const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// `parent` names the enclosing object in messages ("rope_scaling." for its fields).
Status missing(const std::string& key) { return invalid_argument("config.json: " + key + ": missing"); }

Status read_int(const json& obj, const std::string& key, bool required, int64_t* out, const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_number_integer())
    return invalid_argument("config.json: " + parent + key + ": expected an integer, got " + v->dump());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return invalid_argument("config.json: " + parent + key + ": " + v->dump() + " is too large");
  *out = v->get<int64_t>();
  return {};
}

// Finite numbers only: a parser may turn 1e999 into infinity.
Status read_double(const json& obj, const std::string& key, bool required, double* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_number() || !std::isfinite(v->get<double>()))
    return invalid_argument("config.json: " + parent + key + ": expected a finite number, got " + v->dump());
  *out = v->get<double>();
  return {};
}

Status read_bool(const json& obj, const std::string& key, bool* out) {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return {};
  if (!v->is_boolean()) return invalid_argument("config.json: " + key + ": expected true or false, got " + v->dump());
  *out = v->get<bool>();
  return {};
}

Status read_string(const json& obj, const std::string& key, bool required, std::string* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_string())
    return invalid_argument("config.json: " + parent + key + ": expected a string, got " + v->dump());
  *out = v->get<std::string>();
  return {};
}

// A boolean key llmq accepts only with the value that leaves the model a plain Llama.
Status require_bool(const json& obj, const std::string& key, bool allowed, const std::string& why) {
  bool v = allowed;
  LLMQ_RETURN_IF_ERROR(read_bool(obj, key, &v));
  if (v != allowed) return unsupported("config.json: " + key + ": " + (v ? "true" : "false") + " is not supported (" + why + ")");
  return {};
}

// bos_token_id / eos_token_id: an integer, or a list of them (Llama 3.1 lists three EOS tokens;
// the first is the one generation stops on by default).
Status read_token_id(const json& obj, const std::string& key, int32_t* out) {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return {};
  const json* id = v;
  if (v->is_array()) {
    if (v->empty()) return {};
    id = &(*v)[0];
  }
  if (!id->is_number_integer() || id->get<int64_t>() < 0 ||
      id->get<int64_t>() > std::numeric_limits<int32_t>::max())
    return invalid_argument("config.json: " + key + ": expected a token id, got " + v->dump());
  *out = static_cast<int32_t>(id->get<int64_t>());
  return {};
}

// partial_rotary_factor (top level, as 4.x read it through getattr, or inside the rope object as
// 5.x writes it): RoPE on a fraction of each head, which llmq does not implement.
Status check_partial_rotary(const json& obj, const std::string& parent) {
  double f = 1.0;
  LLMQ_RETURN_IF_ERROR(read_double(obj, "partial_rotary_factor", false, &f, parent));
  if (f != 1.0)
    return unsupported("config.json: " + parent + "partial_rotary_factor: " + json(f).dump() +
                       " is not supported (llmq rotates whole heads: only 1)");
  return {};
}

// ---- RoPE, in either spelling.

// One spelling's view of RoPE: rope_scaling (4.x) or rope_parameters (5.x).
struct RopeSpelling {
  std::string name;          // "rope_scaling" or "rope_parameters"
  std::string type;          // "default" or "llama3"
  bool has_theta = false;    // rope_theta inside the object
  double theta = 0.0;
  RopeScaling scaling;       // enabled for llama3
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
  if (r.type != "default" && r.type != "llama3")
    return unsupported("config.json: " + parent + (rope_type.empty() ? "type" : "rope_type") + ": RoPE type '" +
                       r.type + "' is not supported (llmq implements 'default' and 'llama3'); refusing rather than "
                       "computing a different model");
  static const std::set<std::string> known = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                              "high_freq_factor", "original_max_position_embeddings",
                                              "partial_rotary_factor"};
  // Anything else (mrope_section, per-layer-type objects, attention scaling, ...) is a RoPE llmq
  // does not compute.
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!it->is_null() && known.count(it.key()) == 0) return not_understood(parent + it.key());
  LLMQ_RETURN_IF_ERROR(check_partial_rotary(obj, parent));
  if (field(obj, "rope_theta") != nullptr) {
    r.has_theta = true;
    LLMQ_RETURN_IF_ERROR(read_double(obj, "rope_theta", true, &r.theta, parent));
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
  if (a.type != "llama3") return true;
  const RopeScaling &x = a.scaling, &y = b.scaling;
  return x.factor == y.factor && x.low_freq_factor == y.low_freq_factor && x.high_freq_factor == y.high_freq_factor &&
         x.original_max_position == y.original_max_position;
}

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
  if (!spellings.empty()) c->rope_scaling = spellings.front().scaling;
  c->rope_style = RopeStyle::kHalf;  // transformers' rotate_half
  return {};
}

// ---- Sliding windows (transformers 5 semantics; the window is refused past its end, see
// ---- ModelConfig::sliding_window).

Status read_sliding_window(const json& j, ModelConfig* c) {
  const std::string& type = c->model_type;
  // Absent (not null) means the config class's default: MistralConfig's is 4096 (transformers 4
  // and 5); Mixtral's and Qwen2's none. Only an explicit null says "no window" for mistral.
  int64_t window = type == "mistral" && j.find("sliding_window") == j.end() ? 4096 : 0;
  if (field(j, "sliding_window") != nullptr) {
    LLMQ_RETURN_IF_ERROR(read_int(j, "sliding_window", true, &window));
    if (window <= 0)
      return invalid_argument("config.json: sliding_window: must be positive or null, got " + std::to_string(window));
  }
  const bool has_flag = field(j, "use_sliding_window") != nullptr;
  bool use_window = false;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "use_sliding_window", &use_window));

  // layer_types (5.x): which layers attend through the window. Its length is checked before
  // anything is sized by num_hidden_layers.
  int64_t n_sliding = 0;
  const json* lt = field(j, "layer_types");
  if (lt != nullptr) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c->n_layers)
      return invalid_argument("config.json: layer_types: expected a list of num_hidden_layers (" +
                              std::to_string(c->n_layers) + ") strings");
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (t == "full_attention") continue;
      if (t == "sliding_attention") {
        ++n_sliding;
        continue;
      }
      return unsupported("config.json: layer_types[" + std::to_string(i) + "]: " + t.dump() +
                         " is not supported (llmq implements \"full_attention\" and, up to the window, "
                         "\"sliding_attention\")");
    }
  }

  if (type == "llama") {
    // LlamaConfig has no window: accepted only where the keys cannot mean one.
    if (window > 0) return not_understood("sliding_window", type);
    if (use_window) return not_understood("use_sliding_window", type);
    if (n_sliding > 0) return not_understood("layer_types", type);
    return {};
  }
  if (type == "mistral" || type == "mixtral") {
    // Every layer attends through sliding_window; these classes read no use_sliding_window or
    // layer_types, so those are accepted only where they say the same.
    if (has_flag && use_window != (window > 0))
      return unsupported("config.json: use_sliding_window: " + std::string(use_window ? "true" : "false") +
                         ", but transformers' " + type + " ignores it and " +
                         (window > 0 ? "applies sliding_window = " + std::to_string(window) : "has no window") +
                         "; refusing to pick one");
    if (lt != nullptr && n_sliding != (window > 0 ? c->n_layers : 0))
      return unsupported("config.json: layer_types disagrees with sliding_window (" +
                         (window > 0 ? std::to_string(window) : std::string("null")) + "), which transformers' " + type +
                         " applies to every layer; refusing to pick one");
    c->sliding_window = window;
    return {};
  }
  // qwen2: the window exists only with use_sliding_window; it applies to the layers layer_types
  // names, or else to layers max_window_layers and up (Qwen2Config.__post_init__).
  int64_t max_window_layers = 28;
  LLMQ_RETURN_IF_ERROR(read_int(j, "max_window_layers", false, &max_window_layers));
  if (max_window_layers < 0)
    return invalid_argument("config.json: max_window_layers: must be >= 0, got " + std::to_string(max_window_layers));
  if (!use_window || window == 0) return {};
  const bool windowed = lt != nullptr ? n_sliding > 0 : max_window_layers < c->n_layers;
  if (windowed) c->sliding_window = window;
  return {};
}

// architectures: only causal-LM heads (a *ForSequenceClassification head is not an lm_head).
Status check_architectures(const json& j) {
  const json* a = field(j, "architectures");
  if (a == nullptr) return {};
  if (!a->is_array()) return invalid_argument("config.json: architectures: expected a list, got " + a->dump());
  const std::string suffix = "ForCausalLM";
  for (const json& name : *a) {
    const bool causal = name.is_string() && name.get<std::string>().size() >= suffix.size() &&
                        name.get<std::string>().compare(name.get<std::string>().size() - suffix.size(), suffix.size(),
                                                        suffix) == 0;
    if (!causal)
      return unsupported("config.json: architectures: " + name.dump() +
                         " is not a causal language model (llmq runs *ForCausalLM models)");
  }
  return {};
}

}  // namespace

Status parse_hf_config(const std::string& json_text, ModelConfig* out) {
  json j;
  LLMQ_RETURN_IF_ERROR(parse_json_text("config.json", json_text, &j));
  if (!j.is_object()) return invalid_argument("config.json: not a JSON object");

  ModelConfig c;
  LLMQ_RETURN_IF_ERROR(read_string(j, "model_type", true, &c.model_type));
  static const std::set<std::string> kSupported = {"llama", "mistral", "qwen2", "mixtral"};
  if (kSupported.count(c.model_type) == 0)
    return unsupported("config.json: model_type '" + c.model_type +
                       "' is not supported (llama, mistral, qwen2, mixtral)");
  const std::string& type = c.model_type;
  const bool mixtral = type == "mixtral";

  // Every key first, so that an unknown one is named even when another field is also wrong.
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (it->is_null()) continue;  // null counts as absent
    const bool known = read_keys().count(key) != 0 || ignored_keys().count(key) != 0;
    if (!known) return not_understood(key);
    if (!key_belongs_to(key, type)) return not_understood(key, type);
  }

  LLMQ_RETURN_IF_ERROR(check_architectures(j));
  LLMQ_RETURN_IF_ERROR(read_int(j, "hidden_size", true, &c.dim));
  LLMQ_RETURN_IF_ERROR(read_int(j, "intermediate_size", true, &c.hidden_dim));
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", true, &c.n_layers));
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_attention_heads", true, &c.n_heads));
  LLMQ_RETURN_IF_ERROR(read_int(j, "vocab_size", true, &c.vocab_size));
  // transformers' defaults where a config leaves num_key_value_heads out differ by class (Llama:
  // num_attention_heads; Mistral, Mixtral: 8; Qwen2: 32); every class maps an explicit null to
  // num_attention_heads.
  c.n_kv_heads = type == "llama" || j.contains("num_key_value_heads") ? c.n_heads : type == "qwen2" ? 32 : 8;
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", false, &c.n_kv_heads));
  c.head_dim = 0;
  LLMQ_RETURN_IF_ERROR(read_int(j, "head_dim", false, &c.head_dim));
  if (c.head_dim == 0 && c.n_heads > 0) {
    if (c.dim % c.n_heads != 0)
      return invalid_argument("config.json: head_dim: missing, and hidden_size " + std::to_string(c.dim) +
                              " is not a multiple of num_attention_heads " + std::to_string(c.n_heads));
    c.head_dim = c.dim / c.n_heads;
  }
  // transformers' class defaults where a config leaves a field out.
  c.max_seq_len = type == "llama" ? 2048 : type == "qwen2" ? 32768 : 131072;
  LLMQ_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", false, &c.max_seq_len));
  // LLaMA 1 conversions (huggyllama/llama-7b) carry max_sequence_length, which no transformers
  // class reads: accepted where it repeats max_position_embeddings.
  int64_t max_sequence_length = c.max_seq_len;
  LLMQ_RETURN_IF_ERROR(read_int(j, "max_sequence_length", false, &max_sequence_length));
  if (max_sequence_length != c.max_seq_len)
    return unsupported("config.json: max_sequence_length (" + std::to_string(max_sequence_length) +
                       ") differs from max_position_embeddings (" + std::to_string(c.max_seq_len) +
                       "); transformers reads only the latter; refusing to pick one");
  // Qwen2's multimodal RoPE (use_mrope, DeepSeek-R1-Distill-Qwen and Qwen2.5-Math configs carry it
  // as false) and SmolLM's rope_interleaved (false there): only the values that mean plain RoPE.
  for (const char* flag : {"use_mrope", "rope_interleaved"}) {
    bool on = false;
    LLMQ_RETURN_IF_ERROR(read_bool(j, flag, &on));
    if (on) return not_understood(flag, type);
  }
  c.norm_eps = mixtral ? 1e-5 : 1e-6;
  LLMQ_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", false, &c.norm_eps));
  LLMQ_RETURN_IF_ERROR(read_rope(j, mixtral ? 1e6 : 10000.0, &c));
  c.tie_embeddings = false;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", &c.tie_embeddings));

  // Llama reads attention_bias (q/k/v and o biases); Qwen2 always biases q/k/v and Mistral and
  // Mixtral never do, whatever the key says: there it is accepted only with that value.
  c.attention_bias = type == "qwen2";
  LLMQ_RETURN_IF_ERROR(read_bool(j, "attention_bias", &c.attention_bias));
  if (type != "llama" && c.attention_bias != (type == "qwen2"))
    return unsupported("config.json: attention_bias: " + std::string(c.attention_bias ? "true" : "false") +
                       ", but transformers' " + type + (type == "qwen2" ? " always has" : " never has") +
                       " attention biases (it does not read the key); refusing rather than computing a different model");

  // Things llmq's transformer does not compute: refuse rather than run a different model.
  LLMQ_RETURN_IF_ERROR(require_bool(j, "mlp_bias", false, "MLP biases are not implemented"));
  std::string act = "silu";
  LLMQ_RETURN_IF_ERROR(read_string(j, "hidden_act", false, &act));
  if (act != "silu" && act != "swish")  // transformers' ACT2FN maps both to SiLU
    return unsupported("config.json: hidden_act: '" + act + "' is not supported (only silu)");
  // Encoder-decoder wiring, pruned heads: not a decoder-only Llama any more.
  LLMQ_RETURN_IF_ERROR(require_bool(j, "is_encoder_decoder", false, "llmq runs decoder-only models"));
  LLMQ_RETURN_IF_ERROR(require_bool(j, "add_cross_attention", false, "llmq runs decoder-only models"));
  LLMQ_RETURN_IF_ERROR(require_bool(j, "tie_encoder_decoder", false, "llmq runs decoder-only models"));
  if (const json* ph = field(j, "pruned_heads"); ph != nullptr && !(ph->is_object() && ph->empty()))
    return unsupported("config.json: pruned_heads: " + ph->dump() + " is not supported (only {})");
  // Llama's tensor-parallel pretraining split the projections into pretraining_tp slices: the same
  // products, so any positive count is the same model.
  int64_t tp = 1;
  LLMQ_RETURN_IF_ERROR(read_int(j, "pretraining_tp", false, &tp));
  if (tp < 1) return invalid_argument("config.json: pretraining_tp: must be positive, got " + std::to_string(tp));
  LLMQ_RETURN_IF_ERROR(read_sliding_window(j, &c));
  // quantization_config's contents are read with the tensors (quantized_checkpoint.cpp); here
  // only whether it is a kind llmq reads at all: AWQ, GPTQ, bitsandbytes, ... store weights that
  // a float reading of the checkpoint would misread.
  if (const json* qc = field(j, "quantization_config")) {
    std::string method;
    if (!qc->is_object()) return invalid_argument("config.json: quantization_config: expected an object, got " + qc->dump());
    LLMQ_RETURN_IF_ERROR(read_string(*qc, "quant_method", true, &method, "quantization_config."));
    if (method != "fp8" && method != "compressed-tensors")
      return unsupported("config.json: quantization_config.quant_method '" + method +
                         "' is not supported (llmq reads fp8 and compressed-tensors)");
  }

  if (mixtral) {
    LLMQ_RETURN_IF_ERROR(read_int(j, "num_local_experts", true, &c.n_experts));
    LLMQ_RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", true, &c.n_experts_per_token));
    if (c.n_experts <= 0) return invalid_argument("config.json: num_local_experts: must be positive");
  }
  LLMQ_RETURN_IF_ERROR(read_token_id(j, "bos_token_id", &c.bos_token));
  LLMQ_RETURN_IF_ERROR(read_token_id(j, "eos_token_id", &c.eos_token));
  // validate() names the ModelConfig field; the prefix names the file it came from.
  if (Status st = c.validate(); !st.ok()) return Status(st.code(), "config.json: " + st.message());
  *out = std::move(c);
  return {};
}

Status parse_hf_weight_block_size(const std::string& config_text, int64_t* rows, int64_t* cols) {
  *rows = *cols = kDefaultWeightBlock;
  json j;
  if (!parse_json_text("config.json", config_text, &j).ok() || !j.is_object()) return {};  // parse_hf_config refuses it
  const json* qc = field(j, "quantization_config");
  if (qc == nullptr || !qc->is_object()) return {};
  const json* wbs = field(*qc, "weight_block_size");
  if (wbs == nullptr) return {};
  if (!wbs->is_array() || wbs->size() != 2 || !(*wbs)[0].is_number_integer() || !(*wbs)[1].is_number_integer() ||
      (*wbs)[0].get<int64_t>() <= 0 || (*wbs)[1].get<int64_t>() <= 0)
    return invalid_argument("config.json: quantization_config.weight_block_size: expected [rows, cols], got " +
                            wbs->dump());
  *rows = (*wbs)[0].get<int64_t>();
  *cols = (*wbs)[1].get<int64_t>();
  return {};
}

// Written in transformers 4's spelling (top-level rope_theta / rope_scaling), which transformers 5,
// vLLM and llmq all read.
std::string hf_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  // The config's own family: a Qwen2 model written as "llama" with attention_bias would make
  // transformers expect an o_proj bias (Llama's attention_bias biases o_proj too) and start it
  // from random weights.
  std::string type = c.is_moe() ? "mixtral" : c.model_type;
  // Llama has no window in transformers: a windowed Llama-shaped model is a Mistral (or, with
  // q/k/v biases, a Qwen2), so that the checkpoint keeps its window.
  if (type == "llama" && c.sliding_window > 0) type = c.attention_bias ? "qwen2" : "mistral";
  const char* arch = type == "mixtral" ? "MixtralForCausalLM"
                     : type == "mistral" ? "MistralForCausalLM"
                     : type == "qwen2"   ? "Qwen2ForCausalLM"
                                         : "LlamaForCausalLM";
  j["architectures"] = {arch};
  j["model_type"] = type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.enabled)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  if (type == "llama") j["attention_bias"] = c.attention_bias;  // Qwen2 biases q/k/v by its type
  j["bos_token_id"] = c.bos_token;
  j["eos_token_id"] = c.eos_token;
  j["torch_dtype"] = "bfloat16";
  if (c.sliding_window > 0) {
    // ModelConfig keeps one window, not which layers use it: written for every layer (Qwen2:
    // max_window_layers 0), which is what llmq computes, up to the window, either way.
    if (type == "qwen2") {
      j["use_sliding_window"] = true;
      j["max_window_layers"] = 0;
    }
    j["sliding_window"] = c.sliding_window;
  } else if (type != "llama") {
    j["sliding_window"] = nullptr;  // explicit: an absent key means 4096 to transformers' Mistral
  }
  if (c.is_moe()) {
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_token;
  }
  return j.dump(2);
}

}  // namespace llmq
