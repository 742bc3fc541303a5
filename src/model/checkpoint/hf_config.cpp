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
#include "model/checkpoint/hf_config_fields.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

using namespace hf_config;  // json and the field readers

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
      "is_llama_config",
      // Remote-code class names: read only under trust_remote_code; transformers' own class, the
      // reference llmq matches, ignores them. Accepted for Phi-3 alone (key_belongs_to), whose
      // configs name the modeling files its native class was made from; elsewhere they mean a
      // model transformers' class of that name may not compute.
      "auto_map"};
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
      "tie_encoder_decoder", "quantization_config", "max_sequence_length", "use_mrope", "rope_interleaved",
      // Qwen3-MoE
      "num_experts", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
      // Phi-3
      "resid_pdrop", "embd_pdrop", "original_max_position_embeddings",
      // gpt-oss (the original release's keys, which no transformers class reads: checked to agree)
      "swiglu_limit", "experts_per_token", "initial_context_length"};
  return keys;
}

// Keys read only for some model types; elsewhere transformers' config class has no such field.
bool key_belongs_to(const std::string& key, const std::string& t) {
  static const std::set<std::string> moe = {"num_local_experts", "num_experts_per_tok"};
  static const std::set<std::string> qwen3_moe = {"moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                                                  "mlp_only_layers"};
  static const std::set<std::string> phi3 = {"resid_pdrop", "embd_pdrop", "original_max_position_embeddings"};
  static const std::set<std::string> gpt_oss = {"swiglu_limit", "experts_per_token", "initial_context_length"};
  if (moe.count(key) != 0) return t == "mixtral" || t == "qwen3_moe" || t == "gpt_oss";
  if (qwen3_moe.count(key) != 0) return t == "qwen3_moe";
  if (key == "num_experts") return t == "qwen3_moe" || t == "gpt_oss";
  if (phi3.count(key) != 0) return t == "phi3";
  if (gpt_oss.count(key) != 0) return t == "gpt_oss";
  // Qwen3-MoE's published configs carry max_window_layers, which its class does not read
  // (read_sliding_window accepts it only where it cannot mean anything).
  if (key == "max_window_layers") return t == "qwen2" || t == "qwen3" || t == "qwen3_moe";
  if (key == "use_sliding_window") return t != "phi3" && t != "gpt_oss";
  if (key == "auto_map") return t == "phi3";
  return true;
}

// ---- Sliding windows (transformers 5 semantics): ModelConfig::sliding_window and, per layer,
// ---- window_layers.

Status read_sliding_window(const json& j, ModelConfig* c) {
  const std::string& type = c->model_type;
  // Absent (not null) means the config class's default: MistralConfig's is 4096 (transformers 4
  // and 5), GptOssConfig's 128; the Qwen classes' 4096 applies only under use_sliding_window;
  // Mixtral's and Phi-3's none. Only an explicit null says "no window" for mistral and gpt_oss.
  const bool absent = j.find("sliding_window") == j.end();
  int64_t window = !absent ? 0 : type == "mistral" ? 4096 : type == "gpt_oss" ? 128 : type.rfind("qwen", 0) == 0 ? 4096 : 0;
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
  const json* lt = field(j, "layer_types");
  std::vector<bool> sliding;
  if (lt != nullptr) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c->n_layers)
      return invalid_argument("config.json: layer_types: expected a list of num_hidden_layers (" +
                              std::to_string(c->n_layers) + ") strings");
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (t == "full_attention" || t == "sliding_attention") {
        sliding.push_back(t == "sliding_attention");
        continue;
      }
      return unsupported("config.json: layer_types[" + std::to_string(i) + "]: " + t.dump() +
                         " is not supported (llmq implements \"full_attention\" and \"sliding_attention\")");
    }
  }
  const int64_t n_sliding = static_cast<int64_t>(std::count(sliding.begin(), sliding.end(), true));

  if (type == "llama") {
    // LlamaConfig has no window: accepted only where the keys cannot mean one.
    if (field(j, "sliding_window") != nullptr) return not_understood("sliding_window", type);
    if (use_window) return not_understood("use_sliding_window", type);
    if (n_sliding > 0) return not_understood("layer_types", type);
    return {};
  }
  if (type == "mistral" || type == "mixtral" || type == "phi3" || type == "qwen3_moe") {
    // Every layer attends through the window (Qwen3-MoE: when use_sliding_window); these classes
    // read no layer_types (and Mistral, Mixtral, Phi-3 no use_sliding_window), so those are
    // accepted only where they say the same.
    if (type == "qwen3_moe" && !use_window) window = 0;
    if (type == "qwen3_moe" && window > 0 && field(j, "max_window_layers") != nullptr) {
      // transformers 5 windows every layer and ignores the key; a value below the layer count
      // says some layers are full, which another reader would follow: refused.
      int64_t mwl = 0;
      LLMQ_RETURN_IF_ERROR(read_int(j, "max_window_layers", true, &mwl));
      if (mwl != 0)
        return unsupported("config.json: max_window_layers: " + std::to_string(mwl) + " with use_sliding_window, but "
                           "transformers' qwen3_moe windows every layer (it does not read the key); refusing to pick one");
    }
    if (type != "qwen3_moe" && has_flag && use_window != (window > 0))
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
  if (type == "gpt_oss") {
    // Layer types as given, else alternating from layer 0 (GptOssConfig.__post_init__); no
    // use_sliding_window switch.
    if (has_flag) return not_understood("use_sliding_window", type);
    if (lt == nullptr)
      for (int64_t i = 0; i < c->n_layers; ++i) sliding.push_back((i + 1) % 2 != 0);
    if (window == 0 && std::count(sliding.begin(), sliding.end(), true) > 0)
      return invalid_argument("config.json: layer_types names sliding_attention layers but sliding_window is null");
    c->sliding_window = window;
    c->window_layers = std::move(sliding);
    return {};
  }
  // qwen2, qwen3: the window exists only with use_sliding_window; it applies to the layers
  // layer_types names, or else to layers max_window_layers and up (__post_init__).
  int64_t max_window_layers = 28;
  LLMQ_RETURN_IF_ERROR(read_int(j, "max_window_layers", false, &max_window_layers));
  if (max_window_layers < 0)
    return invalid_argument("config.json: max_window_layers: must be >= 0, got " + std::to_string(max_window_layers));
  if (!use_window || window == 0) {
    // transformers sets no window then, and a "sliding_attention" layer makes its mask code raise.
    if (n_sliding > 0)
      return unsupported("config.json: layer_types names sliding_attention layers, but there is no window (" +
                         std::string(use_window ? "sliding_window is null" : "use_sliding_window is false") +
                         "): transformers refuses such a config");
    return {};
  }
  if (lt == nullptr)
    for (int64_t i = 0; i < c->n_layers; ++i) sliding.push_back(i >= max_window_layers);
  c->sliding_window = window;
  c->window_layers = std::move(sliding);
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
  static const std::set<std::string> kSupported = {"llama", "mistral", "qwen2", "mixtral", "qwen3",
                                                   "qwen3_moe", "phi3", "gpt_oss"};
  if (kSupported.count(c.model_type) == 0)
    return unsupported("config.json: model_type '" + c.model_type +
                       "' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, phi3, gpt_oss)");
  const std::string& type = c.model_type;
  const bool mixtral = type == "mixtral";
  const bool gpt_oss = type == "gpt_oss";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";

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
  // Qwen3: 32; Qwen3-MoE: 4; gpt-oss: 8; Phi-3: num_attention_heads.
  c.n_kv_heads = type == "llama" || type == "phi3" || j.contains("num_key_value_heads") ? c.n_heads
                 : type == "qwen2" || type == "qwen3"                                  ? 32
                 : type == "qwen3_moe"                                                 ? 4
                                                                                       : 8;
  LLMQ_RETURN_IF_ERROR(read_int(j, "num_key_value_heads", false, &c.n_kv_heads));
  // Qwen3's and gpt-oss's classes default head_dim to 128 and 64, not hidden_size / heads.
  c.head_dim = type == "qwen3" ? 128 : gpt_oss ? 64 : 0;
  if (const auto hd = j.find("head_dim"); hd != j.end()) {
    if (hd->is_null()) {
      // An explicit null: GptOssConfig derives hidden_size / heads; Qwen3's attention takes the
      // None and fails; the other classes derive.
      if (type == "qwen3")
        return unsupported("config.json: head_dim: null, which transformers' qwen3 cannot run (it reads the None)");
      c.head_dim = 0;
    } else {
      LLMQ_RETURN_IF_ERROR(read_int(j, "head_dim", true, &c.head_dim));
      if (c.head_dim <= 0)
        return invalid_argument("config.json: head_dim: must be positive, got " + std::to_string(c.head_dim));
    }
  }
  if (c.head_dim == 0 && c.n_heads > 0) {
    if (c.dim % c.n_heads != 0)
      return invalid_argument("config.json: head_dim: missing, and hidden_size " + std::to_string(c.dim) +
                              " is not a multiple of num_attention_heads " + std::to_string(c.n_heads));
    c.head_dim = c.dim / c.n_heads;
  }
  // transformers' class defaults where a config leaves a field out.
  c.max_seq_len = type == "llama" ? 2048 : type == "phi3" ? 4096 : qwen3 || type == "qwen2" ? 32768 : 131072;
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
  c.norm_eps = mixtral || gpt_oss || type == "phi3" ? 1e-5 : 1e-6;
  LLMQ_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", false, &c.norm_eps));
  LLMQ_RETURN_IF_ERROR(read_rope(j, mixtral ? 1e6 : gpt_oss ? 150000.0 : 10000.0, &c));
  if (gpt_oss && field(j, "rope_scaling") == nullptr && field(j, "rope_parameters") == nullptr) {
    // GptOssConfig.__post_init__'s RoPE when the config names none.
    c.yarn = YarnScaling{};
    c.yarn.enabled = true;
    c.yarn.factor = 32.0;
    c.yarn.truncate = false;
    c.yarn.original_max_position = 4096;
    c.yarn.attention_factor = 0.1 * std::log(32.0) + 1.0;
  }
  if (type == "phi3") {
    // Phi3Config turns rope types "su" and "yarn" into "longrope", whose frequencies switch with
    // the sequence length: not implemented, and its yarn is not the yarn read above.
    if (c.yarn.enabled || c.rope_scaling.enabled)
      return unsupported("config.json: rope_scaling: Phi-3's scaled RoPE (longrope, which Phi3Config makes of 'su' and "
                         "'yarn') is not implemented; refusing rather than computing a different model");
    // original_max_position_embeddings only feeds longrope.
  }
  c.tie_embeddings = false;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", &c.tie_embeddings));

  // Llama reads attention_bias (q/k/v and o biases); Qwen2 always biases q/k/v and Mistral and
  // Mixtral never do, whatever the key says: there it is accepted only with that value.
  // Llama, Qwen3 and gpt-oss read attention_bias (q/k/v and o biases; gpt-oss's default true);
  // Qwen2 always biases q/k/v, and Mistral, Mixtral and Phi-3 never do, whatever the key says:
  // there it is accepted only with that value.
  c.attention_bias = type == "qwen2" || gpt_oss;
  LLMQ_RETURN_IF_ERROR(read_bool(j, "attention_bias", &c.attention_bias));
  const bool reads_bias = type == "llama" || qwen3 || gpt_oss;
  if (!reads_bias && c.attention_bias != (type == "qwen2"))
    return unsupported("config.json: attention_bias: " + std::string(c.attention_bias ? "true" : "false") +
                       ", but transformers' " + type + (type == "qwen2" ? " always has" : " never has") +
                       " attention biases (it does not read the key); refusing rather than computing a different model");
  c.qk_norm = qwen3;
  if (gpt_oss) {
    c.attention_sinks = true;
    c.activation = GluActivation::kClampedSwiglu;
    c.moe_routing = MoeRouting::kTopKSoftmax;
    c.moe_bias = true;
    // GptOssExperts fixes limit = 7 and alpha = 1.702; the original release's swiglu_limit must
    // say the same, or the checkpoint was meant for another arithmetic.
    double limit = 7.0;
    LLMQ_RETURN_IF_ERROR(read_double(j, "swiglu_limit", false, &limit));
    if (limit != 7.0)
      return unsupported("config.json: swiglu_limit: " + json(limit).dump() +
                         ", but transformers' gpt_oss clamps at 7 (it does not read the key); refusing to pick one");
    int64_t initial_context = 0;  // the original release's name for the YaRN original length; not read
    LLMQ_RETURN_IF_ERROR(read_int(j, "initial_context_length", false, &initial_context));
  }

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
  // read_sliding_window sizes a list by num_hidden_layers: its range first (validate() repeats it).
  if (c.n_layers < 1 || c.n_layers > 4096)
    return invalid_argument("config.json: num_hidden_layers: " + std::to_string(c.n_layers) + " is outside [1, 4096]");
  LLMQ_RETURN_IF_ERROR(read_sliding_window(j, &c));
  // quantization_config's contents are read with the tensors (quantized_checkpoint.cpp); here
  // only whether it is a kind llmq reads at all: AWQ, GPTQ, bitsandbytes, ... store weights that
  // a float reading of the checkpoint would misread.
  if (const json* qc = field(j, "quantization_config")) {
    std::string method;
    if (!qc->is_object()) return invalid_argument("config.json: quantization_config: expected an object, got " + qc->dump());
    LLMQ_RETURN_IF_ERROR(read_string(*qc, "quant_method", true, &method, "quantization_config."));
    const bool mxfp4 = method == "mxfp4" && gpt_oss;
    if (method != "fp8" && method != "compressed-tensors" && !mxfp4)
      return unsupported("config.json: quantization_config.quant_method '" + method +
                         "' is not supported (llmq reads fp8 and compressed-tensors, and mxfp4 for gpt_oss)");
    if (mxfp4) {
      // The published gpt-oss checkpoints: MXFP4 experts, every other tensor BF16 (the modules
      // listed in modules_to_not_convert). Which tensors are MXFP4 is checked by name and dtype.
      for (auto it = qc->begin(); it != qc->end(); ++it)
        if (it.key() != "quant_method" && it.key() != "modules_to_not_convert" && !it->is_null())
          return not_understood("quantization_config." + it.key(), type);
      c.experts_mxfp4 = true;
      // 32 values per MXFP4 block along each expert weight's input: whole blocks only.
      if (c.dim % 32 != 0 || c.hidden_dim % 32 != 0)
        return invalid_argument("config.json: hidden_size (" + std::to_string(c.dim) + ") and intermediate_size (" +
                                std::to_string(c.hidden_dim) + ") must be multiples of 32 for MXFP4 experts");
    }
  }

  if (mixtral || gpt_oss || type == "qwen3_moe") {
    // num_experts is num_local_experts' other name (attribute_map); 4.x Qwen3-MoE configs write it.
    const bool local = field(j, "num_local_experts") != nullptr, other = field(j, "num_experts") != nullptr;
    if (local && other) {
      int64_t a = 0, b = 0;
      LLMQ_RETURN_IF_ERROR(read_int(j, "num_local_experts", true, &a));
      LLMQ_RETURN_IF_ERROR(read_int(j, "num_experts", true, &b));
      if (a != b) return invalid_argument("config.json: num_local_experts and num_experts disagree; refusing to pick one");
    }
    c.n_experts = mixtral ? 8 : gpt_oss ? 128 : 128;
    c.n_experts_per_token = mixtral ? 2 : gpt_oss ? 4 : 8;
    LLMQ_RETURN_IF_ERROR(read_int(j, other ? "num_experts" : "num_local_experts", mixtral, &c.n_experts));
    LLMQ_RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", mixtral, &c.n_experts_per_token));
    if (c.n_experts <= 0) return invalid_argument("config.json: num_local_experts: must be positive");
    int64_t experts_per_token = c.n_experts_per_token;
    LLMQ_RETURN_IF_ERROR(read_int(j, "experts_per_token", false, &experts_per_token));
    if (experts_per_token != c.n_experts_per_token)
      return unsupported("config.json: experts_per_token (" + std::to_string(experts_per_token) +
                         ") differs from num_experts_per_tok (" + std::to_string(c.n_experts_per_token) +
                         "); transformers reads only the latter; refusing to pick one");
  }
  if (type == "qwen3_moe") {
    // Every layer sparse (decoder_sparse_step 1, no mlp_only_layers), as every published
    // Qwen3-MoE: a mix of dense and sparse layers is refused, naming the field.
    int64_t step = 1;
    LLMQ_RETURN_IF_ERROR(read_int(j, "decoder_sparse_step", false, &step));
    if (step != 1)
      return unsupported("config.json: decoder_sparse_step: " + std::to_string(step) +
                         " (dense layers between the MoE layers) is not supported; only 1");
    if (const json* mlp_only = field(j, "mlp_only_layers"); mlp_only != nullptr && !(mlp_only->is_array() && mlp_only->empty()))
      return unsupported("config.json: mlp_only_layers: " + mlp_only->dump() + " (dense layers in an MoE model) is not "
                         "supported; only []");
    c.hidden_dim = 768;
    LLMQ_RETURN_IF_ERROR(read_int(j, "moe_intermediate_size", false, &c.hidden_dim));
    c.moe_renormalize = false;
    LLMQ_RETURN_IF_ERROR(read_bool(j, "norm_topk_prob", &c.moe_renormalize));
  }
  // Absent or null: the model has none (ModelConfig's 1 / 2 are llama2.c's, which no Hugging Face
  // config implies: in a byte-level vocabulary such as GPT-2's or o200k's, token 1 is '"').
  c.bos_token = -1;
  c.eos_token = -1;
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

}  // namespace llmq
