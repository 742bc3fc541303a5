// cuda_quantize_attention_inputs (src/attention/attention_quantize.cu) against the host quantizers
// of attention_quant_support.hpp, which follow the CPU specification: codes and scales bit for bit,
// v_t's padding columns zero. BF16 inputs N(0, 1) with 0.1% outliers x100, an all-zero Q row, K row
// and V (block, channel) for the scale-1 rule; Q, K and V slices of one fused QKV buffer (row
// strides), q_len < kv_len (Q is the last q_len tokens), GQA, kv_len not a multiple of 64 (and long
// enough for smooth_k's chunked mean), INT8 and E4M3, head dims 64 and 128 (and 8, 96, 256),
// smooth_k on and off, quantize_v off. The argument checks run without a GPU; the rest skips
// visibly without one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_quant_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;
using namespace testing::attention;

struct Case {
  int64_t q_len, kv_len, heads, kv_heads, d;
};
// kv_len 333 and 129: a partial last V block; 600: three chunks of smooth_k's partial sums.
const Case kCases[] = {{300, 333, 8, 2, 128}, {333, 333, 8, 2, 64}, {70, 600, 4, 4, 128}, {1, 129, 4, 1, 64},
                       {5, 77, 2, 1, 96},     {3, 70, 2, 2, 256},   {2, 40, 2, 1, 8}};

struct Variant {
  bool fp8, smooth_k, quantize_v;
  int64_t v_block = 64;
};

std::string describe(const Case& c, const Variant& v, uint64_t seed) {
  return std::string(v.fp8 ? "e4m3" : "int8") + " q_len=" + std::to_string(c.q_len) + " kv_len=" +
         std::to_string(c.kv_len) + " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
         " d=" + std::to_string(c.d) + (v.smooth_k ? " smooth_k" : "") + (v.quantize_v ? "" : " no-v") +
         " v_block=" + std::to_string(v.v_block) +
         " seed=" + std::to_string(seed);
}

// The first element where two arrays differ (bitwise), or -1.
template <typename T> int64_t first_difference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

template <typename T> void expect_bit_equal(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  const int64_t i = first_difference(got, want);
  if (i >= 0)
    ADD_FAILURE() << what << ": first difference at element " << i << " of " << want.size() << ": got "
                  << +got[static_cast<size_t>(i)] << ", want " << +want[static_cast<size_t>(i)];
}

// The fused QKV buffer [tokens, (heads + 2 kv_heads) * d] of BF16 bits: Q in columns [0, heads d),
// K next, V last. N(0, 1) with 0.1% of entries x100; the all-zero rows and block are set below.
std::vector<uint16_t> make_qkv(const Case& c, uint64_t seed) {
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<uint16_t> qkv(static_cast<size_t>(c.kv_len * width));
  for (uint16_t& x : qkv) {
    float v = normal(rng);
    if (uniform(rng) < 1e-3f) v *= 100.f;
    x = float_to_bf16_bits(v);
  }
  const int64_t q_first = c.kv_len - c.q_len;  // Q's token 0
  auto zero = [&](int64_t token, int64_t col, int64_t n) {
    for (int64_t i = 0; i < n; ++i) qkv[static_cast<size_t>(token * width + col + i)] = 0;
  };
  zero(q_first, (c.heads - 1) * c.d, c.d);                  // Q: last token-0 row of the last head
  zero(c.kv_len / 2, c.heads * c.d, c.d);                   // K: the middle token, kv head 0
  const int64_t v_col = (c.heads + c.kv_heads) * c.d + (c.kv_heads - 1) * c.d + c.d / 2;  // V: last kv head, one channel
  const int64_t last_block = (c.kv_len - 1) / 128 * 128;  // the last (partial) block of 128 keys, or two of 64
  for (int64_t t = last_block; t < c.kv_len; ++t) zero(t, v_col, 1);
  return qkv;
}

// The [tokens, heads, d] floats of one slice of the fused buffer.
std::vector<float> slice(const std::vector<uint16_t>& qkv, int64_t width, int64_t first_token, int64_t tokens,
                         int64_t col, int64_t heads, int64_t d) {
  std::vector<float> x(static_cast<size_t>(tokens * heads * d));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < heads * d; ++i)
      x[static_cast<size_t>(t * heads * d + i)] = bf16_bits_to_float(qkv[static_cast<size_t>((first_token + t) * width + col + i)]);
  return x;
}

