// merge_tensor_parallel_calibration (tensor_parallel.hpp): the whole model's statistics from what
// each rank of a split measured. Host only, so the CPU tests check it against a split of the
// unsplit statistics; how each linear is split is shard_plan.cpp's (column- or row-parallel).
#include <algorithm>

#include "llmq/quantized_model.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {
namespace {

// Whether a linear's input columns are split over the ranks (row-parallel: o_proj, down_proj and
// an expert's w2); every other linear reads the whole input on every rank.
bool input_split(const LinearId& id) { return id.role == LinearRole::kO || id.role == LinearRole::kDown; }

// Folds rank `rank`'s per-channel maxima `a` into the whole's: its slice of `width` channels when the
// input is split (the row-parallel weight's columns are the same slice), else a max over ranks: the
// whole input seen by each, and per-input-channel weight maxima over each rank's share of the rows
// (column-parallel, lm_head by vocabulary) or of all of them (replicated). False: `a` is not `width` long.
bool concat_or_max(const std::vector<float>& a, std::vector<float>* whole, int64_t rank, int64_t width, bool concat) {
  if (static_cast<int64_t>(a.size()) != width) return false;
  if (concat) {
    std::copy(a.begin(), a.end(), whole->begin() + rank * width);
  } else {
    for (int64_t j = 0; j < width; ++j)
      (*whole)[static_cast<size_t>(j)] = std::max((*whole)[static_cast<size_t>(j)], a[static_cast<size_t>(j)]);
  }
  return true;
}

}  // namespace

Status merge_tensor_parallel_calibration(const ModelConfig& full, const std::vector<CalibrationStats>& ranks,
                                         CalibrationStats* out) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  if (n < 1) return invalid_argument("tensor-parallel calibration: no ranks");
  LLMQ_RETURN_IF_ERROR(check_tensor_parallel(full, static_cast<int>(n), /*block_scales=*/false));
  const std::string of_n = " of " + std::to_string(n);
  CalibrationStats whole;
  whole.model = ranks[0].model;
  whole.data = ranks[0].data;
  whole.tokens = ranks[0].tokens;
  for (const LinearId& id : linear_ids(full)) {
    const std::string name = id.hf_name(full);
    const int64_t k = linear_shape(full, id)[1];
    const bool split = n > 1 && input_split(id);
    const int64_t width = split ? k / n : k;
    int64_t seen_by = 0;
    for (const CalibrationStats& r : ranks) seen_by += r.find(name) != nullptr ? 1 : 0;
    if (seen_by == 0) continue;  // an expert no token chose: no rank saw it, as on one GPU
    if (seen_by != n)
      return invalid_argument("tensor-parallel calibration: " + std::to_string(seen_by) + of_n + " ranks saw " + name);
    LinearStats w;
    w.in_features = k;
    w.rows_seen = ranks[0].find(name)->rows_seen;
    w.input_channel_absmax.assign(static_cast<size_t>(k), 0.0f);
    w.weight_channel_absmax.assign(static_cast<size_t>(k), 0.0f);
    for (int64_t r = 0; r < n; ++r) {
      const LinearStats& s = *ranks[static_cast<size_t>(r)].find(name);
      const std::string at = "tensor-parallel calibration: rank " + std::to_string(r) + of_n + "'s " + name;
      if (s.in_features != width)
        return invalid_argument(at + " has " + std::to_string(s.in_features) + " input channels, not " + std::to_string(width));
      if (s.rows_seen != w.rows_seen)
        return invalid_argument(at + " saw " + std::to_string(s.rows_seen) + " rows, rank 0 " + std::to_string(w.rows_seen));
      if (!concat_or_max(s.input_channel_absmax, &w.input_channel_absmax, r, width, split) ||
          !concat_or_max(s.weight_channel_absmax, &w.weight_channel_absmax, r, width, split))
        return invalid_argument(at + " does not hold " + std::to_string(width) + " channel maxima");
      w.weight_absmax = std::max(w.weight_absmax, s.weight_absmax);
    }
    for (float m : w.input_channel_absmax) w.input_absmax = std::max(w.input_absmax, static_cast<double>(m));
    whole.linears[name] = std::move(w);
  }
  for (int64_t r = 0; r < n; ++r)
    for (const auto& [name, s] : ranks[static_cast<size_t>(r)].linears)
      if (whole.linears.count(name) == 0)
        return invalid_argument("tensor-parallel calibration: rank " + std::to_string(r) + of_n + " measured " + name +
                                ", which is not a linear layer of the model");
  // KV heads: rank r holds heads [r KV/N, (r+1) KV/N) of every layer.
  const ModelConfig local = tensor_parallel_config(full, static_cast<int>(n));
  int64_t kv_seen_by = 0;
  for (const CalibrationStats& r : ranks) kv_seen_by += r.kv_cache.empty() ? 0 : 1;
  if (kv_seen_by != 0 && kv_seen_by != n)
    return invalid_argument("tensor-parallel calibration: " + std::to_string(kv_seen_by) + of_n + " ranks measured the KV cache");
  if (kv_seen_by == n) {
    const int64_t layers = full.n_layers, heads = local.n_kv_heads;
    std::vector<float> k(static_cast<size_t>(layers * full.n_kv_heads)), v(k.size());
    for (int64_t r = 0; r < n; ++r) {
      const KvCacheStats& kv = ranks[static_cast<size_t>(r)].kv_cache;
      const size_t count = static_cast<size_t>(layers * heads);
      if (kv.layers != layers || kv.kv_heads != heads || kv.k_absmax.size() != count || kv.v_absmax.size() != count)
        return invalid_argument("tensor-parallel calibration: rank " + std::to_string(r) + of_n + "'s KV cache is " +
                                std::to_string(kv.layers) + " layers of " + std::to_string(kv.kv_heads) + " heads, not " +
                                std::to_string(layers) + " of " + std::to_string(heads));
      for (int64_t l = 0; l < layers; ++l)
        for (int64_t h = 0; h < heads; ++h) {
          const size_t to = static_cast<size_t>(l * full.n_kv_heads + r * heads + h), from = static_cast<size_t>(l * heads + h);
          k[to] = kv.k_absmax[from];
          v[to] = kv.v_absmax[from];
        }
    }
    LLMQ_RETURN_IF_ERROR(whole.kv_cache.merge(k, v, layers, full.n_kv_heads));
  }
  *out = std::move(whole);
  return {};
}

}  // namespace llmq
