// The GPU runtime's calibration observer (calibration_observer.hpp): the module table, the weight
// statistics measured once, and the fold of what was observed into CalibrationStats.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_check.cuh"
#include "llmq/tensor_parallel.hpp"
#include "runtime/calibration_observer.hpp"
#include "runtime/channel_absmax.hpp"

namespace llmq::runtime {
namespace {

std::string module_name(const ModelConfig& c, int64_t layer, LinearRole role) {
  LinearId id;
  id.layer = layer;
  id.role = role;
  return id.hf_name(c);
}

// The linears whose inputs the observer reads must take BF16 rows and hold BF16 or F32 weights.
Status check_observable(const GpuLinear& l, const std::string& precision) {
  bool float_weights = !l.parts.empty();
  for (const LinearPart& p : l.parts) float_weights = float_weights && (p.w_dtype == DType::kBF16 || p.w_dtype == DType::kF32);
  if (l.act != ActQuant::kNone || !float_weights)
    return unsupported("calibration on the GPU needs BF16 or F32 linears (precision bf16 or f32) whose inputs are BF16; " +
                       l.name + " of this " + precision + " model is not");
  return {};
}

}  // namespace

Status CalibrationObserver::create(const GpuModel::Impl& model, CudaStream stream, std::unique_ptr<CalibrationObserver>* out) {
  const ModelConfig& c = model.config;
  // A tensor-parallel rank observes its slices under the rank's config (merge_tensor_parallel_calibration
  // puts them together); expert parallelism would need the experts' global numbers.
  if (model.tp.size > 1 && model.tp.expert_parallel)
    return unsupported("calibration on the GPU: expert parallelism (--ep) splits the experts; calibrate with --tp alone");
  std::unique_ptr<CalibrationObserver> o(new CalibrationObserver());
  const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim, hidden = c.hidden_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const GpuLayer& L = model.layers[static_cast<size_t>(l)];
    const bool moe = L.moe.active();
    for (const GpuLinear* g : {&L.qkv, &L.o}) LLMQ_RETURN_IF_ERROR(check_observable(*g, model.precision));
    for (const GpuLinear* g : moe ? std::vector<const GpuLinear*>{&L.moe.router, &L.moe.gate_up, &L.moe.down}
                                  : std::vector<const GpuLinear*>{&L.gate_up, &L.down})
      LLMQ_RETURN_IF_ERROR(check_observable(*g, model.precision));
    if (L.qkv.n != q_dim + 2 * kv_dim || L.qkv.k != c.dim || L.o.k != q_dim ||
        (!moe && (L.gate_up.n != 2 * hidden || L.gate_up.k != c.dim || L.down.k != hidden)))
      return Status(StatusCode::kInternal, "calibration on the GPU: layer " + std::to_string(l) +
                                               "'s linears do not have the shapes of its config");
    // The order of CalibrationInput: kAttention, kO, kFfn, kDown.
    LLMQ_RETURN_IF_ERROR(o->add_slot({{module_name(c, l, LinearRole::kQ), &L.qkv, 0, q_dim},
                                      {module_name(c, l, LinearRole::kK), &L.qkv, q_dim, q_dim + kv_dim},
                                      {module_name(c, l, LinearRole::kV), &L.qkv, q_dim + kv_dim, q_dim + 2 * kv_dim}},
                                     c.dim, stream));
    LLMQ_RETURN_IF_ERROR(o->add_slot({{module_name(c, l, LinearRole::kO), &L.o, 0, L.o.n}}, q_dim, stream));
    if (moe) {  // kFfn: the router; kDown: unused (the experts' inputs are folded per expert)
      LLMQ_RETURN_IF_ERROR(
          o->add_slot({{module_name(c, l, LinearRole::kRouter), &L.moe.router, 0, L.moe.router.n}}, c.dim, stream));
      LLMQ_RETURN_IF_ERROR(o->add_slot({}, hidden, stream));
      LLMQ_RETURN_IF_ERROR(o->add_moe_layer(l, L.moe, c, stream));
      continue;
    }
    LLMQ_RETURN_IF_ERROR(o->add_slot({{module_name(c, l, LinearRole::kGate), &L.gate_up, 0, hidden},
                                      {module_name(c, l, LinearRole::kUp), &L.gate_up, hidden, 2 * hidden}},
                                     c.dim, stream));
    LLMQ_RETURN_IF_ERROR(o->add_slot({{module_name(c, l, LinearRole::kDown), &L.down, 0, L.down.n}}, hidden, stream));
  }
  LLMQ_RETURN_IF_ERROR(check_observable(model.lm_head, model.precision));
  // A rank's lm_head holds its share of the vocabulary's rows.
  if (model.lm_head.n != linear_shard(model.full_config, ShardedLinear::kLmHead, model.tp).n() || model.lm_head.k != c.dim)
    return Status(StatusCode::kInternal, "calibration on the GPU: lm_head is not [vocab, dim]");
  LLMQ_RETURN_IF_ERROR(o->add_slot({{module_name(c, -1, LinearRole::kLmHead), &model.lm_head, 0, model.lm_head.n}}, c.dim, stream));

