// GPU tests of the runtime's attention kernels (src/runtime/attention.hpp) against a float64 CPU
// reference computed from the same BF16 inputs:
//  * Prefill: head_dim 8/32/64/128 x causal or not x GQA 1/2/4/8, on both kernels where the
//    tensor-core one applies; single sequences of 1, 19, 99, 989 queries; a batch of sequences of
//    different lengths with earlier context in the cache (kv_len > q count) in permuted slots;
//    odd kv head counts (3, 5) and groups (1, 3, 5).
//  * Decode: kv_len 1, 17, 1000, 8192 in one batch with max_kv_len above all of them; batch 1 with
//    32 q / 8 kv heads at 8192 (the split over many chunks); a single-chunk plan with no workspace;
//    odd kv head counts (3, 5, 7) and groups (1, 3, 5); a CUDA graph captured once and replayed
//    after kv_len grew on the device.
//  * The cache holds NaN everywhere outside the valid positions (unused slots, positions >= kv_len),
//    outputs are poisoned with NaN before each run, and each case runs twice over different
//    poisons: the outputs must be equal byte for byte (every element written, deterministic).
//  * Argument errors name the field; they are rejected before any launch, so they need no GPU.
//  * E4M3 cache (kv_dtype kE4M3): every case above again (suites *E4m3), plus odd kv head counts,
//    over codes = e4m3_rne_saturating(x / scale) with per-kv-head scales spread log-uniformly over
//    [0.01, 4] (so the codes include saturated outliers and subnormals), NaN codes (0x7F in K,
//    0xFF in V) everywhere outside the valid positions; the reference runs on the dequantized
//    values decode_e4m3(code) * scale. Every non-NaN code through each kernel (a single key: the
//    output is the widened code times v_scale). A graph captured before the scales were written.
// Inputs: Gaussian with outlier channels and spikes (never zero), seeded; the seed and the case are
// in every failure message.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "runtime/attention.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using ::llmq::runtime::KvCacheDType;
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
// The E4M3 cases use the same two bounds: the reference computes on the dequantized values
// decode_e4m3(code) * scale, which are exactly what the kernels compute with (widening a code to
// FP16 / BF16 / FP32 is exact; k_scale enters as one FP32 product with the softmax scale and v_scale
// as one FP32 multiply of the output, 2^-24 relative each), so the quantization error never enters
// the comparison and what remains is the BF16 rounding of P and of the output and the FP32
// accumulation order, as for a BF16 cache.
constexpr uint64_t kSeed = 20261122;
constexpr uint8_t kNanCodeK = 0x7F, kNanCodeV = 0xFF;  // the two E4M3 NaNs, poisoned outside the valid positions

// ---------------------------------------------------------------------------------------------
// Problems: one layer's KV cache with some sequences in it.

// The exact value of every E4M3 code (llmq's conversion specification, format.hpp), as a table:
// the references read millions of codes.
float e4m3_value(uint8_t code) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int c = 0; c < 256; ++c) t[c] = fp8_to_float(static_cast<uint8_t>(c), DType::kE4M3);
    return t;
  }();
  return table[code];
}

struct KvProblem {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, slots = 0, capacity = 0;
  std::vector<int32_t> kv_len, slot;  // per sequence
  bool fp8 = false;                   // E4M3 cache: k_cache8 / v_cache8 and the scales, else k_cache / v_cache
  std::vector<uint16_t> k_cache, v_cache;
  std::vector<uint8_t> k_cache8, v_cache8;
  std::vector<float> k_scale, v_scale;  // [n_kv_heads]
  uint64_t seed = 0;
  int64_t batch() const { return static_cast<int64_t>(kv_len.size()); }
  int64_t cache_index(int64_t b, int64_t pos, int64_t kv_head) const {
    return ((slot[b] * capacity + pos) * n_kv_heads + kv_head) * head_dim;
  }
  // Element `index` of the cache (a cache_index + dim) as the kernels must see it.
  double key(int64_t index, int64_t kv_head) const {
    if (!fp8) return bf16_bits_to_float(k_cache[index]);
    return double(e4m3_value(k_cache8[index])) * k_scale[kv_head];
  }
  double value(int64_t index, int64_t kv_head) const {
    if (!fp8) return bf16_bits_to_float(v_cache[index]);
    return double(e4m3_value(v_cache8[index])) * v_scale[kv_head];
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16_bits(x[i]);
  return out;
}

// Per-kv-head scales spread log-uniformly over [0.01, 4], one random draw per stratum so that
// both ends appear whatever the head count; shuffled so that kv head order says nothing.
std::vector<float> random_scales(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; ++g)
    scales[g] = static_cast<float>(0.01 * std::pow(400.0, (static_cast<double>(g) + uniform(rng)) / static_cast<double>(n)));
  std::shuffle(scales.begin(), scales.end(), rng);
  return scales;
}

