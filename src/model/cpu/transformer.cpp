// The CPU float32 forward pass (see transformer.hpp) and FloatLinearBackend.
// The arithmetic follows llama2.c's run.c operation for operation where the order of float
// operations matters (RMSNorm, RoPE angles, attention scores, softmax, the weighted sum of V,
// SiLU), so llama2.c checkpoints reproduce run.c's greedy output token for token. The compile
// flags forbid FMA contraction (-ffp-contract=off), which keeps that true on every compiler.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "llmq/transformer.hpp"

#include "llmq/format.hpp"
#include "llmq/nonfinite.hpp"

namespace llmq {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::string describe(const LinearId& id) {
  if (id.role == LinearRole::kLmHead) return "lm_head";
  std::string s = "layer " + std::to_string(id.layer) + " " + linear_role_name(id.role);
  if (id.expert >= 0) s += " expert " + std::to_string(id.expert);
  return s;
}

// R rows x O outputs of y = x W^T. Each output is its own float accumulator that runs over k in
// ascending order, so the result is bit-identical to a plain dot product (and independent of how
// many rows are batched); the block only gives the CPU independent add chains and reuses loads.
//
// Left out of UndefinedBehaviorSanitizer (AddressSanitizer still checks every load and store): the
// block is float multiply-adds over ranges FloatLinearBackend::forward has checked, and UBSan's
// per-element checks keep its accumulators out of registers: the float forward ran 4x slower and
// took 90% of the sanitizer build's export tests (measured: a 64x512x512 product 8.5 s with
// them, 2.1 s without; 0.2 s in the release build).
#if defined(__GNUC__) || defined(__clang__)
#define LLMQ_NO_UBSAN_HOT_LOOP __attribute__((no_sanitize("undefined")))
#else
#define LLMQ_NO_UBSAN_HOT_LOOP
#endif
template <int R, int O>
LLMQ_NO_UBSAN_HOT_LOOP void matmul_block(const float* x, const float* w, int64_t in, float* y, int64_t out) {
  float acc[R][O] = {};
  const float* xr[R];
  const float* wo[O];
  for (int r = 0; r < R; ++r) xr[r] = x + r * in;
  for (int o = 0; o < O; ++o) wo[o] = w + o * in;
  for (int64_t k = 0; k < in; ++k)
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < O; ++o) acc[r][o] += wo[o][k] * xr[r][k];
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < O; ++o) y[r * out + o] = acc[r][o];
}

template <int R>
void matmul_rows(const float* x, const float* w, int64_t in, int64_t out, float* y) {
  constexpr int kOutBlock = R == 1 ? 8 : 4;  // one row (decode): more chains per row instead
  int64_t o = 0;
  for (; o + kOutBlock <= out; o += kOutBlock) matmul_block<R, kOutBlock>(x, w + o * in, in, y + o, out);
  for (; o < out; ++o) matmul_block<R, 1>(x, w + o * in, in, y + o, out);
}

// run.c's rmsnorm: o = weight * (x / sqrt(mean(x^2) + eps)), the sum of squares in float.
void rmsnorm(float* o, const float* x, const float* weight, int64_t size, float eps) {
  float ss = 0.0f;
  for (int64_t j = 0; j < size; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(size);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t j = 0; j < size; ++j) o[j] = weight[j] * (ss * x[j]);
}

// run.c's softmax: subtract the max (first occurrence), exp, sum in order, divide. With an
// attention sink (gpt-oss) the sink's logit joins the max and the denominator, as transformers
// concatenates it to the scores, and takes no value.
void softmax(float* x, int64_t size, const float* sink = nullptr) {
  float max_val = sink != nullptr ? *sink : x[0];
  for (int64_t i = sink != nullptr ? 0 : 1; i < size; ++i)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int64_t i = 0; i < size; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  if (sink != nullptr) sum += std::exp(*sink - max_val);
  for (int64_t i = 0; i < size; ++i) x[i] /= sum;
}

// run.c's SwiGLU: silu(g) * u with silu(g) = g * (1 / (1 + exp(-g))), in that rounding order.
void swiglu(float* gate, const float* up, int64_t size) {
  for (int64_t i = 0; i < size; ++i) {
    float val = gate[i];
    val *= (1.0f / (1.0f + std::exp(-val)));
    val *= up[i];
    gate[i] = val;
  }
}

