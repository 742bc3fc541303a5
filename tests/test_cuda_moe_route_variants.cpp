// The MoE routing and combine variants of the newer families against host implementations of the
// CPU reference's rules (transformer.cpp):
//   * routing with a router bias (gpt-oss), top-k then softmax over the k logits (gpt-oss), and
//     softmax then top-k without renormalisation (Qwen3-MoE norm_topk_prob: false): the same
//     experts exactly, weights within a few ulps (device expf), row_experts the inverse of the
//     permutation's experts;
//   * the combine with per-expert output biases (gpt-oss's down_proj), experts outside the biased
//     range (another rank's, under expert parallelism) left unbiased: bit for bit.
// Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_moe.hpp"
#include "llmq/format.hpp"
#include "llmq/synthetic.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

struct Rule {
  const char* name;
  bool topk_softmax;
  bool renormalize;
  bool bias;
};

// transformer.cpp's routing of one token (logits + bias), on the host.
void host_route(const float* logits, const float* bias, int64_t experts, int64_t top_k, const Rule& rule, int32_t* ids,
                float* weights) {
  std::vector<float> p(logits, logits + experts);
  if (bias != nullptr)
    for (int64_t e = 0; e < experts; ++e) p[e] += bias[e];
  auto softmax = [](float* x, int64_t n) {
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - mx));
    for (int64_t i = 0; i < n; ++i) x[i] /= sum;
  };
  if (!rule.topk_softmax) softmax(p.data(), experts);
  std::vector<int64_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::vector<float> top(static_cast<size_t>(top_k));
  for (int64_t s = 0; s < top_k; ++s) top[s] = p[order[s]];
  if (rule.topk_softmax) softmax(top.data(), top_k);
  float total = 0.0f;
  for (int64_t s = 0; s < top_k; ++s) total += top[s];
  const bool divide = !rule.topk_softmax && rule.renormalize;
  std::vector<std::pair<int64_t, float>> picked;
  for (int64_t s = 0; s < top_k; ++s) picked.emplace_back(order[s], divide ? top[s] / total : top[s]);
  std::sort(picked.begin(), picked.end());
  for (int64_t s = 0; s < top_k; ++s) {
    ids[s] = static_cast<int32_t>(picked[s].first);
    weights[s] = picked[s].second;
  }
}

TEST(CudaMoeRouteVariants, RoutingRulesMatchTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  const Rule rules[] = {{"softmax-topk renormalised + bias", false, true, true},
                        {"softmax-topk unnormalised", false, false, false},
                        {"topk-softmax + bias (gpt-oss)", true, true, true},
                        {"topk-softmax", true, false, false}};
  const int64_t shapes[][3] = {{1, 4, 2}, {37, 32, 4}, {300, 128, 8}, {1100, 8, 2}};
  for (const Rule& rule : rules)
    for (const auto& shape : shapes) {
      const int64_t T = shape[0], E = shape[1], K = shape[2], slots = T * K;
      SCOPED_TRACE(testing::repro(41, T, E, std::string(rule.name) + " top_k=" + std::to_string(K)));
      const std::vector<float> logits = synthetic_activations(T, E, 41);
      const std::vector<float> bias = synthetic_activations(1, E, 42);
      DeviceBuffer<float> d_logits(logits.size()), d_bias(bias.size()), d_w(slots);
      DeviceBuffer<int32_t> d_ids(slots), d_off(E + 1), d_sorted(slots), d_rows(slots), d_experts(slots);
      CUDA_ASSERT(d_logits.upload(logits));
      CUDA_ASSERT(d_bias.upload(bias));
      MoeRouteArgs a;
      a.tokens = T;
      a.experts = E;
      a.top_k = K;
      a.logits = d_logits.get();
      a.topk_ids = d_ids.get();
      a.topk_weights = d_w.get();
      a.expert_offsets = d_off.get();
      a.sorted_slots = d_sorted.get();
      a.slot_rows = d_rows.get();
      a.row_experts = d_experts.get();
      a.logit_bias = rule.bias ? d_bias.get() : nullptr;
      a.topk_softmax = rule.topk_softmax;
      a.renormalize = rule.renormalize;
      const Status st = cuda_moe_route(a, nullptr);
      ASSERT_TRUE(st.ok()) << st.to_string();
      std::vector<int32_t> ids, sorted, row_experts;
      std::vector<float> w;
      CUDA_ASSERT(cudaDeviceSynchronize());
      CUDA_ASSERT(d_ids.download(&ids));
      CUDA_ASSERT(d_w.download(&w));
      CUDA_ASSERT(d_sorted.download(&sorted));
      CUDA_ASSERT(d_experts.download(&row_experts));
      std::vector<int32_t> want_ids(static_cast<size_t>(K));
      std::vector<float> want_w(static_cast<size_t>(K));
      for (int64_t t = 0; t < T; ++t) {
        host_route(&logits[t * E], rule.bias ? bias.data() : nullptr, E, K, rule, want_ids.data(), want_w.data());
        for (int64_t s = 0; s < K; ++s) {
          ASSERT_EQ(ids[t * K + s], want_ids[s]) << "token " << t << " slot " << s;
          // Device expf may differ from the host's by an ulp: the weights by a few.
          ASSERT_NEAR(w[t * K + s], want_w[s], 4e-7f * std::max(1.0f, want_w[s])) << "token " << t;
        }
      }
      for (int64_t r = 0; r < slots; ++r) ASSERT_EQ(row_experts[r], ids[sorted[r]]) << "permuted row " << r;
    }
}

