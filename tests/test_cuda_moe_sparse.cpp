// The sparse top-k MoE path on the GPU, piece by piece against the CPU reference:
//   * routing (softmax, top-k with ties to the lower id, renormalised weights, the expert-major
//     permutation) equals a host implementation of transformer.cpp's rule exactly;
//   * the grouped expert GEMM, both kernels (decode-size streaming and wgmma), on skewed routings:
//     expert sizes expected x U(0.7, 1.3), empty experts, one hot expert; experts of different
//     magnitudes so that a row multiplied by the wrong expert or scale is caught;
//   * gather and combine (the un-permute) equal the same arithmetic on the host bit for bit.
// Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_moe.hpp"
#include "llmq/format.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/synthetic.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

// transformer.cpp's routing of one token, on the host.
void host_route(const float* logits, int64_t experts, int64_t top_k, int32_t* ids, float* weights) {
  std::vector<float> p(logits, logits + experts);
  float mx = p[0];
  for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, p[e]);
  float sum = 0.0f;
  for (float& v : p) sum += (v = std::exp(v - mx));
  for (float& v : p) v /= sum;
  std::vector<int64_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float total = 0.0f;  // in rank order, as the reference (and torch) sums the top-k values
  for (int64_t s = 0; s < top_k; ++s) total += p[order[s]];
  std::sort(order.begin(), order.begin() + top_k);
  for (int64_t s = 0; s < top_k; ++s) {
    ids[s] = static_cast<int32_t>(order[s]);
    weights[s] = p[order[s]] / total;
  }
}

// cuda_moe_route on host logits [tokens, experts]; every output downloaded.
struct Routed {
  std::vector<int32_t> ids, offsets, sorted, rows;
  std::vector<float> weights;
};
::testing::AssertionResult route_on_device(const std::vector<float>& logits, int64_t tokens, int64_t experts,
                                           int64_t top_k, Routed* out) {
  const int64_t slots = tokens * top_k;
  DeviceBuffer<float> d_logits(logits.size()), d_w(slots);
  DeviceBuffer<int32_t> d_ids(slots), d_off(experts + 1), d_sorted(slots), d_rows(slots);
  if (d_logits.upload(logits) != cudaSuccess) return ::testing::AssertionFailure() << "upload";
  MoeRouteArgs a;
  a.tokens = tokens;
  a.experts = experts;
  a.top_k = top_k;
  a.logits = d_logits.get();
  a.topk_ids = d_ids.get();
  a.topk_weights = d_w.get();
  a.expert_offsets = d_off.get();
  a.sorted_slots = d_sorted.get();
  a.slot_rows = d_rows.get();
  const Status st = cuda_moe_route(a, nullptr);
  if (!st.ok()) return ::testing::AssertionFailure() << st.to_string();
  if (cudaDeviceSynchronize() != cudaSuccess || d_ids.download(&out->ids) != cudaSuccess ||
      d_w.download(&out->weights) != cudaSuccess || d_off.download(&out->offsets) != cudaSuccess ||
      d_sorted.download(&out->sorted) != cudaSuccess || d_rows.download(&out->rows) != cudaSuccess)
    return ::testing::AssertionFailure() << "CUDA error running or downloading the routing";
  return ::testing::AssertionSuccess();
}

struct RouteCase {
  int64_t tokens, experts, top_k;
  float hot_bias;  // added to expert 3's logits: a large value sends every token there
};

TEST(CudaMoeSparse, RoutingMatchesTheCpuRuleAndPermutesStably) {
  LLMQ_REQUIRE_GPU();
  const RouteCase cases[] = {{1, 8, 2, 0}, {37, 8, 2, 0}, {2500, 8, 2, 0}, {300, 32, 4, 0},
                             {64, 8, 2, 30.0f}, {1100, 64, 6, 0}, {5, 4, 4, 0}};
  for (const RouteCase& c : cases) {
    SCOPED_TRACE(testing::repro(21, c.tokens, c.experts, "top_k=" + std::to_string(c.top_k)));
    std::vector<float> logits = synthetic_activations(c.tokens, c.experts, 21);
    for (int64_t t = 0; t < c.tokens; ++t) logits[t * c.experts + 3 % c.experts] += c.hot_bias;
    Routed r;
    ASSERT_TRUE(route_on_device(logits, c.tokens, c.experts, c.top_k, &r));
    const std::vector<int32_t>&ids = r.ids, &off = r.offsets, &sorted = r.sorted, &rows = r.rows;
    const std::vector<float>& w = r.weights;

    std::vector<int64_t> count(static_cast<size_t>(c.experts), 0);
    std::vector<int32_t> want_ids(static_cast<size_t>(c.top_k));
    std::vector<float> want_w(static_cast<size_t>(c.top_k));
    for (int64_t t = 0; t < c.tokens; ++t) {
      host_route(&logits[t * c.experts], c.experts, c.top_k, want_ids.data(), want_w.data());
      for (int64_t s = 0; s < c.top_k; ++s) {
        ASSERT_EQ(ids[t * c.top_k + s], want_ids[s]) << "token " << t << " slot " << s;
        // Device expf may differ from the host's by an ulp: the renormalised weights by a few.
        ASSERT_NEAR(w[t * c.top_k + s], want_w[s], 4e-7f * std::max(1.0f, want_w[s])) << "token " << t;
        ++count[static_cast<size_t>(want_ids[s])];
      }
    }
    ASSERT_EQ(off[0], 0);
    for (int64_t e = 0; e < c.experts; ++e) ASSERT_EQ(off[e + 1] - off[e], count[e]) << "expert " << e;
    // Each expert's rows hold its slots in ascending order, and slot_rows is the inverse.
    for (int64_t e = 0; e < c.experts; ++e)
      for (int32_t r = off[e]; r < off[e + 1]; ++r) {
        const int32_t slot = sorted[r];
        ASSERT_EQ(ids[slot], e) << "row " << r;
        if (r > off[e]) ASSERT_GT(slot, sorted[r - 1]) << "row " << r;
        ASSERT_EQ(rows[slot], r) << "slot " << slot;
      }
    if (c.hot_bias > 0) ASSERT_EQ(count[3], c.tokens) << "the hot expert takes every token";
  }
}