// gpt-oss's clamped SwiGLU, as GptOssExperts._apply_gate: g = min(gate, limit), u = clamp(up,
// -limit, limit), (u + 1) * (g * sigmoid(g * alpha)), with sigmoid(x) = 1 / (1 + exp(-x)).
void clamped_swiglu(float* gate, const float* up, int64_t size, float limit, float alpha) {
  for (int64_t i = 0; i < size; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::min(std::max(up[i], -limit), limit);
    const float glu = g * (1.0f / (1.0f + std::exp(-(g * alpha))));
    gate[i] = (u + 1.0f) * glu;
  }
}

void glu(const ModelConfig& c, float* gate, const float* up, int64_t size) {
  if (c.activation == GluActivation::kClampedSwiglu)
    clamped_swiglu(gate, up, size, static_cast<float>(c.glu_limit), static_cast<float>(c.glu_alpha));
  else
    swiglu(gate, up, size);
}

// YaRN's inverse frequencies (transformers' _compute_yarn_parameters): the ramp between pairs that
// keep their frequency (extrapolation) and pairs divided by factor (interpolation), computed in
// double where transformers computes in Python floats and in float where it uses float32 tensors.
void yarn_inv_freq(const ModelConfig& c, std::vector<float>* inv) {
  const YarnScaling& y = c.yarn;
  const double dim = static_cast<double>(c.head_dim);
  const double base = c.rope_theta;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(static_cast<double>(y.original_max_position) / (rotations * 2.0 * kPi))) / (2.0 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const float lo = static_cast<float>(low), width = static_cast<float>(high - low);
  const float factor = static_cast<float>(y.factor);
  const float theta = static_cast<float>(base);
  for (size_t j = 0; j < inv->size(); ++j) {
    const float pos_freq = std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(c.head_dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::min(std::max((static_cast<float>(j) - lo) / width, 0.0f), 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    (*inv)[j] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

}  // namespace

float rope_attention_factor(const ModelConfig& c) {
  return c.yarn.enabled ? static_cast<float>(c.yarn.attention_factor) : 1.0f;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float theta = static_cast<float>(c.rope_theta);
  for (int64_t j = 0; j < half; ++j)
    inv[j] = 1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(c.head_dim));
  if (c.yarn.enabled) yarn_inv_freq(c, &inv);
  if (c.rope_scaling.enabled) {
    const RopeScaling& s = c.rope_scaling;
    const float factor = static_cast<float>(s.factor);
    const float low_ff = static_cast<float>(s.low_freq_factor);
    const float high_ff = static_cast<float>(s.high_freq_factor);
    const float old_ctx = static_cast<float>(s.original_max_position);
    const float low_freq_wavelen = old_ctx / low_ff;
    const float high_freq_wavelen = old_ctx / high_ff;
    const float two_pi = static_cast<float>(2.0 * kPi);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / factor;  // long wavelengths: interpolate fully
      } else if (!(wavelen < high_freq_wavelen)) {
        const float smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff);
        f = (1.0f - smooth) * f / factor + smooth * f;
      }  // short wavelengths: unchanged
    }
  }
  return inv;
}

namespace {

// Rotate one head vector in place. cos_sin holds (cos, sin) of pos * inv_freq[j] for each pair j.
void rope_head(float* v, const float* cos_sin, int64_t head_dim, RopeStyle style) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float fcr = cos_sin[2 * j];
    const float fci = cos_sin[2 * j + 1];
    // kInterleaved: llama2.c pairs (2j, 2j+1); kHalf: HF's rotate_half pairs (j, j + half).
    const int64_t i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
    const int64_t i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
    const float v0 = v[i0];
    const float v1 = v[i1];
    v[i0] = v0 * fcr - v1 * fci;
    v[i1] = v0 * fci + v1 * fcr;
  }
}

bool has_shape(const Tensor& t, std::initializer_list<int64_t> shape) {
  return t.dtype() == DType::kF32 && t.nbytes() > 0 &&
         std::equal(t.shape().begin(), t.shape().end(), shape.begin(), shape.end());
}

