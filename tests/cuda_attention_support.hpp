// Helpers shared by the GPU tests of the runtime's attention kernels (test_cuda_attention_prefill.cpp,
// test_cuda_attention_decode.cpp, test_cuda_attention.cpp, test_cuda_attention_quant_prefill.cpp):
// the error bounds, one layer's paged KV cache (BF16 or E4M3 with per-kv-head scales) filled with
// seeded outlier data and NaN outside the valid positions, its device copy, and the float64
// reference row with the comparison against it.
// Paged layouts (KvLayout): the identity table (table row r lists blocks r * stride .., the old
// [slots, capacity] layout), or SHUFFLED: the used blocks a random permutation of the physical
// ones, spare blocks left NaN, every table entry past a sequence's last block garbage (-1, 2^31 - 1,
// num_blocks, random), and optionally one sequence's first blocks shared with another's (its
// logical data then starts with the other's rows in every layout). The data a sequence sees is the
// same in every layout, so outputs must be equal byte for byte.
// E4M3: codes = e4m3_rne_saturating(x / scale) with per-kv-head scales spread log-uniformly over
// [0.01, 4] (saturated outliers and subnormals), NaN codes (0x7F in K, 0xFF in V) outside the valid
// positions; the reference runs on the dequantized values decode_e4m3(code) * scale. Inputs are
// Gaussian with outlier channels and spikes (never zero), seeded; the seed and the case are in every
// failure message. Sliding windows and attention sinks: reference_row's key_begin and sink,
// random_sinks.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace cuda_attention_test {

using ::llmq::attention::KvCacheDType;
using ::llmq::attention::PrefillKernel;
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
inline float e4m3_value(uint8_t code) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int c = 0; c < 256; ++c) t[c] = fp8_to_float(static_cast<uint8_t>(c), DType::kE4M3);
    return t;
  }();
  return table[code];
}

// Where a problem's cache rows are (see the file comment).
struct KvLayout {
  int64_t block_size = 0;  // a power of two dividing the capacity; 0: the largest such <= 64
  bool shuffled = false;   // false: the identity table
  // Sequence shared_dst's first shared_positions positions hold sequence shared_src's rows (-1:
  // none); shuffled, its first shared_positions / block_size table entries are shared_src's.
  int shared_src = -1, shared_dst = -1;
  int64_t shared_positions = 0;
  std::string describe() const {
    std::ostringstream os;
    os << " pages=" << (shuffled ? "shuffled" : "identity") << "/bs" << block_size;
    if (shared_src >= 0) os << " shared " << shared_positions << " of seq " << shared_src << " -> " << shared_dst;
    return os.str();
  }
};