  int64_t floats = 0;
  for (const Slot& s : o->slots_) floats += s.k;
  const int64_t n_slots = static_cast<int64_t>(o->slots_.size());
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(floats * 4, "calibration channel absmax", &o->channel_max_));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n_slots * 8, "calibration non-finite counts", &o->nonfinite_));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->channel_max_.get(), 0, static_cast<size_t>(floats * 4), stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->nonfinite_.get(), 0, static_cast<size_t>(n_slots * 8), stream));
  o->layers_ = c.n_layers;
  o->kv_heads_ = c.n_kv_heads;
  o->head_dim_ = c.head_dim;
  const int64_t kv_floats = c.n_layers * 2 * kv_dim;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(kv_floats * 4, "calibration KV cache absmax", &o->kv_max_));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(8, "calibration KV cache non-finite count", &o->kv_nonfinite_));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->kv_max_.get(), 0, static_cast<size_t>(kv_floats * 4), stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->kv_nonfinite_.get(), 0, 8, stream));
  int64_t moe_floats = 0, moe_counts = 0;
  for (const auto& [layer, m] : o->moe_layers_) {
    moe_floats = std::max(moe_floats, m.down_offset + m.experts * m.hidden);
    moe_counts = std::max(moe_counts, m.rows_offset + m.experts);
  }
  if (moe_counts > 0) {
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(moe_floats * 4, "calibration expert absmax", &o->moe_max_));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(moe_counts * 8, "calibration expert rows", &o->moe_rows_));
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(8, "calibration expert non-finite count", &o->moe_nonfinite_));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->moe_max_.get(), 0, static_cast<size_t>(moe_floats * 4), stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->moe_rows_.get(), 0, static_cast<size_t>(moe_counts * 8), stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(o->moe_nonfinite_.get(), 0, 8, stream));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  *out = std::move(o);
  return {};
}

// Measures each reader's weight rows (every part of its linear that overlaps them) and appends
// the slot.
Status CalibrationObserver::add_slot(const std::vector<Reader>& readers, int64_t k, CudaStream stream) {
  Slot slot;
  slot.k = k;
  slot.offset = slots_.empty() ? 0 : slots_.back().offset + slots_.back().k;
  for (const Reader& r : readers) {
    WeightStats w;
    LLMQ_RETURN_IF_ERROR(measure_weight(r, k, stream, &w));
    weights_[r.name] = std::move(w);
    slot.modules.push_back(r.name);
  }
  slots_.push_back(std::move(slot));
  return {};
}

// An MoE layer's experts: each one's w1 (gate rows), w3 (up rows) and w2 (its dim rows of down),
// measured now; their running maxima are allocated once every layer is known (create).
Status CalibrationObserver::add_moe_layer(int64_t layer, const GpuMoe& moe, const ModelConfig& c, CudaStream stream) {
  MoeLayer m;
  m.experts = moe.experts;
  m.dim = c.dim;
  m.hidden = c.hidden_dim;
  if (moe.held() != moe.experts || moe.gate_up.n != moe.experts * 2 * m.hidden || moe.gate_up.k != m.dim ||
      moe.down.n != moe.experts * m.dim || moe.down.k != m.hidden)
    return Status(StatusCode::kInternal, "calibration on the GPU: layer " + std::to_string(layer) +
                                             "'s experts do not have the shapes of its config");
  int64_t floats = 0, counts = 0;
  for (const auto& [l, other] : moe_layers_) {
    floats = std::max(floats, other.down_offset + other.experts * other.hidden);
    counts = std::max(counts, other.rows_offset + other.experts);
  }
  m.in_offset = floats;
  m.down_offset = floats + m.experts * m.dim;
  m.rows_offset = counts;
  for (int64_t e = 0; e < m.experts; ++e) {
    LinearId id;
    id.layer = layer;
    id.expert = e;
    const int64_t g0 = e * 2 * m.hidden;
    const std::pair<LinearRole, Reader> readers[] = {
        {LinearRole::kGate, {"", &moe.gate_up, g0, g0 + m.hidden}},
        {LinearRole::kUp, {"", &moe.gate_up, g0 + m.hidden, g0 + 2 * m.hidden}},
        {LinearRole::kDown, {"", &moe.down, e * m.dim, (e + 1) * m.dim}}};
    for (auto [role, r] : readers) {
      id.role = role;
      r.name = id.hf_name(c);
      WeightStats w;
      LLMQ_RETURN_IF_ERROR(measure_weight(r, role == LinearRole::kDown ? m.hidden : m.dim, stream, &w));
      weights_[r.name] = std::move(w);
      (role == LinearRole::kGate ? m.w1 : role == LinearRole::kUp ? m.w3 : m.w2).push_back(r.name);
    }
  }
  moe_layers_[layer] = std::move(m);
  return {};
}