TEST(CudaMoeRouteVariants, CombineAddsEachExpertsBiasExactly) {
  LLMQ_REQUIRE_GPU();
  const int64_t tokens = 53, top_k = 4, experts = 8, first = 2, biased = 4;  // experts 2..5 biased here
  const int64_t P = tokens * top_k;
  std::mt19937 rng(12);
  std::vector<int32_t> slot_rows(static_cast<size_t>(P)), ids(static_cast<size_t>(P));
  std::iota(slot_rows.begin(), slot_rows.end(), 0);
  std::shuffle(slot_rows.begin(), slot_rows.end(), rng);
  for (int32_t& e : ids) e = static_cast<int32_t>(rng() % experts);
  for (const int64_t n : {int64_t{64}, int64_t{13}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> yf = synthetic_activations(P, n, 5);
    std::vector<uint16_t> y(yf.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = float_to_bf16_bits(yf[i]);
    std::vector<float> w = synthetic_activations(tokens, top_k, 6);
    for (float& v : w) v = std::fabs(v) + 0.01f;
    const std::vector<float> bias = synthetic_activations(biased, n, 7);
    DeviceBuffer<uint16_t> d_y(y.size()), d_o(static_cast<size_t>(tokens * n));
    DeviceBuffer<float> d_w(w.size()), d_b(bias.size());
    DeviceBuffer<int32_t> d_rows(slot_rows.size()), d_ids(ids.size());
    CUDA_ASSERT(d_y.upload(y));
    CUDA_ASSERT(d_w.upload(w));
    CUDA_ASSERT(d_b.upload(bias));
    CUDA_ASSERT(d_rows.upload(slot_rows));
    CUDA_ASSERT(d_ids.upload(ids));
    MoeCombineArgs c;
    c.tokens = tokens;
    c.top_k = top_k;
    c.n = n;
    c.y = d_y.get();
    c.topk_weights = d_w.get();
    c.slot_rows = d_rows.get();
    c.out = d_o.get();
    c.bias = d_b.get();
    c.topk_ids = d_ids.get();
    c.bias_first = first;
    c.bias_experts = biased;
    ASSERT_TRUE(cuda_moe_combine(c, nullptr).ok());
    std::vector<uint16_t> o;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_o.download(&o));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t s = 0; s < top_k; ++s) {
          float v = bf16_bits_to_float(y[slot_rows[t * top_k + s] * n + j]);
          const int64_t e = ids[t * top_k + s] - first;
          if (e >= 0 && e < biased) v = v + bias[e * n + j];
          acc = acc + w[t * top_k + s] * v;
        }
        ASSERT_EQ(o[t * n + j], float_to_bf16_bits(acc)) << "token " << t << " col " << j;
      }
  }
}

}  // namespace
}  // namespace llmq
