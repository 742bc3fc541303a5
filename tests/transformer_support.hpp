// Helpers shared by the model runtime tests (test_transformer.cpp: the default model, MoE, sampler,
// errors; test_transformer_llama2c.cpp: llama2.c checkpoints): tolerances, logits of a forward
// pass, relative errors, seeded tokens, a naive double-precision reference forward pass, and
// llama2.c's v1 file written from weights.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/transformer.hpp"
#include "support.hpp"

namespace llmq {
namespace transformer_test {

// Batched and one-by-one forward run the same float operations; allow a little anyway.
constexpr double kBatchRelTolerance = 1e-5;
// The float32 forward against the double reference: max |diff| / max |reference logit|.
constexpr double kReferenceTolerance = 1e-4;

constexpr double kPi = 3.14159265358979323846;

inline std::vector<float> logits_of(Transformer* t, const std::vector<int32_t>& tokens, int64_t start_pos = 0) {
  std::vector<float> out(tokens.size() * static_cast<size_t>(t->config().vocab_size), std::nanf(""));
  const Status st = t->forward(tokens.data(), static_cast<int64_t>(tokens.size()), start_pos, out.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// max |a - b| / max |b|
inline double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_error(a, std::vector<double>(b.begin(), b.end()));
}

inline std::vector<int32_t> seeded_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// ---------------------------------------------------------------------------------------------
// A naive double-precision forward pass, written from the model definitions (not from the
// library): all positions at once, no cache, explicit loops.

inline std::vector<double> ref_linear(const Linear& l, const std::vector<double>& x) {
  const int64_t out = l.weight.shape()[0], in = l.weight.shape()[1];
  const float* w = l.weight.data_as<float>();
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s = l.bias.nbytes() > 0 ? l.bias.data_as<float>()[o] : 0.0;
    for (int64_t k = 0; k < in; ++k) s += static_cast<double>(w[o * in + k]) * x[k];
    y[o] = s;
  }
  return y;
}

inline std::vector<double> ref_rmsnorm(const std::vector<double>& x, const Tensor& g, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g.data_as<float>()[i];
  return y;
}

inline std::vector<double> ref_inv_freq(const ModelConfig& c) {
  std::vector<double> inv(static_cast<size_t>(c.head_dim / 2));
  for (size_t j = 0; j < inv.size(); ++j)
    inv[j] = 1.0 / std::pow(c.rope_theta, 2.0 * static_cast<double>(j) / static_cast<double>(c.head_dim));
  if (c.yarn.enabled) {  // YaRN (arXiv 2309.00071): a ramp between kept and 1/factor frequencies
    const YarnScaling& y = c.yarn;
    const double dim = static_cast<double>(c.head_dim);
    auto dim_of = [&](double rotations) {
      return dim * std::log(static_cast<double>(y.original_max_position) / (rotations * 2 * kPi)) / (2 * std::log(c.rope_theta));
    };
    double lo = dim_of(y.beta_fast), hi = dim_of(y.beta_slow);
    if (y.truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0);
    hi = std::min(hi, dim - 1);
    if (lo == hi) hi += 0.001;
    for (size_t j = 0; j < inv.size(); ++j) {
      const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(j) - lo) / (hi - lo)));
      inv[j] = inv[j] / y.factor * ramp + inv[j] * (1 - ramp);
    }
  }
  if (c.rope_scaling.enabled) {
    const RopeScaling& s = c.rope_scaling;
    const double old_ctx = static_cast<double>(s.original_max_position);
    for (double& f : inv) {
      const double wavelen = 2 * kPi / f;
      if (wavelen < old_ctx / s.high_freq_factor) continue;
      if (wavelen > old_ctx / s.low_freq_factor) {
        f /= s.factor;
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

// scale: YaRN's attention factor on cos and sin (1 otherwise).
inline void ref_rope(double* v, int64_t hd, int64_t pos, const std::vector<double>& inv, RopeStyle style,
                     double scale = 1.0) {
  const int64_t half = hd / 2;
  for (int64_t j = 0; j < half; ++j) {
    const double a = static_cast<double>(pos) * inv[j];
    const int64_t i0 = style == RopeStyle::kInterleaved ? 2 * j : j;
    const int64_t i1 = style == RopeStyle::kInterleaved ? 2 * j + 1 : j + half;
    const double x0 = v[i0], x1 = v[i1];
    v[i0] = (x0 * std::cos(a) - x1 * std::sin(a)) * scale;
    v[i1] = (x0 * std::sin(a) + x1 * std::cos(a)) * scale;
  }
}

// SiLU-gated MLP, or gpt-oss's: gate clamped above at the limit, up to [-limit, limit],
// (up + 1) * gate * sigmoid(alpha * gate).
inline std::vector<double> ref_swiglu_mlp(const Expert& e, const std::vector<double>& x, const ModelConfig* c = nullptr) {
  std::vector<double> g = ref_linear(e.gate, x), u = ref_linear(e.up, x);
  const bool clamped = c != nullptr && c->activation == GluActivation::kClampedSwiglu;
  for (size_t i = 0; i < g.size(); ++i) {
    if (clamped) {
      const double gg = std::min(g[i], c->glu_limit), uu = std::max(-c->glu_limit, std::min(u[i], c->glu_limit));
      g[i] = (uu + 1) * gg / (1 + std::exp(-c->glu_alpha * gg));
    } else {
      g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    }
  }
  return ref_linear(e.down, g);
}

// Per-head RMSNorm of Qwen3's q and k, on `heads` heads of hd values.
inline void ref_head_norm(double* v, int64_t heads, int64_t hd, const Tensor& g, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    const std::vector<double> y = ref_rmsnorm(std::vector<double>(v + h * hd, v + (h + 1) * hd), g, eps);
    std::copy(y.begin(), y.end(), v + h * hd);
  }
}

inline std::vector<double> reference_logits(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const int64_t n = static_cast<int64_t>(tokens.size()), hd = c.head_dim;
  const std::vector<double> inv = ref_inv_freq(c);
  const double rope_scale = c.yarn.enabled ? c.yarn.attention_factor : 1.0;
  std::vector<std::vector<double>> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* e = w.token_embedding.data_as<float>() + tokens[i] * c.dim;
    x[i].assign(e, e + c.dim);
  }
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
    const int64_t window = c.layer_window(layer);
    std::vector<std::vector<double>> q(x.size()), k(x.size()), v(x.size());
    for (int64_t i = 0; i < n; ++i) {
      const auto h = ref_rmsnorm(x[i], L.attn_norm, c.norm_eps);
      q[i] = ref_linear(L.q, h);
      k[i] = ref_linear(L.k, h);
      v[i] = ref_linear(L.v, h);
      if (c.qk_norm) {
        ref_head_norm(q[i].data(), c.n_heads, hd, L.q_norm, c.norm_eps);
        ref_head_norm(k[i].data(), c.n_kv_heads, hd, L.k_norm, c.norm_eps);
      }
      for (int64_t hh = 0; hh < c.n_heads; ++hh) ref_rope(&q[i][hh * hd], hd, i, inv, c.rope_style, rope_scale);
      for (int64_t hh = 0; hh < c.n_kv_heads; ++hh) ref_rope(&k[i][hh * hd], hd, i, inv, c.rope_style, rope_scale);
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> att(static_cast<size_t>(c.n_heads * hd), 0.0);
      for (int64_t hh = 0; hh < c.n_heads; ++hh) {
        const int64_t kvh = hh / (c.n_heads / c.n_kv_heads);
        // Keys t with i - window < t <= i (all t <= i without a window); a sink joins the
        // denominator with no value.
        const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        const double sink = c.attention_sinks ? L.sinks.data_as<float>()[hh] : -1e300;
        std::vector<double> s(static_cast<size_t>(i + 1), 0.0);
        double mx = sink, sum = 0;
        for (int64_t t = first; t <= i; ++t) {
          double d = 0;
          for (int64_t j = 0; j < hd; ++j) d += q[i][hh * hd + j] * k[t][kvh * hd + j];
          s[t] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[t]);
        }
        for (int64_t t = first; t <= i; ++t) sum += (s[t] = std::exp(s[t] - mx));
        if (c.attention_sinks) sum += std::exp(sink - mx);
        for (int64_t t = first; t <= i; ++t)
          for (int64_t j = 0; j < hd; ++j) att[hh * hd + j] += s[t] / sum * v[t][kvh * hd + j];
      }
      const auto o = ref_linear(L.o, att);
      for (int64_t d = 0; d < c.dim; ++d) x[i][d] += o[d];
      const auto h = ref_rmsnorm(x[i], L.ffn_norm, c.norm_eps);
      std::vector<double> f(static_cast<size_t>(c.dim), 0.0);
      if (!c.is_moe()) {
        f = ref_swiglu_mlp(L.mlp, h, &c);
      } else {
        // The k largest logits (ties to the lower id). Their weights: softmax over all experts,
        // then optionally divided by the k kept (Mixtral, Qwen3-MoE); or softmax over the k
        // logits alone (gpt-oss), which is the same as the renormalised case.
        std::vector<double> p = ref_linear(L.router, h);
        std::vector<int64_t> idx(p.size());
        for (size_t e = 0; e < idx.size(); ++e) idx[e] = static_cast<int64_t>(e);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
        const double mx = p[idx[0]];
        double sum = 0, kept = 0;
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (int64_t s = 0; s < c.n_experts_per_token; ++s) kept += p[idx[s]];
        const bool renormalise = c.moe_routing == MoeRouting::kTopKSoftmax || c.moe_renormalize;
        for (int64_t s = 0; s < c.n_experts_per_token; ++s) {
          const auto y = ref_swiglu_mlp(L.experts[idx[s]], h, &c);
          const double weight = renormalise ? p[idx[s]] / kept : p[idx[s]] / sum;
          for (int64_t d = 0; d < c.dim; ++d) f[d] += weight * y[d];
        }
      }
      for (int64_t d = 0; d < c.dim; ++d) x[i][d] += f[d];
    }
  }
  std::vector<double> logits;
  for (int64_t i = 0; i < n; ++i) {
    const auto y = ref_linear(w.lm_head, ref_rmsnorm(x[i], w.final_norm, c.norm_eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

inline bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())) == 0;
}