Status CalibrationObserver::measure_weight(const Reader& r, int64_t k, CudaStream stream, WeightStats* out) {
  DeviceAllocation max_d, bad_d;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(k * 4, "calibration weight absmax", &max_d));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(8, "calibration weight non-finite count", &bad_d));
  if (r.linear->k != k || r.row_begin < 0 || r.row_end > r.linear->n || r.row_begin >= r.row_end)
    return Status(StatusCode::kInternal, "calibration on the GPU: " + r.name + " is not rows of " + r.linear->name);
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(max_d.get(), 0, static_cast<size_t>(k * 4), stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bad_d.get(), 0, 8, stream));
  for (const LinearPart& p : r.linear->parts) {
    const int64_t begin = std::max(r.row_begin, p.n_offset), end = std::min(r.row_end, p.n_offset + p.n);
    if (begin >= end) continue;
    const int64_t elem = p.w_dtype == DType::kF32 ? 4 : 2;
    ChannelAbsmaxArgs a;
    a.x = p.w.as<char>() + (begin - p.n_offset) * k * elem;  // part rows [n, k], row-major
    a.dtype = p.w_dtype;
    a.rows = end - begin;
    a.k = k;
    a.ld = k;
    a.channel_max = max_d.as<float>();
    a.nonfinite = bad_d.as<unsigned long long>();
    LLMQ_RETURN_IF_ERROR(channel_absmax(a, stream));
  }
  WeightStats w;
  w.channel_absmax.resize(static_cast<size_t>(k));
  unsigned long long bad = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w.channel_absmax.data(), max_d.get(), static_cast<size_t>(k * 4),
                                            cudaMemcpyDeviceToHost, stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&bad, bad_d.get(), 8, cudaMemcpyDeviceToHost, stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (bad != 0)
    return invalid_argument("calibration on the GPU: the weight of " + r.name + " holds " + std::to_string(bad) +
                            " NaN/Inf values");
  for (float m : w.channel_absmax) w.absmax = std::max(w.absmax, static_cast<double>(m));
  *out = std::move(w);
  return {};
}

Status CalibrationObserver::fold(int64_t slot, const uint16_t* x, int64_t rows, CudaStream stream) {
  if (slot < 0 || slot >= static_cast<int64_t>(slots_.size()) || (x == nullptr && rows > 0))
    return Status(StatusCode::kInternal, "calibration observer: no input for slot " + std::to_string(slot));
  Slot& s = slots_[static_cast<size_t>(slot)];
  ChannelAbsmaxArgs a;
  a.x = x;
  a.dtype = DType::kBF16;
  a.rows = rows;
  a.k = s.k;
  a.ld = s.k;  // every activation buffer the forward pass hands over is [rows, k], packed
  a.channel_max = channel_max_.as<float>() + s.offset;
  a.nonfinite = nonfinite_.as<unsigned long long>() + slot;
  LLMQ_RETURN_IF_ERROR(channel_absmax(a, stream));
  s.rows_seen += rows;
  return {};
}

Status CalibrationObserver::observe(int64_t layer, CalibrationInput which, const uint16_t* x, int64_t rows, CudaStream stream) {
  return fold(layer * 4 + static_cast<int64_t>(which), x, rows, stream);
}

Status CalibrationObserver::observe_lm_head(const uint16_t* x, int64_t rows, CudaStream stream) {
  return fold(static_cast<int64_t>(slots_.size()) - 1, x, rows, stream);
}

