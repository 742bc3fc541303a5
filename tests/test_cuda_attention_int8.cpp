// The 8-bit flash-attention kernels (half-INT8, full-INT8, FP8) against the CPU specification
// (quant_attention.hpp) on the same codes: they differ only in FP32 operation order and the SFU's
// exp2, so the outputs agree to well under each variant's own error against float (FP8 less
// tightly: see below); and each kernel's error against float matches the specification's. Causal
// and not, GQA, head dims 64 and 128, lengths that are not multiples of the tile, a cached prefix
// (q_len < kv_len); sliding windows (1 key to past kv_len) and attention sinks (random, +8, -30)
// on every kernel, the Hopper one included. Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attention_quant_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"
#include "llmq/quant_attention.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;
using namespace testing::attention;

enum class Kernel { kHalfInt8, kFullInt8, kFp8 };
const char* kernel_name(Kernel k) { return k == Kernel::kHalfInt8 ? "half-int8" : k == Kernel::kFullInt8 ? "full-int8" : "fp8"; }

struct Case {
  int64_t q_len, kv_len, heads, kv_heads, d;
  bool causal;
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // sink_logits per head
};

// Attention-sink logits: uniform in [-3, 3], head 0 at +8 (the sink dominates), head 1 at -30 (no
// visible effect).
std::vector<float> sink_logits(int64_t heads, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-3.f, 3.f);
  std::vector<float> s(static_cast<size_t>(heads));
  for (float& x : s) x = uniform(rng);
  s[0] = 8.f;
  if (heads > 1) s[1] = -30.f;
  return s;
}
const Case kCases[] = {{200, 200, 4, 2, 128, true}, {333, 333, 4, 4, 64, false}, {70, 300, 8, 2, 128, true},
                       {1, 129, 2, 1, 64, true},   {513, 513, 2, 2, 128, false}};

// The specification's options for each kernel.
QuantAttentionOptions spec_of(Kernel k, int64_t v_block = 64) {
  QuantAttentionOptions o;
  if (k == Kernel::kHalfInt8) {
    o.variant = AttentionVariant::kHalfInt8;
    return o;
  }
  o.variant = k == Kernel::kFp8 ? AttentionVariant::kFp8 : AttentionVariant::kFullInt8;
  o.v_scaling = VScaling::kPerBlock;
  o.p_max = 255;
  o.p_tile_max = k == Kernel::kFullInt8;
  o.block_kv = v_block;
  return o;
}

