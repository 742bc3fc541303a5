// GPU tests of the runtime's prefill attention kernel (src/attention/attention.hpp) against a
// float64 CPU reference computed from the same inputs: head_dim 8/32/64/128 x causal or not x GQA
// 1/2/4/8, on both kernels where the tensor-core one applies; single sequences of 1, 19, 99, 989
// queries; a batch of sequences of different lengths with earlier context in the cache (kv_len > q
// count) in permuted slots; odd kv head counts (3, 5) and groups (1, 3, 5). Every case again over an
// E4M3 cache (suites *E4m3). The cache holds NaN outside the valid positions, outputs are poisoned
// before each run, and each case runs twice over different poisons: the outputs must be equal byte
// for byte. Sliding windows (1 key, within a tile, across tiles, covering everything) and attention
// sinks (random, +8, -30), alone and together, on both kernels and cache types (WindowAndSinks).
// Paged caches (PagedLayoutsMatchTheIdentityLayout): the same sequences in SHUFFLED physical blocks
// of 1, 16 and 64 positions (spare blocks NaN, garbage table entries past each sequence, two
// sequences sharing their first blocks) must give outputs equal byte for byte to the identity
// layout, which is checked against the reference; both kernels, both cache types, windows shorter
// than the prompts, sinks, GQA.
// Decode is tested in test_cuda_attention_decode.cu, argument errors and the widening of
// every E4M3 code in test_cuda_attention.cu. Every GPU test SKIPs (visibly) without an FP8 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "cuda_attention_support.hpp"
#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_attention_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// Prefill

struct PrefillCase {
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2;
  bool causal = true;
  std::vector<int32_t> q_len, start, slot;  // per sequence; kv_len = start + q_len
  int64_t slots = 1, capacity = 0;
  PrefillKernel kernel = PrefillKernel::kAuto;
  bool fp8 = false;  // E4M3 cache
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // random_sinks per q head
  KvLayout layout;     // the identity table unless set
  uint64_t seed = kSeed;

  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " prefill d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << (causal ? " causal" : " full") << " window=" << window << (sinks ? " sinks" : "") << " kernel="
       << (kernel == PrefillKernel::kAuto ? "auto" : kernel == PrefillKernel::kTensorCore ? "mma" : "simt")
       << " cache=" << (fp8 ? "e4m3" : "bf16") << " (q,start,slot)=";
    for (size_t b = 0; b < q_len.size(); ++b) os << "(" << q_len[b] << "," << start[b] << "," << slot[b] << ")";
    os << " capacity=" << capacity << layout.describe();
    return os.str();
  }
};

// A single sequence in slot 0 starting at position 0.
PrefillCase single_sequence(int64_t d, int64_t group, bool causal, int32_t n, bool fp8 = false) {
  PrefillCase c;
  c.fp8 = fp8;
  c.head_dim = d;
  c.n_kv_heads = 2;
  c.n_heads = 2 * group;
  c.causal = causal;
  c.q_len = {n};
  c.start = {0};
  c.slot = {0};
  c.capacity = n;
  return c;
}

