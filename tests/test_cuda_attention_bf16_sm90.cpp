// The Hopper BF16 flash attention (attention/bf16_attention_sm90.hpp) against the CPU
// specification's BF16 variant (quant_attention.hpp: BF16 Q, K, V and P, FP32 accumulation) on the
// same BF16 inputs: they differ in FP32 operation order, the SFU's exp2 and where P is rounded, so
// the outputs agree to well under BF16's own error against float; and the kernel's error against
// float matches the specification's. Causal and not, GQA, lengths off the tile, a cached prefix,
// both consumer warpgroups, 16k keys; a batch of sequences in one launch against each alone. Skips
// visibly without a Hopper GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention/bf16_attention_sm90.hpp"
#include "cuda/device_facts.cuh"
#include "cuda_support.hpp"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"
#include "llmq/quant_attention.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

struct Case {
  int64_t q_len, kv_len, heads, kv_heads;
  bool causal;
};

bool hopper_kernel_runs() {
  cuda::DeviceFacts dev;
  return cuda::current_device_facts(&dev).ok() && attention::sm90_bf16_attention_runs(dev);
}

void check(const Case& c, uint64_t seed) {
  constexpr int64_t d = 128;
  SCOPED_TRACE("q " + std::to_string(c.q_len) + " kv " + std::to_string(c.kv_len) + " heads " + std::to_string(c.heads) +
               "/" + std::to_string(c.kv_heads) + (c.causal ? " causal" : ""));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  const auto fill = [&](std::vector<float>& x) {
    for (float& v : x) {
      v = normal(rng);
      if (uniform(rng) < 1e-3f) v *= 20.f;  // outliers
      v = bf16_bits_to_float(float_to_bf16_bits(v));
    }
  };
  std::vector<float> q(static_cast<size_t>(c.q_len * c.heads * d)), k(static_cast<size_t>(c.kv_len * c.kv_heads * d)), v(k.size());
  fill(q);
  fill(k);
  fill(v);
  AttentionProblem p;
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = d;
  p.causal = c.causal;
  std::vector<float> want_spec(q.size()), want_float(q.size());
  QuantAttentionOptions spec;
  spec.variant = AttentionVariant::kBf16;
  spec.block_kv = 128;
  ASSERT_TRUE(quant_attention_reference(p, spec, q.data(), k.data(), v.data(), want_spec.data()).ok());
  QuantAttentionOptions fo;
  fo.variant = AttentionVariant::kFloat;
  ASSERT_TRUE(quant_attention_reference(p, fo, q.data(), k.data(), v.data(), want_float.data()).ok());

  const int64_t stride = attention_v_t_stride(c.kv_len);
  std::vector<uint16_t> q16(q.size()), k16(k.size()), vt16(static_cast<size_t>(c.kv_heads * d * stride), 0);
  for (size_t i = 0; i < q.size(); ++i) q16[i] = float_to_bf16_bits(q[i]);
  for (size_t i = 0; i < k.size(); ++i) k16[i] = float_to_bf16_bits(k[i]);
  for (int64_t t = 0; t < c.kv_len; ++t)
    for (int64_t g = 0; g < c.kv_heads; ++g)
      for (int64_t ch = 0; ch < d; ++ch)
        vt16[static_cast<size_t>((g * d + ch) * stride + t)] = float_to_bf16_bits(v[static_cast<size_t>((t * c.kv_heads + g) * d + ch)]);
  DeviceBuffer<uint16_t> dq(q16.size()), dk(k16.size()), dvt(vt16.size()), dout(q.size());
  CUDA_ASSERT(dq.upload(q16));
  CUDA_ASSERT(dk.upload(k16));
  CUDA_ASSERT(dvt.upload(vt16));
  CUDA_ASSERT(dout.fill_bytes(0xFF));
  attention::Bf16AttentionArgs a;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.causal = c.causal;
  a.q = dq.get();
  a.k = dk.get();
  a.v_t = dvt.get();
  a.out = dout.get();
  const Status st = attention::sm90_bf16_attention(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint16_t> out16;
  CUDA_ASSERT(dout.download(&out16));
  std::vector<float> got(out16.size());
  for (size_t i = 0; i < got.size(); ++i) {
    got[i] = bf16_bits_to_float(out16[i]);
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
  }
  CUDA_ASSERT(dout.fill_bytes(0xFF));  // a second run gives the same bits
  ASSERT_TRUE(attention::sm90_bf16_attention(a, nullptr).ok());
  std::vector<uint16_t> again;
  CUDA_ASSERT(dout.download(&again));
  EXPECT_TRUE(again == out16) << "two runs differ";
  const int64_t n = static_cast<int64_t>(got.size());
  const AttentionError vs_spec = attention_error(got.data(), want_spec.data(), n);
  const AttentionError gpu_cost = attention_error(got.data(), want_float.data(), n);
  const AttentionError spec_cost = attention_error(want_spec.data(), want_float.data(), n);
  std::printf("  bf16 sm90 q %lld kv %lld heads %lld/%lld%s: vs spec rel L1 %.2e | vs float MRE: GPU %.3f%%, spec %.3f%%\n",
              static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len), static_cast<long long>(c.heads),
              static_cast<long long>(c.kv_heads), c.causal ? " causal" : "", vs_spec.rel_l1, 100 * gpu_cost.mre,
              100 * spec_cost.mre);
  // BF16 output rounding (2^-9 relative) and P rounded from a differently ordered exp2: a few 1e-3.
  EXPECT_LT(vs_spec.rel_l1, 6e-3);
  EXPECT_LT(gpu_cost.mre, 1.2 * spec_cost.mre + 2e-3);
}

