// The tensor-parallel split plan (tensor_parallel.hpp) on the CPU: that the slices each rank takes
// compute the unsplit blocks. An attention block (GQA, causal) and an MLP, dense and per expert,
// of a seeded model: the sum over ranks of each rank's block on its slices equals the block on the
// whole weights, for 2 and 4 ranks. The GPU loaders cut exactly these slices
// (test_cuda_tensor_parallel checks the GPU side); and the configuration checks name what does
// not divide.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "llmq/gpu_runtime.hpp"
#include "llmq/model.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {
namespace {

using Matrix = std::vector<float>;  // row-major

// Rows `s.rows` of the input columns [col_begin, col_begin + col_count) of w [n, k].
Matrix slice(const Matrix& w, int64_t n, int64_t k, const LinearShard& s) {
  EXPECT_LE(s.col_begin + s.col_count, k);
  Matrix out;
  for (const LinearShard::Rows& r : s.rows) {
    EXPECT_LE(r.begin + r.count, n);
    for (int64_t i = r.begin; i < r.begin + r.count; ++i)
      out.insert(out.end(), w.begin() + i * k + s.col_begin, w.begin() + i * k + s.col_begin + s.col_count);
  }
  return out;
}

Matrix concat_rows(const std::vector<const Tensor*>& parts) {
  Matrix out;
  for (const Tensor* t : parts) out.insert(out.end(), t->data_as<float>(), t->data_as<float>() + t->numel());
  return out;
}

// y [t, n] = x [t, k] w^T, w [n, k]; x rows may be strided (ldx).
Matrix linear(const Matrix& x, int64_t t, int64_t k, int64_t ldx, const Matrix& w, int64_t n) {
  Matrix y(static_cast<size_t>(t * n), 0.0f);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(x[i * ldx + c]) * w[j * k + c];
      y[i * n + j] = static_cast<float>(acc);
    }
  return y;
}

// Causal GQA attention block without RoPE: qkv [heads + 2 kv_heads rows of head_dim, dim], o [dim,
// heads * head_dim]; out [t, dim].
Matrix attention_block(const Matrix& x, int64_t t, int64_t dim, const Matrix& qkv, const Matrix& o, int64_t heads,
                       int64_t kv_heads, int64_t hd) {
  const int64_t q_dim = heads * hd, kv_dim = kv_heads * hd, n = q_dim + 2 * kv_dim;
  const Matrix y = linear(x, t, dim, dim, qkv, n);
  Matrix attn(static_cast<size_t>(t * q_dim), 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kvh = h / (heads / kv_heads);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> p(static_cast<size_t>(i + 1));
      double mx = -1e300, sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < hd; ++d) s += y[i * n + h * hd + d] * y[j * n + q_dim + kvh * hd + d];
        p[j] = s / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, p[j]);
      }
      for (double& v : p) sum += (v = std::exp(v - mx));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j <= i; ++j) acc += p[j] * y[j * n + q_dim + kv_dim + kvh * hd + d];
        attn[i * q_dim + h * hd + d] = static_cast<float>(acc / sum);
      }
    }
  }
  return linear(attn, t, q_dim, q_dim, o, dim);
}

// SiLU(gate) * up, then down: gate_up [2 h, dim] (gate rows, then up rows), down [dim, h].
Matrix mlp(const Matrix& x, int64_t t, int64_t dim, const Matrix& gate_up, const Matrix& down, int64_t h) {
  const Matrix gu = linear(x, t, dim, dim, gate_up, 2 * h);
  Matrix a(static_cast<size_t>(t * h));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < h; ++j) {
      const double g = gu[i * 2 * h + j];
      a[i * h + j] = static_cast<float>(g / (1.0 + std::exp(-g)) * gu[i * 2 * h + h + j]);
    }
  return linear(a, t, h, h, down, dim);
}

Matrix random_rows(int64_t t, int64_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Matrix x(static_cast<size_t>(t * dim));
  for (float& v : x) v = normal(rng);
  for (int64_t i = 0; i < t; ++i) x[i * dim + (i * 7) % dim] = 40.0f;  // outlier channels
  return x;
}