// Runs the case on the GPU twice (over NaN, then 0x7F poison), checks both runs agree byte for
// byte and (reference: true) the output against the float64 reference; *output: the output.
void check_prefill(const PrefillCase& c, std::vector<uint16_t>* output = nullptr, bool reference = true) {
  const std::string what = c.describe();
  SCOPED_TRACE(what);
  KvProblem p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.slots = c.slots;
  p.capacity = c.capacity;
  p.slot = c.slot;
  p.seed = c.seed;
  p.fp8 = c.fp8;
  p.layout = c.layout;
  std::vector<int32_t> q_start = {0};
  int64_t max_q = 0;
  for (size_t b = 0; b < c.q_len.size(); ++b) {
    p.kv_len.push_back(c.start[b] + c.q_len[b]);
    q_start.push_back(q_start.back() + c.q_len[b]);
    max_q = std::max<int64_t>(max_q, c.q_len[b]);
  }
  fill_cache(&p);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int64_t total_q = q_start.back(), row = c.n_heads * c.head_dim;
  const std::vector<uint16_t> q = to_bf16(testing::outlier_matrix(total_q, row, c.seed + 7, 4.0f));
  const std::vector<float> sinks = c.sinks ? random_sinks(c.n_heads, c.seed + 11) : std::vector<float>();

  DeviceBuffer<uint16_t> d_q(q.size()), d_out(q.size());
  DeviceBuffer<float> d_sinks(sinks.size());
  if (c.sinks) CUDA_ASSERT(d_sinks.upload(sinks));
  DeviceCache d_cache(p);
  DeviceBuffer<int32_t> d_q_start(q_start.size()), d_kv_len(p.kv_len.size()), d_slot(p.slot.size());
  ASSERT_TRUE(d_q.ok() && d_out.ok() && d_cache.ok()) << "device allocation failed";
  CUDA_ASSERT(d_q.upload(q));
  CUDA_ASSERT(d_cache.upload(p));
  CUDA_ASSERT(d_q_start.upload(q_start));
  CUDA_ASSERT(d_kv_len.upload(p.kv_len));
  CUDA_ASSERT(d_slot.upload(p.slot));

  attention::PrefillAttentionArgs a;
  a.q = d_q.get();
  d_cache.set(c.fp8, &a);
  a.out = d_out.get();
  a.q_start = d_q_start.get();
  a.kv_len = d_kv_len.get();
  a.slot = d_slot.get();
  a.batch = p.batch();
  a.max_q_len = max_q;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.causal = c.causal;
  a.kernel = c.kernel;
  a.window = c.window;
  a.sinks = c.sinks ? d_sinks.get() : nullptr;

  std::vector<uint16_t> runs[2];
  const int poison[2] = {0xFF, 0x7F};
  for (int r = 0; r < 2; ++r) {
    CUDA_ASSERT(d_out.fill_bytes(poison[r]));
    const Status st = attention::prefill_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_out.download(&runs[r]));
  }
  ASSERT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 2))
      << "two runs over different poisons differ: an element left unwritten or a nondeterministic result";
  if (output != nullptr) *output = runs[0];
  if (!reference) return;

  std::vector<double> ref(q.size());
  const double scale = a.softmax_scale;
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t i = 0; i < c.q_len[b]; ++i) {
      const int64_t pos = c.start[b] + i, qrow = q_start[b] + i;
      const int64_t key_end = c.causal ? pos + 1 : p.kv_len[b];
      const int64_t key_begin = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
      for (int64_t h = 0; h < c.n_heads; ++h)
        reference_row(p, b, h, &q[qrow * row + h * c.head_dim], key_end, scale, &ref[qrow * row + h * c.head_dim],
                      key_begin, c.sinks ? &sinks[h] : nullptr);
    }
  expect_close(runs[0], ref, what);
}

// The case lists below run once per cache type (the E4M3 suites on other seeds).
void head_dims_causal_and_gqa_on_both_kernels(bool fp8) {
  uint64_t seed = kSeed + (fp8 ? 10000 : 0);
  for (int64_t d : {8, 32, 64, 128})
    for (bool causal : {true, false})
      for (int64_t group : {1, 2, 4, 8}) {
        // Two sequences: 19 fresh queries in slot 2, and 37 queries after 62 cached positions in slot 0.
        PrefillCase c;
        c.head_dim = d;
        c.n_kv_heads = 2;
        c.n_heads = 2 * group;
        c.causal = causal;
        c.q_len = {19, 37};
        c.start = {0, 62};
        c.slot = {2, 0};
        c.slots = 3;
        c.capacity = 128;
        c.fp8 = fp8;
        c.seed = ++seed;
        check_prefill(c);
        if (d != 8) {
          c.kernel = PrefillKernel::kCudaCore;
          check_prefill(c);
        }
      }
}

void odd_lengths(bool fp8) {
  uint64_t seed = kSeed + 100 + (fp8 ? 10000 : 0);
  for (int64_t d : {64, 128})
    for (bool causal : {true, false})
      for (int32_t n : {1, 19, 99, 989}) {
        PrefillCase c = single_sequence(d, 4, causal, n, fp8);
        c.seed = ++seed;
        check_prefill(c);
      }
  PrefillCase c = single_sequence(128, 4, true, 989, fp8);
  c.kernel = PrefillKernel::kCudaCore;
  check_prefill(c);
  for (int32_t n : {1, 99}) {  // the CUDA-core kernel's other head dims
    check_prefill(single_sequence(16, 2, true, n, fp8));
    check_prefill(single_sequence(256, 2, true, n, fp8));
  }
}