// ---- llama2.c files (test_transformer_llama2c.cpp, test_tokenizer_export.cpp)

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void append(std::vector<uint8_t>* out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}
inline void append(std::vector<uint8_t>* out, const Tensor& t) {
  append(out, t.data(), static_cast<size_t>(t.nbytes()));
}

// export.py's version1_export layout, written from loaded weights.
inline std::vector<uint8_t> v1_bytes(const ModelWeights& w, bool shared) {
  const ModelConfig& c = w.config;
  std::vector<uint8_t> b;
  const uint32_t magic = 0x616b3432;
  const int32_t header[8] = {1, static_cast<int32_t>(c.dim), static_cast<int32_t>(c.hidden_dim),
                             static_cast<int32_t>(c.n_layers), static_cast<int32_t>(c.n_heads),
                             static_cast<int32_t>(c.n_kv_heads), static_cast<int32_t>(c.vocab_size),
                             static_cast<int32_t>(c.max_seq_len)};
  append(&b, &magic, 4);
  append(&b, header, sizeof header);
  b.push_back(shared ? 1 : 0);
  b.resize(256, 0);
  for (const auto& L : w.layers) append(&b, L.attn_norm);
  for (const auto& L : w.layers) append(&b, L.ffn_norm);
  append(&b, w.final_norm);
  append(&b, w.token_embedding);
  for (const auto& L : w.layers) append(&b, L.q.weight);
  for (const auto& L : w.layers) append(&b, L.k.weight);
  for (const auto& L : w.layers) append(&b, L.v.weight);
  for (const auto& L : w.layers) append(&b, L.o.weight);
  for (const auto& L : w.layers) append(&b, L.mlp.gate.weight);
  for (const auto& L : w.layers) append(&b, L.mlp.down.weight);
  for (const auto& L : w.layers) append(&b, L.mlp.up.weight);
  if (!shared) append(&b, w.lm_head.weight);
  return b;
}

}  // namespace transformer_test
}  // namespace llmq
