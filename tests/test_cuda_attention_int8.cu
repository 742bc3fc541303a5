// The INT8 flash-attention kernels (half- and full-INT8) against the CPU specification (quant_attention.hpp, variant
// half-int8) on the same codes: they differ only in FP32 operation order and the SFU's exp2, so the
// outputs agree to well under the variant's own error against float; and the kernel's error
// against float matches the specification's. Causal and not, GQA, head dims 64 and 128, lengths
// that are not multiples of the tile, a cached prefix (q_len < kv_len). Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"
#include "llmq/quant_attention.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

// Per-row 8-bit codes as the specification makes them: scale absmax / 127 (INT8) or / 448 (E4M3),
// code = RNE(x * (1 / scale)).
int8_t code8(float x, float inv, bool fp8);

void quantize_rows(const std::vector<float>& x, int64_t rows, int64_t d, std::vector<int8_t>* codes,
                   std::vector<float>* scales, bool fp8 = false) {
  codes->resize(x.size());
  scales->resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0.f;
    for (int64_t c = 0; c < d; ++c) m = std::max(m, std::fabs(x[r * d + c]));
    const float s = m > 0.f ? m / (fp8 ? 448.f : 127.f) : 1.f, inv = 1.f / s;
    (*scales)[r] = s;
    for (int64_t c = 0; c < d; ++c) (*codes)[r * d + c] = code8(x[r * d + c], inv, fp8);
  }
}

struct Case {
  int64_t q_len, kv_len, heads, kv_heads, d;
  bool causal;
};

TEST(CudaHalfInt8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  const Case cases[] = {{200, 200, 4, 2, 128, true}, {333, 333, 4, 4, 64, false}, {70, 300, 8, 2, 128, true},
                        {1, 129, 2, 1, 64, true},   {513, 513, 2, 2, 128, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE("q_len=" + std::to_string(c.q_len) + " kv_len=" + std::to_string(c.kv_len) + " heads=" +
                 std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d=" + std::to_string(c.d) +
                 (c.causal ? " causal" : ""));
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> q(static_cast<size_t>(c.q_len * c.heads * c.d)), k(static_cast<size_t>(c.kv_len * c.kv_heads * c.d)),
        v(k.size());
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    AttentionProblem p;
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.head_dim = c.d;
    p.causal = c.causal;
    QuantAttentionOptions spec;
    spec.variant = AttentionVariant::kHalfInt8;
    std::vector<float> want_spec(q.size()), want_float(q.size());
    ASSERT_TRUE(quant_attention_reference(p, spec, q.data(), k.data(), v.data(), want_spec.data()).ok());
    QuantAttentionOptions fo;
    fo.variant = AttentionVariant::kFloat;
    ASSERT_TRUE(quant_attention_reference(p, fo, q.data(), k.data(), v.data(), want_float.data()).ok());

    std::vector<int8_t> q8, k8;
    std::vector<float> qs_rows, ks_rows;
    quantize_rows(q, c.q_len * c.heads, c.d, &q8, &qs_rows);
    quantize_rows(k, c.kv_len * c.kv_heads, c.d, &k8, &ks_rows);
    std::vector<float> qs(qs_rows.size()), ks(ks_rows.size());  // [heads, q_len], [kv_heads, kv_len]
    for (int64_t i = 0; i < c.q_len; ++i)
      for (int64_t h = 0; h < c.heads; ++h) qs[h * c.q_len + i] = qs_rows[i * c.heads + h];
    for (int64_t t = 0; t < c.kv_len; ++t)
      for (int64_t h = 0; h < c.kv_heads; ++h) ks[h * c.kv_len + t] = ks_rows[t * c.kv_heads + h];
    std::vector<uint16_t> v16(v.size());
    for (size_t i = 0; i < v.size(); ++i) v16[i] = float_to_bf16_bits(v[i]);

    DeviceBuffer<int8_t> dq(q8.size()), dk(k8.size());
    DeviceBuffer<float> dqs(qs.size()), dks(ks.size());
    DeviceBuffer<uint16_t> dv(v16.size()), dout(q.size());
    CUDA_ASSERT(dq.upload(q8));
    CUDA_ASSERT(dk.upload(k8));
    CUDA_ASSERT(dqs.upload(qs));
    CUDA_ASSERT(dks.upload(ks));
    CUDA_ASSERT(dv.upload(v16));
    CUDA_ASSERT(dout.fill_bytes(0xFF));
    HalfInt8AttentionArgs a;
    a.q_len = c.q_len;
    a.kv_len = c.kv_len;
    a.heads = c.heads;
    a.kv_heads = c.kv_heads;
    a.head_dim = c.d;
    a.causal = c.causal;
    a.q = dq.get();
    a.q_scale = dqs.get();
    a.k = dk.get();
    a.k_scale = dks.get();
    a.v = dv.get();
    a.out = dout.get();
    const Status st = cuda_half_int8_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint16_t> out16;
    CUDA_ASSERT(dout.download(&out16));
    std::vector<float> got(out16.size());
    for (size_t i = 0; i < got.size(); ++i) {
      got[i] = bf16_bits_to_float(out16[i]);
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    }
    const int64_t n = static_cast<int64_t>(got.size());
    const AttentionError vs_spec = attention_error(got.data(), want_spec.data(), n);
    const AttentionError gpu_cost = attention_error(got.data(), want_float.data(), n);
    const AttentionError spec_cost = attention_error(want_spec.data(), want_float.data(), n);
    std::printf("  q %lld kv %lld heads %lld/%lld d %lld%s: vs spec rel L1 %.2e | vs float MRE: GPU %.3f%%, spec %.3f%%\n",
                static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len), static_cast<long long>(c.heads),
                static_cast<long long>(c.kv_heads), static_cast<long long>(c.d), c.causal ? " causal" : "",
                vs_spec.rel_l1, 100 * gpu_cost.mre, 100 * spec_cost.mre);
    // BF16 output rounding (2^-9) plus operation order: far below the variant's ~1% own error.
    EXPECT_LT(vs_spec.rel_l1, 3e-3);
    EXPECT_LT(gpu_cost.mre, 1.2 * spec_cost.mre + 2e-3);
  }
}