// Router logits that overflowed (NaN, +-Inf) must still route every token to k distinct valid
// experts with finite weights summing to 1: an out-of-range id would write outside the permutation.
TEST(CudaMoeSparse, NonFiniteRouterLogitsStillRouteValidly) {
  LLMQ_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t E = 8;
  for (const int64_t K : {int64_t{2}, int64_t{3}}) {
    std::vector<float> logits = synthetic_activations(6, E, 23);
    logits[0 * E + 0] = nan;                                  // one NaN
    for (int64_t e = 0; e < E; ++e) logits[1 * E + e] = nan;  // all NaN
    logits[2 * E + 5] = inf;                                  // one +inf
    for (int64_t e = 0; e < E; ++e) logits[3 * E + e] = -inf;  // all -inf
    logits[4 * E + 1] = inf;
    logits[4 * E + 6] = inf;                                  // two +inf
    const int64_t T = 6, slots = T * K;
    Routed r;
    ASSERT_TRUE(route_on_device(logits, T, E, K, &r));
    const std::vector<int32_t>&ids = r.ids, &off = r.offsets;
    const std::vector<float>& w = r.weights;
    for (int64_t t = 0; t < T; ++t) {
      float total = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        const int32_t id = ids[t * K + s];
        ASSERT_GE(id, 0) << "token " << t;
        ASSERT_LT(id, E) << "token " << t;
        if (s > 0) ASSERT_GT(id, ids[t * K + s - 1]) << "token " << t << ": ids distinct and ascending";
        ASSERT_TRUE(std::isfinite(w[t * K + s])) << "token " << t;
        total += w[t * K + s];
      }
      EXPECT_NEAR(total, 1.0f, 1e-5f) << "token " << t;
    }
    EXPECT_EQ(off[E], slots);
    if (K == 2) {  // two +inf logits share the probability and are both picked
      EXPECT_EQ(ids[4 * K + 0], 1);
      EXPECT_EQ(ids[4 * K + 1], 6);
    }
  }
}

// Group sizes for `rows` permuted rows over `experts`.
enum class Skew { kUniform, kEmpty, kHot };
std::vector<int64_t> group_sizes(int64_t rows, int64_t experts, Skew skew, uint64_t seed) {
  std::vector<int64_t> sizes(static_cast<size_t>(experts), 0);
  if (skew == Skew::kHot) {
    sizes[2 % experts] = rows;
    return sizes;
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.7, 1.3);
  std::vector<double> want(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) want[e] = (skew == Skew::kEmpty && e % 3 == 1) ? 0.0 : u(rng);
  const double total = std::accumulate(want.begin(), want.end(), 0.0);
  int64_t given = 0;
  for (int64_t e = 0; e < experts; ++e) given += (sizes[e] = static_cast<int64_t>(std::floor(rows * want[e] / total)));
  for (int64_t e = 0; given < rows; e = (e + 1) % experts)
    if (want[e] > 0) ++sizes[e], ++given;
  return sizes;
}

const char* skew_name(Skew s) { return s == Skew::kUniform ? "uniform" : s == Skew::kEmpty ? "empty" : "hot"; }

struct GemmCase {
  int64_t experts, tokens, top_k, k, n;
};