void batch_with_cached_context_and_permuted_slots(bool fp8) {
  uint64_t seed = kSeed + 200 + (fp8 ? 10000 : 0);
  for (int64_t d : {32, 64, 128})
    for (bool causal : {true, false}) {
      // Lengths around the 64-row tiles, with and without earlier context; slots out of order.
      PrefillCase c;
      c.fp8 = fp8;
      c.head_dim = d;
      c.n_heads = 8;
      c.n_kv_heads = 1;
      c.causal = causal;
      c.q_len = {1, 19, 99, 64, 65, 200, 63};
      c.start = {0, 300, 0, 64, 1, 811, 129};
      c.slot = {5, 0, 7, 2, 3, 6, 1};
      c.slots = 8;
      c.capacity = 1024;
      c.seed = ++seed;
      check_prefill(c);
    }
}

// Odd kv head counts (3 and 5) and GQA groups (1, 3, 5), odd lengths, both kernels.
void odd_head_counts(bool fp8) {
  uint64_t seed = kSeed + 250 + (fp8 ? 10000 : 0);
  for (int64_t d : {64, 128})
    for (const auto& heads : {std::pair<int64_t, int64_t>{3, 3}, {9, 3}, {15, 5}})
      for (PrefillKernel kernel : {PrefillKernel::kAuto, PrefillKernel::kCudaCore}) {
        PrefillCase c;
        c.fp8 = fp8;
        c.head_dim = d;
        c.n_heads = heads.first;
        c.n_kv_heads = heads.second;
        c.causal = true;
        c.q_len = {77, 3, 130};
        c.start = {0, 41, 5};
        c.slot = {1, 3, 0};
        c.slots = 4;
        c.capacity = 160;
        c.kernel = kernel;
        c.seed = ++seed;
        check_prefill(c);
      }
}

// Sliding windows of 1 key, within a tile, one tile, across tiles, past every position but under
// the capacity (the window path with nothing masked) and past the capacity (the plain path), with
// and without sinks (and sinks alone); GQA; a batch with cached context around the 64-key tiles;
// both kernels.
void window_and_sinks(bool fp8) {
  uint64_t seed = kSeed + 700 + (fp8 ? 10000 : 0);
  for (int64_t d : {32, 64, 128})
    for (int64_t window : {0, 1, 7, 64, 100, 350, 1024})
      for (bool sinks : {false, true}) {
        if (window == 0 && !sinks) continue;  // the other suites
        PrefillCase c;
        c.fp8 = fp8;
        c.head_dim = d;
        c.n_heads = 8;
        c.n_kv_heads = 2;
        c.q_len = {1, 19, 99, 64, 130};
        c.start = {0, 300, 0, 64, 211};
        c.slot = {4, 0, 2, 3, 1};
        c.slots = 5;
        c.capacity = 400;
        c.window = window;
        c.sinks = sinks;
        c.seed = ++seed;
        check_prefill(c);
        c.kernel = PrefillKernel::kCudaCore;
        check_prefill(c);
      }
  // A long sequence whose CTAs skip most key tiles; no GQA; the CUDA-core kernel's other head dims.
  for (int64_t d : {16, 64, 128, 256}) {
    PrefillCase c = single_sequence(d, 1, true, d == 16 || d == 256 ? 199 : 989, fp8);
    c.window = 100;
    c.sinks = true;
    c.seed = ++seed;
    check_prefill(c);
  }
}

// The first differing element of two equal-sized BF16 outputs, or -1.
int64_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

// The case in the identity layout (against the reference), then in shuffled layouts of block
// sizes 1, 16 and 64: equal byte for byte.
void check_paged_prefill(PrefillCase c) {
  std::vector<uint16_t> identity, paged;
  c.layout.shuffled = false;
  c.layout.block_size = 0;
  check_prefill(c, &identity);
  if (::testing::Test::HasFatalFailure()) return;
  for (int64_t bs : {1, 16, 64}) {
    c.layout.shuffled = true;
    c.layout.block_size = bs;
    check_prefill(c, &paged, /*reference=*/false);
    if (::testing::Test::HasFatalFailure()) return;
    const int64_t diff = first_difference(identity, paged);
    EXPECT_EQ(diff, -1) << c.describe() << ": differs from the identity layout at element " << diff << " (0x" << std::hex
                        << (diff >= 0 && diff < static_cast<int64_t>(paged.size()) ? paged[diff] : 0) << " vs 0x"
                        << (diff >= 0 && diff < static_cast<int64_t>(identity.size()) ? identity[diff] : 0) << ")";
  }
}

