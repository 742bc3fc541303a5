// GPU tests of the runtime's decode attention kernel (src/attention/attention.hpp) against a
// float64 CPU reference computed from the same inputs: kv_len 1, 17, 1000, 8192 and 0 in one batch with
// max_kv_len above all of them; batch 1 with 32 q / 8 kv heads at 8192 (the split over many chunks);
// a single-chunk plan with no workspace; 64 sequences at once (one chunk each); serving batches
// (the warp-per-group kernel: groups alone fill the GPU); odd kv head counts
// (3, 5, 7) and groups (1, 3, 5, 6, 7); a CUDA
// graph captured once and replayed after kv_len grew on the device (E4M3: before the scales were
// written). Sliding windows (1 key to past max_kv_len) with kv_len inside and past them, and
// attention sinks (random, +8, -30), over one chunk and many, and in a replayed graph whose
// kv_len grows past the window. Every case again over an E4M3 cache (suites *E4m3). The cache holds NaN outside the
// valid positions, outputs are poisoned before each run, and each case runs twice over different
// poisons: the outputs must be equal byte for byte. Paged caches (PagedLayoutsMatchTheIdentityLayout):
// the same sequences in SHUFFLED physical blocks of 1, 16 and 64 positions (spare blocks NaN,
// garbage table entries past each sequence, two sequences sharing their first blocks), batch 1, 3
// and 8, GQA, windows, sinks, one chunk and many, every head dim: outputs equal byte for byte to
// the identity layout's, which is checked against the reference. Every GPU test SKIPs (visibly)
// without an FP8 GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "attention/decode_plan.hpp"
#include "cuda_attention_support.hpp"
#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_attention_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// Decode

struct DecodeCase {
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2, max_kv_len = 0;
  std::vector<int32_t> kv_len, slot;
  int64_t slots = 1, capacity = 0;
  bool fp8 = false;  // E4M3 cache
  int64_t window = 0;  // sliding window (0: none)
  bool sinks = false;  // random_sinks per q head
  KvLayout layout;     // the identity table unless set
  uint64_t seed = kSeed;
  std::optional<attention::DecodeKernel> kernel;  // the kernel this case must run, where it matters
  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " decode d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << " max_kv_len=" << max_kv_len << " window=" << window << (sinks ? " sinks" : "") << " cache=" << (fp8 ? "e4m3" : "bf16") << " (kv_len,slot)=";
    for (size_t b = 0; b < kv_len.size(); ++b) os << "(" << kv_len[b] << "," << slot[b] << ")";
    os << " capacity=" << capacity << layout.describe();
    return os.str();
  }
};

// The host side of a decode case: the cache, the queries and the float64 reference.
struct DecodeRun {
  KvProblem p;
  std::vector<uint16_t> q;
  std::vector<float> sinks;  // empty: none
  std::vector<double> ref;
};

// reference: false skips the float64 reference (run->ref stays empty).
void make_decode_problem(const DecodeCase& c, DecodeRun* run, bool reference = true) {
  KvProblem& p = run->p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.slots = c.slots;
  p.capacity = c.capacity;
  p.slot = c.slot;
  p.kv_len = c.kv_len;
  p.seed = c.seed;
  p.fp8 = c.fp8;
  p.layout = c.layout;
  fill_cache(&p);
  const int64_t row = c.n_heads * c.head_dim;
  run->q = to_bf16(testing::outlier_matrix(p.batch(), row, c.seed + 7, 4.0f));
  if (c.sinks) run->sinks = random_sinks(c.n_heads, c.seed + 11);
  if (!reference) return;
  run->ref.assign(run->q.size(), 0.0);
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  for (int64_t b = 0; b < p.batch(); ++b) {
    // The query sits at position kv_len - 1: its window is [kv_len - window, kv_len).
    const int64_t key_begin = c.window > 0 ? std::max<int64_t>(0, p.kv_len[b] - c.window) : 0;
    for (int64_t h = 0; h < c.n_heads; ++h)
      reference_row(p, b, h, &run->q[b * row + h * c.head_dim], p.kv_len[b], scale, &run->ref[b * row + h * c.head_dim],
                    key_begin, c.sinks ? &run->sinks[h] : nullptr);
  }
}

// The device copies of a decode case and the arguments that point at them.
struct DecodeDevice {
  DeviceBuffer<uint16_t> q, out;
  DeviceCache cache;
  DeviceBuffer<int32_t> kv_len, slot;
  DeviceBuffer<uint8_t> ws;
  DeviceBuffer<float> sinks;
  attention::DecodeAttentionArgs args;