void expect_close(const Matrix& got, const Matrix& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  // float outputs of double sums: only the final rounding and the order of the rank sum differ.
  EXPECT_LE(std::sqrt(num / den), 1e-6) << what;
  EXPECT_GT(den, 0.0) << what;
}

Matrix sum(const std::vector<Matrix>& parts) {
  Matrix out(parts[0].size(), 0.0f);
  for (const Matrix& p : parts)
    for (size_t i = 0; i < p.size(); ++i) out[i] += p[i];
  return out;
}

TEST(TensorParallelPlan, AttentionBlockIsTheSumOfItsRanks) {
  DefaultModelOptions mo;
  mo.n_layers = 1;
  const ModelWeights w = make_default_model(mo);  // 8 heads, 4 kv heads, head_dim 32
  const ModelConfig& c = w.config;
  const LayerWeights& L = w.layers[0];
  const Matrix qkv = concat_rows({&L.q.weight, &L.k.weight, &L.v.weight});
  const Matrix o = concat_rows({&L.o.weight});
  const int64_t t = 6, qkv_n = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, q_dim = c.n_heads * c.head_dim;
  const Matrix x = random_rows(t, c.dim, 1);
  const Matrix whole = attention_block(x, t, c.dim, qkv, o, c.n_heads, c.n_kv_heads, c.head_dim);
  for (int tp : {2, 4}) {
    std::vector<Matrix> partial;
    for (int r = 0; r < tp; ++r) {
      const LinearShard sq = linear_shard(c, ShardedLinear::kQkv, {r, tp});
      const LinearShard so = linear_shard(c, ShardedLinear::kO, {r, tp});
      EXPECT_FALSE(sq.partial_sum);
      EXPECT_TRUE(so.partial_sum);
      const ModelConfig lc = tensor_parallel_config(c, tp);
      EXPECT_EQ(sq.n(), (lc.n_heads + 2 * lc.n_kv_heads) * lc.head_dim);
      partial.push_back(attention_block(x, t, c.dim, slice(qkv, qkv_n, c.dim, sq), slice(o, c.dim, q_dim, so), lc.n_heads,
                                        lc.n_kv_heads, lc.head_dim));
    }
    expect_close(sum(partial), whole, "attention tp " + std::to_string(tp));
  }
}

TEST(TensorParallelPlan, MlpIsTheSumOfItsRanks) {
  DefaultModelOptions mo;
  mo.n_layers = 1;
  const ModelWeights w = make_default_model(mo);
  const ModelConfig& c = w.config;
  const Matrix gate_up = concat_rows({&w.layers[0].mlp.gate.weight, &w.layers[0].mlp.up.weight});
  const Matrix down = concat_rows({&w.layers[0].mlp.down.weight});
  const int64_t t = 5, h = c.hidden_dim;
  const Matrix x = random_rows(t, c.dim, 2);
  const Matrix whole = mlp(x, t, c.dim, gate_up, down, h);
  for (int tp : {2, 4}) {
    std::vector<Matrix> partial;
    for (int r = 0; r < tp; ++r) {
      const LinearShard sg = linear_shard(c, ShardedLinear::kGateUp, {r, tp});
      const LinearShard sd = linear_shard(c, ShardedLinear::kDown, {r, tp});
      partial.push_back(mlp(x, t, c.dim, slice(gate_up, 2 * h, c.dim, sg), slice(down, c.dim, h, sd), h / tp));
    }
    expect_close(sum(partial), whole, "mlp tp " + std::to_string(tp));
  }
}

// A one-layer MoE model (4 experts) and its experts stacked as the GPU runtime holds them:
// gate_up [experts * 2 h, dim] (each expert's gate rows, then its up rows) and down [experts * dim, h].
struct StackedExperts {
  ModelWeights w;
  Matrix gate_up, down;
};
StackedExperts stacked_experts() {
  DefaultModelOptions mo;
  mo.n_layers = 1;
  mo.n_experts = 4;
  StackedExperts s{make_default_model(mo), {}, {}};
  std::vector<const Tensor*> gu_parts, down_parts;
  for (const Expert& e : s.w.layers[0].experts) {
    gu_parts.insert(gu_parts.end(), {&e.gate.weight, &e.up.weight});
    down_parts.push_back(&e.down.weight);
  }
  s.gate_up = concat_rows(gu_parts);
  s.down = concat_rows(down_parts);
  return s;
}