// E4M3 codes of x (row-major [rows, n_kv_heads * head_dim]) / the scale of each element's kv head,
// RNE and saturating: what the runtime's RoPE kernel writes. Finite x never gives a NaN code.
std::vector<uint8_t> quantize_rows(const std::vector<float>& x, int64_t n_kv_heads, int64_t head_dim,
                                   const std::vector<float>& scale) {
  std::vector<uint8_t> codes(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t kv_head = (static_cast<int64_t>(i) / head_dim) % n_kv_heads;
    codes[i] = float_to_fp8(x[i] / scale[kv_head], DType::kE4M3);
  }
  return codes;
}

// The cache is NaN (BF16 0xFFFF; E4M3 0x7F in K, 0xFF in V) outside the valid positions: the
// kernels must never use them.
void fill_cache(KvProblem* p) {
  const int64_t row = p->n_kv_heads * p->head_dim;
  const size_t size = static_cast<size_t>(p->slots * p->capacity * row);
  if (p->fp8) {
    p->k_cache8.assign(size, kNanCodeK);
    p->v_cache8.assign(size, kNanCodeV);
    p->k_scale = random_scales(p->n_kv_heads, p->seed * 1000 + 998);
    p->v_scale = random_scales(p->n_kv_heads, p->seed * 1000 + 999);
  } else {
    p->k_cache.assign(size, 0xFFFF);
    p->v_cache.assign(size, 0xFFFF);
  }
  for (int64_t b = 0; b < p->batch(); ++b) {
    const uint64_t seed = p->seed * 1000 + static_cast<uint64_t>(b);
    // Keys: mild outlier channels (x4) keep the softmax neither flat nor one-hot; values: x20.
    // E4M3: the same values divided by the scales; with scales from 0.01 to 4 the codes run from
    // subnormals to saturated outliers (448), while the dequantized keys keep the softmax's shape.
    const std::vector<float> k = testing::outlier_matrix(p->kv_len[b], row, seed, 4.0f);
    const std::vector<float> v = testing::outlier_matrix(p->kv_len[b], row, seed + 500, 20.0f);
    const int64_t base = p->cache_index(b, 0, 0);
    if (p->fp8) {
      const std::vector<uint8_t> k8 = quantize_rows(k, p->n_kv_heads, p->head_dim, p->k_scale);
      const std::vector<uint8_t> v8 = quantize_rows(v, p->n_kv_heads, p->head_dim, p->v_scale);
      std::copy(k8.begin(), k8.end(), p->k_cache8.begin() + base);
      std::copy(v8.begin(), v8.end(), p->v_cache8.begin() + base);
    } else {
      const std::vector<uint16_t> k16 = to_bf16(k), v16 = to_bf16(v);
      std::copy(k16.begin(), k16.end(), p->k_cache.begin() + base);
      std::copy(v16.begin(), v16.end(), p->v_cache.begin() + base);
    }
  }
}

// The device copy of a problem's cache (either type) and the argument fields that point at it.
struct DeviceCache {
  DeviceBuffer<uint16_t> k, v;
  DeviceBuffer<uint8_t> k8, v8;
  DeviceBuffer<float> k_scale, v_scale;
  explicit DeviceCache(const KvProblem& p)
      : k(p.k_cache.size()), v(p.v_cache.size()), k8(p.k_cache8.size()), v8(p.v_cache8.size()),
        k_scale(p.k_scale.size()), v_scale(p.v_scale.size()) {}
  bool ok() const { return k.ok() && v.ok() && k8.ok() && v8.ok() && k_scale.ok() && v_scale.ok(); }
  cudaError_t upload(const KvProblem& p) {
    if (p.fp8) {
      for (cudaError_t e : {k8.upload(p.k_cache8), v8.upload(p.v_cache8), k_scale.upload(p.k_scale), v_scale.upload(p.v_scale)})
        if (e != cudaSuccess) return e;
      return cudaSuccess;
    }
    const cudaError_t e = k.upload(p.k_cache);
    return e != cudaSuccess ? e : v.upload(p.v_cache);
  }
  // The BF16 pointers stay null for an E4M3 cache (and the E4M3 ones for BF16): the kernels must
  // not need them.
  template <typename Args> void set(bool fp8, Args* a) const {
    a->kv_dtype = fp8 ? KvCacheDType::kE4M3 : KvCacheDType::kBF16;
    a->k_cache = k.get();
    a->v_cache = v.get();
    a->k_cache8 = k8.get();
    a->v_cache8 = v8.get();
    a->k_scale = k_scale.get();
    a->v_scale = v_scale.get();
  }
};

