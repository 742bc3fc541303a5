// The runtime's 8-bit prefill attention over a paged BF16 cache (attention/quant_prefill_attention.hpp):
// QuantPrefillAttention::run, for each variant (half-INT8, full-INT8, FP8) and head dims 64 and
// 128, must give outputs equal byte for byte to what the public entry points it wraps
// (cuda_quantize_attention_inputs, then the variant's kernel: cuda_attention_int8.hpp) compute from
// each sequence's K / V as contiguous rows, i.e. the 8-bit path before the cache was paged, which
// test_cuda_attention_int8.cpp and test_cuda_attention_quantize.cpp hold to the CPU specification.
// Layouts: the identity table, and SHUFFLED physical blocks of 1, 16 and 64 positions (spare blocks
// NaN, garbage table entries past each sequence, two sequences sharing their first 64 positions),
// as cuda_attention_support.hpp lays them out. Three sequences with cached context in permuted
// table rows, GQA 4; no window, and a window shorter than the prompts with sinks. Outputs are
// poisoned before each run. Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attention/quant_prefill_attention.hpp"
#include "cuda_attention_support.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_attention_int8.hpp"
#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_attention_test;  // NOLINT: the suite's shared helpers

struct QuantCase {
  AttentionVariant variant = AttentionVariant::kFullInt8;
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2;
  std::vector<int32_t> q_len = {130, 19, 77}, start = {0, 70, 64}, slot = {2, 0, 3};
  int64_t slots = 4, capacity = 384;
  int64_t window = 0;
  bool sinks = false;
  uint64_t seed = kSeed;
  std::string describe(const KvLayout& layout) const {
    return "REPRO seed=" + std::to_string(seed) + " " + attention_variant_name(variant) + " d=" + std::to_string(head_dim) +
           " heads=" + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) + " window=" + std::to_string(window) +
           (sinks ? " sinks" : "") + layout.describe();
  }
};

// The problem's cache in `layout` (sequence 2 shares sequence 0's first 64 positions).
KvProblem make_problem(const QuantCase& c, KvLayout layout) {
  KvProblem p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.slots = c.slots;
  p.capacity = c.capacity;
  p.slot = c.slot;
  for (size_t b = 0; b < c.q_len.size(); ++b) p.kv_len.push_back(c.start[b] + c.q_len[b]);
  p.seed = c.seed;
  layout.shared_src = 0;
  layout.shared_dst = 2;
  layout.shared_positions = 64;
  p.layout = layout;
  fill_cache(&p);
  return p;
}

struct StepInputs {
  DeviceBuffer<uint16_t> q, out;
  DeviceBuffer<float> sinks;
  std::vector<attention::PrefillSequence> seqs;
  explicit StepInputs(const QuantCase& c, int64_t total_q)
      : q(static_cast<size_t>(total_q * c.n_heads * c.head_dim)), out(static_cast<size_t>(total_q * c.n_heads * c.head_dim)),
        sinks(c.sinks ? static_cast<size_t>(c.n_heads) : 0) {}
};

// The step through QuantPrefillAttention over the problem's paged cache.
void run_paged(const QuantCase& c, const KvProblem& p, StepInputs* in, std::vector<uint16_t>* out) {
  attention::QuantPrefillAttention qpa;
  int64_t max_q = 0, max_kv = 0;
  for (const auto& s : in->seqs) max_q = std::max(max_q, s.q_len), max_kv = std::max(max_kv, s.kv_len);
  const Status st = qpa.allocate(c.variant, c.n_heads, c.n_kv_heads, c.head_dim, max_q, max_kv);
  ASSERT_TRUE(st.ok()) << st.to_string();
  DeviceCache cache(p);
  ASSERT_TRUE(cache.ok()) << "device allocation failed";
  CUDA_ASSERT(cache.upload(p));
  CUDA_ASSERT(in->out.fill_bytes(0xFF));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const Status rst = qpa.run(in->q.get(), cache.k.get(), cache.v.get(), cache.pages, in->seqs, in->out.get(), scale, nullptr,
                             c.window, c.sinks ? in->sinks.get() : nullptr);
  ASSERT_TRUE(rst.ok()) << rst.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(in->out.download(out));
}

