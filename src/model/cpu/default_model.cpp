// make_default_model: a seeded Llama-shaped (or Mixtral-shaped) model that llmq generates itself,
// so every command works with no checkpoint. The weights are random but shaped like a real LLM's
// where quantization cares: the attention and FFN RMSNorm gains have a few outlier channels (the
// same channels in every layer, 20-50x the rest), so q/k/v and gate/up see the outlier input
// channels that LLM.int8() and SmoothQuant describe.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "llmq/model.hpp"

namespace llmq {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kOutlierFraction = 0.01;  // about 1% of the channels
constexpr int64_t kMinOutliers = 2;
constexpr double kOutlierGainMin = 20.0;
constexpr double kOutlierGainMax = 50.0;
constexpr double kNormGainJitter = 0.1;   // ordinary gains: 1 + N(0, 0.1)
// The final norm's gain sets the logits' scale: the normed state has unit RMS and lm_head rows are
// N(0, 1/dim), so logits have std ~ this gain: 2.5 gives peaked but not one-hot distributions
// (entropies of about 1.5-4.5 nats over 512 tokens, against ln 512 = 6.2 for uniform).
constexpr double kFinalNormGain = 2.5;

// std::normal_distribution's algorithm is implementation-defined; Box-Muller over mt19937_64's
// (fully specified) output gives the same weights with every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * kPi * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * kPi * u2);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(engine_() % static_cast<uint64_t>(n)); }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

void fill_normal(Tensor* t, Rng* rng, double mean, double sigma) {
  float* p = t->data_as<float>();
  for (int64_t i = 0; i < t->numel(); ++i) p[i] = static_cast<float>(mean + sigma * rng->normal());
}

Linear random_linear(Rng* rng, int64_t layer, LinearRole role, int64_t expert, int64_t out, int64_t in) {
  Linear l;
  l.id.layer = layer;
  l.id.role = role;
  l.id.expert = expert;
  l.weight = Tensor(DType::kF32, {out, in});
  fill_normal(&l.weight, rng, 0.0, 1.0 / std::sqrt(static_cast<double>(in)));
  return l;
}

Expert random_expert(Rng* rng, int64_t layer, int64_t expert, int64_t dim, int64_t hidden) {
  Expert e;
  e.gate = random_linear(rng, layer, LinearRole::kGate, expert, hidden, dim);
  e.up = random_linear(rng, layer, LinearRole::kUp, expert, hidden, dim);
  e.down = random_linear(rng, layer, LinearRole::kDown, expert, dim, hidden);
  return e;
}

Tensor norm_gains(Rng* rng, int64_t dim, const std::vector<int64_t>& outliers) {
  Tensor t(DType::kF32, {dim});
  fill_normal(&t, rng, 1.0, kNormGainJitter);
  float* g = t.data_as<float>();
  for (int64_t ch : outliers)
    g[ch] = static_cast<float>(kOutlierGainMin + (kOutlierGainMax - kOutlierGainMin) * rng->uniform());
  return t;
}

}  // namespace

ModelWeights make_default_model(const DefaultModelOptions& o) {
  ModelWeights w;
  ModelConfig& c = w.config;
  const bool moe = o.n_experts > 0;
  c.model_type = moe ? "mixtral" : "llama";
  c.dim = o.dim;
  c.hidden_dim = o.hidden_dim;
  c.n_layers = o.n_layers;
  c.n_heads = o.n_heads;
  c.n_kv_heads = o.n_kv_heads;
  c.head_dim = o.n_heads > 0 ? o.dim / o.n_heads : 0;
  c.vocab_size = o.vocab_size;
  c.max_seq_len = o.max_seq_len;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.rope_style = RopeStyle::kHalf;
  c.tie_embeddings = false;
  c.n_experts = moe ? o.n_experts : 0;
  c.n_experts_per_token = moe ? o.n_experts_per_token : 0;
  c.bos_token = 1;
  c.eos_token = 2;
  // Options that fail validation (the caller can check w.config.validate()) give no tensors.
  if (!c.validate().ok()) return w;

  Rng rng(o.seed);
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;

  // Distinct outlier channels, shared by every layer (real LLMs' outliers persist across layers).
  const int64_t n_outliers = std::max<int64_t>(kMinOutliers, static_cast<int64_t>(kOutlierFraction * static_cast<double>(c.dim)));
  std::vector<int64_t> outliers;
  std::vector<bool> taken(static_cast<size_t>(c.dim), false);
  while (static_cast<int64_t>(outliers.size()) < std::min(n_outliers, c.dim)) {
    const int64_t ch = rng.below(c.dim);
    if (taken[ch]) continue;
    taken[ch] = true;
    outliers.push_back(ch);
  }

  w.token_embedding = Tensor(DType::kF32, {c.vocab_size, c.dim});
  fill_normal(&w.token_embedding, &rng, 0.0, 1.0);
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = norm_gains(&rng, c.dim, outliers);
    L.q = random_linear(&rng, l, LinearRole::kQ, -1, q_dim, c.dim);
    L.k = random_linear(&rng, l, LinearRole::kK, -1, kv_dim, c.dim);
    L.v = random_linear(&rng, l, LinearRole::kV, -1, kv_dim, c.dim);
    L.o = random_linear(&rng, l, LinearRole::kO, -1, c.dim, q_dim);
    L.ffn_norm = norm_gains(&rng, c.dim, outliers);
    if (moe) {
      L.router = random_linear(&rng, l, LinearRole::kRouter, -1, c.n_experts, c.dim);
      for (int64_t e = 0; e < c.n_experts; ++e) L.experts.push_back(random_expert(&rng, l, e, c.dim, c.hidden_dim));
    } else {
      L.mlp = random_expert(&rng, l, -1, c.dim, c.hidden_dim);
    }
  }
  w.final_norm = Tensor(DType::kF32, {c.dim});
  fill_normal(&w.final_norm, &rng, kFinalNormGain, kFinalNormGain * kNormGainJitter);
  w.lm_head = random_linear(&rng, -1, LinearRole::kLmHead, -1, c.vocab_size, c.dim);
  return w;
}

}  // namespace llmq
