// GPU tests of the runtime's attention kernels (src/runtime/attention.hpp) against a float64 CPU
// reference computed from the same BF16 inputs:
//  * Prefill: head_dim 8/32/64/128 x causal or not x GQA 1/2/4/8, on both kernels where the
//    tensor-core one applies; single sequences of 1, 19, 99, 989 queries; a batch of sequences of
//    different lengths with earlier context in the cache (kv_len > q count) in permuted slots.
//  * Decode: kv_len 1, 17, 1000, 8192 in one batch with max_kv_len above all of them; batch 1 with
//    32 q / 8 kv heads at 8192 (the split over many chunks); a single-chunk plan with no workspace;
//    a CUDA graph captured once and replayed after kv_len grew on the device.
//  * The cache holds NaN everywhere outside the valid positions (unused slots, positions >= kv_len),
//    outputs are poisoned with NaN before each run, and each case runs twice over different
//    poisons: the outputs must be equal byte for byte (every element written, deterministic).
//  * Argument errors name the field; they are rejected before any launch, so they need no GPU.
// Inputs: Gaussian with outlier channels and spikes (never zero), seeded; the seed and the case are
// in every failure message.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "runtime/attention.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using ::llmq::runtime::PrefillKernel;
using ::llmq::testing::DeviceBuffer;

// ||out - ref|| / ||ref|| over a whole output. The kernel rounds its output to BF16 (2^-9 relative
// per element) and the prefill kernel also rounds the softmax weights P to BF16 before P V (2^-9
// per weight, partly averaging out); both give ~2e-3. 1e-2 leaves room for that and for FP32
// accumulation order, while a wrong index, mask or scale gives errors of order 1.
constexpr double kMaxRelativeError = 1e-2;
// max |out - ref| over max |ref|: one element may be a near-cancelling sum whose BF16 P error
// does not average out; still an order below any real mistake.
constexpr double kMaxAbsErrorFraction = 3e-2;
constexpr uint64_t kSeed = 20261122;

// ---------------------------------------------------------------------------------------------
// Problems: one layer's KV cache with some sequences in it.