TEST(CudaMoeSparse, GroupedGemmMatchesTheCpuReferenceOnSkewedRoutings) {
  LLMQ_REQUIRE_GPU();
  const GemmCase cases[] = {{8, 1, 2, 512, 384}, {8, 5, 2, 320, 208}, {8, 16, 2, 512, 256},
                            {8, 64, 2, 256, 384}, {32, 40, 4, 2880 / 9, 320}, {8, 200, 2, 512, 384},
                            {4, 700, 2, 384, 272}};
  for (const GemmCase& c : cases) {
    for (Skew skew : {Skew::kUniform, Skew::kEmpty, Skew::kHot}) {
      const int64_t P = c.tokens * c.top_k, E = c.experts, K = c.k, N = c.n;
      // A token meets an expert once: a hot expert holds at most `tokens` rows.
      std::vector<int64_t> sizes = group_sizes(P, E, skew, 5);
      if (skew == Skew::kHot) {
        sizes.assign(static_cast<size_t>(E), 0);
        sizes[2] = c.tokens;
        for (int64_t rest = P - c.tokens, e = 3; rest > 0; e = (e + 1) % E)
          if (e != 2) ++sizes[e], --rest;
      }
      std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
      for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + static_cast<int32_t>(sizes[e]);
      // Tokens' codes (per-token scales) and the token behind each permuted row.
      std::vector<float> x = synthetic_activations(c.tokens, K, 31);
      QuantizedTensor qx;
      ASSERT_TRUE(quantize(TensorView{x.data(), DType::kF32, {c.tokens, K}}, QuantSpec::per_token(DType::kE4M3), &qx).ok());
      const uint8_t* xc = qx.data.data_as<uint8_t>();
      const float* xs = qx.scales.scales.data_as<float>();
      std::vector<int32_t> row_token(static_cast<size_t>(P));
      for (int64_t p = 0; p < P; ++p) row_token[p] = static_cast<int32_t>((p * 7 + 3) % c.tokens);
      std::vector<uint8_t> a_perm(static_cast<size_t>(P * K));
      std::vector<float> s_perm(static_cast<size_t>(P));
      for (int64_t p = 0; p < P; ++p) {
        std::copy(xc + row_token[p] * K, xc + (row_token[p] + 1) * K, a_perm.begin() + p * K);
        s_perm[p] = xs[row_token[p]];
      }
      std::vector<uint8_t> w_codes;
      std::vector<float> w_scales;
      for (int64_t e = 0; e < E; ++e) {
        std::vector<float> w = synthetic_weights(N, K, 100 + static_cast<uint64_t>(e));
        for (float& v : w) v *= static_cast<float>(1 << (e % 5));
        QuantizedTensor qw;
        ASSERT_TRUE(quantize(TensorView{w.data(), DType::kF32, {N, K}}, QuantSpec::per_channel(DType::kE4M3), &qw).ok());
        w_codes.insert(w_codes.end(), qw.data.data_as<uint8_t>(), qw.data.data_as<uint8_t>() + N * K);
        w_scales.insert(w_scales.end(), qw.scales.scales.data_as<float>(), qw.scales.scales.data_as<float>() + N);
      }
      DeviceBuffer<uint8_t> d_x(static_cast<size_t>(c.tokens * K)), d_ap(a_perm.size()), d_w(w_codes.size());
      DeviceBuffer<float> d_xs(static_cast<size_t>(c.tokens)), d_sp(s_perm.size()), d_ws(w_scales.size());
      DeviceBuffer<int32_t> d_off(off.size()), d_rt(row_token.size());
      DeviceBuffer<uint16_t> d_y(static_cast<size_t>(P * N));
      CUDA_ASSERT(d_x.upload(xc, static_cast<size_t>(c.tokens * K)));
      CUDA_ASSERT(d_xs.upload(xs, static_cast<size_t>(c.tokens)));
      CUDA_ASSERT(d_ap.upload(a_perm));
      CUDA_ASSERT(d_sp.upload(s_perm));
      CUDA_ASSERT(d_w.upload(w_codes));
      CUDA_ASSERT(d_ws.upload(w_scales));
      CUDA_ASSERT(d_off.upload(off));
      CUDA_ASSERT(d_rt.upload(row_token));

      // The CPU reference of every output, in double: row p meets its expert's weights only.
      std::vector<double> reference(static_cast<size_t>(P * N));
      std::vector<float> a_dec(a_perm.size()), w_dec(w_codes.size());
      for (size_t i = 0; i < a_dec.size(); ++i) a_dec[i] = fp8_to_float(a_perm[i], DType::kE4M3);
      for (size_t i = 0; i < w_dec.size(); ++i) w_dec[i] = fp8_to_float(w_codes[i], DType::kE4M3);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t p = off[e]; p < off[e + 1]; ++p)
          for (int64_t j = 0; j < N; ++j) {
            double acc = 0;
            const float* ar = &a_dec[p * K];
            const float* wr = &w_dec[(e * N + j) * K];
            for (int64_t i = 0; i < K; ++i) acc += static_cast<double>(ar[i]) * wr[i];
            reference[p * N + j] = acc * s_perm[p] * w_scales[e * N + j];
          }
      struct Variant {
        MoeGemmKernel kernel;
        bool rows_in_place;
        bool fast = false;  // MoeGroupedGemm::fast_accumulation
        int64_t block_rows = 0;  // MoeGroupedGemm::wgmma_block_rows (0: the kernel's choice)
        int64_t block_cols = 0;  // MoeGroupedGemm::wgmma_block_cols (0: the kernel's choice)
      };
      std::vector<Variant> variants = {{MoeGemmKernel::kDecode, true}, {MoeGemmKernel::kDecode, false}};
      CudaDeviceInfo info;
      ASSERT_TRUE(query_cuda_device(0, &info).ok());
      if (info.major == 9 && info.minor == 0) {
        variants.push_back({MoeGemmKernel::kWgmma, false});
        variants.push_back({MoeGemmKernel::kWgmma, false, true});
        variants.push_back({MoeGemmKernel::kWgmma, false, false, 64});  // both tile heights on every routing
        variants.push_back({MoeGemmKernel::kWgmma, false, false, 128, 128});
        variants.push_back({MoeGemmKernel::kWgmma, false, true, 64});
        variants.push_back({MoeGemmKernel::kWgmma, false, true, 128, 128});
        variants.push_back({MoeGemmKernel::kWgmma, false, false, 128, 192});  // the 128-column bits
        variants.push_back({MoeGemmKernel::kWgmma, false, true, 128, 192});
      }
      std::vector<uint16_t> y_cols128[2];  // 128-row, 128-column tiles' output, promoted and fast
      for (const Variant& v : variants) {
        SCOPED_TRACE(testing::repro(31, P, K, std::string("experts=") + std::to_string(E) + " n=" + std::to_string(N) +
                                                  " " + skew_name(skew) + " kernel=" + moe_gemm_kernel_name(v.kernel) +
                                                  (v.rows_in_place ? " a_rows" : " gathered") + (v.fast ? " fast" : "") +
                                                  " block_rows=" + std::to_string(v.block_rows) +
                                                  " block_cols=" + std::to_string(v.block_cols)));
        CUDA_ASSERT(d_y.fill_bytes(0xFF));
        MoeGroupedGemm g;
        g.rows = P;
        g.experts = E;
        g.n = N;
        g.k = K;
        g.max_rows_per_expert = c.tokens;
        g.expert_offsets = d_off.get();
        if (v.rows_in_place) {
          g.a = d_x.get();
          g.a_rows = d_rt.get();
          g.a_rows_count = c.tokens;
          g.a_scale = d_xs.get();
        } else {
          g.a = d_ap.get();
          g.a_scale = d_sp.get();
        }
        g.w = d_w.get();
        g.w_scale = d_ws.get();
        g.d = d_y.get();
        g.fast_accumulation = v.fast;
        g.wgmma_block_rows = v.block_rows;
        g.wgmma_block_cols = v.block_cols;
        const Status st = cuda_moe_grouped_gemm(g, nullptr, v.kernel);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<uint16_t> y;
        CUDA_ASSERT(d_y.download(&y));
        // 192-column tiles sum each output in the 128-column tiles' order: the same bits.
        if (v.kernel == MoeGemmKernel::kWgmma && v.block_rows == 128 && v.block_cols == 128) y_cols128[v.fast] = y;
        if (v.block_cols == 192) {
          ASSERT_EQ(y.size(), y_cols128[v.fast].size()) << "the 128-column variant runs first";
          EXPECT_EQ(0, std::memcmp(y.data(), y_cols128[v.fast].data(), y.size() * 2)) << "192 columns differ from 128";
        }
        double worst = 0;
        for (int64_t e = 0; e < E; ++e) {
          double diff = 0, norm = 0;
          for (int64_t p = off[e]; p < off[e + 1]; ++p)
            for (int64_t j = 0; j < N; ++j) {
              const double want = reference[p * N + j];
              const double got = bf16_bits_to_float(y[p * N + j]);
              ASSERT_FALSE(std::isnan(got)) << "row " << p << " col " << j << " not written";
              diff += (got - want) * (got - want);
              norm += want * want;
            }
          if (norm == 0) continue;
          const double err = std::sqrt(diff / norm);
          // FP32 accumulation in another order and one BF16 rounding (~2^-9 relative at most); the
          // tensor core's own accumulator over all of K (fast) keeps fewer bits: the bound cuBLASLt's
          // FAST_ACCUM is held to (test_cuda_fp8_gemm_plumbing).
          EXPECT_LT(err, v.fast ? 1e-2 : 4e-3) << "expert " << e << " (" << sizes[e] << " rows)";
          worst = std::max(worst, err);
        }
        std::printf("  E=%lld tokens=%lld rows=%lld K=%lld N=%lld %-7s %-6s %-8s rows/tile %3lld worst expert rel frobenius %.2e\n",
                    static_cast<long long>(E), static_cast<long long>(c.tokens), static_cast<long long>(P),
                    static_cast<long long>(K), static_cast<long long>(N), skew_name(skew),
                    moe_gemm_kernel_name(v.kernel), v.rows_in_place ? "a_rows" : v.fast ? "fast" : "gathered",
                    static_cast<long long>(v.block_rows), worst);
      }
    }
  }
}