  DecodeDevice(const DecodeCase& c, const DecodeRun& run)
      : q(run.q.size()), out(run.q.size()), cache(run.p), kv_len(run.p.kv_len.size()), slot(run.p.slot.size()),
        sinks(run.sinks.size()),
        ws(static_cast<size_t>(attention::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len))) {
    const int64_t ws_bytes = attention::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len);
    args.q = q.get();
    cache.set(c.fp8, &args);
    args.out = out.get();
    args.kv_len = kv_len.get();
    args.slot = slot.get();
    args.batch = run.p.batch();
    args.n_heads = c.n_heads;
    args.n_kv_heads = c.n_kv_heads;
    args.head_dim = c.head_dim;
    args.max_kv_len = c.max_kv_len;
    args.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    args.workspace = ws_bytes > 0 ? ws.get() : nullptr;
    args.workspace_bytes = ws_bytes;
    args.window = c.window;
    args.sinks = c.sinks ? sinks.get() : nullptr;
  }
  bool ok() const { return q.ok() && out.ok() && cache.ok() && kv_len.ok() && slot.ok() && ws.ok(); }
  cudaError_t upload(const DecodeRun& run) {
    for (cudaError_t e : {q.upload(run.q), cache.upload(run.p), kv_len.upload(run.p.kv_len), slot.upload(run.p.slot)})
      if (e != cudaSuccess) return e;
    return run.sinks.empty() ? cudaSuccess : sinks.upload(run.sinks);
  }
};

// Runs the case twice over different poisons (equal byte for byte), then (reference: true) against
// the float64 reference; *output: the output.
void check_decode(const DecodeCase& c, std::vector<uint16_t>* output = nullptr, bool reference = true) {
  const std::string what = c.describe();
  SCOPED_TRACE(what);
  DecodeRun run;
  make_decode_problem(c, &run, reference);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  DecodeDevice dev(c, run);
  ASSERT_TRUE(dev.ok()) << "device allocation failed";
  CUDA_ASSERT(dev.upload(run));
  const attention::DecodeAttentionArgs& a = dev.args;
  if (c.kernel.has_value()) {
    attention::DecodeKernel chosen = attention::DecodeKernel::kCudaCore;
    const Status st = attention::decode_kernel_choice(a, &chosen);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(static_cast<int>(chosen), static_cast<int>(*c.kernel)) << "not the kernel this case is about";
  }
  DeviceBuffer<uint16_t>& d_out = dev.out;
  DeviceBuffer<uint8_t>& d_ws = dev.ws;
  const int64_t ws_bytes = a.workspace_bytes;

  std::vector<uint16_t> runs[2];
  const int poison[2] = {0xFF, 0x7F};
  for (int r = 0; r < 2; ++r) {
    CUDA_ASSERT(d_out.fill_bytes(poison[r]));
    if (ws_bytes > 0) CUDA_ASSERT(d_ws.fill_bytes(poison[r]));
    const Status st = attention::decode_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_out.download(&runs[r]));
  }
  ASSERT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 2))
      << "two runs over different poisons differ: an element left unwritten or a nondeterministic result";
  if (output != nullptr) *output = runs[0];
  if (reference) expect_close(runs[0], run.ref, what);
}

// The case in the identity layout (against the reference), then in shuffled layouts of block
// sizes 1, 16 and 64: equal byte for byte.
void check_paged_decode(DecodeCase c) {
  std::vector<uint16_t> identity, paged;
  c.layout.shuffled = false;
  c.layout.block_size = 0;
  check_decode(c, &identity);
  if (::testing::Test::HasFatalFailure()) return;
  for (int64_t bs : {1, 16, 64}) {
    c.layout.shuffled = true;
    c.layout.block_size = bs;
    check_decode(c, &paged, /*reference=*/false);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(identity.size(), paged.size());
    size_t diff = 0;
    while (diff < paged.size() && paged[diff] == identity[diff]) ++diff;
    EXPECT_EQ(diff, paged.size()) << c.describe() << ": differs from the identity layout at element " << diff;
  }
}