// The specification's smooth_k mean: per (kv head, channel) a double sum in token order, divided
// by kv_len, cast to float.
std::vector<float> spec_k_mean(const std::vector<float>& k, int64_t kv_len, int64_t kv_heads, int64_t d) {
  std::vector<float> mean(static_cast<size_t>(kv_heads * d));
  for (int64_t g = 0; g < kv_heads; ++g)
    for (int64_t c = 0; c < d; ++c) {
      double s = 0;
      for (int64_t t = 0; t < kv_len; ++t) s += k[static_cast<size_t>((t * kv_heads + g) * d + c)];
      mean[static_cast<size_t>(g * d + c)] = static_cast<float>(s / static_cast<double>(kv_len));
    }
  return mean;
}

// Distance in ulps of two finite floats of the same sign (their bit patterns as integers).
int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return (ia & 0x7FFFFFFF) + (ib & 0x7FFFFFFF);
  return std::llabs(static_cast<long long>(ia) - ib);
}

struct Outputs {
  std::vector<int8_t> q8, k8, v_t;
  std::vector<float> qs, ks, vs, k_mean;
};

void check_case(const Case& c, const Variant& var, uint64_t seed, bool check_determinism = false) {
  SCOPED_TRACE(describe(c, var, seed));
  // v_block 0 (V per channel over all keys) is the host quantizer's one block of every key.
  const int64_t v_block = var.v_block == 0 ? std::max<int64_t>(c.kv_len, 1) : var.v_block;
  const int64_t width = (c.heads + 2 * c.kv_heads) * c.d, tiles = (c.kv_len + v_block - 1) / v_block;
  const int64_t vt_size = c.kv_heads * c.d * attention_v_t_stride(c.kv_len);
  const std::vector<uint16_t> qkv = make_qkv(c, seed);

  DeviceBuffer<uint16_t> dqkv(qkv.size());
  DeviceBuffer<int8_t> dq8(static_cast<size_t>(c.q_len * c.heads * c.d)), dk8(static_cast<size_t>(c.kv_len * c.kv_heads * c.d)),
      dvt(static_cast<size_t>(vt_size));
  DeviceBuffer<float> dqs(static_cast<size_t>(c.heads * c.q_len)), dks(static_cast<size_t>(c.kv_heads * c.kv_len)),
      dvs(static_cast<size_t>(c.kv_heads * tiles * c.d)), dmean(static_cast<size_t>(c.kv_heads * c.d));
  ASSERT_TRUE(dqkv.ok() && dq8.ok() && dk8.ok() && dvt.ok() && dqs.ok() && dks.ok() && dvs.ok() && dmean.ok());
  CUDA_ASSERT(dqkv.upload(qkv));
  // Garbage in every output, so a code, scale or padding byte left unwritten shows.
  CUDA_ASSERT(dq8.fill_bytes(0x7F));
  CUDA_ASSERT(dk8.fill_bytes(0x7F));
  CUDA_ASSERT(dvt.fill_bytes(0x7F));
  CUDA_ASSERT(dqs.fill_bytes(0x7F));
  CUDA_ASSERT(dks.fill_bytes(0x7F));
  CUDA_ASSERT(dvs.fill_bytes(0x7F));
  CUDA_ASSERT(dmean.fill_bytes(0x7F));

  AttentionQuantizeArgs a;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.d;
  a.fp8 = var.fp8;
  a.smooth_k = var.smooth_k;
  a.quantize_v = var.quantize_v;
  a.v_block = var.v_block;
  a.q = dqkv.get() + (c.kv_len - c.q_len) * width;  // Q: the last q_len tokens
  a.k = dqkv.get() + c.heads * c.d;
  a.v = dqkv.get() + (c.heads + c.kv_heads) * c.d;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = width;
  a.q8 = dq8.get();
  a.q_scale = dqs.get();
  a.k8 = dk8.get();
  a.k_scale = dks.get();
  a.v_t = dvt.get();
  a.v_scale = dvs.get();
  a.k_mean = dmean.get();
  if (!var.quantize_v) {  // V's input and scales unused, so not even looked at; v_t is checked untouched below
    a.v = nullptr;
    a.v_scale = nullptr;
  }
  const Status st = cuda_quantize_attention_inputs(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  Outputs got;
  CUDA_ASSERT(dq8.download(&got.q8));
  CUDA_ASSERT(dk8.download(&got.k8));
  CUDA_ASSERT(dvt.download(&got.v_t));
  CUDA_ASSERT(dqs.download(&got.qs));
  CUDA_ASSERT(dks.download(&got.ks));
  CUDA_ASSERT(dvs.download(&got.vs));
  CUDA_ASSERT(dmean.download(&got.k_mean));

  // Host: the same slices, quantized as the specification does.
  const std::vector<float> q = slice(qkv, width, c.kv_len - c.q_len, c.q_len, 0, c.heads, c.d);
  std::vector<float> k = slice(qkv, width, 0, c.kv_len, c.heads * c.d, c.kv_heads, c.d);
  const std::vector<float> v = slice(qkv, width, 0, c.kv_len, (c.heads + c.kv_heads) * c.d, c.kv_heads, c.d);
  Outputs want;
  quantize_rows(q, c.q_len, c.heads, c.d, var.fp8, &want.q8, &want.qs);
  if (var.smooth_k) {
    // The GPU sums each channel in chunks (in double), the specification in token order: the double
    // sums of BF16 terms are exact here, so the means agree, and a rounding difference could move a
    // mean by one float ulp at most. The K codes are then checked against the GPU's own mean, which
    // makes them bit-exact: everything after the mean is the same correctly rounded float arithmetic.
    const std::vector<float> mean = spec_k_mean(k, c.kv_len, c.kv_heads, c.d);
    int64_t unequal = 0;
    for (size_t i = 0; i < mean.size(); ++i) {
      const int64_t dist = ulp_distance(got.k_mean[i], mean[i]);
      EXPECT_LE(dist, 1) << "k_mean[" << i << "]: got " << got.k_mean[i] << ", want " << mean[i];
      unequal += dist != 0;
    }
    EXPECT_EQ(unequal, 0) << "k_mean: means one ulp apart (summation order), expected none on these inputs";
    for (int64_t t = 0; t < c.kv_len; ++t)
      for (int64_t i = 0; i < c.kv_heads * c.d; ++i)
        k[static_cast<size_t>(t * c.kv_heads * c.d + i)] -= got.k_mean[static_cast<size_t>(i)];
  }
  quantize_rows(k, c.kv_len, c.kv_heads, c.d, var.fp8, &want.k8, &want.ks);
  std::vector<int8_t> v_codes;
  quantize_v_blocks(v, c.kv_len, c.kv_heads, c.d, var.fp8, &v_codes, &want.vs, v_block);
  want.v_t = transpose_v_codes(v_codes, c.kv_len, c.kv_heads, c.d);  // zeros past kv_len

  expect_bit_equal(got.q8, want.q8, "q8");
  expect_bit_equal(got.qs, want.qs, "q_scale");
  expect_bit_equal(got.k8, want.k8, "k8");
  expect_bit_equal(got.ks, want.ks, "k_scale");
  // The all-zero rows and block: scale 1.
  EXPECT_EQ(got.qs[static_cast<size_t>((c.heads - 1) * c.q_len)], 1.f) << "q_scale of the all-zero row";
  if (!var.smooth_k) EXPECT_EQ(got.ks[static_cast<size_t>(c.kv_len / 2)], 1.f) << "k_scale of the all-zero row";
  if (var.quantize_v) {
    expect_bit_equal(got.v_t, want.v_t, "v_t");
    expect_bit_equal(got.vs, want.vs, "v_scale");
    if (var.v_block != 0)  // per channel the channel is zero in its last block only
      EXPECT_EQ(got.vs[static_cast<size_t>(((c.kv_heads - 1) * tiles + tiles - 1) * c.d + c.d / 2)], 1.f)
          << "v_scale of the all-zero block";
    // The padding: the columns of keys kv_len .. stride - 1. Within the last 32-key group the kappa
    // order interleaves them with real keys' columns (key 39 sits in column 45), so "columns at or
    // beyond kv_len" is not the set: the columns are attention_v_t_column of the missing keys.
    const int64_t stride = attention_v_t_stride(c.kv_len);
    for (int64_t r = 0; r < c.kv_heads * c.d; ++r)
      for (int64_t key = c.kv_len; key < stride; ++key) {
        const int64_t col = attention_v_t_column(key);
        ASSERT_EQ(got.v_t[static_cast<size_t>(r * stride + col)], 0) << "v_t padding row " << r << " column " << col;
      }
  } else {
    // Half-INT8: V's outputs are left alone.
    for (size_t i = 0; i < got.v_t.size(); ++i) ASSERT_EQ(got.v_t[i], 0x7F) << "v_t written with quantize_v off";
  }

  if (check_determinism) {
    CUDA_ASSERT(dq8.fill_bytes(0x7F));
    CUDA_ASSERT(dk8.fill_bytes(0x7F));
    CUDA_ASSERT(dvt.fill_bytes(0x7F));
    const Status again = cuda_quantize_attention_inputs(a, nullptr);
    ASSERT_TRUE(again.ok()) << again.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    Outputs second;
    CUDA_ASSERT(dq8.download(&second.q8));
    CUDA_ASSERT(dk8.download(&second.k8));
    CUDA_ASSERT(dvt.download(&second.v_t));
    CUDA_ASSERT(dmean.download(&second.k_mean));
    expect_bit_equal(second.q8, got.q8, "q8 (second run)");
    expect_bit_equal(second.k8, got.k8, "k8 (second run)");
    expect_bit_equal(second.v_t, got.v_t, "v_t (second run)");
    expect_bit_equal(second.k_mean, got.k_mean, "k_mean (second run)");
  }
}

TEST(CudaAttentionQuantize, Int8MatchesTheHostQuantizers) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (bool smooth_k : {false, true}) check_case(c, {false, smooth_k, true}, ++seed, smooth_k && c.kv_len == 600);
}