struct KvProblem {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, slots = 0, capacity = 0;
  std::vector<int32_t> kv_len, slot;  // per sequence
  std::vector<uint16_t> k_cache, v_cache;
  uint64_t seed = 0;
  int64_t batch() const { return static_cast<int64_t>(kv_len.size()); }
  int64_t cache_index(int64_t b, int64_t pos, int64_t kv_head) const {
    return ((slot[b] * capacity + pos) * n_kv_heads + kv_head) * head_dim;
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16_bits(x[i]);
  return out;
}

// The cache is NaN (0xFFFF) outside the valid positions: the kernels must never use them.
void fill_cache(KvProblem* p) {
  const int64_t row = p->n_kv_heads * p->head_dim;
  p->k_cache.assign(p->slots * p->capacity * row, 0xFFFF);
  p->v_cache.assign(p->k_cache.size(), 0xFFFF);
  for (int64_t b = 0; b < p->batch(); ++b) {
    const uint64_t seed = p->seed * 1000 + static_cast<uint64_t>(b);
    // Keys: mild outlier channels (x4) keep the softmax neither flat nor one-hot; values: x20.
    const std::vector<uint16_t> k = to_bf16(testing::outlier_matrix(p->kv_len[b], row, seed, 4.0f));
    const std::vector<uint16_t> v = to_bf16(testing::outlier_matrix(p->kv_len[b], row, seed + 500, 20.0f));
    const int64_t base = p->cache_index(b, 0, 0);
    std::copy(k.begin(), k.end(), p->k_cache.begin() + base);
    std::copy(v.begin(), v.end(), p->v_cache.begin() + base);
  }
}

// out[row, h, :] = softmax(scale * q k^T) v over keys [0, key_end), in float64.
void reference_row(const KvProblem& p, int64_t b, int64_t h, const uint16_t* q, int64_t key_end, double scale,
                   double* out) {
  const int64_t d = p.head_dim, kvh = h / (p.n_heads / p.n_kv_heads);
  std::vector<double> s(static_cast<size_t>(key_end));
  double m = -INFINITY;
  for (int64_t j = 0; j < key_end; ++j) {
    const uint16_t* k = &p.k_cache[p.cache_index(b, j, kvh)];
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(bf16_bits_to_float(q[i])) * bf16_bits_to_float(k[i]);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double sum = 0;
  std::fill(out, out + d, 0.0);
  for (int64_t j = 0; j < key_end; ++j) {
    const double w = std::exp(s[j] - m);
    sum += w;
    const uint16_t* v = &p.v_cache[p.cache_index(b, j, kvh)];
    for (int64_t i = 0; i < d; ++i) out[i] += w * bf16_bits_to_float(v[i]);
  }
  for (int64_t i = 0; i < d; ++i) out[i] /= sum;
}

// Compares a BF16 output with the reference; the message carries the case.
void expect_close(const std::vector<uint16_t>& out, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = bf16_bits_to_float(out[i]);
    ASSERT_TRUE(std::isfinite(o)) << what << ": element " << i << " is " << o << " (bits 0x" << std::hex << out[i] << ")";
    err2 += (o - ref[i]) * (o - ref[i]);
    ref2 += ref[i] * ref[i];
    max_err = std::max(max_err, std::fabs(o - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LT(rel, kMaxRelativeError) << what << ": relative Frobenius error";
  EXPECT_LT(max_err, kMaxAbsErrorFraction * max_ref) << what << ": max abs error (max |ref| " << max_ref << ")";
}

// ---------------------------------------------------------------------------------------------
// Prefill

struct PrefillCase {
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2;
  bool causal = true;
  std::vector<int32_t> q_len, start, slot;  // per sequence; kv_len = start + q_len
  int64_t slots = 1, capacity = 0;
  PrefillKernel kernel = PrefillKernel::kAuto;
  uint64_t seed = kSeed;

  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " prefill d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << (causal ? " causal" : " full") << " kernel="
       << (kernel == PrefillKernel::kAuto ? "auto" : kernel == PrefillKernel::kTensorCore ? "mma" : "simt") << " (q,start,slot)=";
    for (size_t b = 0; b < q_len.size(); ++b) os << "(" << q_len[b] << "," << start[b] << "," << slot[b] << ")";
    return os.str();
  }
};

// A single sequence in slot 0 starting at position 0.
PrefillCase single_sequence(int64_t d, int64_t group, bool causal, int32_t n) {
  PrefillCase c;
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
// byte and the output against the float64 reference.
void check_prefill(const PrefillCase& c) {
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
  std::vector<int32_t> q_start = {0};
  int64_t max_q = 0;
  for (size_t b = 0; b < c.q_len.size(); ++b) {
    p.kv_len.push_back(c.start[b] + c.q_len[b]);
    q_start.push_back(q_start.back() + c.q_len[b]);
    max_q = std::max<int64_t>(max_q, c.q_len[b]);
  }
  fill_cache(&p);
  const int64_t total_q = q_start.back(), row = c.n_heads * c.head_dim;
  const std::vector<uint16_t> q = to_bf16(testing::outlier_matrix(total_q, row, c.seed + 7, 4.0f));

  DeviceBuffer<uint16_t> d_q(q.size()), d_k(p.k_cache.size()), d_v(p.v_cache.size()), d_out(q.size());
  DeviceBuffer<int32_t> d_q_start(q_start.size()), d_kv_len(p.kv_len.size()), d_slot(p.slot.size());
  CUDA_ASSERT(d_q.upload(q));
  CUDA_ASSERT(d_k.upload(p.k_cache));
  CUDA_ASSERT(d_v.upload(p.v_cache));
  CUDA_ASSERT(d_q_start.upload(q_start));
  CUDA_ASSERT(d_kv_len.upload(p.kv_len));
  CUDA_ASSERT(d_slot.upload(p.slot));

  runtime::PrefillAttentionArgs a;
  a.q = d_q.get();
  a.k_cache = d_k.get();
  a.v_cache = d_v.get();
  a.out = d_out.get();
  a.q_start = d_q_start.get();
  a.kv_len = d_kv_len.get();
  a.slot = d_slot.get();
  a.batch = p.batch();
  a.max_q_len = max_q;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.capacity = c.capacity;
  a.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.causal = c.causal;
  a.kernel = c.kernel;

  std::vector<uint16_t> runs[2];
  const int poison[2] = {0xFF, 0x7F};
  for (int r = 0; r < 2; ++r) {
    CUDA_ASSERT(d_out.fill_bytes(poison[r]));
    const Status st = runtime::prefill_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_out.download(&runs[r]));
  }
  ASSERT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 2))
      << "two runs over different poisons differ: an element left unwritten or a nondeterministic result";

  std::vector<double> ref(q.size());
  const double scale = a.softmax_scale;
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t i = 0; i < c.q_len[b]; ++i) {
      const int64_t pos = c.start[b] + i, qrow = q_start[b] + i;
      const int64_t key_end = c.causal ? pos + 1 : p.kv_len[b];
      for (int64_t h = 0; h < c.n_heads; ++h)
        reference_row(p, b, h, &q[qrow * row + h * c.head_dim], key_end, scale, &ref[qrow * row + h * c.head_dim]);
    }
  expect_close(runs[0], ref, what);
}