// Batch 1 (Llama-3-8B heads, many chunks; bs 1 puts every key in its own block), 3 and 8 (the two
// sequences of the shared prefix among them), kv_len inside and past windows, GQA 1 / 4 / 6,
// sinks; every head dim (E4M3 d = 8: 8-byte copies); max_kv_len above every kv_len.
void decode_paged_layouts(bool fp8) {
  uint64_t seed = kSeed + 950 + (fp8 ? 10000 : 0);
  for (int64_t window : {0, 700}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.kv_len = {3001};
    c.slot = {0};
    c.slots = 1;
    c.capacity = 4096;
    c.max_kv_len = 4096;
    c.window = window;
    c.sinks = window > 0;
    c.seed = ++seed;
    check_paged_decode(c);
  }
  for (int64_t d : {64, 128})
    for (int64_t window : {0, 100}) {
      DecodeCase c;
      c.fp8 = fp8;
      c.head_dim = d;
      c.n_heads = 8;
      c.n_kv_heads = 2;
      c.kv_len = {1, 1000, 130, 64, 17, 2000, 65, 333};
      c.slot = {5, 0, 7, 2, 3, 6, 1, 4};
      c.slots = 8;
      c.capacity = 2048;
      c.max_kv_len = 2048;
      c.window = window;
      c.sinks = window > 0;
      c.layout.shared_src = 1;
      c.layout.shared_dst = 2;
      c.layout.shared_positions = 64;
      c.seed = ++seed;
      check_paged_decode(c);
    }
  for (int64_t d : {8, 16, 32, 256}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = d;
    c.n_heads = 12;
    c.n_kv_heads = 2;
    c.kv_len = {70, 5, 700};
    c.slot = {2, 0, 1};
    c.slots = 3;
    c.capacity = 1024;
    c.max_kv_len = 1024;
    c.window = 333;
    c.sinks = true;
    c.layout.shared_src = 0;
    c.layout.shared_dst = 2;
    c.layout.shared_positions = 64;
    c.seed = ++seed;
    check_paged_decode(c);
  }
  DecodeCase one;  // one chunk, no workspace
  one.fp8 = fp8;
  one.head_dim = 64;
  one.n_heads = 8;
  one.n_kv_heads = 8;
  one.kv_len = {64, 1, 37};
  one.slot = {1, 2, 0};
  one.slots = 3;
  one.capacity = 64;
  one.max_kv_len = 64;
  one.seed = ++seed;
  check_paged_decode(one);
}

TEST(CudaDecodeAttention, PagedLayoutsMatchTheIdentityLayout) {
  LLMQ_REQUIRE_GPU();
  decode_paged_layouts(false);
}
TEST(CudaDecodeAttentionE4m3, PagedLayoutsMatchTheIdentityLayout) {
  LLMQ_REQUIRE_GPU();
  decode_paged_layouts(true);
}

// Two sequences of first_len and 700 keys in swapped slots, 2 kv heads, one chunk each (1024 positions).
DecodeCase two_sequences(bool fp8, int64_t head_dim, int64_t n_heads, int32_t first_len, uint64_t seed) {
  DecodeCase c;
  c.fp8 = fp8;
  c.head_dim = head_dim;
  c.n_kv_heads = 2;
  c.n_heads = n_heads;
  c.kv_len = {first_len, 700};
  c.slot = {1, 0};
  c.slots = 2;
  c.capacity = 1024;
  c.max_kv_len = 1024;
  c.seed = seed;
  return c;
}

void decode_head_dims_gqa_and_lengths(bool fp8) {
  uint64_t seed = kSeed + 300 + (fp8 ? 10000 : 0);
  for (int64_t d : {8, 32, 64, 128})
    for (int64_t group : {1, 2, 4, 8}) {
      DecodeCase c;
      c.fp8 = fp8;
      c.head_dim = d;
      c.n_kv_heads = 2;
      c.n_heads = 2 * group;
      c.kv_len = {1, 17, 1000, 8192, 0};  // 0: an empty sequence gives zeros (every chunk empty)
      c.slot = {2, 0, 3, 1, 4};
      c.slots = 5;
      c.capacity = 9000;
      c.max_kv_len = 9000;  // above every kv_len: the tail chunks have nothing to do
      c.seed = ++seed;
      check_decode(c);
    }
  // head_dim 128 (the tensor-core kernel) with 6 and 7 heads per CTA (rows of the 16-row tile past
  // them padding), and at a serving batch: 64 sequences of up to 900 keys, one chunk per sequence
  // (every CTA runs all of its sequence's tiles).
  for (int64_t group : {6, 7}) check_decode(two_sequences(fp8, 128, 2 * group, 33, ++seed));
  {
    DecodeCase c;
    c.fp8 = fp8;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    for (int32_t b = 0; b < 64; ++b) {
      c.kv_len.push_back(1 + (b * 131) % 900);
      c.slot.push_back((b * 17) % 64);
    }
    c.slots = 64;
    c.capacity = 1024;
    c.max_kv_len = 1024;
    c.seed = ++seed;
    int sms = 0;
    CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (64 * 8 < attention::kDecodeWarpGroupsPerSm * sms) c.kernel = attention::DecodeKernel::kCtaMma;  // too few groups
    check_decode(c);
  }
  // group 6: heads_per_cta 6 in an 8-head register tile
  for (int64_t d : {16, 256}) check_decode(two_sequences(fp8, d, 12, 5, ++seed));
}