// Expert j's MLP from stacked gate/up and down slices whose experts have FFN width h.
Matrix expert_mlp(const Matrix& x, int64_t t, int64_t dim, const Matrix& gate_up, const Matrix& down, int64_t j, int64_t h) {
  return mlp(x, t, dim, Matrix(gate_up.begin() + j * 2 * h * dim, gate_up.begin() + (j + 1) * 2 * h * dim),
             Matrix(down.begin() + j * dim * h, down.begin() + (j + 1) * dim * h), h);
}

TEST(TensorParallelPlan, EveryExpertIsTheSumOfItsRanks) {
  const StackedExperts model = stacked_experts();
  const ModelConfig& c = model.w.config;
  const Matrix& gate_up = model.gate_up;
  const Matrix& down = model.down;
  const int64_t t = 4, h = c.hidden_dim, E = c.n_experts;
  const Matrix x = random_rows(t, c.dim, 3);
  for (int tp : {2, 4}) {
    std::vector<Matrix> gu_slices, down_slices;
    for (int r = 0; r < tp; ++r) {
      gu_slices.push_back(slice(gate_up, E * 2 * h, c.dim, linear_shard(c, ShardedLinear::kExpertsGateUp, {r, tp})));
      down_slices.push_back(slice(down, E * c.dim, h, linear_shard(c, ShardedLinear::kExpertsDown, {r, tp})));
    }
    const int64_t hl = h / tp;
    for (int64_t e = 0; e < E; ++e) {
      std::vector<Matrix> partial;
      for (int r = 0; r < tp; ++r)  // expert e's rows of the rank's stacked slices (FFN width hl)
        partial.push_back(expert_mlp(x, t, c.dim, gu_slices[static_cast<size_t>(r)], down_slices[static_cast<size_t>(r)], e, hl));
      expect_close(sum(partial), expert_mlp(x, t, c.dim, gate_up, down, e, h),
                   "expert " + std::to_string(e) + " tp " + std::to_string(tp));
    }
  }
}

// Expert parallelism: rank r's stacked slices are experts [r E / N, (r + 1) E / N) whole, so every
// expert lives on exactly one rank and the sum over ranks of each rank's experts' weighted outputs is
// the whole MoE block's.
TEST(TensorParallelPlan, ExpertParallelRanksHoldWholeExperts) {
  const StackedExperts model = stacked_experts();
  const ModelConfig& c = model.w.config;
  const Matrix& gate_up = model.gate_up;
  const Matrix& down = model.down;
  const int64_t t = 3, h = c.hidden_dim, E = c.n_experts;
  const Matrix x = random_rows(t, c.dim, 5);
  const std::vector<float> weight = {0.6f, 0.0f, 0.3f, 0.1f};  // a routing: experts 0, 2, 3
  Matrix whole(static_cast<size_t>(t * c.dim), 0.0f);
  std::vector<Matrix> expert_out;
  for (int64_t e = 0; e < E; ++e) {
    expert_out.push_back(expert_mlp(x, t, c.dim, gate_up, down, e, h));
    for (size_t i = 0; i < whole.size(); ++i) whole[i] += weight[e] * expert_out.back()[i];
  }
  EXPECT_EQ(tensor_parallel_config(c, 2, true).hidden_dim, h);
  EXPECT_EQ(tensor_parallel_config(c, 2, true).n_heads, c.n_heads / 2);
  for (int tp : {2, 4}) {
    const int64_t local = E / tp;
    std::vector<Matrix> partial;
    for (int r = 0; r < tp; ++r) {
      TensorParallelRank rank{r, tp, true};
      const LinearShard sg = linear_shard(c, ShardedLinear::kExpertsGateUp, rank);
      const LinearShard sd = linear_shard(c, ShardedLinear::kExpertsDown, rank);
      EXPECT_TRUE(sd.partial_sum);
      const Matrix g = slice(gate_up, E * 2 * h, c.dim, sg), d = slice(down, E * c.dim, h, sd);
      ASSERT_EQ(g.size(), static_cast<size_t>(local * 2 * h * c.dim));
      Matrix mine(whole.size(), 0.0f);
      for (int64_t j = 0; j < local; ++j) {
        const Matrix y = expert_mlp(x, t, c.dim, g, d, j, h);
        EXPECT_EQ(y, expert_out[static_cast<size_t>(r * local + j)]) << "rank " << r << " expert " << j;
        for (size_t i = 0; i < mine.size(); ++i) mine[i] += weight[r * local + j] * y[i];
      }
      partial.push_back(mine);
    }
    expect_close(sum(partial), whole, "expert parallel tp " + std::to_string(tp));
  }
  // Experts that the ranks do not divide, and a dense model, are refused with the reason.
  ModelConfig six = c;
  six.n_experts = 6;
  Status st = check_tensor_parallel(six, 4, false, true);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("num_local_experts 6"), std::string::npos) << st.to_string();
  DefaultModelOptions dense;
  dense.n_layers = 1;
  st = check_tensor_parallel(make_default_model(dense).config, 2, false, true);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("MoE"), std::string::npos) << st.to_string();
}