TEST(CudaPrefillAttention, HeadDimsCausalAndGqaOnBothKernels) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = kSeed;
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
        c.seed = ++seed;
        check_prefill(c);
        if (d != 8) {
          c.kernel = PrefillKernel::kCudaCore;
          check_prefill(c);
        }
      }
}

TEST(CudaPrefillAttention, OddLengths) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = kSeed + 100;
  for (int64_t d : {64, 128})
    for (bool causal : {true, false})
      for (int32_t n : {1, 19, 99, 989}) {
        PrefillCase c = single_sequence(d, 4, causal, n);
        c.seed = ++seed;
        check_prefill(c);
      }
  PrefillCase c = single_sequence(128, 4, true, 989);
  c.kernel = PrefillKernel::kCudaCore;
  check_prefill(c);
  for (int32_t n : {1, 99}) {  // the CUDA-core kernel's other head dims
    check_prefill(single_sequence(16, 2, true, n));
    check_prefill(single_sequence(256, 2, true, n));
  }
}

TEST(CudaPrefillAttention, BatchWithCachedContextAndPermutedSlots) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = kSeed + 200;
  for (int64_t d : {32, 64, 128})
    for (bool causal : {true, false}) {
      // Lengths around the 64-row tiles, with and without earlier context; slots out of order.
      PrefillCase c;
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

// ---------------------------------------------------------------------------------------------
// Decode

struct DecodeCase {
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2, max_kv_len = 0;
  std::vector<int32_t> kv_len, slot;
  int64_t slots = 1, capacity = 0;
  uint64_t seed = kSeed;
  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " decode d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << " max_kv_len=" << max_kv_len << " (kv_len,slot)=";
    for (size_t b = 0; b < kv_len.size(); ++b) os << "(" << kv_len[b] << "," << slot[b] << ")";
    return os.str();
  }
};

// The host side of a decode case: the cache, the queries and the float64 reference.
struct DecodeRun {
  KvProblem p;
  std::vector<uint16_t> q;
  std::vector<double> ref;
};

void make_decode_problem(const DecodeCase& c, DecodeRun* run) {
  KvProblem& p = run->p;
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.head_dim = c.head_dim;
  p.slots = c.slots;
  p.capacity = c.capacity;
  p.slot = c.slot;
  p.kv_len = c.kv_len;
  p.seed = c.seed;
  fill_cache(&p);
  const int64_t row = c.n_heads * c.head_dim;
  run->q = to_bf16(testing::outlier_matrix(p.batch(), row, c.seed + 7, 4.0f));
  run->ref.assign(run->q.size(), 0.0);
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  for (int64_t b = 0; b < p.batch(); ++b)
    for (int64_t h = 0; h < c.n_heads; ++h)
      reference_row(p, b, h, &run->q[b * row + h * c.head_dim], p.kv_len[b], scale, &run->ref[b * row + h * c.head_dim]);
}

// The device copies of a decode case and the arguments that point at them.
struct DecodeDevice {
  DeviceBuffer<uint16_t> q, k, v, out;
  DeviceBuffer<int32_t> kv_len, slot;
  DeviceBuffer<uint8_t> ws;
  runtime::DecodeAttentionArgs args;

  DecodeDevice(const DecodeCase& c, const DecodeRun& run)
      : q(run.q.size()), k(run.p.k_cache.size()), v(run.p.v_cache.size()), out(run.q.size()),
        kv_len(run.p.kv_len.size()), slot(run.p.slot.size()),
        ws(static_cast<size_t>(runtime::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len))) {
    const int64_t ws_bytes = runtime::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len);
    args.q = q.get();
    args.k_cache = k.get();
    args.v_cache = v.get();
    args.out = out.get();
    args.kv_len = kv_len.get();
    args.slot = slot.get();
    args.batch = run.p.batch();
    args.n_heads = c.n_heads;
    args.n_kv_heads = c.n_kv_heads;
    args.head_dim = c.head_dim;
    args.capacity = c.capacity;
    args.max_kv_len = c.max_kv_len;
    args.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    args.workspace = ws_bytes > 0 ? ws.get() : nullptr;
    args.workspace_bytes = ws_bytes;
  }
  bool ok() const { return q.ok() && k.ok() && v.ok() && out.ok() && kv_len.ok() && slot.ok() && ws.ok(); }
  cudaError_t upload(const DecodeRun& run) {
    for (cudaError_t e : {q.upload(run.q), k.upload(run.p.k_cache), v.upload(run.p.v_cache), kv_len.upload(run.p.kv_len),
                          slot.upload(run.p.slot)})
      if (e != cudaSuccess) return e;
    return cudaSuccess;
  }
};