// One case: N(0,1) inputs, the specification and float results on the host, the kernel on the same
// codes, and the assertions.
// v_channel (FP8, Hopper): V with one scale per channel over all keys (v_block 0), against the
// specification's VScaling::kPerChannel with the kernel's 128-key tiles.
void check_kernel(Kernel kernel, const Case& c, uint64_t seed, bool v_transposed = false, bool v_channel = false) {
  SCOPED_TRACE(std::string(kernel_name(kernel)) + " q_len=" + std::to_string(c.q_len) + " kv_len=" +
               std::to_string(c.kv_len) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
               " d=" + std::to_string(c.d) + (c.causal ? " causal" : "") + (v_transposed ? " v_t" : "") +
               " window=" + std::to_string(c.window) + (c.sinks ? " sinks" : "") + (v_channel ? " v per channel" : ""));
  const bool fp8 = kernel == Kernel::kFp8;
  std::mt19937_64 rng(seed);
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
  p.window = c.window;
  const std::vector<float> sinks = c.sinks ? sink_logits(c.heads, seed + 1) : std::vector<float>();
  p.sinks = c.sinks ? sinks.data() : nullptr;
  std::vector<float> want_spec(q.size()), want_float(q.size());
  // With v_t, the block the device's fastest kernel takes (128 for the Hopper kernel at d = 128).
  int64_t v_block = 64;
  if (v_transposed) ASSERT_TRUE(cuda_attention_v_block(c.d, &v_block).ok());
  QuantAttentionOptions spec = spec_of(kernel, v_block);
  if (v_channel) spec.v_scaling = VScaling::kPerChannel;
  ASSERT_TRUE(quant_attention_reference(p, spec, q.data(), k.data(), v.data(), want_spec.data()).ok());
  QuantAttentionOptions fo;
  fo.variant = AttentionVariant::kFloat;
  ASSERT_TRUE(quant_attention_reference(p, fo, q.data(), k.data(), v.data(), want_float.data()).ok());

  std::vector<int8_t> q8, k8, v8;
  std::vector<float> qs, ks, vs;
  quantize_rows(q, c.q_len, c.heads, c.d, fp8, &q8, &qs);
  quantize_rows(k, c.kv_len, c.kv_heads, c.d, fp8, &k8, &ks);
  std::vector<uint16_t> v16(v.size());
  if (kernel == Kernel::kHalfInt8) {
    for (size_t i = 0; i < v.size(); ++i) v16[i] = float_to_bf16_bits(v[i]);
  } else {
    quantize_v_blocks(v, c.kv_len, c.kv_heads, c.d, fp8, &v8, &vs, v_channel ? c.kv_len : v_block);  // all keys: one block
  }
  DeviceBuffer<int8_t> dq(q8.size()), dk(k8.size()), dv8(v8.size());
  DeviceBuffer<float> dqs(qs.size()), dks(ks.size()), dvs(vs.size());
  const std::vector<int8_t> vt = v_transposed ? transpose_v_codes(v8, c.kv_len, c.kv_heads, c.d) : std::vector<int8_t>();
  DeviceBuffer<int8_t> dvt(vt.size());
  DeviceBuffer<uint16_t> dv16(v16.size()), dout(q.size());
  DeviceBuffer<float> dsinks(sinks.size());
  if (c.sinks) CUDA_ASSERT(dsinks.upload(sinks));
  CUDA_ASSERT(dq.upload(q8));
  CUDA_ASSERT(dk.upload(k8));
  CUDA_ASSERT(dqs.upload(qs));
  CUDA_ASSERT(dks.upload(ks));
  if (kernel == Kernel::kHalfInt8) {
    CUDA_ASSERT(dv16.upload(v16));
  } else {
    if (v_transposed) {
      CUDA_ASSERT(dvt.upload(vt));
    } else {
      CUDA_ASSERT(dv8.upload(v8));
    }
    CUDA_ASSERT(dvs.upload(vs));
  }
  CUDA_ASSERT(dout.fill_bytes(0xFF));
  FullInt8AttentionArgs a;
  a.qk.q_len = c.q_len;
  a.qk.kv_len = c.kv_len;
  a.qk.heads = c.heads;
  a.qk.kv_heads = c.kv_heads;
  a.qk.head_dim = c.d;
  a.qk.causal = c.causal;
  a.qk.window = c.window;
  a.qk.sinks = c.sinks ? dsinks.get() : nullptr;
  a.qk.q = dq.get();
  a.qk.q_scale = dqs.get();
  a.qk.k = dk.get();
  a.qk.k_scale = dks.get();
  a.qk.v = dv16.get();
  a.qk.out = dout.get();
  a.v = v_transposed ? nullptr : dv8.get();  // with v_t only: the Hopper kernel at d = 128 on sm_90
  a.v_t = v_transposed ? dvt.get() : nullptr;
  a.v_scale = dvs.get();
  a.v_block = v_channel ? 0 : v_block;
  const Status st = kernel == Kernel::kHalfInt8   ? cuda_half_int8_attention(a.qk, nullptr)
                    : kernel == Kernel::kFullInt8 ? cuda_full_int8_attention(a, nullptr)
                                                  : cuda_fp8_attention(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint16_t> out16;
  CUDA_ASSERT(dout.download(&out16));
  std::vector<float> got(out16.size());
  for (size_t i = 0; i < got.size(); ++i) {
    got[i] = bf16_bits_to_float(out16[i]);
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
  }
  // Deterministic: a second run gives the same bits (no races between the kernel's stages).
  CUDA_ASSERT(dout.fill_bytes(0xFF));
  const Status again = kernel == Kernel::kHalfInt8   ? cuda_half_int8_attention(a.qk, nullptr)
                       : kernel == Kernel::kFullInt8 ? cuda_full_int8_attention(a, nullptr)
                                                     : cuda_fp8_attention(a, nullptr);
  ASSERT_TRUE(again.ok()) << again.to_string();
  std::vector<uint16_t> out16_again;
  CUDA_ASSERT(dout.download(&out16_again));
  EXPECT_TRUE(out16 == out16_again) << "two runs differ";
  const int64_t n = static_cast<int64_t>(got.size());
  // The query row (of one head) farthest from the specification, to locate a fault.
  double worst = 0;
  int64_t worst_row = 0;
  for (int64_t r = 0; r < c.q_len * c.heads; ++r) {
    double diff = 0, ref = 0;
    for (int64_t i = r * c.d; i < (r + 1) * c.d; ++i) {
      diff += std::fabs(got[i] - want_spec[i]);
      ref += std::fabs(want_spec[i]);
    }
    if (ref > 0 && diff / ref > worst) worst = diff / ref, worst_row = r;
  }
  std::printf("    worst row: token %lld head %lld, rel L1 %.2e\n", static_cast<long long>(worst_row / c.heads),
              static_cast<long long>(worst_row % c.heads), worst);
  const AttentionError vs_spec = attention_error(got.data(), want_spec.data(), n);
  const AttentionError gpu_cost = attention_error(got.data(), want_float.data(), n);
  const AttentionError spec_cost = attention_error(want_spec.data(), want_float.data(), n);
  std::printf("  %s%s v_block %lld q %lld kv %lld heads %lld/%lld d %lld%s window %lld%s: vs spec rel L1 %.2e | vs float MRE: GPU %.3f%%, spec %.3f%%\n",
              kernel_name(kernel), v_transposed ? " (v_t)" : "", static_cast<long long>(v_block), static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len),
              static_cast<long long>(c.heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.d),
              c.causal ? " causal" : "", static_cast<long long>(c.window), c.sinks ? " sinks" : "", vs_spec.rel_l1,
              100 * gpu_cost.mre, 100 * spec_cost.mre);
  // Half-INT8: BF16 output rounding (2^-9) plus operation order, far below its ~1% own error.
  // Full-INT8: P's rounding to an integer can differ by one step where the GPU's exp2 and the
  // host's straddle a half: a little looser. FP8: an E4M3 P code rounds the other way wherever the
  // two exp2 straddle a rounding point, and each flip moves that P by 2^-4, so the GPU and the
  // specification differ by about as much as the specification differs from float (measured
  // 0.2-0.65 of it).
  switch (kernel) {
    case Kernel::kHalfInt8: EXPECT_LT(vs_spec.rel_l1, 3e-3); break;
    case Kernel::kFullInt8: EXPECT_LT(vs_spec.rel_l1, 5e-3); break;
    case Kernel::kFp8: EXPECT_LT(vs_spec.rel_l1, 0.8 * spec_cost.rel_l1); break;
  }
  EXPECT_LT(gpu_cost.mre, 1.2 * spec_cost.mre + 2e-3);
}