// BF16 experts (the baseline FP8 is measured against) through both kernels: BF16 x BF16 products
// summed in FP32, one BF16 rounding; the reference sums the same BF16 values in double.
TEST(CudaMoeSparse, Bf16GroupedGemmMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  const GemmCase cases[] = {{8, 1, 2, 512, 384}, {8, 16, 2, 320, 208}, {32, 40, 4, 320, 320}, {8, 200, 2, 512, 384}};
  for (const GemmCase& c : cases) {
    for (Skew skew : {Skew::kUniform, Skew::kEmpty}) {
      const int64_t P = c.tokens * c.top_k, E = c.experts, K = c.k, N = c.n;
      const std::vector<int64_t> sizes = group_sizes(P, E, skew, 6);
      std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
      for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + static_cast<int32_t>(sizes[e]);
      std::vector<float> xf = synthetic_activations(c.tokens, K, 41);
      std::vector<uint16_t> x(xf.size()), w(static_cast<size_t>(E * N * K));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16_bits(xf[i]);
      for (int64_t e = 0; e < E; ++e) {
        const std::vector<float> we = synthetic_weights(N, K, 200 + static_cast<uint64_t>(e));
        for (int64_t i = 0; i < N * K; ++i) w[e * N * K + i] = float_to_bf16_bits(we[i] * static_cast<float>(1 << (e % 5)));
      }
      std::vector<int32_t> row_token(static_cast<size_t>(P));
      std::vector<uint16_t> a_perm(static_cast<size_t>(P * K));
      for (int64_t p = 0; p < P; ++p) {
        row_token[p] = static_cast<int32_t>((p * 5 + 1) % c.tokens);
        std::copy(&x[row_token[p] * K], &x[(row_token[p] + 1) * K], a_perm.begin() + p * K);
      }
      DeviceBuffer<uint16_t> d_x(x.size()), d_ap(a_perm.size()), d_w(w.size()), d_y(static_cast<size_t>(P * N));
      DeviceBuffer<int32_t> d_off(off.size()), d_rt(row_token.size());
      CUDA_ASSERT(d_x.upload(x));
      CUDA_ASSERT(d_ap.upload(a_perm));
      CUDA_ASSERT(d_w.upload(w));
      CUDA_ASSERT(d_off.upload(off));
      CUDA_ASSERT(d_rt.upload(row_token));
      // (kernel, rows in place, the wgmma kernel's tile rows: 0 its choice)
      std::vector<std::tuple<MoeGemmKernel, bool, int64_t>> variants = {{MoeGemmKernel::kDecode, true, 0},
                                                                        {MoeGemmKernel::kDecode, false, 0}};
      CudaDeviceInfo info;
      ASSERT_TRUE(query_cuda_device(0, &info).ok());
      if (info.major == 9 && info.minor == 0)
        for (const int64_t rows : {64, 128}) variants.push_back({MoeGemmKernel::kWgmma, false, rows});
      for (const auto& [kernel, in_place, block_rows] : variants) {
        SCOPED_TRACE(testing::repro(41, P, K, std::string("bf16 experts=") + std::to_string(E) + " n=" + std::to_string(N) +
                                                  " " + skew_name(skew) + " kernel=" + moe_gemm_kernel_name(kernel) +
                                                  (in_place ? " a_rows" : " gathered") + " block_rows=" + std::to_string(block_rows)));
        CUDA_ASSERT(d_y.fill_bytes(0xFF));
        MoeGroupedGemm g;
        g.rows = P;
        g.experts = E;
        g.n = N;
        g.k = K;
        g.max_rows_per_expert = c.tokens;
        g.expert_offsets = d_off.get();
        g.a_dtype = DType::kBF16;
        g.w_dtype = DType::kBF16;
        g.wgmma_block_rows = block_rows;
        if (in_place) {
          g.a = d_x.get();
          g.a_rows = d_rt.get();
          g.a_rows_count = c.tokens;
        } else {
          g.a = d_ap.get();
        }
        g.w = d_w.get();
        g.d = d_y.get();
        const Status st = cuda_moe_grouped_gemm(g, nullptr, kernel);
        ASSERT_TRUE(st.ok()) << st.to_string();
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<uint16_t> y;
        CUDA_ASSERT(d_y.download(&y));
        double worst = 0;
        for (int64_t e = 0; e < E; ++e) {
          double diff = 0, norm = 0;
          for (int64_t p = off[e]; p < off[e + 1]; ++p)
            for (int64_t j = 0; j < N; ++j) {
              double want = 0;
              for (int64_t i = 0; i < K; ++i)
                want += static_cast<double>(bf16_bits_to_float(a_perm[p * K + i])) * bf16_bits_to_float(w[(e * N + j) * K + i]);
              const double got = bf16_bits_to_float(y[p * N + j]);
              ASSERT_FALSE(std::isnan(got)) << "row " << p << " col " << j << " not written";
              diff += (got - want) * (got - want);
              norm += want * want;
            }
          if (norm == 0) continue;
          const double err = std::sqrt(diff / norm);
          EXPECT_LT(err, 4e-3) << "expert " << e;
          worst = std::max(worst, err);
        }
        std::printf("  bf16 E=%lld tokens=%lld K=%lld N=%lld %-7s %-6s %-8s worst expert rel frobenius %.2e\n",
                    static_cast<long long>(E), static_cast<long long>(c.tokens), static_cast<long long>(K),
                    static_cast<long long>(N), skew_name(skew), moe_gemm_kernel_name(kernel), in_place ? "a_rows" : "gathered",
                    worst);
      }
    }
  }
}

