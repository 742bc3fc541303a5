// The calibration statistics file (format llmq-calibration-v1): JSON written by `llmq calibrate`
// and read by quantize / eval / logits. Reading checks every field itself, so a hand-edited or
// corrupt file gets an error naming the linear and field rather than a nlohmann type error, and a
// number that does not fit (1e300 as a count, 1e39 as a float absmax) is refused instead of being
// cast into a wrong value.
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/calibration.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "llmq-calibration-v1";

// `where` is the field's path in the file ("linears['model.layers.0.self_attn.q_proj'].rows_seen").
Status bad_field(const std::string& source, const std::string& where, const std::string& what) {
  return invalid_argument("--stats: " + source + ": " + where + ": " + what);
}

const json* member(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

Status read_count(const std::string& source, const json& obj, const char* key, const std::string& where,
                  bool required, int64_t* out) {
  const json* v = member(obj, key);
  if (v == nullptr) return required ? bad_field(source, where + key, "missing") : Status();
  // Integers only: nlohmann's get<int64_t>() on 1e300 would be an out-of-range float cast.
  const bool fits = v->is_number_unsigned() ? v->get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()}
                                            : v->is_number_integer() && v->get<int64_t>() >= 0;
  if (!fits) return bad_field(source, where + key, "expected a non-negative integer, got " + v->dump());
  *out = v->get<int64_t>();
  return {};
}

// A finite, non-negative absmax that also fits float32 when `as_float` (the channel statistics
// are stored as float: 1e39 would become inf).
Status read_absmax(const std::string& source, const json& v, const std::string& where, bool as_float, double* out) {
  const double limit = as_float ? static_cast<double>(std::numeric_limits<float>::max())
                                : std::numeric_limits<double>::max();
  if (!v.is_number() || !(v.get<double>() >= 0.0) || !(v.get<double>() <= limit))
    return bad_field(source, where, std::string("expected a finite non-negative ") + (as_float ? "float32" : "number") +
                                        ", got " + v.dump());
  *out = v.get<double>();
  return {};
}

// `count_name` names what fixes the length in the error ("in_features", "layers x kv_heads").
Status read_channels(const std::string& source, const json& obj, const char* key, const std::string& where,
                     int64_t in_features, std::vector<float>* out, const char* count_name = "in_features") {
  const json* v = member(obj, key);
  if (v == nullptr) return bad_field(source, where + key, "missing");
  if (!v->is_array()) return bad_field(source, where + key, "expected an array, got " + v->dump());
  if (static_cast<int64_t>(v->size()) != in_features)
    return bad_field(source, where + key,
                     std::to_string(v->size()) + " values for " + count_name + " " + std::to_string(in_features));
  out->clear();
  out->reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    double x = 0;
    LLMQ_RETURN_IF_ERROR(read_absmax(source, (*v)[i], where + key + "[" + std::to_string(i) + "]", true, &x));
    out->push_back(static_cast<float>(x));
  }
  return {};
}

Status read_string(const std::string& source, const json& obj, const char* key, std::string* out) {
  const json* v = member(obj, key);
  if (v == nullptr) return {};
  if (!v->is_string()) return bad_field(source, key, "expected a string, got " + v->dump());
  *out = v->get<std::string>();
  return {};
}

Status parse_linear(const std::string& source, const std::string& name, const json& v, LinearStats* out) {
  const std::string where = "linears['" + name + "'].";
  if (!v.is_object()) return bad_field(source, "linears['" + name + "']", "expected an object");
  LinearStats l;
  LLMQ_RETURN_IF_ERROR(read_count(source, v, "in_features", where, true, &l.in_features));
  LLMQ_RETURN_IF_ERROR(read_count(source, v, "rows_seen", where, true, &l.rows_seen));
  for (const auto& [key, dst] : {std::pair<const char*, double*>{"input_absmax", &l.input_absmax},
                                 {"weight_absmax", &l.weight_absmax}}) {
    const json* x = member(v, key);
    if (x == nullptr) return bad_field(source, where + key, "missing");
    LLMQ_RETURN_IF_ERROR(read_absmax(source, *x, where + key, false, dst));
  }
  LLMQ_RETURN_IF_ERROR(read_channels(source, v, "input_channel_absmax", where, l.in_features, &l.input_channel_absmax));
  LLMQ_RETURN_IF_ERROR(
      read_channels(source, v, "weight_channel_absmax", where, l.in_features, &l.weight_channel_absmax));
  *out = std::move(l);
  return {};
}