// lm_head by vocabulary rows: the ranks' logits, side by side, are the whole row; a vocabulary the
// ranks do not divide stays whole on every rank.
TEST(TensorParallelPlan, LmHeadSlicesTileTheVocabulary) {
  DefaultModelOptions mo;
  mo.n_layers = 1;
  const ModelWeights w = make_default_model(mo);
  const ModelConfig& c = w.config;
  const Matrix head = concat_rows({&w.lm_head.weight});
  const int64_t t = 3, V = c.vocab_size;
  const Matrix x = random_rows(t, c.dim, 4);
  const Matrix whole = linear(x, t, c.dim, c.dim, head, V);
  for (int tp : {2, 4}) {
    Matrix joined(whole.size());
    for (int r = 0; r < tp; ++r) {
      const LinearShard s = linear_shard(c, ShardedLinear::kLmHead, {r, tp});
      ASSERT_EQ(s.n() * tp, V);
      const Matrix part = linear(x, t, c.dim, c.dim, slice(head, V, c.dim, s), s.n());
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < s.n(); ++j) joined[i * V + r * s.n() + j] = part[i * s.n() + j];
    }
    EXPECT_EQ(joined, whole) << "tp " << tp;
  }
  ModelConfig odd = c;
  odd.vocab_size = 300;
  EXPECT_EQ(linear_shard(odd, ShardedLinear::kLmHead, {1, 8}).n(), 300);
}

TEST(TensorParallelPlan, ConfigChecksNameWhatDoesNotDivide) {
  ModelConfig big;
  ASSERT_TRUE(synthetic_model_config("llama3-70b", &big).ok());  // 64 heads, 8 kv heads, FFN 28672
  for (int tp : {1, 2, 4, 8}) {
    const Status st = check_tensor_parallel(big, tp, true);
    EXPECT_TRUE(st.ok()) << tp << ": " << st.to_string();
    const ModelConfig lc = tensor_parallel_config(big, tp);
    EXPECT_EQ(lc.n_heads * tp, big.n_heads);
    EXPECT_EQ(lc.n_kv_heads * tp, big.n_kv_heads);
    EXPECT_EQ(lc.hidden_dim * tp, big.hidden_dim);
    EXPECT_EQ(lc.dim, big.dim);
    EXPECT_EQ(lc.vocab_size, big.vocab_size);
  }
  Status st = check_tensor_parallel(big, 16, false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("num_key_value_heads 8"), std::string::npos) << st.to_string();
  ModelConfig tiny;
  ASSERT_TRUE(synthetic_model_config("tiny", &tiny).ok());  // head_dim 32, 4 kv heads
  EXPECT_TRUE(check_tensor_parallel(tiny, 2, false).ok());
  st = check_tensor_parallel(tiny, 2, true);  // a rank's kv slice: 2 x 32 = 64
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("128x128"), std::string::npos) << st.to_string();
  tiny.hidden_dim = 770;
  st = check_tensor_parallel(tiny, 4, false);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("intermediate_size 770"), std::string::npos) << st.to_string();
  EXPECT_FALSE(check_tensor_parallel(tiny, 0, false).ok());
}

}  // namespace
}  // namespace llmq