// DeepSeek-style block scales: 1x128 activation blocks x 128x128 weight blocks per expert, applied
// per K block by both kernels, against the CPU reference summing block by block in double. K not a
// multiple of 128 (a partial last block) included.
TEST(CudaMoeSparse, BlockScaledGroupedGemmMatchesTheCpuReference) {
  LLMQ_REQUIRE_GPU();
  CudaDeviceInfo info;
  ASSERT_TRUE(query_cuda_device(0, &info).ok());
  const GemmCase cases[] = {{8, 1, 2, 512, 256}, {8, 37, 2, 448, 384}, {4, 300, 2, 384, 128}};
  for (const GemmCase& c : cases) {
    for (Skew skew : {Skew::kUniform, Skew::kEmpty, Skew::kHot}) {
      const int64_t P = c.tokens * c.top_k, E = c.experts, K = c.k, N = c.n, KB = (K + 127) / 128;
      std::vector<int64_t> sizes = group_sizes(P, E, skew, 7);
      std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
      for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + static_cast<int32_t>(sizes[e]);
      std::vector<float> x = synthetic_activations(P, K, 51);
      QuantizedTensor qx;
      ASSERT_TRUE(quantize(TensorView{x.data(), DType::kF32, {P, K}}, QuantSpec::per_block(DType::kE4M3, 1, 128), &qx).ok());
      const std::vector<uint8_t> a(qx.data.data_as<uint8_t>(), qx.data.data_as<uint8_t>() + P * K);
      const std::vector<float> as(qx.scales.scales.data_as<float>(), qx.scales.scales.data_as<float>() + P * KB);
      std::vector<uint8_t> w;
      std::vector<float> ws;
      for (int64_t e = 0; e < E; ++e) {
        std::vector<float> we = synthetic_weights(N, K, 300 + static_cast<uint64_t>(e));
        for (float& v : we) v *= static_cast<float>(1 << (e % 5));
        QuantizedTensor qw;
        ASSERT_TRUE(quantize(TensorView{we.data(), DType::kF32, {N, K}}, QuantSpec::per_block(DType::kE4M3, 128, 128), &qw).ok());
        w.insert(w.end(), qw.data.data_as<uint8_t>(), qw.data.data_as<uint8_t>() + N * K);
        ws.insert(ws.end(), qw.scales.scales.data_as<float>(), qw.scales.scales.data_as<float>() + (N / 128) * KB);
      }
      DeviceBuffer<uint8_t> d_a(a.size()), d_w(w.size());
      DeviceBuffer<float> d_as(as.size()), d_ws(ws.size());
      DeviceBuffer<int32_t> d_off(off.size());
      DeviceBuffer<uint16_t> d_y(static_cast<size_t>(P * N));
      CUDA_ASSERT(d_a.upload(a));
      CUDA_ASSERT(d_w.upload(w));
      CUDA_ASSERT(d_as.upload(as));
      CUDA_ASSERT(d_ws.upload(ws));
      CUDA_ASSERT(d_off.upload(off));
      // (kernel, the wgmma kernel's tile rows) with both tile heights forced on every routing.
      for (const auto& [kernel, block_rows] : {std::pair{MoeGemmKernel::kDecode, int64_t{0}},
                                               std::pair{MoeGemmKernel::kWgmma, int64_t{64}},
                                               std::pair{MoeGemmKernel::kWgmma, int64_t{128}}}) {
      if (kernel == MoeGemmKernel::kWgmma && !(info.major == 9 && info.minor == 0)) continue;
      CUDA_ASSERT(d_y.fill_bytes(0xFF));
      SCOPED_TRACE(testing::repro(51, P, K, std::string("block experts=") + std::to_string(E) + " n=" + std::to_string(N) + " " +
                                                skew_name(skew) + " kernel=" + moe_gemm_kernel_name(kernel) +
                                                " block_rows=" + std::to_string(block_rows)));
      MoeGroupedGemm g;
      g.rows = P;
      g.experts = E;
      g.n = N;
      g.k = K;
      g.max_rows_per_expert = c.tokens;
      g.expert_offsets = d_off.get();
      g.a = d_a.get();
      g.a_scale = d_as.get();
      g.w = d_w.get();
      g.w_scale = d_ws.get();
      g.block_scales = true;
      g.wgmma_block_rows = block_rows;
      g.d = d_y.get();
      const Status st = cuda_moe_grouped_gemm(g, nullptr, kernel);
      ASSERT_TRUE(st.ok()) << st.to_string();
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<uint16_t> y;
      CUDA_ASSERT(d_y.download(&y));
      double worst = 0;
      for (int64_t e = 0; e < E; ++e) {
        double diff = 0, norm = 0;
        for (int64_t p = off[e]; p < off[e + 1]; ++p)
          for (int64_t j = 0; j < N; ++j) {
            double want = 0;
            for (int64_t kb = 0; kb < KB; ++kb) {
              double part = 0;
              for (int64_t i = kb * 128; i < std::min(K, kb * 128 + 128); ++i)
                part += static_cast<double>(fp8_to_float(a[p * K + i], DType::kE4M3)) *
                        fp8_to_float(w[(e * N + j) * K + i], DType::kE4M3);
              want += part * as[p * KB + kb] * ws[(e * (N / 128) + j / 128) * KB + kb];
            }
            const double got = bf16_bits_to_float(y[p * N + j]);
            ASSERT_FALSE(std::isnan(got)) << "row " << p << " col " << j << " not written";
            diff += (got - want) * (got - want);
            norm += want * want;
          }
        if (norm == 0) continue;
        const double err = std::sqrt(diff / norm);
        EXPECT_LT(err, 4e-3) << "expert " << e;
        worst = std::max(worst, err);
      }
      std::printf("  block E=%lld tokens=%lld K=%lld N=%lld %-7s %-6s worst expert rel frobenius %.2e\n", static_cast<long long>(E),
                  static_cast<long long>(c.tokens), static_cast<long long>(K), static_cast<long long>(N), skew_name(skew),
                  moe_gemm_kernel_name(kernel), worst);
      }
    }
  }
}