// "kv_cache": {"layers": L, "kv_heads": H, "k_absmax": [L * H], "v_absmax": [L * H]} (optional:
// files from before it have none).
Status parse_kv_cache(const std::string& source, const json& v, KvCacheStats* out) {
  const std::string where = "kv_cache.";
  if (!v.is_object()) return bad_field(source, "kv_cache", "expected an object");
  KvCacheStats kv;
  LLMQ_RETURN_IF_ERROR(read_count(source, v, "layers", where, true, &kv.layers));
  LLMQ_RETURN_IF_ERROR(read_count(source, v, "kv_heads", where, true, &kv.kv_heads));
  // Bounded before the product: both are checked against the model later; here only against
  // overflow and against an allocation the file's own arrays could never fill.
  constexpr int64_t kMaxEntries = int64_t{1} << 24;
  if (kv.layers < 1 || kv.kv_heads < 1 || kv.layers > kMaxEntries || kv.kv_heads > kMaxEntries / kv.layers)
    return bad_field(source, "kv_cache", std::to_string(kv.layers) + " layers of " + std::to_string(kv.kv_heads) +
                                              " KV heads (each at least 1, at most 2^24 entries)");
  const int64_t n = kv.layers * kv.kv_heads;
  LLMQ_RETURN_IF_ERROR(read_channels(source, v, "k_absmax", where, n, &kv.k_absmax, "layers x kv_heads"));
  LLMQ_RETURN_IF_ERROR(read_channels(source, v, "v_absmax", where, n, &kv.v_absmax, "layers x kv_heads"));
  *out = std::move(kv);
  return {};
}

}  // namespace

const LinearStats* CalibrationStats::find(const std::string& module) const {
  const auto it = linears.find(module);
  return it == linears.end() ? nullptr : &it->second;
}

Status CalibrationStats::save(const std::string& path) const {
  json j;
  j["format"] = kFormat;
  j["model"] = model;
  j["data"] = data;
  j["tokens"] = tokens;
  json ls = json::object();
  for (const auto& [name, s] : linears) {
    ls[name] = {{"in_features", s.in_features},
                {"rows_seen", s.rows_seen},
                {"input_absmax", s.input_absmax},
                {"input_channel_absmax", s.input_channel_absmax},
                {"weight_absmax", s.weight_absmax},
                {"weight_channel_absmax", s.weight_channel_absmax}};
  }
  j["linears"] = ls;
  if (!kv_cache.empty())
    j["kv_cache"] = {{"layers", kv_cache.layers},
                     {"kv_heads", kv_cache.kv_heads},
                     {"k_absmax", kv_cache.k_absmax},
                     {"v_absmax", kv_cache.v_absmax}};
  // Durable and all-or-nothing (a crash leaves the old file or the new one), and under the output
  // rules (output_dir.hpp): never the model or data these statistics came from, nor a file inside
  // them; an existing file is replaced only when it is itself llmq statistics (calibrate has always
  // rewritten its output, which is recomputable, so no --force is asked for that).
  OutputRules rules;
  rules.kind = OutputKind::kStatsFile;
  rules.inputs = {model, data};
  rules.overwrite = true;
  return write_output_file(path, j.dump(1) + "\n", rules);
}

Status CalibrationStats::load(const std::string& path, CalibrationStats* out) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_input_file("--stats", path, kMaxSideFileBytes, &text));
  return parse(path, text, out);
}

Status CalibrationStats::parse(const std::string& source, const std::string& json_text, CalibrationStats* out) {
  json j;
  LLMQ_RETURN_IF_ERROR(parse_json_text("--stats: " + source, json_text, &j));
  const json* format = j.is_object() ? member(j, "format") : nullptr;
  if (format == nullptr || *format != kFormat)
    return invalid_argument("--stats: " + source + " is not an llmq calibration file (format " + kFormat + ")");
  CalibrationStats s;
  LLMQ_RETURN_IF_ERROR(read_string(source, j, "model", &s.model));
  LLMQ_RETURN_IF_ERROR(read_string(source, j, "data", &s.data));
  LLMQ_RETURN_IF_ERROR(read_count(source, j, "tokens", "", false, &s.tokens));
  const json* linears = member(j, "linears");
  if (linears == nullptr || !linears->is_object())
    return bad_field(source, "linears", "expected an object of per-linear statistics");
  for (const auto& [name, v] : linears->items()) LLMQ_RETURN_IF_ERROR(parse_linear(source, name, v, &s.linears[name]));
  if (const json* kv = member(j, "kv_cache"); kv != nullptr) LLMQ_RETURN_IF_ERROR(parse_kv_cache(source, *kv, &s.kv_cache));
  *out = std::move(s);
  return {};
}

}  // namespace llmq