// Full-INT8 (llmq's variant: V per (64-key tile, channel), P in [0, 255] against the tile's row
// maximum) against the specification with the same options. P's rounding to an integer can differ
// by one step where the GPU's exp2 and the host's straddle a half, so the agreement is a little
// looser than half-INT8's; the error against float must match the specification's.
// 8-bit codes of x * (1 / scale): INT8 (RNE, saturating) or E4M3 (RNE, saturating).
int8_t code8(float x, float inv, bool fp8) {
  if (fp8) return static_cast<int8_t>(float_to_fp8(x * inv, DType::kE4M3));
  return static_cast<int8_t>(encode_int(x * inv, DType::kI8));
}

// One case of the full-INT8 or FP8 kernel against the specification with the same options.
void check_eight_bit_kernel(const Case& c, bool fp8) {
  {
    SCOPED_TRACE("q_len=" + std::to_string(c.q_len) + " kv_len=" + std::to_string(c.kv_len) + " heads=" +
                 std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d=" + std::to_string(c.d) +
                 (c.causal ? " causal" : ""));
    std::mt19937_64 rng(13);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> q(static_cast<size_t>(c.q_len * c.heads * c.d)), k(static_cast<size_t>(c.kv_len * c.kv_heads * c.d)),
        v(k.size());
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    AttentionProblem p;
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.head_dim = c.d;
    p.causal = c.causal;
    QuantAttentionOptions spec;
    spec.variant = fp8 ? AttentionVariant::kFp8 : AttentionVariant::kFullInt8;
    spec.v_scaling = VScaling::kPerBlock;
    spec.p_max = 255;
    spec.p_tile_max = !fp8;
    spec.block_kv = 64;
    std::vector<float> want_spec(q.size()), want_float(q.size());
    ASSERT_TRUE(quant_attention_reference(p, spec, q.data(), k.data(), v.data(), want_spec.data()).ok());
    QuantAttentionOptions fo;
    fo.variant = AttentionVariant::kFloat;
    ASSERT_TRUE(quant_attention_reference(p, fo, q.data(), k.data(), v.data(), want_float.data()).ok());

    std::vector<int8_t> q8, k8, v8(v.size());
    std::vector<float> qs_rows, ks_rows;
    quantize_rows(q, c.q_len * c.heads, c.d, &q8, &qs_rows, fp8);
    quantize_rows(k, c.kv_len * c.kv_heads, c.d, &k8, &ks_rows, fp8);
    std::vector<float> qs(qs_rows.size()), ks(ks_rows.size());
    for (int64_t i = 0; i < c.q_len; ++i)
      for (int64_t h = 0; h < c.heads; ++h) qs[h * c.q_len + i] = qs_rows[i * c.heads + h];
    for (int64_t t = 0; t < c.kv_len; ++t)
      for (int64_t h = 0; h < c.kv_heads; ++h) ks[h * c.kv_len + t] = ks_rows[t * c.kv_heads + h];
    // V: one scale per (64-key tile, kv head, channel), [kv_heads, tiles, d].
    const int64_t tiles = (c.kv_len + 63) / 64;
    std::vector<float> vs(static_cast<size_t>(c.kv_heads * tiles * c.d));
    for (int64_t h = 0; h < c.kv_heads; ++h)
      for (int64_t j = 0; j < tiles; ++j)
        for (int64_t ch = 0; ch < c.d; ++ch) {
          float m = 0.f;
          for (int64_t t = j * 64; t < std::min(c.kv_len, j * 64 + 64); ++t) m = std::max(m, std::fabs(v[(t * c.kv_heads + h) * c.d + ch]));
          const float sc = m > 0.f ? m / (fp8 ? 448.f : 127.f) : 1.f, inv = 1.f / sc;
          vs[(h * tiles + j) * c.d + ch] = sc;
          for (int64_t t = j * 64; t < std::min(c.kv_len, j * 64 + 64); ++t) {
            const int64_t i = (t * c.kv_heads + h) * c.d + ch;
            v8[i] = code8(v[i], inv, fp8);
          }
        }
    DeviceBuffer<int8_t> dq(q8.size()), dk(k8.size()), dv(v8.size());
    DeviceBuffer<float> dqs(qs.size()), dks(ks.size()), dvs(vs.size());
    DeviceBuffer<uint16_t> dout(q.size());
    CUDA_ASSERT(dq.upload(q8));
    CUDA_ASSERT(dk.upload(k8));
    CUDA_ASSERT(dv.upload(v8));
    CUDA_ASSERT(dqs.upload(qs));
    CUDA_ASSERT(dks.upload(ks));
    CUDA_ASSERT(dvs.upload(vs));
    CUDA_ASSERT(dout.fill_bytes(0xFF));
    FullInt8AttentionArgs a;
    a.qk.q_len = c.q_len;
    a.qk.kv_len = c.kv_len;
    a.qk.heads = c.heads;
    a.qk.kv_heads = c.kv_heads;
    a.qk.head_dim = c.d;
    a.qk.causal = c.causal;
    a.qk.q = dq.get();
    a.qk.q_scale = dqs.get();
    a.qk.k = dk.get();
    a.qk.k_scale = dks.get();
    a.qk.out = dout.get();
    a.v = dv.get();
    a.v_scale = dvs.get();
    const Status st = fp8 ? cuda_fp8_attention(a, nullptr) : cuda_full_int8_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint16_t> out16;
    CUDA_ASSERT(dout.download(&out16));
    std::vector<float> got(out16.size());
    for (size_t i = 0; i < got.size(); ++i) {
      got[i] = bf16_bits_to_float(out16[i]);
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    }
    const int64_t n = static_cast<int64_t>(got.size());
    const AttentionError vs_spec = attention_error(got.data(), want_spec.data(), n);
    const AttentionError gpu_cost = attention_error(got.data(), want_float.data(), n);
    const AttentionError spec_cost = attention_error(want_spec.data(), want_float.data(), n);
    std::printf("  %s q %lld kv %lld heads %lld/%lld d %lld%s: vs spec rel L1 %.2e | vs float MRE: GPU %.3f%%, spec %.3f%%\n",
                fp8 ? "fp8" : "full-int8", static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len),
                static_cast<long long>(c.heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
                c.causal ? " causal" : "", vs_spec.rel_l1, 100 * gpu_cost.mre, 100 * spec_cost.mre);
    // FP8: an E4M3 P code rounds the other way wherever the GPU's exp2 and the host's straddle a
    // rounding point, and each such flip moves that P by 2^-4, so the GPU and the specification
    // differ by about as much as the specification differs from float (measured 0.2-0.65 of it);
    // INT8's P steps are 1/255 and the two agree to BF16 output rounding.
    if (fp8)
      EXPECT_LT(vs_spec.rel_l1, 0.8 * spec_cost.rel_l1);
    else
      EXPECT_LT(vs_spec.rel_l1, 5e-3);
    EXPECT_LT(gpu_cost.mre, 1.2 * spec_cost.mre + 2e-3);
  }
}

const Case kEightBitCases[] = {{200, 200, 4, 2, 128, true}, {333, 333, 4, 4, 64, false}, {70, 300, 8, 2, 128, true},
                               {1, 129, 2, 1, 64, true},   {513, 513, 2, 2, 128, false}};

TEST(CudaFullInt8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kEightBitCases) check_eight_bit_kernel(c, false);
}

TEST(CudaFp8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kEightBitCases) check_eight_bit_kernel(c, true);
}

TEST(CudaHalfInt8Attention, RefusesBadArguments) {
  HalfInt8AttentionArgs a;
  a.q_len = 4;
  a.kv_len = 4;
  a.heads = 4;
  a.kv_heads = 3;
  a.head_dim = 64;
  EXPECT_NE(cuda_half_int8_attention(a, nullptr).message().find("kv_heads"), std::string::npos);
  a.kv_heads = 2;
  a.head_dim = 96;
  EXPECT_EQ(cuda_half_int8_attention(a, nullptr).code(), StatusCode::kUnsupported);
  a.head_dim = 64;
  EXPECT_NE(cuda_half_int8_attention(a, nullptr).message().find("null"), std::string::npos);
}

}  // namespace
}  // namespace llmq