TEST(CudaBf16AttentionSm90, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  if (!hopper_kernel_runs()) GTEST_SKIP() << "the BF16 wgmma attention runs on Hopper (sm_90a) only";
  const Case cases[] = {{200, 200, 4, 2, true}, {513, 513, 2, 2, false}, {70, 300, 8, 2, true},  {1, 129, 2, 1, true},
                        {700, 1000, 4, 1, true}, {640, 640, 4, 2, false}, {64, 16384, 2, 1, true}, {128, 128, 2, 2, true}};
  uint64_t seed = 1;
  for (const Case& c : cases) check(c, ++seed);
}

// A batch of sequences in one launch (sm90_bf16_attention_batch): each sequence's output is the same
// bits as the sequence run alone, whatever sits in the packed rows between them (K rows past a
// sequence's keys hold NaN patterns here: masked, never read into a score). Per-kv-head scales (the
// E4M3 cache's) give, for powers of two, the same bits as the unscaled inputs they stand for.
TEST(CudaBf16AttentionSm90, BatchMatchesEachSequenceAlone) {
  LLMQ_REQUIRE_GPU();
  if (!hopper_kernel_runs()) GTEST_SKIP() << "the BF16 wgmma attention runs on Hopper (sm_90a) only";
  constexpr int64_t d = 128, heads = 4, kv_heads = 2;
  struct Seq {
    int64_t q_len, kv_len;
  };
  const std::vector<Seq> seqs = {{200, 200}, {70, 300}, {1, 129}, {513, 513}, {128, 128}};
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  const auto bf16 = [&]() { return float_to_bf16_bits(normal(rng)); };
  int64_t rows_q = 0, keys = 0;
  std::vector<int64_t> q_begin, kv_begin;
  for (const Seq& s : seqs) {
    q_begin.push_back(rows_q);
    kv_begin.push_back(keys);
    rows_q += s.q_len;
    keys += attention_v_t_stride(s.kv_len);
  }
  const float k_scale[kv_heads] = {0.25f, 4.f}, v_scale[kv_heads] = {2.f, 0.125f};
  std::vector<uint16_t> q(static_cast<size_t>(rows_q * heads * d)), k(static_cast<size_t>(keys * kv_heads * d), 0xFFFF),
      vt(static_cast<size_t>(kv_heads * d * keys), 0);
  for (uint16_t& x : q) x = bf16();
  // k_scaled / vt_scaled: the same keys and values divided by the head's scale (exact: powers of two).
  std::vector<uint16_t> k_scaled = k, vt_scaled = vt;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t t = 0; t < seqs[i].kv_len; ++t)
      for (int64_t g = 0; g < kv_heads; ++g)
        for (int64_t c = 0; c < d; ++c) {
          const size_t at_k = static_cast<size_t>(((kv_begin[i] + t) * kv_heads + g) * d + c);
          const size_t at_v = static_cast<size_t>((g * d + c) * keys + kv_begin[i] + t);
          k[at_k] = bf16();
          vt[at_v] = bf16();
          k_scaled[at_k] = float_to_bf16_bits(bf16_bits_to_float(k[at_k]) / k_scale[g]);
          vt_scaled[at_v] = float_to_bf16_bits(bf16_bits_to_float(vt[at_v]) / v_scale[g]);
        }
  DeviceBuffer<uint16_t> dq(q.size()), dk(k.size()), dvt(vt.size()), dks(k.size()), dvts(vt.size()), dout(q.size());
  DeviceBuffer<float> dscale_k(kv_heads), dscale_v(kv_heads);
  CUDA_ASSERT(dq.upload(q));
  CUDA_ASSERT(dk.upload(k));
  CUDA_ASSERT(dvt.upload(vt));
  CUDA_ASSERT(dks.upload(k_scaled));
  CUDA_ASSERT(dvts.upload(vt_scaled));
  CUDA_ASSERT(dscale_k.upload(std::vector<float>(k_scale, k_scale + kv_heads)));
  CUDA_ASSERT(dscale_v.upload(std::vector<float>(v_scale, v_scale + kv_heads)));
  attention::Bf16AttentionBatchArgs b;
  b.seqs.count = static_cast<int>(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    b.seqs.q_begin[i] = static_cast<int>(q_begin[i]);
    b.seqs.q_len[i] = static_cast<int>(seqs[i].q_len);
    b.seqs.kv_len[i] = static_cast<int>(seqs[i].kv_len);
    b.seqs.kv_begin[i] = static_cast<int>(kv_begin[i]);
  }
  b.keys = keys;
  b.heads = heads;
  b.kv_heads = kv_heads;
  b.q = dq.get();
  b.k = dk.get();
  b.v_t = dvt.get();
  b.out = dout.get();
  CUDA_ASSERT(dout.fill_bytes(0xFF));
  const Status st = attention::sm90_bf16_attention_batch(b, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<uint16_t> batched, scaled;
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(dout.download(&batched));
  b.k = dks.get();
  b.v_t = dvts.get();
  b.k_scale = dscale_k.get();
  b.v_scale = dscale_v.get();
  CUDA_ASSERT(dout.fill_bytes(0xFF));
  ASSERT_TRUE(attention::sm90_bf16_attention_batch(b, nullptr).ok());
  CUDA_ASSERT(dout.download(&scaled));
  EXPECT_TRUE(scaled == batched) << "scaled inputs with their scales differ from the unscaled inputs";
  // Each sequence alone, from its own contiguous K and V^T.
  for (size_t i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    const int64_t n = seqs[i].kv_len, stride = attention_v_t_stride(n);
    std::vector<uint16_t> k1(static_cast<size_t>(n * kv_heads * d)), vt1(static_cast<size_t>(kv_heads * d * stride), 0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t x = 0; x < kv_heads * d; ++x) k1[static_cast<size_t>(t * kv_heads * d + x)] = k[static_cast<size_t>((kv_begin[i] + t) * kv_heads * d + x)];
    for (int64_t r = 0; r < kv_heads * d; ++r)
      for (int64_t t = 0; t < n; ++t) vt1[static_cast<size_t>(r * stride + t)] = vt[static_cast<size_t>(r * keys + kv_begin[i] + t)];
    DeviceBuffer<uint16_t> dk1(k1.size()), dvt1(vt1.size()), dout1(static_cast<size_t>(seqs[i].q_len * heads * d));
    CUDA_ASSERT(dk1.upload(k1));
    CUDA_ASSERT(dvt1.upload(vt1));
    attention::Bf16AttentionArgs a;
    a.q_len = seqs[i].q_len;
    a.kv_len = n;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.q = dq.get() + q_begin[i] * heads * d;
    a.k = dk1.get();
    a.v_t = dvt1.get();
    a.out = dout1.get();
    ASSERT_TRUE(attention::sm90_bf16_attention(a, nullptr).ok());
    std::vector<uint16_t> alone;
    CUDA_ASSERT(dout1.download(&alone));
    const std::vector<uint16_t> part(batched.begin() + q_begin[i] * heads * d,
                                     batched.begin() + (q_begin[i] + seqs[i].q_len) * heads * d);
    EXPECT_TRUE(part == alone) << "the batch's rows differ from the sequence run alone";
    for (uint16_t x : part) ASSERT_TRUE(std::isfinite(bf16_bits_to_float(x)));
  }
}

