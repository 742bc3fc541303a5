// config.json's field readers, shared by the reader of the model's fields (hf_config.cpp) and of
// its RoPE (hf_config_rope.cpp). A null value counts as absent: configs write "head_dim": null,
// "rope_scaling": null, "sliding_window": null. Messages name the field ("config.json: <parent><key>: ...").
// Internal header.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "llmq/model.hpp"
#include "llmq/status.hpp"

namespace llmq::hf_config {

using json = nlohmann::json;

inline Status not_understood(const std::string& key, const std::string& model_type = "") {
  return unsupported("config.json: field '" + key + "' is not understood by llmq" +
                     (model_type.empty() ? "" : " for model_type '" + model_type + "'") +
                     "; refusing rather than computing a different model");
}


inline const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// `parent` names the enclosing object in messages ("rope_scaling." for its fields).
inline Status missing(const std::string& key) { return invalid_argument("config.json: " + key + ": missing"); }

inline Status read_int(const json& obj, const std::string& key, bool required, int64_t* out, const std::string& parent = "") {
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
inline Status read_double(const json& obj, const std::string& key, bool required, double* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_number() || !std::isfinite(v->get<double>()))
    return invalid_argument("config.json: " + parent + key + ": expected a finite number, got " + v->dump());
  *out = v->get<double>();
  return {};
}

inline Status read_bool(const json& obj, const std::string& key, bool* out) {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return {};
  if (!v->is_boolean()) return invalid_argument("config.json: " + key + ": expected true or false, got " + v->dump());
  *out = v->get<bool>();
  return {};
}

inline Status read_string(const json& obj, const std::string& key, bool required, std::string* out,
                   const std::string& parent = "") {
  const json* v = field(obj, key.c_str());
  if (v == nullptr) return required ? missing(parent + key) : Status();
  if (!v->is_string())
    return invalid_argument("config.json: " + parent + key + ": expected a string, got " + v->dump());
  *out = v->get<std::string>();
  return {};
}

// A boolean key llmq accepts only with the value that leaves the model a plain Llama.
inline Status require_bool(const json& obj, const std::string& key, bool allowed, const std::string& why) {
  bool v = allowed;
  LLMQ_RETURN_IF_ERROR(read_bool(obj, key, &v));
  if (v != allowed) return unsupported("config.json: " + key + ": " + (v ? "true" : "false") + " is not supported (" + why + ")");
  return {};
}

// bos_token_id / eos_token_id: an integer, or a list of them (Llama 3.1 lists three EOS tokens;
// the first is the one generation stops on by default).
inline Status read_token_id(const json& obj, const std::string& key, int32_t* out) {
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
inline Status check_partial_rotary(const json& obj, const std::string& parent) {
  double f = 1.0;
  LLMQ_RETURN_IF_ERROR(read_double(obj, "partial_rotary_factor", false, &f, parent));
  if (f != 1.0)
    return unsupported("config.json: " + parent + "partial_rotary_factor: " + json(f).dump() +
                       " is not supported (llmq rotates whole heads: only 1)");
  return {};
}

// theta and scaling (llama3, yarn) from rope_theta, rope_scaling and rope_parameters into `c`
// (hf_config_rope.cpp).
Status read_rope(const json& j, double default_theta, ModelConfig* c);

}  // namespace llmq::hf_config