TEST(CudaAttentionQuantize, E4m3MatchesTheHostQuantizers) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const Case& c : kCases)
    for (bool smooth_k : {false, true}) check_case(c, {true, smooth_k, true}, ++seed);
}

// V blocks of 128 keys (the Hopper kernel's tile; head_dim <= 128).
TEST(CudaAttentionQuantize, VBlocksOf128MatchTheHostQuantizers) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = 400;
  for (const Case& c : kCases)
    if (c.d <= 128)
      for (bool fp8 : {false, true}) check_case(c, {fp8, false, true, 128}, ++seed, !fp8 && c.kv_len == 600);
}

// V per channel over all keys (v_block 0, E4M3 only; head_dim <= 128): the absmax pass, the blocks
// quantized with its scales, the scales written last. kv_len 600: two absmax chunks' atomics.
TEST(CudaAttentionQuantize, VPerChannelMatchesTheHostQuantizers) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = 500;
  for (const Case& c : kCases)
    if (c.d <= 128) check_case(c, {true, false, true, 0}, ++seed, c.kv_len == 600);
  check_case({4, 1500, 2, 2, 128}, {true, true, true, 0}, 599);  // three chunks, smooth_k
}

TEST(CudaAttentionQuantize, HalfInt8LeavesVAlone) {
  LLMQ_REQUIRE_GPU();
  check_case(kCases[0], {false, false, false}, 300);
  check_case(kCases[1], {false, true, false}, 301);
}