TEST(CudaBf16AttentionSm90, RefusesBadBatches) {
  attention::Bf16AttentionBatchArgs b;
  b.heads = b.kv_heads = 2;
  b.keys = 256;
  b.seqs.count = 1;
  b.seqs.q_len[0] = 8;
  b.seqs.kv_len[0] = 8;
  b.seqs.kv_begin[0] = 64;  // not a multiple of 128
  EXPECT_NE(attention::sm90_bf16_attention_batch(b, nullptr).message().find("multiple of 128"), std::string::npos);
  b.seqs.kv_begin[0] = 256;  // past the rows of k
  EXPECT_NE(attention::sm90_bf16_attention_batch(b, nullptr).message().find("rows of k"), std::string::npos);
  b.seqs.kv_begin[0] = 0;
  b.seqs.count = attention::kBf16AttentionMaxSeqs + 1;
  EXPECT_NE(attention::sm90_bf16_attention_batch(b, nullptr).message().find("sequences"), std::string::npos);
}

TEST(CudaBf16AttentionSm90, RefusesBadArguments) {
  attention::Bf16AttentionArgs a;
  a.q_len = 8;
  a.kv_len = 4;
  a.heads = a.kv_heads = 2;
  EXPECT_NE(attention::sm90_bf16_attention(a, nullptr).message().find("q_len"), std::string::npos);
  a.kv_len = 8;
  a.heads = 3;
  EXPECT_NE(attention::sm90_bf16_attention(a, nullptr).message().find("heads"), std::string::npos);
  a.heads = 2;
  EXPECT_NE(attention::sm90_bf16_attention(a, nullptr).message().find("null"), std::string::npos);
}

}  // namespace
}  // namespace llmq