// Runs on every forward call, so the names are only built when something is wrong.
template <typename NameFn>
Status check_tensor(const Tensor& t, std::initializer_list<int64_t> shape, NameFn name) {
  if (has_shape(t, shape)) return {};
  std::string want = "f32[";
  for (auto it = shape.begin(); it != shape.end(); ++it) want += (it == shape.begin() ? "" : ", ") + std::to_string(*it);
  return invalid_argument("weights: " + name() + ": expected " + want + "], got " + t.view().describe());
}

Status check_linear(const Linear& l, int64_t out, int64_t in, const ModelConfig& c) {
  LLMQ_RETURN_IF_ERROR(check_tensor(l.weight, {out, in}, [&] { return l.id.hf_name(c) + ".weight"; }));
  if (l.bias.nbytes() > 0) LLMQ_RETURN_IF_ERROR(check_tensor(l.bias, {out}, [&] { return l.id.hf_name(c) + ".bias"; }));
  return {};
}

// Shapes of every tensor against the config, so a bad loader fails with a name, not a crash.
Status check_weights(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  LLMQ_RETURN_IF_ERROR(c.validate());
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  LLMQ_RETURN_IF_ERROR(check_tensor(w.token_embedding, {c.vocab_size, c.dim}, [] { return std::string("model.embed_tokens"); }));
  if (static_cast<int64_t>(w.layers.size()) != c.n_layers)
    return invalid_argument("weights: " + std::to_string(w.layers.size()) + " layers, config says " +
                            std::to_string(c.n_layers));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    auto prefix = [l] { return "model.layers." + std::to_string(l) + "."; };
    LLMQ_RETURN_IF_ERROR(check_tensor(L.attn_norm, {c.dim}, [&] { return prefix() + "input_layernorm"; }));
    LLMQ_RETURN_IF_ERROR(check_tensor(L.ffn_norm, {c.dim}, [&] { return prefix() + "post_attention_layernorm"; }));
    LLMQ_RETURN_IF_ERROR(check_linear(L.q, q_dim, c.dim, c));
    LLMQ_RETURN_IF_ERROR(check_linear(L.k, kv_dim, c.dim, c));
    LLMQ_RETURN_IF_ERROR(check_linear(L.v, kv_dim, c.dim, c));
    LLMQ_RETURN_IF_ERROR(check_linear(L.o, c.dim, q_dim, c));
    if (c.qk_norm) {
      LLMQ_RETURN_IF_ERROR(check_tensor(L.q_norm, {c.head_dim}, [&] { return prefix() + "self_attn.q_norm"; }));
      LLMQ_RETURN_IF_ERROR(check_tensor(L.k_norm, {c.head_dim}, [&] { return prefix() + "self_attn.k_norm"; }));
    }
    if (c.attention_sinks)
      LLMQ_RETURN_IF_ERROR(check_tensor(L.sinks, {c.n_heads}, [&] { return prefix() + "self_attn.sinks"; }));
    if (c.is_moe()) {
      LLMQ_RETURN_IF_ERROR(check_linear(L.router, c.n_experts, c.dim, c));
      if (static_cast<int64_t>(L.experts.size()) != c.n_experts)
        return invalid_argument("weights: " + prefix() + "block_sparse_moe: " + std::to_string(L.experts.size()) +
                                " experts, config says " + std::to_string(c.n_experts));
      for (const Expert& e : L.experts) {
        LLMQ_RETURN_IF_ERROR(check_linear(e.gate, c.hidden_dim, c.dim, c));
        LLMQ_RETURN_IF_ERROR(check_linear(e.up, c.hidden_dim, c.dim, c));
        LLMQ_RETURN_IF_ERROR(check_linear(e.down, c.dim, c.hidden_dim, c));
      }
    } else {
      LLMQ_RETURN_IF_ERROR(check_linear(L.mlp.gate, c.hidden_dim, c.dim, c));
      LLMQ_RETURN_IF_ERROR(check_linear(L.mlp.up, c.hidden_dim, c.dim, c));
      LLMQ_RETURN_IF_ERROR(check_linear(L.mlp.down, c.dim, c.hidden_dim, c));
    }
  }
  LLMQ_RETURN_IF_ERROR(check_tensor(w.final_norm, {c.dim}, [] { return std::string("model.norm"); }));
  return check_linear(w.lm_head, c.vocab_size, c.dim, c);
}

}  // namespace