Status CalibrationObserver::observe_kv(int64_t layer, const uint16_t* k_cache, const uint16_t* v_cache,
                                       const attention::KvPages& pages, const int32_t* slot, const int32_t* position,
                                       int64_t tokens, CudaStream stream) {
  if (layer < 0 || layer >= layers_ || k_cache == nullptr || v_cache == nullptr)
    return Status(StatusCode::kInternal, "calibration observer: no BF16 K/V cache for layer " + std::to_string(layer));
  const int64_t kv_dim = kv_heads_ * head_dim_;
  for (int which = 0; which < 2; ++which) {
    ChannelAbsmaxArgs a;
    a.x = which == 0 ? k_cache : v_cache;
    a.dtype = DType::kBF16;
    a.rows = tokens;
    a.k = kv_dim;
    a.ld = kv_dim;  // a cache row: [kv heads, head_dim]
    a.channel_max = kv_max_.as<float>() + (layer * 2 + which) * kv_dim;
    a.nonfinite = kv_nonfinite_.as<unsigned long long>();
    a.position = position;
    a.slot = slot;
    a.pages = pages;
    LLMQ_RETURN_IF_ERROR(channel_absmax(a, stream));
  }
  kv_seen_ = kv_seen_ || tokens > 0;
  return {};
}

// One fold of an MoE layer's routed rows into its per-expert maxima: the experts' inputs (x the
// token rows, gathered through row_tokens) or their GLU output (act, in routed order).
Status CalibrationObserver::fold_experts(int64_t layer, bool down, const uint16_t* x, const int32_t* row_tokens,
                                         const int32_t* offsets, int64_t rows, CudaStream stream) {
  const auto it = moe_layers_.find(layer);
  if (it == moe_layers_.end() || x == nullptr || offsets == nullptr || (!down && row_tokens == nullptr))
    return Status(StatusCode::kInternal, "calibration observer: layer " + std::to_string(layer) + " is not an observed MoE layer");
  const MoeLayer& m = it->second;
  ChannelAbsmaxArgs a;
  a.x = x;
  a.dtype = DType::kBF16;
  a.rows = rows;
  a.k = a.ld = down ? m.hidden : m.dim;
  a.channel_max = moe_max_.as<float>() + (down ? m.down_offset : m.in_offset);
  a.nonfinite = moe_nonfinite_.as<unsigned long long>();
  a.row_index = down ? nullptr : row_tokens;
  a.segment_offsets = offsets;
  a.segments = m.experts;
  LLMQ_RETURN_IF_ERROR(channel_absmax(a, stream));
  if (down) return {};
  return segment_rows_add(offsets, m.experts, moe_rows_.as<int64_t>() + m.rows_offset, stream);  // once per step
}

Status CalibrationObserver::observe_experts_in(int64_t layer, const uint16_t* x, const int32_t* row_tokens,
                                               const int32_t* offsets, int64_t rows, CudaStream stream) {
  return fold_experts(layer, false, x, row_tokens, offsets, rows, stream);
}

Status CalibrationObserver::observe_experts_down(int64_t layer, const uint16_t* act, const int32_t* offsets, int64_t rows,
                                                 CudaStream stream) {
  return fold_experts(layer, true, act, nullptr, offsets, rows, stream);
}

// One module's input maxima (k channels at `maxima`) and rows folded into *stats; its weight
// statistics on first sighting, as CalibrationBackend.
void CalibrationObserver::fold_module(const std::string& name, const float* maxima, int64_t k, int64_t rows,
                                      CalibrationStats* stats) const {
  LinearStats& l = stats->linears[name];
  if (l.in_features == 0) {
    const WeightStats& w = weights_.at(name);
    l.in_features = k;
    l.input_channel_absmax.assign(static_cast<size_t>(k), 0.0f);
    l.weight_channel_absmax = w.channel_absmax;
    l.weight_absmax = w.absmax;
  }
  for (int64_t j = 0; j < k; ++j) {
    float& m = l.input_channel_absmax[static_cast<size_t>(j)];
    m = std::max(m, maxima[j]);
  }
  for (float m : l.input_channel_absmax) l.input_absmax = std::max(l.input_absmax, static_cast<double>(m));
  l.rows_seen += rows;
}