// out[row, h, :] = softmax(scale * q k^T) v over keys [0, key_end), in float64.
void reference_row(const KvProblem& p, int64_t b, int64_t h, const uint16_t* q, int64_t key_end, double scale,
                   double* out) {
  const int64_t d = p.head_dim, kvh = h / (p.n_heads / p.n_kv_heads);
  std::vector<double> s(static_cast<size_t>(key_end));
  double m = -INFINITY;
  for (int64_t j = 0; j < key_end; ++j) {
    const int64_t k = p.cache_index(b, j, kvh);
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(bf16_bits_to_float(q[i])) * p.key(k + i, kvh);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double sum = 0;
  std::fill(out, out + d, 0.0);
  for (int64_t j = 0; j < key_end; ++j) {
    const double w = std::exp(s[j] - m);
    sum += w;
    const int64_t v = p.cache_index(b, j, kvh);
    for (int64_t i = 0; i < d; ++i) out[i] += w * p.value(v + i, kvh);
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
  bool fp8 = false;  // E4M3 cache
  uint64_t seed = kSeed;

  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " prefill d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << (causal ? " causal" : " full") << " kernel="
       << (kernel == PrefillKernel::kAuto ? "auto" : kernel == PrefillKernel::kTensorCore ? "mma" : "simt")
       << " cache=" << (fp8 ? "e4m3" : "bf16") << " (q,start,slot)=";
    for (size_t b = 0; b < q_len.size(); ++b) os << "(" << q_len[b] << "," << start[b] << "," << slot[b] << ")";
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
  p.fp8 = c.fp8;
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

  DeviceBuffer<uint16_t> d_q(q.size()), d_out(q.size());
  DeviceCache d_cache(p);
  DeviceBuffer<int32_t> d_q_start(q_start.size()), d_kv_len(p.kv_len.size()), d_slot(p.slot.size());
  ASSERT_TRUE(d_q.ok() && d_out.ok() && d_cache.ok()) << "device allocation failed";
  CUDA_ASSERT(d_q.upload(q));
  CUDA_ASSERT(d_cache.upload(p));
  CUDA_ASSERT(d_q_start.upload(q_start));
  CUDA_ASSERT(d_kv_len.upload(p.kv_len));
  CUDA_ASSERT(d_slot.upload(p.slot));

  runtime::PrefillAttentionArgs a;
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

// ---------------------------------------------------------------------------------------------
// Decode

struct DecodeCase {
  int64_t head_dim = 128, n_heads = 8, n_kv_heads = 2, max_kv_len = 0;
  std::vector<int32_t> kv_len, slot;
  int64_t slots = 1, capacity = 0;
  bool fp8 = false;  // E4M3 cache
  uint64_t seed = kSeed;
  std::string describe() const {
    std::ostringstream os;
    os << "REPRO seed=" << seed << " decode d=" << head_dim << " heads=" << n_heads << "/" << n_kv_heads
       << " max_kv_len=" << max_kv_len << " cache=" << (fp8 ? "e4m3" : "bf16") << " (kv_len,slot)=";
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
  p.fp8 = c.fp8;
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
  DeviceBuffer<uint16_t> q, out;
  DeviceCache cache;
  DeviceBuffer<int32_t> kv_len, slot;
  DeviceBuffer<uint8_t> ws;
  runtime::DecodeAttentionArgs args;

  DecodeDevice(const DecodeCase& c, const DecodeRun& run)
      : q(run.q.size()), out(run.q.size()), cache(run.p), kv_len(run.p.kv_len.size()), slot(run.p.slot.size()),
        ws(static_cast<size_t>(runtime::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len))) {
    const int64_t ws_bytes = runtime::decode_attention_workspace_bytes(run.p.batch(), c.n_heads, c.head_dim, c.max_kv_len);
    args.q = q.get();
    cache.set(c.fp8, &args);
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
  bool ok() const { return q.ok() && out.ok() && cache.ok() && kv_len.ok() && slot.ok() && ws.ok(); }
  cudaError_t upload(const DecodeRun& run) {
    for (cudaError_t e : {q.upload(run.q), cache.upload(run.p), kv_len.upload(run.p.kv_len), slot.upload(run.p.slot)})
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

void decode_head_dims_gqa_and_lengths(bool fp8) {
  uint64_t seed = kSeed + 300 + (fp8 ? 10000 : 0);
  for (int64_t d : {8, 32, 64, 128})
    for (int64_t group : {1, 2, 4, 8}) {
      DecodeCase c;
      c.fp8 = fp8;
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
    c.fp8 = fp8;
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
  EXPECT_EQ(runtime::decode_attention_workspace_bytes(3, 8, 64, 64), 0);  // <= kMinChunkKeys keys: one chunk
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

TEST(CudaDecodeAttention, HeadDimsGqaAndLengths) {
  LLMQ_REQUIRE_GPU();
  decode_head_dims_gqa_and_lengths(false);
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
void decode_graph_replay_follows_device_kv_len(bool fp8) {
  DecodeCase c;
  c.fp8 = fp8;
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

// ---------------------------------------------------------------------------------------------
// E4M3: every code widens exactly. One sequence, ONE key (so the softmax weight is exactly 1 and
// the output is the value row times v_scale), d = 128, 2 kv heads: the value rows of the two heads
// hold the 254 non-NaN codes (0x00-0x7E, 0x80-0xFE; slot 127 of each repeats +-1.0), keys are all
// +-0 (score 0: P = 2^0 = 1 exactly on every kernel). v_scale 1 and 3/8: decode_e4m3(code) * 3/8
// has at most 6 significant bits, so the BF16 output is exact whatever the rounding. The 1-ulp
// slack below only covers an approximate 2^0 that this test does not expect; any mis-decoded
// code (a subnormal read as a normal, a lost sign, a wrong exponent) is off by far more.
// Positions >= 1 and the other slot hold NaN codes.
struct EveryCodeProblem {
  static constexpr int64_t kDim = 128, kKvHeads = 2, kCapacity = 4, kSlots = 2;
  std::vector<uint8_t> k8, v8;
  std::vector<float> k_scale = {0.75f, 2.5f}, v_scale = {1.0f, 0.375f};
  std::vector<uint16_t> q;
  std::vector<float> expect;  // [kKvHeads * kDim]: decode(code) * v_scale, exact
  EveryCodeProblem() {
    k8.assign(kSlots * kCapacity * kKvHeads * kDim, kNanCodeK);
    v8.assign(k8.size(), kNanCodeV);
    const int64_t base = (1 * kCapacity + 0) * kKvHeads * kDim;  // slot 1, position 0
    for (int64_t h = 0; h < kKvHeads; ++h)
      for (int64_t i = 0; i < kDim; ++i) {
        const uint8_t code = static_cast<uint8_t>(i == 127 ? h * 128 + 0x38 : h * 128 + i);  // 0x38 = 1.0
        v8[base + h * kDim + i] = code;
        k8[base + h * kDim + i] = static_cast<uint8_t>((i % 2) * 0x80);  // +0, -0
        expect.push_back(e4m3_value(code) * v_scale[h]);
      }
    q = to_bf16(testing::outlier_matrix(1, kKvHeads * kDim, kSeed + 900, 4.0f));
  }
};

void expect_every_code(const std::vector<uint16_t>& out, const std::vector<float>& expect, const std::string& what) {
  ASSERT_EQ(out.size(), expect.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < out.size() && bad < 10; ++i) {
    const float o = bf16_bits_to_float(out[i]), e = expect[i];
    const bool ok = std::fabs(o - e) <= std::fabs(e) * 0x1p-8f;
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << what << ": head " << i / EveryCodeProblem::kDim << " dim " << i % EveryCodeProblem::kDim
                    << " got " << o << " expected " << e;
  }
}

TEST(CudaAttentionE4m3, EveryCodeWidensExactly) {
  LLMQ_REQUIRE_GPU();
  const EveryCodeProblem p;
  using P = EveryCodeProblem;
  DeviceBuffer<uint8_t> k8(p.k8.size()), v8(p.v8.size());
  DeviceBuffer<float> k_scale(P::kKvHeads), v_scale(P::kKvHeads);
  DeviceBuffer<uint16_t> q(p.q.size()), out(p.q.size());
  DeviceBuffer<int32_t> meta(4);  // q_start {0, 1}, kv_len 1, slot 1
  const std::vector<int32_t> host_meta = {0, 1, 1, 1};
  CUDA_ASSERT(k8.upload(p.k8));
  CUDA_ASSERT(v8.upload(p.v8));
  CUDA_ASSERT(k_scale.upload(p.k_scale));
  CUDA_ASSERT(v_scale.upload(p.v_scale));
  CUDA_ASSERT(q.upload(p.q));
  CUDA_ASSERT(meta.upload(host_meta));

  runtime::DecodeAttentionArgs d;
  d.q = q.get();
  d.kv_dtype = KvCacheDType::kE4M3;
  d.k_cache8 = k8.get();
  d.v_cache8 = v8.get();
  d.k_scale = k_scale.get();
  d.v_scale = v_scale.get();
  d.out = out.get();
  d.kv_len = meta.get() + 2;
  d.slot = meta.get() + 3;
  d.batch = 1;
  d.n_heads = d.n_kv_heads = P::kKvHeads;
  d.head_dim = P::kDim;
  d.capacity = P::kCapacity;
  d.max_kv_len = 1;
  d.softmax_scale = 0.125f;
  ASSERT_EQ(runtime::decode_attention_workspace_bytes(1, P::kKvHeads, P::kDim, 1), 0);
  std::vector<uint16_t> result;
  CUDA_ASSERT(out.fill_bytes(0xFF));
  const Status st = runtime::decode_attention(d, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(out.download(&result));
  expect_every_code(result, p.expect, "decode");

  for (PrefillKernel kernel : {PrefillKernel::kTensorCore, PrefillKernel::kCudaCore}) {
    runtime::PrefillAttentionArgs a;
    a.q = q.get();
    a.kv_dtype = KvCacheDType::kE4M3;
    a.k_cache8 = k8.get();
    a.v_cache8 = v8.get();
    a.k_scale = k_scale.get();
    a.v_scale = v_scale.get();
    a.out = out.get();
    a.q_start = meta.get();
    a.kv_len = meta.get() + 2;
    a.slot = meta.get() + 3;
    a.batch = 1;
    a.max_q_len = 1;
    a.n_heads = a.n_kv_heads = P::kKvHeads;
    a.head_dim = P::kDim;
    a.capacity = P::kCapacity;
    a.softmax_scale = 0.125f;
    a.kernel = kernel;
    CUDA_ASSERT(out.fill_bytes(0xFF));
    const Status pst = runtime::prefill_attention(a, nullptr);
    ASSERT_TRUE(pst.ok()) << pst.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(out.download(&result));
    expect_every_code(result, p.expect, kernel == PrefillKernel::kTensorCore ? "prefill mma" : "prefill simt");
  }
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

// An E4M3 cache: the BF16 pointers null (allowed), the code and scale pointers set.
template <typename Args> Args with_e4m3_cache(Args a) {
  a.k_cache = a.v_cache = nullptr;
  a.kv_dtype = KvCacheDType::kE4M3;
  a.k_cache8 = a.v_cache8 = fake_device_pointer<const uint8_t>();
  a.k_scale = a.v_scale = fake_device_pointer<const float>();
  return a;
}

// Each E4M3 field in turn made invalid: null codes or scales, misaligned codes; a kv_dtype out of
// the enum. `call` runs the entry point on the arguments.
template <typename Args, typename Call> void expect_e4m3_rejections(const Args& valid, Call call) {
  Args a = valid;
  a.k_cache8 = nullptr;
  expect_invalid(call(a), "k_cache8 is null");
  a = valid;
  a.v_cache8 = nullptr;
  expect_invalid(call(a), "v_cache8 is null");
  a = valid;
  a.k_scale = nullptr;
  expect_invalid(call(a), "k_scale is null");
  a = valid;
  a.v_scale = nullptr;
  expect_invalid(call(a), "v_scale is null");
  a = valid;
  a.k_cache8 = reinterpret_cast<const uint8_t*>(uintptr_t{4096 + 8});
  expect_invalid(call(a), "k_cache8, v_cache8");
  a = valid;
  a.v_cache8 = reinterpret_cast<const uint8_t*>(uintptr_t{4096 + 1});
  expect_invalid(call(a), "16-byte aligned");
  a = valid;
  a.kv_dtype = static_cast<KvCacheDType>(7);
  expect_invalid(call(a), "kv_dtype");
  // Shape checks still apply.
  a = valid;
  a.head_dim = 96;
  expect_invalid(call(a), "head_dim 96");
  // A BF16 cache with only the E4M3 pointers set names the BF16 field.
  a = valid;
  a.kv_dtype = KvCacheDType::kBF16;
  expect_invalid(call(a), "k_cache is null");
}

TEST(CudaPrefillAttentionE4m3, RejectsInvalidArguments) {
  expect_e4m3_rejections(with_e4m3_cache(valid_prefill_args()),
                         [](const runtime::PrefillAttentionArgs& a) { return runtime::prefill_attention(a, nullptr); });
}

TEST(CudaDecodeAttentionE4m3, RejectsInvalidArguments) {
  expect_e4m3_rejections(with_e4m3_cache(valid_decode_args()),
                         [](const runtime::DecodeAttentionArgs& a) { return runtime::decode_attention(a, nullptr); });
}

}  // namespace
}  // namespace llmq