Status FloatLinearBackend::forward(const Linear& linear, const float* x, int64_t rows, float* y) {
  const Tensor& w = linear.weight;
  if (w.dtype() != DType::kF32 || w.shape().size() != 2)
    return invalid_argument(describe(linear.id) + ": weight must be f32 [out, in], got " + w.view().describe());
  const int64_t out = w.shape()[0];
  const int64_t in = w.shape()[1];
  // nbytes, not numel: a default Tensor has an empty shape, whose numel() is 1.
  const bool has_bias = linear.bias.nbytes() > 0;
  if (has_bias && (linear.bias.dtype() != DType::kF32 || linear.bias.numel() != out))
    return invalid_argument(describe(linear.id) + ": bias must be f32 [" + std::to_string(out) + "], got " +
                            linear.bias.view().describe());
  if (rows < 0) return invalid_argument(describe(linear.id) + ": rows = " + std::to_string(rows));
  if (rows > 0 && (x == nullptr || y == nullptr)) return invalid_argument(describe(linear.id) + ": null x or y");
  const float* wd = w.data_as<float>();
  constexpr int kRowBlock = 4;
  int64_t r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock) matmul_rows<kRowBlock>(x + r * in, wd, in, out, y + r * out);
  for (; r < rows; ++r) matmul_rows<1>(x + r * in, wd, in, out, y + r * out);
  if (has_bias) {
    const float* b = linear.bias.data_as<float>();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t o = 0; o < out; ++o) y[i * out + o] += b[o];
  }
  return {};
}

Transformer::Transformer(const ModelWeights& weights, LinearBackend* backend)
    : weights_(weights), backend_(backend != nullptr ? backend : &float_backend_) {}

void Transformer::reset() {
  key_cache_.clear();
  value_cache_.clear();
  cached_positions_ = 0;
}

Status Transformer::set_kv_cache_e4m3(std::vector<float> k_scales, std::vector<float> v_scales) {
  const ModelConfig& c = weights_.config;
  const size_t want = static_cast<size_t>(c.n_layers * c.n_kv_heads);
  if (!k_scales.empty() || !v_scales.empty()) {
    if (k_scales.size() != want || v_scales.size() != want)
      return invalid_argument("set_kv_cache_e4m3: want " + std::to_string(want) + " scales each (layers x kv heads), got " +
                              std::to_string(k_scales.size()) + " and " + std::to_string(v_scales.size()));
    for (size_t i = 0; i < want; ++i)
      if (!(k_scales[i] > 0.0f) || !(v_scales[i] > 0.0f) || !std::isfinite(k_scales[i]) || !std::isfinite(v_scales[i]))
        return invalid_argument("set_kv_cache_e4m3: scale " + std::to_string(i) + " is not finite and positive");
  }
  kv_k_scales_ = std::move(k_scales);
  kv_v_scales_ = std::move(v_scales);
  return {};
}

void Transformer::kv_absmax(std::vector<float>* k, std::vector<float>* v) const {
  const ModelConfig& c = weights_.config;
  const int64_t hd = c.head_dim, kv_dim = c.n_kv_heads * hd;
  k->assign(static_cast<size_t>(c.n_layers * c.n_kv_heads), 0.0f);
  v->assign(k->size(), 0.0f);
  if (key_cache_.empty()) return;
  const int64_t seq_cap = static_cast<int64_t>(key_cache_.size()) / (c.n_layers * kv_dim);
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t t = 0; t < cached_positions_; ++t)
      for (int64_t e = 0; e < kv_dim; ++e) {
        const size_t at = static_cast<size_t>((l * seq_cap + t) * kv_dim + e);
        const size_t head = static_cast<size_t>(l * c.n_kv_heads + e / hd);
        (*k)[head] = std::max((*k)[head], std::fabs(key_cache_[at]));
        (*v)[head] = std::max((*v)[head], std::fabs(value_cache_[at]));
      }
}

