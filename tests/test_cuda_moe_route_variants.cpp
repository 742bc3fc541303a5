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

// One routing call's output buffers on the device, and arguments that point at them.
struct RouteOutputs {
  DeviceBuffer<float> w;
  DeviceBuffer<int32_t> ids, off, sorted, rows, experts;
  RouteOutputs(int64_t T, int64_t E, int64_t K)
      : w(T * K), ids(T * K), off(E + 1), sorted(T * K), rows(T * K), experts(T * K) {}
  MoeRouteArgs args(int64_t T, int64_t E, int64_t K, const Rule& rule, const float* d_bias) {
    MoeRouteArgs a;
    a.tokens = T;
    a.experts = E;
    a.top_k = K;
    a.topk_ids = ids.get();
    a.topk_weights = w.get();
    a.expert_offsets = off.get();
    a.sorted_slots = sorted.get();
    a.slot_rows = rows.get();
    a.row_experts = experts.get();
    a.logit_bias = rule.bias ? d_bias : nullptr;
    a.topk_softmax = rule.topk_softmax;
    a.renormalize = rule.renormalize;
    return a;
  }
};

// The call's picks against host_route on the host's logits: the same experts exactly, weights
// within a few ulps (device expf may differ from the host's by an ulp), the permutation consistent
// (each permuted row inside its expert's range, row_experts its inverse).
::testing::AssertionResult picks_match_host(const std::vector<float>& logits, const std::vector<float>& bias, const Rule& rule,
                                            int64_t T, int64_t E, int64_t K, RouteOutputs& out) {
  std::vector<int32_t> ids, off, sorted, row_experts;
  std::vector<float> w;
  if (cudaDeviceSynchronize() != cudaSuccess || out.ids.download(&ids) != cudaSuccess || out.w.download(&w) != cudaSuccess ||
      out.off.download(&off) != cudaSuccess || out.sorted.download(&sorted) != cudaSuccess ||
      out.experts.download(&row_experts) != cudaSuccess)
    return ::testing::AssertionFailure() << "CUDA error running or downloading the routing";
  std::vector<int32_t> want_ids(static_cast<size_t>(K));
  std::vector<float> want_w(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    host_route(&logits[t * E], rule.bias ? bias.data() : nullptr, E, K, rule, want_ids.data(), want_w.data());
    for (int64_t s = 0; s < K; ++s) {
      if (ids[t * K + s] != want_ids[s])
        return ::testing::AssertionFailure() << "token " << t << " slot " << s << ": expert " << ids[t * K + s] << ", want " << want_ids[s];
      if (std::fabs(w[t * K + s] - want_w[s]) > 4e-7f * std::max(1.0f, want_w[s]))
        return ::testing::AssertionFailure() << "token " << t << " slot " << s << ": weight " << w[t * K + s] << ", want " << want_w[s];
    }
  }
  for (int64_t r = 0; r < T * K; ++r) {
    const int32_t e = ids[sorted[r]];
    if (row_experts[r] != e || r < off[e] || r >= off[e + 1])
      return ::testing::AssertionFailure() << "permuted row " << r << " is not in its expert's range";
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaMoeRouteVariants, RoutingRulesMatchTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  const Rule rules[] = {{"softmax-topk renormalised + bias", false, true, true},
                        {"softmax-topk unnormalised", false, false, false},
                        {"topk-softmax + bias (gpt-oss)", true, true, true},
                        {"topk-softmax", true, false, false}};
  const int64_t shapes[][3] = {{1, 4, 2}, {37, 32, 4}, {300, 128, 8}, {1100, 8, 2}, {2049, 512, 4}};
  for (const Rule& rule : rules)
    for (const auto& shape : shapes) {
      const int64_t T = shape[0], E = shape[1], K = shape[2];
      SCOPED_TRACE(testing::repro(41, T, E, std::string(rule.name) + " top_k=" + std::to_string(K)));
      const std::vector<float> logits = synthetic_activations(T, E, 41);
      const std::vector<float> bias = synthetic_activations(1, E, 42);
      DeviceBuffer<float> d_logits(logits.size()), d_bias(bias.size());
      CUDA_ASSERT(d_logits.upload(logits));
      CUDA_ASSERT(d_bias.upload(bias));
      // One CTA (no counter), then the top-k spread over CTAs with the last one ranking.
      DeviceBuffer<uint32_t> d_arrivals(1);
      CUDA_ASSERT(d_arrivals.upload(std::vector<uint32_t>{0}));
      for (const bool spread : {false, true}) {
        SCOPED_TRACE(spread ? "over CTAs" : "one CTA");
        RouteOutputs out(T, E, K);
        MoeRouteArgs a = out.args(T, E, K, rule, d_bias.get());
        a.logits = d_logits.get();
        a.arrivals = spread ? d_arrivals.get() : nullptr;
        const Status st = cuda_moe_route(a, nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_TRUE(picks_match_host(logits, bias, rule, T, E, K, out));
      }
      std::vector<uint32_t> arrivals;
      CUDA_ASSERT(d_arrivals.download(&arrivals));
      ASSERT_EQ(arrivals[0], 0u) << "the arrival counter is left for the next call";
    }
}

// The routing kernel's own router GEMM (decode sizes) against the host: x and the router's rows
// hold multiples of 1/16 and 1/32 (outliers 1.5x), so every product and partial sum is exact in
// f32 and the logits do not depend on the summation order; ties between equal logits then test
// the lower-id rule as well. Every rule, 1..8 tokens, 32..256 experts, widths that are not a
// multiple of 256 bytes.
TEST(CudaMoeRouteVariants, FusedRouterGemmRoutesAsTheHostLogits) {
  LLMQ_REQUIRE_GPU();
  const Rule rules[] = {{"softmax-topk renormalised + bias", false, true, true},
                        {"softmax-topk unnormalised", false, false, false},
                        {"topk-softmax + bias (gpt-oss)", true, true, true}};
  // {5, 8, 2, 8} and {8, 8, 2, 256} fit one CTA (no arrival between the router and the routing).
  const int64_t shapes[][4] = {{1, 32, 4, 2880}, {3, 128, 8, 2048}, {8, 256, 8, 72}, {5, 8, 2, 8}, {8, 8, 2, 256}};
  std::mt19937 rng(77);
  const auto grid_value = [&](float unit) {
    const int v = static_cast<int>(rng() % 17) - 8;
    const float outlier = rng() % 64 == 0 ? 12.0f / 8.0f : 1.0f;  // a few large values
    return (v == 0 ? 1.0f : static_cast<float>(v)) * unit * outlier;
  };
  for (const Rule& rule : rules)
    for (const auto& shape : shapes) {
      const int64_t T = shape[0], E = shape[1], K = shape[2], D = shape[3];
      SCOPED_TRACE(std::string(rule.name) + " T=" + std::to_string(T) + " E=" + std::to_string(E) + " K=" +
                   std::to_string(K) + " dim=" + std::to_string(D));
      ASSERT_TRUE(moe_route_computes_logits(T, E, D));
      std::vector<uint16_t> x(static_cast<size_t>(T * D)), w(static_cast<size_t>(E * D));
      std::vector<float> logits(static_cast<size_t>(T * E), 0.0f);
      for (uint16_t& v : x) v = float_to_bf16_bits(grid_value(1.0f / 8.0f));
      for (uint16_t& v : w) v = float_to_bf16_bits(grid_value(1.0f / 16.0f));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) {
          double acc = 0.0;
          for (int64_t k = 0; k < D; ++k) acc += double(bf16_bits_to_float(x[t * D + k])) * bf16_bits_to_float(w[e * D + k]);
          logits[t * E + e] = static_cast<float>(acc);  // exact: multiples of 1/512 far below 2^15
        }
      const std::vector<float> bias = synthetic_activations(1, E, 42);
      DeviceBuffer<uint16_t> d_x(x.size()), d_rw(w.size());
      DeviceBuffer<float> d_bias(bias.size()), d_logits(T * E);
      DeviceBuffer<uint32_t> d_arrivals(1);
      CUDA_ASSERT(d_x.upload(x));
      CUDA_ASSERT(d_rw.upload(w));
      CUDA_ASSERT(d_bias.upload(bias));
      CUDA_ASSERT(d_arrivals.upload(std::vector<uint32_t>{0}));
      // Stale logits that would route elsewhere: a read before the router wrote shows.
      std::vector<float> junk(static_cast<size_t>(T * E));
      for (size_t i = 0; i < junk.size(); ++i) junk[i] = (i % 3 == 0 ? 1e30f : -1e30f);
      CUDA_ASSERT(d_logits.upload(junk));
      RouteOutputs out(T, E, K);
      MoeRouteArgs a = out.args(T, E, K, rule, d_bias.get());
      a.router_x = d_x.get();
      a.router_w = d_rw.get();
      a.dim = D;
      a.logits = d_logits.get();
      a.arrivals = d_arrivals.get();
      // Twice on the same counter: the grid's last CTA must leave it zero for the next launch.
      for (int call = 0; call < 2; ++call) {
        const Status st = cuda_moe_route(a, nullptr);
        ASSERT_TRUE(st.ok()) << st.to_string();
        ASSERT_TRUE(picks_match_host(logits, bias, rule, T, E, K, out)) << "call " << call;
      }
      std::vector<float> got_logits;
      std::vector<uint32_t> arrivals;
      CUDA_ASSERT(d_arrivals.download(&arrivals));
      ASSERT_EQ(arrivals[0], 0u) << "the arrival counter is left for the next call";
      CUDA_ASSERT(d_logits.download(&got_logits));
      for (int64_t i = 0; i < T * E; ++i) ASSERT_EQ(got_logits[i], logits[i]) << "logit " << i;
    }
  // Past the fused sizes the call is refused, naming the limit.
  MoeRouteArgs a;
  a.tokens = kMoeRouteFusedMaxTokens + 1;
  a.experts = 8;
  a.top_k = 2;
  a.dim = 64;
  int32_t dummy = 0;
  a.router_w = &dummy;
  a.router_x = &dummy;
  a.logits = reinterpret_cast<float*>(&dummy);
  a.arrivals = reinterpret_cast<uint32_t*>(&dummy);
  a.topk_ids = a.expert_offsets = a.sorted_slots = a.slot_rows = &dummy;
  a.topk_weights = reinterpret_cast<float*>(&dummy);
  const Status st = cuda_moe_route(a, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("router_w"), std::string::npos) << st.to_string();
}

TEST(CudaMoeRouteVariants, CombineAddsEachExpertsBiasExactly) {
  LLMQ_REQUIRE_GPU();
  const int64_t top_k = 4, experts = 8, first = 2, biased = 4;  // experts 2..5 biased here
  // 53 tokens: a CTA per token; 2 tokens (decode): the columns spread over several CTAs too, with
  // widths that leave a partial CTA (2888) and no 16-byte path (13, 2883).
  for (const int64_t tokens : {int64_t{53}, int64_t{2}})
  for (const int64_t n : {int64_t{64}, int64_t{13}, int64_t{2888}, int64_t{2883}}) {
    if (tokens == 53 && n > 64) continue;
    SCOPED_TRACE("tokens=" + std::to_string(tokens) + " n=" + std::to_string(n));
    const int64_t P = tokens * top_k;
    std::mt19937 rng(12);
    std::vector<int32_t> slot_rows(static_cast<size_t>(P)), ids(static_cast<size_t>(P));
    std::iota(slot_rows.begin(), slot_rows.end(), 0);
    std::shuffle(slot_rows.begin(), slot_rows.end(), rng);
    for (int32_t& e : ids) e = static_cast<int32_t>(rng() % experts);
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