// Four sequences with cached context around the 64-key tiles in permuted table rows; sequence 2
// shares sequence 0's first 64 positions (whole blocks at every block size); plain, a window
// shorter than the prompts with sinks, non-causal; GQA 4; both kernels.
void paged_layouts(bool fp8) {
  uint64_t seed = kSeed + 900 + (fp8 ? 10000 : 0);
  for (int64_t d : {64, 128})
    for (int variant = 0; variant < 3; ++variant)
      for (PrefillKernel kernel : {PrefillKernel::kTensorCore, PrefillKernel::kCudaCore}) {
        PrefillCase c;
        c.fp8 = fp8;
        c.head_dim = d;
        c.n_heads = 8;
        c.n_kv_heads = 2;
        c.q_len = {130, 19, 77, 1};
        c.start = {0, 70, 64, 200};
        c.slot = {2, 0, 3, 1};
        c.slots = 4;
        c.capacity = 384;
        c.causal = variant != 2;
        c.window = variant == 1 ? 50 : 0;
        c.sinks = variant == 1;
        c.kernel = kernel;
        c.layout.shared_src = 0;
        c.layout.shared_dst = 2;
        c.layout.shared_positions = 64;
        c.seed = ++seed;
        check_paged_prefill(c);
      }
  // One long prompt over many tiles with a window, d = 32 (two rows a thread per tile load).
  PrefillCase c = single_sequence(32, 2, true, 300, fp8);
  c.capacity = 320;
  c.window = 100;
  c.sinks = true;
  c.seed = ++seed;
  check_paged_prefill(c);
}

TEST(CudaPrefillAttention, PagedLayoutsMatchTheIdentityLayout) {
  LLMQ_REQUIRE_GPU();
  paged_layouts(false);
}
TEST(CudaPrefillAttentionE4m3, PagedLayoutsMatchTheIdentityLayout) {
  LLMQ_REQUIRE_GPU();
  paged_layouts(true);
}

TEST(CudaPrefillAttention, WindowAndSinks) {
  LLMQ_REQUIRE_GPU();
  window_and_sinks(false);
}
TEST(CudaPrefillAttentionE4m3, WindowAndSinks) {
  LLMQ_REQUIRE_GPU();
  window_and_sinks(true);
}

TEST(CudaPrefillAttention, HeadDimsCausalAndGqaOnBothKernels) {
  LLMQ_REQUIRE_GPU();
  head_dims_causal_and_gqa_on_both_kernels(false);
}
TEST(CudaPrefillAttention, OddLengths) {
  LLMQ_REQUIRE_GPU();
  odd_lengths(false);
}
TEST(CudaPrefillAttention, BatchWithCachedContextAndPermutedSlots) {
  LLMQ_REQUIRE_GPU();
  batch_with_cached_context_and_permuted_slots(false);
}
TEST(CudaPrefillAttention, OddHeadCounts) {
  LLMQ_REQUIRE_GPU();
  odd_head_counts(false);
}
TEST(CudaPrefillAttentionE4m3, HeadDimsCausalAndGqaOnBothKernels) {
  LLMQ_REQUIRE_GPU();
  head_dims_causal_and_gqa_on_both_kernels(true);
}
TEST(CudaPrefillAttentionE4m3, OddLengths) {
  LLMQ_REQUIRE_GPU();
  odd_lengths(true);
}
TEST(CudaPrefillAttentionE4m3, BatchWithCachedContextAndPermutedSlots) {
  LLMQ_REQUIRE_GPU();
  batch_with_cached_context_and_permuted_slots(true);
}
TEST(CudaPrefillAttentionE4m3, OddHeadCounts) {
  LLMQ_REQUIRE_GPU();
  odd_head_counts(true);
}

}  // namespace
}  // namespace llmq