TEST(CudaHalfInt8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kCases) check_kernel(Kernel::kHalfInt8, c, 11);
}

TEST(CudaFullInt8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kCases) check_kernel(Kernel::kFullInt8, c, 13);
}

TEST(CudaFp8Attention, MatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kCases) check_kernel(Kernel::kFp8, c, 13);
}

// V given transposed (v_t): at d = 128 on Hopper the wgmma kernel, else mma.sync reading V^T tiles
// as they are. Adds a case of several 128-row blocks (both consumer warpgroups, causal skipping).
TEST(CudaFullInt8Attention, TransposedVMatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kCases) check_kernel(Kernel::kFullInt8, c, 17, true);
  check_kernel(Kernel::kFullInt8, {700, 1000, 4, 1, 128, true}, 19, true);
}

TEST(CudaFp8Attention, TransposedVMatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kCases) check_kernel(Kernel::kFp8, c, 17, true);
  check_kernel(Kernel::kFp8, {700, 1000, 4, 1, 128, true}, 19, true);
}

// V per channel (v_block 0): the Hopper kernel that accumulates P V across tiles in the tensor core.
TEST(CudaFp8Attention, VPerChannelMatchesTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  int64_t v_block = -1;
  ASSERT_TRUE(cuda_attention_v_block(128, &v_block, true).ok());  // FP8's choice: 0 where the Hopper kernel runs
  if (v_block != 0) GTEST_SKIP() << "V per channel runs on the Hopper kernel only (sm_90a, d = 128)";
  for (const Case& c : kCases)
    if (c.d == 128) check_kernel(Kernel::kFp8, c, 41, true, true);
  check_kernel(Kernel::kFp8, {700, 1000, 4, 1, 128, true}, 43, true, true);
  check_kernel(Kernel::kFp8, {640, 640, 4, 2, 128, false}, 47, true, true);
  check_kernel(Kernel::kFp8, {700, 1000, 4, 1, 128, true, 300, true}, 53, true, true);
  check_kernel(Kernel::kFp8, {200, 200, 4, 2, 128, true, 1, true}, 59, true, true);
  check_kernel(Kernel::kFp8, {70, 300, 8, 2, 128, true, 129, true}, 61, true, true);
  // Long contexts: P V accumulates across 128 tiles in the tensor core's FP32 accumulators (the last
  // queries of a cached prefix see all 16384 keys).
  check_kernel(Kernel::kFp8, {64, 16384, 4, 1, 128, true}, 67, true, true);
  check_kernel(Kernel::kFp8, {32, 16384, 2, 2, 128, false}, 71, true, true);
}