struct KvProblem {
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, slots = 0, capacity = 0;
  std::vector<int32_t> kv_len, slot;  // per sequence; slot: its block-table row
  bool fp8 = false;                   // E4M3 cache: k_cache8 / v_cache8 and the scales, else k_cache / v_cache
  KvLayout layout;
  // Made by fill_cache: block_table [slots, table_stride], layout.block_size resolved.
  std::vector<int32_t> block_table;
  int64_t table_stride = 0, num_blocks = 0;
  std::vector<uint16_t> k_cache, v_cache;  // [num_blocks * block_size, n_kv_heads, head_dim]
  std::vector<uint8_t> k_cache8, v_cache8;
  std::vector<float> k_scale, v_scale;  // [n_kv_heads]
  uint64_t seed = 0;
  int64_t batch() const { return static_cast<int64_t>(kv_len.size()); }
  int64_t cache_row(int64_t b, int64_t pos) const {
    const int64_t bs = layout.block_size;
    return int64_t{block_table[slot[b] * table_stride + pos / bs]} * bs + pos % bs;
  }
  int64_t cache_index(int64_t b, int64_t pos, int64_t kv_head) const {
    return (cache_row(b, pos) * n_kv_heads + kv_head) * head_dim;
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

inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16_bits(x[i]);
  return out;
}

// Per-kv-head scales spread log-uniformly over [0.01, 4], one random draw per stratum so that
// both ends appear whatever the head count; shuffled so that kv head order says nothing.
inline std::vector<float> random_scales(int64_t n, uint64_t seed) {
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
inline std::vector<uint8_t> quantize_rows(const std::vector<float>& x, int64_t n_kv_heads, int64_t head_dim,
                                          const std::vector<float>& scale) {
  std::vector<uint8_t> codes(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t kv_head = (static_cast<int64_t>(i) / head_dim) % n_kv_heads;
    codes[i] = float_to_fp8(x[i] / scale[kv_head], DType::kE4M3);
  }
  return codes;
}

// The block table of p->layout (resolving block_size 0); see the file comment. Shuffled: the
// sequences' blocks drawn in random order from num_blocks = (blocks used) + 3 spare.
inline void make_block_table(KvProblem* p) {
  KvLayout& l = p->layout;
  if (l.block_size == 0)
    for (l.block_size = 64; p->capacity % l.block_size != 0;) l.block_size /= 2;
  const int64_t bs = l.block_size;
  ASSERT_EQ(p->capacity % bs, 0) << "block size " << bs << " must divide the capacity " << p->capacity;
  ASSERT_EQ(bs & (bs - 1), 0) << "block size " << bs << " is not a power of two";
  p->table_stride = p->capacity / bs;
  const int64_t stride = p->table_stride;
  p->block_table.assign(static_cast<size_t>(p->slots * stride), 0);
  if (!l.shuffled) {
    p->num_blocks = p->slots * stride;
    for (int64_t i = 0; i < p->slots * stride; ++i) p->block_table[i] = static_cast<int32_t>(i);
    return;
  }
  std::mt19937_64 rng(p->seed * 1000 + 777 + static_cast<uint64_t>(bs));
  const int64_t shared_blocks = l.shared_src >= 0 ? l.shared_positions / bs : 0;
  std::vector<int64_t> used(static_cast<size_t>(p->slots), 0);  // blocks of each table row
  int64_t needed = -shared_blocks;
  for (int64_t b = 0; b < p->batch(); ++b) {
    used[p->slot[b]] = (p->kv_len[b] + bs - 1) / bs;
    needed += used[p->slot[b]];
  }
  p->num_blocks = needed + 3;
  std::vector<int32_t> physical(static_cast<size_t>(p->num_blocks));
  for (int64_t i = 0; i < p->num_blocks; ++i) physical[i] = static_cast<int32_t>(i);
  std::shuffle(physical.begin(), physical.end(), rng);
  const int32_t garbage[] = {-1, INT32_MAX, INT32_MIN, static_cast<int32_t>(p->num_blocks), static_cast<int32_t>(rng())};
  for (size_t i = 0; i < p->block_table.size(); ++i) p->block_table[i] = garbage[i % 5];
  size_t next = 0;
  // The shared sequence last, so that its first entries copy those of the one it shares.
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t b = 0; b < p->batch(); ++b) {
      const bool dst = b == l.shared_dst && shared_blocks > 0;
      if (dst != (pass == 1)) continue;
      int32_t* row = &p->block_table[p->slot[b] * stride];
      for (int64_t i = 0; i < used[p->slot[b]]; ++i)
        row[i] = dst && i < shared_blocks ? p->block_table[p->slot[l.shared_src] * stride + i] : physical[next++];
    }
}

// The cache is NaN (BF16 0xFFFF; E4M3 0x7F in K, 0xFF in V) outside the valid positions: the
// kernels must never use them. Each position's row goes where the block table puts it.
inline void fill_cache(KvProblem* p) {
  make_block_table(p);
  if (::testing::Test::HasFatalFailure()) return;
  const int64_t row = p->n_kv_heads * p->head_dim;
  const size_t size = static_cast<size_t>(p->num_blocks * p->layout.block_size * row);
  if (p->fp8) {
    p->k_cache8.assign(size, kNanCodeK);
    p->v_cache8.assign(size, kNanCodeV);
    p->k_scale = random_scales(p->n_kv_heads, p->seed * 1000 + 998);
    p->v_scale = random_scales(p->n_kv_heads, p->seed * 1000 + 999);
  } else {
    p->k_cache.assign(size, 0xFFFF);
    p->v_cache.assign(size, 0xFFFF);
  }
  // Keys: mild outlier channels (x4) keep the softmax neither flat nor one-hot; values: x20.
  // E4M3: the same values divided by the scales; with scales from 0.01 to 4 the codes run from
  // subnormals to saturated outliers (448), while the dequantized keys keep the softmax's shape.
  const auto keys = [&](int64_t b) {
    return testing::outlier_matrix(p->kv_len[b], row, p->seed * 1000 + static_cast<uint64_t>(b), 4.0f);
  };
  const auto values = [&](int64_t b) {
    return testing::outlier_matrix(p->kv_len[b], row, p->seed * 1000 + static_cast<uint64_t>(b) + 500, 20.0f);
  };
  for (int64_t b = 0; b < p->batch(); ++b) {
    std::vector<float> k = keys(b), v = values(b);
    if (b == p->layout.shared_dst) {  // the shared prefix: the other sequence's rows
      const int64_t n = p->layout.shared_positions * row;
      ASSERT_LE(p->layout.shared_positions, std::min(p->kv_len[b], p->kv_len[p->layout.shared_src])) << "shared prefix";
      const std::vector<float> ks = keys(p->layout.shared_src), vs = values(p->layout.shared_src);
      std::copy(ks.begin(), ks.begin() + n, k.begin());
      std::copy(vs.begin(), vs.begin() + n, v.begin());
    }
    std::vector<uint8_t> k8, v8;
    std::vector<uint16_t> k16, v16;
    if (p->fp8) {
      k8 = quantize_rows(k, p->n_kv_heads, p->head_dim, p->k_scale);
      v8 = quantize_rows(v, p->n_kv_heads, p->head_dim, p->v_scale);
    } else {
      k16 = to_bf16(k);
      v16 = to_bf16(v);
    }
    for (int64_t pos = 0; pos < p->kv_len[b]; ++pos) {
      const int64_t src = pos * row, dst = p->cache_index(b, pos, 0);
      if (p->fp8) {
        std::copy(k8.begin() + src, k8.begin() + src + row, p->k_cache8.begin() + dst);
        std::copy(v8.begin() + src, v8.begin() + src + row, p->v_cache8.begin() + dst);
      } else {
        std::copy(k16.begin() + src, k16.begin() + src + row, p->k_cache.begin() + dst);
        std::copy(v16.begin() + src, v16.begin() + src + row, p->v_cache.begin() + dst);
      }
    }
  }
}

// The device copy of a problem's cache (either type) and block table, and the argument fields that
// point at them.
struct DeviceCache {
  DeviceBuffer<uint16_t> k, v;
  DeviceBuffer<uint8_t> k8, v8;
  DeviceBuffer<float> k_scale, v_scale;
  DeviceBuffer<int32_t> table;
  attention::KvPages pages;
  explicit DeviceCache(const KvProblem& p)
      : k(p.k_cache.size()), v(p.v_cache.size()), k8(p.k_cache8.size()), v8(p.v_cache8.size()),
        k_scale(p.k_scale.size()), v_scale(p.v_scale.size()), table(p.block_table.size()) {
    pages.block_table = table.get();
    pages.table_stride = p.table_stride;
    pages.block_size = p.layout.block_size;
    pages.num_blocks = p.num_blocks;
  }
  bool ok() const { return k.ok() && v.ok() && k8.ok() && v8.ok() && k_scale.ok() && v_scale.ok() && table.ok(); }
  cudaError_t upload(const KvProblem& p) {
    if (const cudaError_t e = table.upload(p.block_table); e != cudaSuccess) return e;
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
    a->pages = pages;
    a->kv_dtype = fp8 ? KvCacheDType::kE4M3 : KvCacheDType::kBF16;
    a->k_cache = k.get();
    a->v_cache = v.get();
    a->k_cache8 = k8.get();
    a->v_cache8 = v8.get();
    a->k_scale = k_scale.get();
    a->v_scale = v_scale.get();
  }
};

// out[row, h, :] = softmax(scale * q k^T) v over keys [key_begin, key_end), in float64. sink: the
// head's attention-sink logit (not scaled), which joins the maximum and the denominator, or null.
inline void reference_row(const KvProblem& p, int64_t b, int64_t h, const uint16_t* q, int64_t key_end,
                          double scale, double* out, int64_t key_begin = 0, const float* sink = nullptr) {
  const int64_t d = p.head_dim, kvh = h / (p.n_heads / p.n_kv_heads);
  if (key_begin >= key_end) {  // no key (kv_len 0): zeros, as the kernels write
    std::fill(out, out + d, 0.0);
    return;
  }
  std::vector<double> s(static_cast<size_t>(key_end));
  double m = sink != nullptr ? double(*sink) : -INFINITY;
  for (int64_t j = key_begin; j < key_end; ++j) {
    const int64_t k = p.cache_index(b, j, kvh);
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(bf16_bits_to_float(q[i])) * p.key(k + i, kvh);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double sum = sink != nullptr ? std::exp(double(*sink) - m) : 0.0;
  std::fill(out, out + d, 0.0);
  for (int64_t j = key_begin; j < key_end; ++j) {
    const double w = std::exp(s[j] - m);
    sum += w;
    const int64_t v = p.cache_index(b, j, kvh);
    for (int64_t i = 0; i < d; ++i) out[i] += w * p.value(v + i, kvh);
  }
  for (int64_t i = 0; i < d; ++i) out[i] /= sum;
}

// Compares a BF16 output with the reference; the message carries the case.
inline void expect_close(const std::vector<uint16_t>& out, const std::vector<double>& ref,
                         const std::string& what) {
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

// Attention-sink logits for n heads: uniform in [-3, 3], with head 0 at +8 (the sink takes most of
// the weight) and head 1 at -30 (no visible effect), the extremes gpt-oss's learned sinks reach.
inline std::vector<float> random_sinks(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-3.f, 3.f);
  std::vector<float> sinks(static_cast<size_t>(n));
  for (float& x : sinks) x = uniform(rng);
  if (n > 0) sinks[0] = 8.f;
  if (n > 1) sinks[1] = -30.f;
  return sinks;
}

}  // namespace cuda_attention_test
}  // namespace llmq