TEST(CudaMoeSparse, GatherAndCombineAreExact) {
  LLMQ_REQUIRE_GPU();
  const int64_t tokens = 77, top_k = 3, k = 96, n_cols[] = {64, 13};
  const int64_t P = tokens * top_k;
  std::mt19937 rng(9);
  std::vector<int32_t> sorted(static_cast<size_t>(P));
  std::iota(sorted.begin(), sorted.end(), 0);
  std::shuffle(sorted.begin(), sorted.end(), rng);
  std::vector<int32_t> slot_rows(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) slot_rows[sorted[p]] = static_cast<int32_t>(p);
  std::vector<uint8_t> codes(static_cast<size_t>(tokens * k));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(rng() & 0x7E);
  std::vector<float> scales = synthetic_activations(1, tokens, 4);
  DeviceBuffer<uint8_t> d_codes(codes.size()), d_out(static_cast<size_t>(P * k));
  DeviceBuffer<float> d_scales(scales.size()), d_out_s(static_cast<size_t>(P));
  DeviceBuffer<int32_t> d_sorted(sorted.size()), d_rows(slot_rows.size());
  CUDA_ASSERT(d_codes.upload(codes));
  CUDA_ASSERT(d_scales.upload(scales));
  CUDA_ASSERT(d_sorted.upload(sorted));
  CUDA_ASSERT(d_rows.upload(slot_rows));
  MoeGatherArgs g;
  g.rows = P;
  g.top_k = top_k;
  g.k = k;
  g.src_codes = d_codes.get();
  g.src_scales = d_scales.get();
  g.sorted_slots = d_sorted.get();
  g.dst_codes = d_out.get();
  g.dst_scales = d_out_s.get();
  ASSERT_TRUE(cuda_moe_gather(g, nullptr).ok());
  std::vector<uint8_t> out;
  std::vector<float> out_s;
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(d_out.download(&out));
  CUDA_ASSERT(d_out_s.download(&out_s));
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t = sorted[p] / top_k;
    ASSERT_EQ(out_s[p], scales[t]) << "row " << p;
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(out[p * k + i], codes[t * k + i]) << "row " << p;
  }

  for (int64_t n : n_cols) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> yf = synthetic_activations(P, n, 5);
    std::vector<uint16_t> y(yf.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = float_to_bf16_bits(yf[i]);
    std::vector<float> w = synthetic_activations(tokens, top_k, 6);
    for (float& v : w) v = std::fabs(v) + 0.01f;
    DeviceBuffer<uint16_t> d_y(y.size()), d_o(static_cast<size_t>(tokens * n));
    DeviceBuffer<float> d_w(w.size());
    CUDA_ASSERT(d_y.upload(y));
    CUDA_ASSERT(d_w.upload(w));
    MoeCombineArgs c;
    c.tokens = tokens;
    c.top_k = top_k;
    c.n = n;
    c.y = d_y.get();
    c.topk_weights = d_w.get();
    c.slot_rows = d_rows.get();
    c.out = d_o.get();
    ASSERT_TRUE(cuda_moe_combine(c, nullptr).ok());
    std::vector<uint16_t> o;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_o.download(&o));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t s = 0; s < top_k; ++s) {
          const float prod = w[t * top_k + s] * bf16_bits_to_float(y[slot_rows[t * top_k + s] * n + j]);
          acc = acc + prod;
        }
        ASSERT_EQ(o[t * n + j], float_to_bf16_bits(acc)) << "token " << t << " col " << j;
      }
  }
}