void check_decode(const DecodeCase& c) {
  const std::string what = c.describe();
  SCOPED_TRACE(what);
  DecodeRun run;
  make_decode_problem(c, &run);
  DecodeDevice dev(c, run);
  ASSERT_TRUE(dev.ok()) << "device allocation failed";
  CUDA_ASSERT(dev.upload(run));
  const runtime::DecodeAttentionArgs& a = dev.args;
  DeviceBuffer<uint16_t>& d_out = dev.out;
  DeviceBuffer<uint8_t>& d_ws = dev.ws;
  const int64_t ws_bytes = a.workspace_bytes;

  std::vector<uint16_t> runs[2];
  const int poison[2] = {0xFF, 0x7F};
  for (int r = 0; r < 2; ++r) {
    CUDA_ASSERT(d_out.fill_bytes(poison[r]));
    if (ws_bytes > 0) CUDA_ASSERT(d_ws.fill_bytes(poison[r]));
    const Status st = runtime::decode_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_out.download(&runs[r]));
  }
  ASSERT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 2))
      << "two runs over different poisons differ: an element left unwritten or a nondeterministic result";
  expect_close(runs[0], run.ref, what);
}

TEST(CudaDecodeAttention, HeadDimsGqaAndLengths) {
  LLMQ_REQUIRE_GPU();
  uint64_t seed = kSeed + 300;
  for (int64_t d : {8, 32, 64, 128})
    for (int64_t group : {1, 2, 4, 8}) {
      DecodeCase c;
      c.head_dim = d;
      c.n_kv_heads = 2;
      c.n_heads = 2 * group;
      c.kv_len = {1, 17, 1000, 8192};
      c.slot = {2, 0, 3, 1};
      c.slots = 4;
      c.capacity = 9000;
      c.max_kv_len = 9000;  // above every kv_len: the tail chunks have nothing to do
      c.seed = ++seed;
      check_decode(c);
    }
  for (int64_t d : {16, 256}) {
    DecodeCase c;
    c.head_dim = d;
    c.n_kv_heads = 2;
    c.n_heads = 12;  // group 6: heads_per_cta 6 in an 8-head register tile
    c.kv_len = {5, 700};
    c.slot = {1, 0};
    c.slots = 2;
    c.capacity = 1024;
    c.max_kv_len = 1024;
    c.seed = ++seed;
    check_decode(c);
  }
}

TEST(CudaDecodeAttention, LongContextBatchOne) {
  LLMQ_REQUIRE_GPU();
  // Llama-3-8B-like heads: few CTAs per chunk, so the plan splits the 8192 keys into many chunks.
  for (int64_t max_kv_len : {8192, 32768}) {
    DecodeCase c;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.kv_len = {8192};
    c.slot = {0};
    c.slots = 1;
    c.capacity = max_kv_len;
    c.max_kv_len = max_kv_len;
    c.seed = kSeed + 400 + static_cast<uint64_t>(max_kv_len);
    check_decode(c);
  }
  // GQA group 16 (split over two CTAs per kv head) and no GQA at all.
  for (int64_t n_kv : {2, 32}) {
    DecodeCase c;
    c.head_dim = 128;
    c.n_heads = 32;
    c.n_kv_heads = n_kv;
    c.kv_len = {3001};
    c.slot = {0};
    c.slots = 1;
    c.capacity = 4096;
    c.max_kv_len = 4096;
    c.seed = kSeed + 500 + static_cast<uint64_t>(n_kv);
    check_decode(c);
  }
}

TEST(CudaDecodeAttention, SingleChunkNeedsNoWorkspace) {
  LLMQ_REQUIRE_GPU();
  EXPECT_EQ(runtime::decode_attention_workspace_bytes(3, 8, 64, 100), 0);
  DecodeCase c;
  c.head_dim = 64;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.kv_len = {1, 100, 37};
  c.slot = {1, 2, 0};
  c.slots = 3;
  c.capacity = 100;
  c.max_kv_len = 100;
  check_decode(c);
}