// Empty parts: q_len 0 quantizes K and V alone (Q's pointers unused), kv_len 0 Q alone.
TEST(CudaAttentionQuantize, EmptyPartsAreSkipped) {
  LLMQ_REQUIRE_GPU();
  const int64_t d = 64, n = 100;
  DeviceBuffer<uint16_t> x(static_cast<size_t>(n * 2 * d));
  DeviceBuffer<int8_t> codes(static_cast<size_t>(n * 2 * d)), vt(static_cast<size_t>(2 * d * attention_v_t_stride(n)));
  DeviceBuffer<float> scales(static_cast<size_t>(2 * n)), vs(static_cast<size_t>(2 * 2 * d));
  CUDA_ASSERT(x.fill_bytes(0x3F));  // BF16 0x3F3F = 0.746
  AttentionQuantizeArgs a;
  a.heads = a.kv_heads = 2;
  a.head_dim = d;
  a.kv_len = n;
  a.k = a.v = x.get();
  a.k_row_stride = a.v_row_stride = 2 * d;
  a.k8 = codes.get();
  a.k_scale = scales.get();
  a.v_t = vt.get();
  a.v_scale = vs.get();
  const Status kv_only = cuda_quantize_attention_inputs(a, nullptr);
  EXPECT_TRUE(kv_only.ok()) << kv_only.to_string();
  a = AttentionQuantizeArgs{};
  a.heads = a.kv_heads = 2;
  a.head_dim = d;
  a.q_len = n;
  a.q = x.get();
  a.q_row_stride = 2 * d;
  a.q8 = codes.get();
  a.q_scale = scales.get();
  const Status q_only = cuda_quantize_attention_inputs(a, nullptr);
  EXPECT_TRUE(q_only.ok()) << q_only.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int8_t> got;
  CUDA_ASSERT(codes.download(&got));
  EXPECT_EQ(got[0], 127);  // a constant row: every code is max
}