namespace {

// The KV cache grows on demand (up to max_seq_len) instead of being allocated for max_seq_len up
// front: a Llama 3 config says 131072 positions, which would be gigabytes for a short prompt.
// Layout [layer, capacity, kv_dim]; growing re-lays each layer's block.
void grow_cache(std::vector<float>* cache, int64_t n_layers, int64_t kv_dim, int64_t old_cap, int64_t new_cap) {
  std::vector<float> grown(static_cast<size_t>(n_layers * new_cap * kv_dim), 0.0f);
  for (int64_t l = 0; l < n_layers; ++l)
    std::copy(cache->begin() + l * old_cap * kv_dim, cache->begin() + (l + 1) * old_cap * kv_dim,
              grown.begin() + l * new_cap * kv_dim);
  cache->swap(grown);
}

}  // namespace

int64_t Transformer::reserve_cache(int64_t end_pos) {
  const ModelConfig& c = weights_.config;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t cap = key_cache_.empty() ? 0 : static_cast<int64_t>(key_cache_.size()) / (c.n_layers * kv_dim);
  if (cap < end_pos) {
    const int64_t new_cap = std::min(c.max_seq_len, std::max({end_pos, 2 * cap, int64_t{64}}));
    grow_cache(&key_cache_, c.n_layers, kv_dim, cap, new_cap);
    grow_cache(&value_cache_, c.n_layers, kv_dim, cap, new_cap);
  }
  return static_cast<int64_t>(key_cache_.size()) / (c.n_layers * kv_dim);
}

// Positions [first, first + n) of the cache to or from [n_layers, n, kv_dim] buffers.
Status Transformer::write_kv(int64_t first, int64_t n, const float* k, const float* v) {
  const ModelConfig& c = weights_.config;
  if (n < 0 || first < 0 || first > c.max_seq_len - n)
    return invalid_argument("write_kv: " + std::to_string(n) + " positions from " + std::to_string(first) +
                            " are outside [0, max_seq_len = " + std::to_string(c.max_seq_len) + ")");
  if (n == 0) return {};
  if (k == nullptr || v == nullptr) return invalid_argument("write_kv: k or v is null");
  const int64_t kv_dim = c.n_kv_heads * c.head_dim, cap = reserve_cache(first + n);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::copy(k + l * n * kv_dim, k + (l + 1) * n * kv_dim, key_cache_.begin() + (l * cap + first) * kv_dim);
    std::copy(v + l * n * kv_dim, v + (l + 1) * n * kv_dim, value_cache_.begin() + (l * cap + first) * kv_dim);
  }
  cached_positions_ = std::max(cached_positions_, first + n);
  return {};
}

Status Transformer::read_kv(int64_t first, int64_t n, float* k, float* v) const {
  const ModelConfig& c = weights_.config;
  if (n < 0 || first < 0 || first > cached_positions_ - n)
    return invalid_argument("read_kv: " + std::to_string(n) + " positions from " + std::to_string(first) +
                            " are not all written (positions 0 .. " + std::to_string(cached_positions_ - 1) + " are)");
  if (n == 0) return {};
  if (k == nullptr || v == nullptr) return invalid_argument("read_kv: k or v is null");
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t cap = static_cast<int64_t>(key_cache_.size()) / (c.n_layers * kv_dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::copy(key_cache_.begin() + (l * cap + first) * kv_dim, key_cache_.begin() + (l * cap + first + n) * kv_dim, k + l * n * kv_dim);
    std::copy(value_cache_.begin() + (l * cap + first) * kv_dim, value_cache_.begin() + (l * cap + first + n) * kv_dim, v + l * n * kv_dim);
  }
  return {};
}