// Captured once at a small kv_len, replayed after kv_len grew on the device: the plan depends only
// on max_kv_len, so the replay must match the reference of the longer sequences.
TEST(CudaDecodeAttention, GraphReplayFollowsDeviceKvLen) {
  LLMQ_REQUIRE_GPU();
  DecodeCase c;
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
  const runtime::DecodeAttentionArgs& a = dev.args;
  DeviceBuffer<uint16_t>& d_out = dev.out;

  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status st = runtime::decode_attention(a, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_ASSERT(cudaGraphLaunch(exec, stream));  // at the short lengths
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  CUDA_ASSERT(dev.kv_len.upload(run.p.kv_len));  // the sequences grew
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

// ---------------------------------------------------------------------------------------------
// Argument errors: each is rejected before anything is launched (the pointers are never used).

template <typename T> T* fake_device_pointer() { return reinterpret_cast<T*>(uintptr_t{4096}); }

runtime::PrefillAttentionArgs valid_prefill_args() {
  runtime::PrefillAttentionArgs a;
  a.q = a.k_cache = a.v_cache = fake_device_pointer<const uint16_t>();
  a.out = fake_device_pointer<uint16_t>();
  a.q_start = a.kv_len = a.slot = fake_device_pointer<const int32_t>();
  a.batch = 1;
  a.max_q_len = 16;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.capacity = 64;
  a.softmax_scale = 0.125f;
  return a;
}

void expect_invalid(const Status& st, const std::string& field) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(field), std::string::npos) << "message does not name " << field << ": " << st.message();
}

TEST(CudaPrefillAttention, RejectsInvalidArguments) {
  auto a = valid_prefill_args();
  a.q = nullptr;
  expect_invalid(runtime::prefill_attention(a, nullptr), "q is null");
  a = valid_prefill_args();
  a.slot = nullptr;
  expect_invalid(runtime::prefill_attention(a, nullptr), "slot");
  a = valid_prefill_args();
  a.n_kv_heads = 3;
  expect_invalid(runtime::prefill_attention(a, nullptr), "n_kv_heads");
  a = valid_prefill_args();
  a.head_dim = 96;
  expect_invalid(runtime::prefill_attention(a, nullptr), "head_dim 96");
  a = valid_prefill_args();
  a.head_dim = 8;
  a.kernel = PrefillKernel::kTensorCore;
  expect_invalid(runtime::prefill_attention(a, nullptr), "head_dim 8");
  a = valid_prefill_args();
  a.softmax_scale = 0.f;
  expect_invalid(runtime::prefill_attention(a, nullptr), "softmax_scale");
  a = valid_prefill_args();
  a.out = reinterpret_cast<uint16_t*>(uintptr_t{4098});
  expect_invalid(runtime::prefill_attention(a, nullptr), "aligned");
  a = valid_prefill_args();
  a.capacity = 0;
  expect_invalid(runtime::prefill_attention(a, nullptr), "capacity");
}

runtime::DecodeAttentionArgs valid_decode_args() {
  runtime::DecodeAttentionArgs a;
  a.q = a.k_cache = a.v_cache = fake_device_pointer<const uint16_t>();
  a.out = fake_device_pointer<uint16_t>();
  a.kv_len = a.slot = fake_device_pointer<const int32_t>();
  a.batch = 1;
  a.n_heads = 32;
  a.n_kv_heads = 8;
  a.head_dim = 128;
  a.capacity = 8192;
  a.max_kv_len = 8192;
  a.softmax_scale = 0.088f;
  a.workspace = fake_device_pointer<void>();
  a.workspace_bytes = runtime::decode_attention_workspace_bytes(1, 32, 128, 8192);
  return a;
}

TEST(CudaDecodeAttention, RejectsInvalidArguments) {
  auto a = valid_decode_args();
  EXPECT_GT(a.workspace_bytes, 0);
  a.k_cache = nullptr;
  expect_invalid(runtime::decode_attention(a, nullptr), "k_cache is null");
  a = valid_decode_args();
  a.kv_len = nullptr;
  expect_invalid(runtime::decode_attention(a, nullptr), "kv_len is null");
  a = valid_decode_args();
  a.n_kv_heads = 5;
  expect_invalid(runtime::decode_attention(a, nullptr), "n_kv_heads");
  a = valid_decode_args();
  a.head_dim = 80;
  expect_invalid(runtime::decode_attention(a, nullptr), "head_dim 80");
  a = valid_decode_args();
  a.workspace_bytes -= 4;
  expect_invalid(runtime::decode_attention(a, nullptr), "workspace_bytes");
  a = valid_decode_args();
  a.workspace = nullptr;
  expect_invalid(runtime::decode_attention(a, nullptr), "workspace is null");
  a = valid_decode_args();
  a.max_kv_len = 0;
  expect_invalid(runtime::decode_attention(a, nullptr), "max_kv_len");
}

}  // namespace
}  // namespace llmq