// Argument checks: every one fails before any CUDA call, so this needs no GPU.
TEST(CudaAttentionQuantize, RefusesBadArguments) {
  alignas(16) static uint16_t x[64];
  alignas(16) static int8_t codes[64];
  alignas(16) static float scales[16];
  AttentionQuantizeArgs good;
  good.q_len = 4;
  good.kv_len = 4;
  good.heads = 4;
  good.kv_heads = 2;
  good.head_dim = 64;
  good.q = good.k = good.v = x;
  good.q_row_stride = 4 * 64;
  good.k_row_stride = good.v_row_stride = 2 * 64 + 8;  // a slice of a wider row
  good.q8 = good.k8 = good.v_t = codes;
  good.q_scale = good.k_scale = good.v_scale = good.k_mean = scales;

  // Each case spoils one field of `good`; the Status must have the code and name the field.
  struct Bad {
    const char* field;
    StatusCode code;
    void (*spoil)(AttentionQuantizeArgs*);
  };
  constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
  const Bad bad[] = {
      {"q_len", kInvalid, [](AttentionQuantizeArgs* a) { a->q_len = -1; }},
      {"kv_len", kInvalid, [](AttentionQuantizeArgs* a) { a->kv_len = -3; }},
      {"kv_heads", kInvalid, [](AttentionQuantizeArgs* a) { a->kv_heads = 3; }},
      {"heads", kInvalid, [](AttentionQuantizeArgs* a) { a->heads = 0; }},
      {"head_dim", kInvalid, [](AttentionQuantizeArgs* a) { a->head_dim = 0; }},
      {"head_dim", StatusCode::kUnsupported, [](AttentionQuantizeArgs* a) { a->head_dim = 100; }},
      {"head_dim", StatusCode::kUnsupported, [](AttentionQuantizeArgs* a) { a->head_dim = 264; }},
      {"q: null", kInvalid, [](AttentionQuantizeArgs* a) { a->q = nullptr; }},
      {"q: must be 16-byte aligned", kInvalid, [](AttentionQuantizeArgs* a) { a->q = x + 1; }},
      {"q_row_stride", kInvalid, [](AttentionQuantizeArgs* a) { a->q_row_stride = 4 * 64 - 8; }},
      {"k_row_stride", kInvalid, [](AttentionQuantizeArgs* a) { a->k_row_stride = 2 * 64 + 4; }},
      {"q8", kInvalid, [](AttentionQuantizeArgs* a) { a->q8 = codes + 4; }},
      {"q_scale", kInvalid, [](AttentionQuantizeArgs* a) { a->q_scale = nullptr; }},
      {"k: null", kInvalid, [](AttentionQuantizeArgs* a) { a->k = nullptr; }},
      {"k8", kInvalid, [](AttentionQuantizeArgs* a) { a->k8 = nullptr; }},
      {"k_scale", kInvalid, [](AttentionQuantizeArgs* a) { a->k_scale = nullptr; }},
      {"k_mean", kInvalid, [](AttentionQuantizeArgs* a) { a->smooth_k = true; a->k_mean = nullptr; }},
      {"v: null", kInvalid, [](AttentionQuantizeArgs* a) { a->v = nullptr; }},
      {"v_row_stride", kInvalid, [](AttentionQuantizeArgs* a) { a->v_row_stride = 64; }},
      {"v_t", kInvalid, [](AttentionQuantizeArgs* a) { a->v_t = codes + 8; }},
      {"v_scale", kInvalid, [](AttentionQuantizeArgs* a) { a->v_scale = nullptr; }},
      {"v_block", kInvalid, [](AttentionQuantizeArgs* a) { a->v_block = 96; }},
      {"v_block", kInvalid, [](AttentionQuantizeArgs* a) { a->v_block = 0; }},  // per channel: E4M3 only
  };
  for (const Bad& b : bad) {
    AttentionQuantizeArgs a = good;
    b.spoil(&a);
    const Status st = cuda_quantize_attention_inputs(a, nullptr);
    EXPECT_EQ(st.code(), b.code) << b.field << ": " << st.to_string();
    EXPECT_NE(st.message().find(b.field), std::string::npos) << st.to_string();
  }
  // Nothing to do (no CUDA call): both parts empty.
  AttentionQuantizeArgs a;
  a.heads = a.kv_heads = 1;
  a.head_dim = 128;
  EXPECT_TRUE(cuda_quantize_attention_inputs(a, nullptr).ok()) << "q_len = kv_len = 0: nothing to do";
}

}  // namespace
}  // namespace llmq