// The same step as QuantPrefillAttention::run computed it before the cache was paged: per
// sequence, the public quantize reading its K / V as contiguous rows, then the variant's kernel.
void run_contiguous(const QuantCase& c, const KvProblem& p, StepInputs* in, std::vector<uint16_t>* out) {
  const int64_t d = c.head_dim, q_row = c.n_heads * d, kv_row = c.n_kv_heads * d;
  int64_t v_block = 64;
  ASSERT_TRUE(cuda_attention_v_block(d, &v_block, c.variant == AttentionVariant::kFp8).ok());  // as the runtime
  CUDA_ASSERT(in->out.fill_bytes(0xFF));
  for (size_t b = 0; b < in->seqs.size(); ++b) {
    const attention::PrefillSequence& s = in->seqs[b];
    std::vector<uint16_t> k(static_cast<size_t>(s.kv_len * kv_row)), v(k.size());
    for (int64_t pos = 0; pos < s.kv_len; ++pos) {
      const int64_t at = p.cache_index(static_cast<int64_t>(b), pos, 0);
      std::memcpy(&k[pos * kv_row], &p.k_cache[at], kv_row * 2);
      std::memcpy(&v[pos * kv_row], &p.v_cache[at], kv_row * 2);
    }
    const int64_t tiles = v_block == 0 ? 1 : (s.kv_len + v_block - 1) / v_block;  // 0: V per channel
    DeviceBuffer<uint16_t> dk(k.size()), dv(v.size());
    DeviceBuffer<int8_t> q8(static_cast<size_t>(s.q_len * q_row)), k8(k.size()),
        v_t(static_cast<size_t>(kv_row * attention_v_t_stride(s.kv_len)));
    DeviceBuffer<float> q_scale(static_cast<size_t>(c.n_heads * s.q_len)), k_scale(static_cast<size_t>(c.n_kv_heads * s.kv_len)),
        v_scale(static_cast<size_t>(c.n_kv_heads * tiles * d));
    CUDA_ASSERT(dk.upload(k));
    CUDA_ASSERT(dv.upload(v));
    AttentionQuantizeArgs qa;
    qa.q_len = s.q_len;
    qa.kv_len = s.kv_len;
    qa.heads = c.n_heads;
    qa.kv_heads = c.n_kv_heads;
    qa.head_dim = d;
    qa.fp8 = c.variant == AttentionVariant::kFp8;
    qa.quantize_v = c.variant != AttentionVariant::kHalfInt8;
    qa.q = in->q.get() + s.q_begin * q_row;
    qa.q_row_stride = q_row;
    qa.k = dk.get();
    qa.k_row_stride = kv_row;
    qa.v = dv.get();
    qa.v_row_stride = kv_row;
    qa.q8 = q8.get();
    qa.q_scale = q_scale.get();
    qa.k8 = k8.get();
    qa.k_scale = k_scale.get();
    qa.v_t = v_t.get();
    qa.v_scale = v_scale.get();
    qa.v_block = v_block;
    Status st = cuda_quantize_attention_inputs(qa, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    FullInt8AttentionArgs a;
    a.qk.q_len = s.q_len;
    a.qk.kv_len = s.kv_len;
    a.qk.heads = c.n_heads;
    a.qk.kv_heads = c.n_kv_heads;
    a.qk.head_dim = d;
    a.qk.causal = true;
    a.qk.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    a.qk.window = c.window;
    a.qk.sinks = c.sinks ? in->sinks.get() : nullptr;
    a.qk.q = q8.get();
    a.qk.q_scale = q_scale.get();
    a.qk.k = k8.get();
    a.qk.k_scale = k_scale.get();
    a.qk.v = dv.get();
    a.qk.out = in->out.get() + s.q_begin * q_row;
    a.v_t = v_t.get();
    a.v_scale = v_scale.get();
    a.v_block = v_block;
    switch (c.variant) {
      case AttentionVariant::kHalfInt8: st = cuda_half_int8_attention(a.qk, nullptr); break;
      case AttentionVariant::kFullInt8: st = cuda_full_int8_attention(a, nullptr); break;
      default: st = cuda_fp8_attention(a, nullptr); break;
    }
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());  // the per-sequence buffers go out of scope
  }
  CUDA_ASSERT(in->out.download(out));
}

void check_variant(const QuantCase& c) {
  SCOPED_TRACE(c.describe(KvLayout{}));
  const KvProblem identity = make_problem(c, KvLayout{});
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  int64_t total_q = 0;
  for (int32_t n : c.q_len) total_q += n;
  StepInputs in(c, total_q);
  ASSERT_TRUE(in.q.ok() && in.out.ok() && in.sinks.ok()) << "device allocation failed";
  CUDA_ASSERT(in.q.upload(to_bf16(testing::outlier_matrix(total_q, c.n_heads * c.head_dim, c.seed + 7, 4.0f))));
  if (c.sinks) CUDA_ASSERT(in.sinks.upload(random_sinks(c.n_heads, c.seed + 11)));
  int64_t q_begin = 0;
  for (size_t b = 0; b < c.q_len.size(); ++b) {
    in.seqs.push_back({q_begin, c.q_len[b], identity.kv_len[b], c.slot[b]});
    q_begin += c.q_len[b];
  }
  std::vector<uint16_t> want, got;
  run_contiguous(c, identity, &in, &want);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_TRUE(std::isfinite(bf16_bits_to_float(want[i]))) << "contiguous output element " << i << " is not finite";
  KvLayout layouts[4] = {KvLayout{}, {1, true}, {16, true}, {64, true}};
  for (const KvLayout& layout : layouts) {
    const KvProblem p = layout.shuffled ? make_problem(c, layout) : identity;
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    run_paged(c, p, &in, &got);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ASSERT_EQ(want.size(), got.size());
    size_t diff = 0;
    while (diff < got.size() && got[diff] == want[diff]) ++diff;
    EXPECT_EQ(diff, got.size()) << c.describe(p.layout) << ": differs from the contiguous layout at element " << diff;
  }
}

void check_all(AttentionVariant variant) {
  uint64_t seed = kSeed + 1200 + static_cast<uint64_t>(variant) * 10;
  for (int64_t d : {64, 128})
    for (bool windowed : {false, true}) {
      QuantCase c;
      c.variant = variant;
      c.head_dim = d;
      c.window = windowed ? 50 : 0;  // shorter than the 130- and 77-query prompts
      c.sinks = windowed;
      c.seed = ++seed;
      check_variant(c);
    }
}

TEST(CudaQuantPrefillAttention, HalfInt8PagedMatchesContiguous) {
  LLMQ_REQUIRE_GPU();
  check_all(AttentionVariant::kHalfInt8);
}
TEST(CudaQuantPrefillAttention, FullInt8PagedMatchesContiguous) {
  LLMQ_REQUIRE_GPU();
  check_all(AttentionVariant::kFullInt8);
}
TEST(CudaQuantPrefillAttention, Fp8PagedMatchesContiguous) {
  LLMQ_REQUIRE_GPU();
  check_all(AttentionVariant::kFp8);
}

}  // namespace
}  // namespace llmq