TEST(CudaMoeSparse, RefusesBadArgumentsNamingThem) {
  MoeRouteArgs r;
  r.tokens = 4;
  r.experts = 8;
  r.top_k = 9;
  Status st = cuda_moe_route(r, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("top_k"), std::string::npos) << st.to_string();
  r.top_k = 2;
  const Status no_offsets = cuda_moe_route(r, nullptr);
  EXPECT_NE(no_offsets.message().find("expert_offsets"), std::string::npos) << no_offsets.to_string();

  MoeGroupedGemm g;
  g.rows = 4;
  g.experts = 2;
  g.n = 16;
  g.k = 24;
  const Status bad_k = cuda_moe_grouped_gemm(g, nullptr);
  EXPECT_EQ(bad_k.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_k.message().find("k:"), std::string::npos) << bad_k.to_string();
  g.k = 32;
  const Status no_groups = cuda_moe_grouped_gemm(g, nullptr);
  EXPECT_NE(no_groups.message().find("expert_offsets"), std::string::npos) << no_groups.to_string();
  MoeGroupedGemm fast_block = g;  // the tensor core's own accumulator: per-channel FP8 only
  fast_block.fast_accumulation = true;
  fast_block.block_scales = true;
  const Status fast = cuda_moe_grouped_gemm(fast_block, nullptr);
  EXPECT_EQ(fast.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fast.message().find("fast_accumulation"), std::string::npos) << fast.to_string();
  MoeGroupedGemm odd_tiles = g;  // the wgmma kernel's tiles are 64 or 128 rows
  odd_tiles.wgmma_block_rows = 96;
  EXPECT_NE(cuda_moe_grouped_gemm(odd_tiles, nullptr).message().find("wgmma_block_rows"), std::string::npos);
  MoeGroupedGemm odd_cols = g;  // 128 or 192 columns
  odd_cols.wgmma_block_cols = 256;
  EXPECT_NE(cuda_moe_grouped_gemm(odd_cols, nullptr).message().find("wgmma_block_cols"), std::string::npos);
  MoeGroupedGemm wide_short = g;  // 192 columns only in 128-row tiles
  wide_short.wgmma_block_cols = 192;
  wide_short.wgmma_block_rows = 64;
  EXPECT_NE(cuda_moe_grouped_gemm(wide_short, nullptr).message().find("wgmma_block_cols"), std::string::npos);
  MoeGroupedGemm wide_block = g;  // nor with block scales
  wide_block.wgmma_block_cols = 192;
  wide_block.block_scales = true;
  EXPECT_NE(cuda_moe_grouped_gemm(wide_block, nullptr).message().find("wgmma_block_cols"), std::string::npos);
  MoeGroupedGemm fast_bf16 = g;  // BF16 experts accumulate in FP32 already: the flag is refused, not ignored
  fast_bf16.fast_accumulation = true;
  fast_bf16.a_dtype = DType::kBF16;
  fast_bf16.w_dtype = DType::kBF16;
  EXPECT_NE(cuda_moe_grouped_gemm(fast_bf16, nullptr).message().find("fast_accumulation"), std::string::npos);

  MoeCombineArgs c;
  c.tokens = 2;
  c.top_k = 17;
  c.n = 8;
  EXPECT_NE(cuda_moe_combine(c, nullptr).message().find("top_k"), std::string::npos);
}

}  // namespace
// The wgmma kernel's tile shape rules (host only).
TEST(CudaMoeSparse, TileRulesTakeWideTilesForPrefillSizedExperts) {
  EXPECT_EQ(moe_wgmma_block_rows(512 * 8, 128), 64);   // Qwen3-30B-A3B decode: 32 rows an expert
  EXPECT_EQ(moe_wgmma_block_rows(4096 * 2, 8), 128);
  EXPECT_EQ(moe_wgmma_block_cols(4096 * 2, 8, 14336), 192);  // Mixtral prefill: 1024 rows an expert
  EXPECT_EQ(moe_wgmma_block_cols(4096 * 4, 32, 2880), 192);  // gpt-oss-20b: 512
  EXPECT_EQ(moe_wgmma_block_cols(512 * 2, 8, 14336), 128);   // 128 rows an expert: 192 lost 2%
  EXPECT_EQ(moe_wgmma_block_cols(4096 * 2, 8, 128), 128);    // narrower than a 192-column tile
  EXPECT_EQ(moe_wgmma_block_cols(100, 0, 14336), 128);
  EXPECT_EQ(moe_wgmma_block_cols(256 * 8, 8, 192), 192);  // the boundaries
  EXPECT_EQ(moe_wgmma_block_cols(255 * 8, 8, 192), 128);
  EXPECT_EQ(moe_wgmma_block_cols(256 * 8, 8, 191), 128);
}

}  // namespace llmq