// Windows of 1 key, under a tile, across tiles and past kv_len, with and without sinks (and sinks
// alone); a cached prefix; causal (a window needs it).
const Case kWindowCases[] = {{200, 200, 4, 2, 128, true, 1, true},   {333, 333, 4, 4, 64, true, 50, false},
                             {70, 300, 8, 2, 128, true, 129, true},  {1, 129, 2, 1, 64, true, 64, true},
                             {513, 513, 2, 2, 128, true, 200, true}, {300, 300, 4, 2, 64, true, 0, true},
                             {150, 150, 2, 1, 128, true, 1000, true}};

TEST(CudaHalfInt8Attention, WindowAndSinksMatchTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kWindowCases) check_kernel(Kernel::kHalfInt8, c, 23);
}

TEST(CudaFullInt8Attention, WindowAndSinksMatchTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kWindowCases) check_kernel(Kernel::kFullInt8, c, 29);
  for (const Case& c : kWindowCases) check_kernel(Kernel::kFullInt8, c, 31, true);
  check_kernel(Kernel::kFullInt8, {700, 1000, 4, 1, 128, true, 300, true}, 37, true);  // both Hopper warpgroups
}

TEST(CudaFp8Attention, WindowAndSinksMatchTheCpuSpecification) {
  LLMQ_REQUIRE_GPU();
  for (const Case& c : kWindowCases) check_kernel(Kernel::kFp8, c, 29);
  for (const Case& c : kWindowCases) check_kernel(Kernel::kFp8, c, 31, true);
  check_kernel(Kernel::kFp8, {700, 1000, 4, 1, 128, true, 300, true}, 37, true);
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
  a.window = -1;
  EXPECT_NE(cuda_half_int8_attention(a, nullptr).message().find("window"), std::string::npos);
  a.window = 2;
  a.causal = false;
  EXPECT_NE(cuda_half_int8_attention(a, nullptr).message().find("window"), std::string::npos);
}

// v_block: 64, or 128 only where the Hopper kernel runs (v_t, d = 128, sm_90a).
TEST(CudaFullInt8Attention, RefusesAVBlockNoKernelTakes) {
  LLMQ_REQUIRE_GPU();
  DeviceBuffer<int8_t> codes(4096);
  DeviceBuffer<float> scales(256);
  DeviceBuffer<uint16_t> out(4096);
  FullInt8AttentionArgs a;
  a.qk.q_len = a.qk.kv_len = 4;
  a.qk.heads = a.qk.kv_heads = 2;
  a.qk.head_dim = 64;
  a.qk.q = a.qk.k = codes.get();
  a.qk.q_scale = a.qk.k_scale = scales.get();
  a.qk.out = out.get();
  a.v = codes.get();
  a.v_scale = scales.get();
  a.v_block = 96;
  const Status odd = cuda_full_int8_attention(a, nullptr);
  EXPECT_EQ(odd.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("v_block"), std::string::npos) << odd.message();
  a.v_block = 128;  // d = 64 and V token-major: no kernel takes it
  const Status wide = cuda_full_int8_attention(a, nullptr);
  EXPECT_NE(wide.code(), StatusCode::kOk);
  EXPECT_NE(wide.message().find("v_block 128"), std::string::npos) << wide.message();
  a.v_block = 0;  // V per channel: FP8 only
  const Status channel = cuda_full_int8_attention(a, nullptr);
  EXPECT_EQ(channel.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(channel.message().find("v_block 0"), std::string::npos) << channel.message();
  const Status channel_fp8 = cuda_fp8_attention(a, nullptr);  // d = 64, V token-major: not the Hopper kernel
  EXPECT_NE(channel_fp8.code(), StatusCode::kOk);
  // Before sm_89 the FP8 kernels are refused first, for the GPU.
  EXPECT_TRUE(channel_fp8.message().find("v_block 0") != std::string::npos ||
              channel_fp8.message().find("sm_89") != std::string::npos)
      << channel_fp8.message();
}

}  // namespace
}  // namespace llmq