Status CalibrationObserver::finish(CudaStream stream, CalibrationStats* stats) {
  const int64_t floats = slots_.empty() ? 0 : slots_.back().offset + slots_.back().k;
  std::vector<float> maxima(static_cast<size_t>(floats));
  std::vector<unsigned long long> bad(slots_.size());
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(maxima.data(), channel_max_.get(), maxima.size() * 4, cudaMemcpyDeviceToHost, stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bad.data(), nonfinite_.get(), bad.size() * 8, cudaMemcpyDeviceToHost, stream));
  const int64_t kv_dim = kv_heads_ * head_dim_;
  std::vector<float> kv_max(static_cast<size_t>(layers_ * 2 * kv_dim));
  unsigned long long kv_bad = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(kv_max.data(), kv_max_.get(), kv_max.size() * 4, cudaMemcpyDeviceToHost, stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&kv_bad, kv_nonfinite_.get(), 8, cudaMemcpyDeviceToHost, stream));
  std::vector<float> moe_max(static_cast<size_t>(moe_max_.bytes() / 4));
  std::vector<int64_t> moe_rows(static_cast<size_t>(moe_rows_.bytes() / 8));
  unsigned long long moe_bad = 0;
  if (!moe_layers_.empty()) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(moe_max.data(), moe_max_.get(), moe_max.size() * 4, cudaMemcpyDeviceToHost, stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(moe_rows.data(), moe_rows_.get(), moe_rows.size() * 8, cudaMemcpyDeviceToHost, stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&moe_bad, moe_nonfinite_.get(), 8, cudaMemcpyDeviceToHost, stream));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (moe_bad != 0)
    return invalid_argument("calibration on the GPU: the experts' inputs held " + std::to_string(moe_bad) +
                            " NaN/Inf values over the calibration data; no statistics were written");
  for (const auto& [layer, m] : moe_layers_)
    for (const auto* names : {&m.w1, &m.w3, &m.w2})
      for (size_t e = 0; e < names->size(); ++e) {
        const auto it = stats->linears.find((*names)[e]);
        const int64_t k = names == &m.w2 ? m.hidden : m.dim;
        if (it != stats->linears.end() && it->second.in_features != k)
          return invalid_argument("calibration on the GPU: the statistics already hold " + (*names)[e] + " with " +
                                  std::to_string(it->second.in_features) + " input channels, this model's has " +
                                  std::to_string(k));
      }
  if (kv_bad != 0)
    return invalid_argument("calibration on the GPU: the KV cache held " + std::to_string(kv_bad) +
                            " NaN/Inf values over the calibration data; no statistics were written");
  // Per KV head: the maximum over its head_dim channels.
  std::vector<float> k_heads(static_cast<size_t>(layers_ * kv_heads_), 0.0f), v_heads(k_heads.size(), 0.0f);
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t e = 0; e < kv_dim; ++e) {
      const size_t head = static_cast<size_t>(l * kv_heads_ + e / head_dim_);
      k_heads[head] = std::max(k_heads[head], kv_max[static_cast<size_t>((l * 2) * kv_dim + e)]);
      v_heads[head] = std::max(v_heads[head], kv_max[static_cast<size_t>((l * 2 + 1) * kv_dim + e)]);
    }
  if (kv_seen_ && !stats->kv_cache.empty() &&
      (stats->kv_cache.layers != layers_ || stats->kv_cache.kv_heads != kv_heads_))
    return invalid_argument("calibration on the GPU: the statistics already hold the KV cache of " +
                            std::to_string(stats->kv_cache.layers) + " layers of " + std::to_string(stats->kv_cache.kv_heads) +
                            " KV heads, this model has " + std::to_string(layers_) + " of " + std::to_string(kv_heads_));
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (bad[i] != 0)
      return invalid_argument("calibration on the GPU: the input of " + slots_[i].modules.front() + " held " +
                              std::to_string(bad[i]) + " NaN/Inf values over the calibration data (the model overflows "
                              "in BF16?); no statistics were written");
    for (const std::string& name : slots_[i].modules) {
      const auto it = stats->linears.find(name);
      if (it != stats->linears.end() && it->second.in_features != slots_[i].k)
        return invalid_argument("calibration on the GPU: the statistics already hold " + name + " with " +
                                std::to_string(it->second.in_features) + " input channels, this model's has " +
                                std::to_string(slots_[i].k));
    }
  }
  for (const Slot& s : slots_)
    for (const std::string& name : s.modules) fold_module(name, maxima.data() + s.offset, s.k, s.rows_seen, stats);
  // Experts: those some token chose (the CPU never sees the others either).
  for (const auto& [layer, m] : moe_layers_)
    for (int64_t e = 0; e < m.experts; ++e) {
      const int64_t rows = moe_rows[static_cast<size_t>(m.rows_offset + e)];
      if (rows == 0) continue;
      const float* in = moe_max.data() + m.in_offset + e * m.dim;
      fold_module(m.w1[static_cast<size_t>(e)], in, m.dim, rows, stats);
      fold_module(m.w3[static_cast<size_t>(e)], in, m.dim, rows, stats);
      fold_module(m.w2[static_cast<size_t>(e)], moe_max.data() + m.down_offset + e * m.hidden, m.hidden, rows, stats);
    }
  if (kv_seen_) return stats->kv_cache.merge(k_heads, v_heads, layers_, kv_heads_);  // shapes checked above
  return {};
}

}  // namespace llmq::runtime
