// The Hopper BF16 flash attention (attention/bf16_attention_sm90.hpp) against the CPU
// specification's BF16 variant (quant_attention.hpp: BF16 Q, K, V and P, FP32 accumulation) on the
// same BF16 inputs: they differ in FP32 operation order, the SFU's exp2 and where P is rounded, so
// the outputs agree to well under BF16's own error against float; and the kernel's error against
// float matches the specification's. Causal and not, GQA, lengths off the tile, a cached prefix,
// both consumer warpgroups, 16k keys. Skips visibly without a Hopper GPU.
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