Status Transformer::forward(const int32_t* tokens, int64_t n, int64_t start_pos, float* logits) {
  LLMQ_RETURN_IF_ERROR(check_weights(weights_));
  const ModelConfig& c = weights_.config;
  if (n < 0) return invalid_argument("forward: n = " + std::to_string(n));
  if (n == 0) return {};
  if (tokens == nullptr || logits == nullptr) return invalid_argument("forward: tokens or logits is null");
  if (start_pos < 0 || start_pos > c.max_seq_len - n)  // not start_pos + n, which can overflow
    return invalid_argument("forward: " + std::to_string(n) + " positions from " + std::to_string(start_pos) +
                            " are outside [0, max_seq_len = " + std::to_string(c.max_seq_len) + ")");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return invalid_argument("forward: tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                              " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");

  const int64_t dim = c.dim;
  const int64_t hd = c.head_dim;
  const int64_t q_dim = c.n_heads * hd;
  const int64_t kv_dim = c.n_kv_heads * hd;
  const int64_t kv_mul = c.n_heads / c.n_kv_heads;
  const int64_t hidden = c.hidden_dim;
  const float eps = static_cast<float>(c.norm_eps);
  const int64_t end_pos = start_pos + n;

  const int64_t seq_cap = reserve_cache(end_pos);
  cached_positions_ = std::max(cached_positions_, end_pos);

  // (cos, sin) per position of this call and pair: angle = pos * inv_freq in float, as run.c;
  // YaRN multiplies both by its attention factor (1 otherwise, which leaves them bit-identical).
  const std::vector<float> inv_freq = rope_inv_freq(c);
  const float rope_factor = rope_attention_factor(c);
  const int64_t half = hd / 2;
  std::vector<float> cos_sin(static_cast<size_t>(n * hd));  // (n, half, 2)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < half; ++j) {
      const float val = static_cast<float>(start_pos + i) * inv_freq[j];
      cos_sin[i * hd + 2 * j] = rope_factor == 1.0f ? std::cos(val) : std::cos(val) * rope_factor;
      cos_sin[i * hd + 2 * j + 1] = rope_factor == 1.0f ? std::sin(val) : std::sin(val) * rope_factor;
    }

  auto buf = [](int64_t a, int64_t b) { return std::vector<float>(static_cast<size_t>(a * b)); };
  std::vector<float> x = buf(n, dim), xb = buf(n, dim), q = buf(n, q_dim), k = buf(n, kv_dim), v = buf(n, kv_dim);
  std::vector<float> att_out = buf(n, q_dim), proj = buf(n, dim), hb = buf(n, hidden), hb2 = buf(n, hidden);
  std::vector<float> att(static_cast<size_t>(end_pos));

  const float* emb = weights_.token_embedding.data_as<float>();
  for (int64_t i = 0; i < n; ++i) std::copy(emb + tokens[i] * dim, emb + (tokens[i] + 1) * dim, x.begin() + i * dim);

  const float score_div = std::sqrt(static_cast<float>(hd));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
    for (int64_t i = 0; i < n; ++i) rmsnorm(&xb[i * dim], &x[i * dim], L.attn_norm.data_as<float>(), dim, eps);
    LLMQ_RETURN_IF_ERROR(backend_->forward(L.q, xb.data(), n, q.data()));
    LLMQ_RETURN_IF_ERROR(backend_->forward(L.k, xb.data(), n, k.data()));
    LLMQ_RETURN_IF_ERROR(backend_->forward(L.v, xb.data(), n, v.data()));

    if (c.qk_norm) {  // Qwen3: RMSNorm over each head's head_dim values, before RoPE
      for (int64_t i = 0; i < n * c.n_heads; ++i) rmsnorm(&q[i * hd], &q[i * hd], L.q_norm.data_as<float>(), hd, eps);
      for (int64_t i = 0; i < n * c.n_kv_heads; ++i) rmsnorm(&k[i * hd], &k[i * hd], L.k_norm.data_as<float>(), hd, eps);
    }

    float* key_layer = key_cache_.data() + l * seq_cap * kv_dim;  // (seq_cap, kv_dim)
    float* value_layer = value_cache_.data() + l * seq_cap * kv_dim;
    for (int64_t i = 0; i < n; ++i) {
      const float* cs = &cos_sin[i * hd];
      for (int64_t h = 0; h < c.n_heads; ++h) rope_head(&q[i * q_dim + h * hd], cs, hd, c.rope_style);
      for (int64_t h = 0; h < c.n_kv_heads; ++h) rope_head(&k[i * kv_dim + h * hd], cs, hd, c.rope_style);
      const int64_t pos = start_pos + i;
      std::copy(&k[i * kv_dim], &k[(i + 1) * kv_dim], key_layer + pos * kv_dim);
      std::copy(&v[i * kv_dim], &v[(i + 1) * kv_dim], value_layer + pos * kv_dim);
      if (!kv_k_scales_.empty()) {
        for (int64_t e = 0; e < kv_dim; ++e) {
          const size_t head = static_cast<size_t>(l * c.n_kv_heads + e / hd);
          const float ks = kv_k_scales_[head], vs = kv_v_scales_[head];
          float& kc = key_layer[pos * kv_dim + e];
          float& vc = value_layer[pos * kv_dim + e];
          kc = fp8_to_float(float_to_fp8(kc * (1.0f / ks), DType::kE4M3), DType::kE4M3) * ks;
          vc = fp8_to_float(float_to_fp8(vc * (1.0f / vs), DType::kE4M3), DType::kE4M3) * vs;
        }
      }
    }

    if (attention_observer_) attention_observer_(l, q.data(), n, key_layer, value_layer, end_pos);

    // Sliding window: the query at pos sees keys (pos - window, pos]. The cache keeps every
    // position; the window only decides which are read.
    const int64_t window = c.layer_window(l);
    const float* sinks = c.attention_sinks ? L.sinks.data_as<float>() : nullptr;
    if (attention_options_.variant != AttentionVariant::kFloat) {
      AttentionProblem ap;
      ap.q_len = n;
      ap.kv_len = end_pos;
      ap.heads = c.n_heads;
      ap.kv_heads = c.n_kv_heads;
      ap.head_dim = hd;
      ap.causal = true;
      ap.window = window;
      ap.sinks = sinks;
      LLMQ_RETURN_IF_ERROR(quant_attention_reference(ap, attention_options_, q.data(), key_layer, value_layer, att_out.data()));
    }
    // Causal attention, token by token and head by head, in run.c's order of operations.
    for (int64_t i = 0; i < n && attention_options_.variant == AttentionVariant::kFloat; ++i) {
      const int64_t pos = start_pos + i;
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const float* qh = &q[i * q_dim + h * hd];
        const int64_t kv_off = (h / kv_mul) * hd;
        const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        for (int64_t t = first; t <= pos; ++t) {
          const float* kt = key_layer + t * kv_dim + kv_off;
          float score = 0.0f;
          for (int64_t d = 0; d < hd; ++d) score += qh[d] * kt[d];
          att[t - first] = score / score_div;
        }
        softmax(att.data(), pos + 1 - first, sinks != nullptr ? &sinks[h] : nullptr);
        float* out = &att_out[i * q_dim + h * hd];
        std::fill(out, out + hd, 0.0f);
        for (int64_t t = first; t <= pos; ++t) {
          const float* vt = value_layer + t * kv_dim + kv_off;
          const float a = att[t - first];
          for (int64_t d = 0; d < hd; ++d) out[d] += a * vt[d];
        }
      }
    }
    LLMQ_RETURN_IF_ERROR(backend_->forward(L.o, att_out.data(), n, proj.data()));
    for (int64_t i = 0; i < n * dim; ++i) x[i] += proj[i];

    for (int64_t i = 0; i < n; ++i) rmsnorm(&xb[i * dim], &x[i * dim], L.ffn_norm.data_as<float>(), dim, eps);
    if (!c.is_moe()) {
      LLMQ_RETURN_IF_ERROR(backend_->forward(L.mlp.gate, xb.data(), n, hb.data()));
      LLMQ_RETURN_IF_ERROR(backend_->forward(L.mlp.up, xb.data(), n, hb2.data()));
      glu(c, hb.data(), hb2.data(), n * hidden);
      LLMQ_RETURN_IF_ERROR(backend_->forward(L.mlp.down, hb.data(), n, proj.data()));
    } else {
      // Routing (ties to the lower expert id). kSoftmaxTopK (Mixtral, Qwen3-MoE): softmax over all
      // experts, the top k, their weights renormalised to sum to 1 when moe_renormalize.
      // kTopKSoftmax (gpt-oss): the top k logits, a softmax over those k. Each expert runs once on
      // the rows routed to it.
      const int64_t n_exp = c.n_experts;
      const int64_t top_k = c.n_experts_per_token;
      std::vector<float> router = buf(n, n_exp);
      LLMQ_RETURN_IF_ERROR(backend_->forward(L.router, xb.data(), n, router.data()));
      std::vector<float> route_weight = buf(n, top_k);   // (n, k), by ascending expert id
      std::vector<int64_t> route_expert(static_cast<size_t>(n * top_k));
      std::vector<int64_t> order(static_cast<size_t>(n_exp));
      std::vector<float> top(static_cast<size_t>(top_k));  // kTopKSoftmax: the k logits
      for (int64_t i = 0; i < n; ++i) {
        float* p = &router[i * n_exp];
        const bool topk_first = c.moe_routing == MoeRouting::kTopKSoftmax;
        if (!topk_first) softmax(p, n_exp);
        for (int64_t e = 0; e < n_exp; ++e) order[e] = e;
        std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                          [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
        if (topk_first) {  // softmax over the k logits, in rank order as torch.topk returns them
          for (int64_t s = 0; s < top_k; ++s) top[s] = p[order[s]];
          softmax(top.data(), top_k);
          for (int64_t s = 0; s < top_k; ++s) p[order[s]] = top[s];
        }
        float total = 0.0f;  // in rank order, as torch sums the top-k values
        for (int64_t s = 0; s < top_k; ++s) total += p[order[s]];
        std::sort(order.begin(), order.begin() + top_k);  // sum experts in id order, as HF's loop
        const bool divide = !topk_first && c.moe_renormalize;
        for (int64_t s = 0; s < top_k; ++s) {
          route_expert[i * top_k + s] = order[s];
          route_weight[i * top_k + s] = divide ? p[order[s]] / total : p[order[s]];
        }
      }
      std::vector<float> slot_out = buf(n * top_k, dim);  // expert output per (token, slot)
      std::vector<float> xe, ge, ue, de;
      std::vector<int64_t> slots;
      for (int64_t e = 0; e < n_exp; ++e) {
        slots.clear();
        for (int64_t s = 0; s < n * top_k; ++s)
          if (route_expert[s] == e) slots.push_back(s);
        if (slots.empty()) continue;  // sparse: unrouted experts cost nothing
        const int64_t m = static_cast<int64_t>(slots.size());
        xe.resize(static_cast<size_t>(m * dim));
        ge.resize(static_cast<size_t>(m * hidden));
        ue.resize(static_cast<size_t>(m * hidden));
        de.resize(static_cast<size_t>(m * dim));
        for (int64_t r = 0; r < m; ++r) {
          const int64_t token = slots[r] / top_k;
          std::copy(&xb[token * dim], &xb[(token + 1) * dim], xe.begin() + r * dim);
        }
        const Expert& ex = L.experts[static_cast<size_t>(e)];
        LLMQ_RETURN_IF_ERROR(backend_->forward(ex.gate, xe.data(), m, ge.data()));
        LLMQ_RETURN_IF_ERROR(backend_->forward(ex.up, xe.data(), m, ue.data()));
        glu(c, ge.data(), ue.data(), m * hidden);
        LLMQ_RETURN_IF_ERROR(backend_->forward(ex.down, ge.data(), m, de.data()));
        for (int64_t r = 0; r < m; ++r) std::copy(&de[r * dim], &de[(r + 1) * dim], slot_out.begin() + slots[r] * dim);
      }
      std::fill(proj.begin(), proj.end(), 0.0f);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < top_k; ++s) {
          const float wgt = route_weight[i * top_k + s];
          const float* ys = &slot_out[(i * top_k + s) * dim];
          for (int64_t d = 0; d < dim; ++d) proj[i * dim + d] += wgt * ys[d];
        }
    }
    for (int64_t i = 0; i < n * dim; ++i) x[i] += proj[i];
  }

  for (int64_t i = 0; i < n; ++i) rmsnorm(&xb[i * dim], &x[i * dim], weights_.final_norm.data_as<float>(), dim, eps);
  LLMQ_RETURN_IF_ERROR(backend_->forward(weights_.lm_head, xb.data(), n, logits));
  return check_logits(logits, n, c.vocab_size, "position ", start_pos);
}

}  // namespace llmq