// Serving batches: enough sequences that the GQA groups alone give every SM
// kDecodeWarpGroupsPerSm warps, so the warp-per-group kernel runs (one chunk per sequence). Lengths
// from none (zeros) and 1 key to 700 with a tile's edges (16, 17, 32, 33) among them; a window with
// sinks; groups 2, 4, 6 and 8 (rows of the tile past 6 padding); the 6-group case also in shuffled
// paged layouts.
void decode_serving_batches(bool fp8) {
  int sms = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint64_t seed = kSeed + 1200 + (fp8 ? 10000 : 0);
  struct Shape {
    int64_t n_heads, n_kv_heads, max_len, window;
    bool sinks, paged;
  };
  for (const Shape& s : {Shape{32, 8, 700, 0, false, false}, Shape{32, 8, 700, 100, true, false}, Shape{12, 2, 80, 0, true, true},
                         Shape{16, 8, 300, 0, false, false}, Shape{16, 2, 80, 0, true, false}}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.n_heads = s.n_heads;
    c.n_kv_heads = s.n_kv_heads;
    // Groups of the whole GQA group (<= 8 heads): n_kv_heads of them per sequence.
    const int64_t batch = (attention::kDecodeWarpGroupsPerSm * sms + s.n_kv_heads - 1) / s.n_kv_heads + 3;
    const int32_t edges[] = {1, 16, 17, 32, 33};
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t len = b < 5 ? std::min<int32_t>(edges[b], static_cast<int32_t>(s.max_len))
                                : static_cast<int32_t>(1 + (b * 131) % s.max_len);
      c.kv_len.push_back(b == batch - 1 ? static_cast<int32_t>(s.max_len) : (b == 5 ? 0 : len));
      c.slot.push_back(static_cast<int32_t>(batch - 1 - b));
    }
    c.slots = batch;
    c.capacity = (s.max_len + 63) / 64 * 64;  // whole blocks of the paged layouts' 64
    c.max_kv_len = c.capacity;
    c.window = s.window;
    c.sinks = s.sinks;
    c.seed = ++seed;
    c.kernel = attention::DecodeKernel::kWarpMma;
    if (s.paged) check_paged_decode(c);
    else check_decode(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void decode_long_context_batch_one(bool fp8) {
  const uint64_t seed = kSeed + (fp8 ? 10000 : 0);
  // Llama-3-8B-like heads: few CTAs per chunk, so the plan splits the 8192 keys into many chunks.
  for (int64_t max_kv_len : {8192, 32768}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.kv_len = {8192};
    c.slot = {0};
    c.slots = 1;
    c.capacity = max_kv_len;
    c.max_kv_len = max_kv_len;
    c.seed = seed + 400 + static_cast<uint64_t>(max_kv_len);
    check_decode(c);
  }
  // GQA group 16 (split over two CTAs per kv head) and no GQA at all.
  for (int64_t n_kv : {2, 32}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = n_kv;
    c.kv_len = {3001};
    c.slot = {0};
    c.slots = 1;
    c.capacity = 4096;
    c.max_kv_len = 4096;
    c.seed = seed + 500 + static_cast<uint64_t>(n_kv);
    check_decode(c);
  }
}

void decode_single_chunk_needs_no_workspace(bool fp8) {
  EXPECT_EQ(attention::decode_attention_workspace_bytes(3, 8, 64, 64), 0);  // <= kMinChunkKeys keys: one chunk
  DecodeCase c;
  c.fp8 = fp8;
  c.head_dim = 64;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.kv_len = {1, 64, 37};
  c.slot = {1, 2, 0};
  c.slots = 3;
  c.capacity = 64;
  c.max_kv_len = 64;
  c.seed = kSeed + (fp8 ? 10000 : 0);
  check_decode(c);
}

// Odd kv head counts and groups, odd lengths from 1 key to many chunks, several head dims.
void decode_odd_head_counts(bool fp8) {
  uint64_t seed = kSeed + 600 + (fp8 ? 10000 : 0);
  for (int64_t d : {32, 64, 128, 256})
    for (const auto& heads : {std::pair<int64_t, int64_t>{3, 3}, {9, 3}, {15, 5}, {35, 7}}) {
      DecodeCase c;
      c.fp8 = fp8;
      c.head_dim = d;
      c.n_heads = heads.first;
      c.n_kv_heads = heads.second;
      c.kv_len = {1, 4999, 63, 65};
      c.slot = {3, 1, 4, 0};
      c.slots = 5;
      c.capacity = 5003;
      c.max_kv_len = 5001;
      c.seed = ++seed;
      check_decode(c);
    }
}

// Windows of 1 key, under a chunk, across chunks and past max_kv_len (the plain path), with and
// without sinks (and sinks alone); kv_len inside the window (1, 17, 100) and past it (1000, 8192)
// in one batch, so chunks are offset differently per sequence; GQA; a single-chunk plan; batch one
// over many chunks of the window; every head dim.
void decode_window_and_sinks(bool fp8) {
  uint64_t seed = kSeed + 700 + (fp8 ? 10000 : 0);
  for (int64_t d : {64, 128})
    for (int64_t window : {0, 1, 100, 700, 4096, 9000})
      for (bool sinks : {false, true}) {
        if (window == 0 && !sinks) continue;  // the other suites
        DecodeCase c;
        c.fp8 = fp8;
        c.head_dim = d;
        c.n_heads = 8;
        c.n_kv_heads = 2;
        c.kv_len = {1, 17, 100, 1000, 8192};
        c.slot = {2, 0, 4, 3, 1};
        c.slots = 5;
        c.capacity = 9000;
        c.max_kv_len = 9000;
        c.window = window;
        c.sinks = sinks;
        c.seed = ++seed;
        check_decode(c);
      }
  DecodeCase one;  // one chunk: the chunk kernel adds the sink itself
  one.fp8 = fp8;
  one.head_dim = 64;
  one.n_heads = 8;
  one.n_kv_heads = 2;
  one.kv_len = {1, 64, 37};
  one.slot = {1, 2, 0};
  one.slots = 3;
  one.capacity = 64;
  one.max_kv_len = 64;
  one.window = 10;
  one.sinks = true;
  one.seed = ++seed;
  check_decode(one);
  for (int64_t window : {1000, 4096}) {  // batch one, 32 / 8 heads: many chunks over the window
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.kv_len = {8192};
    c.slot = {0};
    c.slots = 1;
    c.capacity = 32768;
    c.max_kv_len = 32768;
    c.window = window;
    c.sinks = true;
    c.seed = ++seed;
    check_decode(c);
  }
  for (int64_t d : {8, 16, 32, 256}) {
    DecodeCase c;
    c.fp8 = fp8;
    c.head_dim = d;
    c.n_heads = 12;
    c.n_kv_heads = 2;
    c.kv_len = {5, 700, 2000};
    c.slot = {1, 0, 2};
    c.slots = 3;
    c.capacity = 2048;
    c.max_kv_len = 2048;
    c.window = 333;
    c.sinks = true;
    c.seed = ++seed;
    check_decode(c);
  }
}

TEST(CudaDecodeAttention, WindowAndSinks) {
  LLMQ_REQUIRE_GPU();
  decode_window_and_sinks(false);
}
TEST(CudaDecodeAttentionE4m3, WindowAndSinks) {
  LLMQ_REQUIRE_GPU();
  decode_window_and_sinks(true);
}

TEST(CudaDecodeAttention, HeadDimsGqaAndLengths) {
  LLMQ_REQUIRE_GPU();
  decode_head_dims_gqa_and_lengths(false);
}
TEST(CudaDecodeAttention, ServingBatchesOfManySequences) {
  LLMQ_REQUIRE_GPU();
  decode_serving_batches(false);
}
TEST(CudaDecodeAttentionE4m3, ServingBatchesOfManySequences) {
  LLMQ_REQUIRE_GPU();
  decode_serving_batches(true);
}
TEST(CudaDecodeAttention, LongContextBatchOne) {
  LLMQ_REQUIRE_GPU();
  decode_long_context_batch_one(false);
}
TEST(CudaDecodeAttention, SingleChunkNeedsNoWorkspace) {
  LLMQ_REQUIRE_GPU();
  decode_single_chunk_needs_no_workspace(false);
}
TEST(CudaDecodeAttention, OddHeadCounts) {
  LLMQ_REQUIRE_GPU();
  decode_odd_head_counts(false);
}
TEST(CudaDecodeAttentionE4m3, HeadDimsGqaAndLengths) {
  LLMQ_REQUIRE_GPU();
  decode_head_dims_gqa_and_lengths(true);
}
TEST(CudaDecodeAttentionE4m3, LongContextBatchOne) {
  LLMQ_REQUIRE_GPU();
  decode_long_context_batch_one(true);
}
TEST(CudaDecodeAttentionE4m3, SingleChunkNeedsNoWorkspace) {
  LLMQ_REQUIRE_GPU();
  decode_single_chunk_needs_no_workspace(true);
}
TEST(CudaDecodeAttentionE4m3, OddHeadCounts) {
  LLMQ_REQUIRE_GPU();
  decode_odd_head_counts(true);
}

// Captured once at a small kv_len, replayed after kv_len grew on the device: the plan depends only
// on max_kv_len, so the replay must match the reference of the longer sequences.
// E4M3: the scales are zeros at capture and at the first replay and written before the second:
// the kernels read them on the device at every replay.
// window / sinks: the same with a window the replayed lengths pass (the captured ones do not).
void decode_graph_replay_follows_device_kv_len(bool fp8, int64_t window = 0, bool sinks = false) {
  DecodeCase c;
  c.fp8 = fp8;
  c.window = window;
  c.sinks = sinks;
  c.head_dim = 128;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.kv_len = {2000, 5000};
  c.slot = {1, 0};
  c.slots = 2;
  c.capacity = 8192;
  c.max_kv_len = 8192;
  const std::string what = c.describe();
  DecodeRun run;
  make_decode_problem(c, &run);
  DecodeDevice dev(c, run);
  ASSERT_TRUE(dev.ok()) << "device allocation failed";
  CUDA_ASSERT(dev.upload(run));
  const std::vector<int32_t> short_len = {3, 1};
  CUDA_ASSERT(dev.kv_len.upload(short_len));
  if (fp8) {
    CUDA_ASSERT(dev.cache.k_scale.fill_bytes(0));
    CUDA_ASSERT(dev.cache.v_scale.fill_bytes(0));
  }
  const attention::DecodeAttentionArgs& a = dev.args;
  DeviceBuffer<uint16_t>& d_out = dev.out;

  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status st = attention::decode_attention(a, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));  // at the short lengths
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  CUDA_ASSERT(dev.kv_len.upload(run.p.kv_len));  // the sequences grew
  if (fp8) {
    CUDA_ASSERT(dev.cache.k_scale.upload(run.p.k_scale));
    CUDA_ASSERT(dev.cache.v_scale.upload(run.p.v_scale));
  }
  CUDA_ASSERT(d_out.fill_bytes(0xFF));
  CUDA_ASSERT(cudaDeviceSynchronize());  // the memset ran on the legacy stream
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  std::vector<uint16_t> out;
  CUDA_ASSERT(d_out.download(&out));
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  CUDA_ASSERT(cudaGraphDestroy(graph));
  CUDA_ASSERT(cudaStreamDestroy(stream));
  expect_close(out, run.ref, what + " (graph replay)");
}

TEST(CudaDecodeAttention, GraphReplayFollowsDeviceKvLen) {
  LLMQ_REQUIRE_GPU();
  decode_graph_replay_follows_device_kv_len(false);
}
TEST(CudaDecodeAttentionE4m3, GraphReplayFollowsDeviceKvLenAndScales) {
  LLMQ_REQUIRE_GPU();
  decode_graph_replay_follows_device_kv_len(true);
}
TEST(CudaDecodeAttention, GraphReplayFollowsDeviceKvLenPastTheWindow) {
  LLMQ_REQUIRE_GPU();
  decode_graph_replay_follows_device_kv_len(false, 1500, true);
}
TEST(CudaDecodeAttentionE4m3, GraphReplayFollowsDeviceKvLenPastTheWindow) {
  LLMQ_REQUIRE_GPU();
  decode_graph_replay_follows_device_kv_len(true, 1500, true);
}

}  // namespace
}  // namespace llmq
