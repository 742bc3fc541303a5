// The runtime's per-row kernels (src/runtime/row_kernels.hpp) on the newer families' pieces, each
// against the same arithmetic on the host:
//   * the GLU with gpt-oss's clamped SwiGLU and per-row-group gate/up biases (MoE: each permuted
//     row's expert; rows of experts outside this rank's range unbiased), and plain SiLU * up;
//   * add + RMSNorm with the producing linear's bias (o_proj's): x += delta + bias, bit for bit;
//   * RoPE + KV-cache write with Qwen3's per-head q/k RMSNorm after the qkv bias;
//   * the paged KV-cache write: tokens of three sequences through a SHUFFLED block table (block
//     sizes 1, 16, 64; garbage entries past each sequence's blocks; BF16 and E4M3 caches) land
//     exactly, byte for byte, as they do in the identity layout, and no other cache byte changes.
// Every kernel form is run: the register kernel (8-aligned rows up to 16384 wide; the GLU only up to
// 64 rows), the GLU kernel of more rows (8-aligned, up to 14336 wide), the shared-memory kernel with
// 8-wide (wider rows) and with scalar accesses (n % 8 != 0); both rope_kv kernels, against each
// other. BF16 outputs within 1 BF16 ulp of the host (device expf and summation order move the float
// value by a few float ulps), the residual exactly; the GLU's E4M3 and INT8 codes within one step
// of value / scale, the scale absmax / qmax of the same rows.
// Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "runtime/row_kernels.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

std::vector<float> normal(size_t n, float std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16_bits(v[i]);
  return b;
}

// A BF16 value within `ulps` BF16 units in the last place of `want`, the unit taken at |want| or at
// `scale` when larger (a difference of products that cancels keeps its operands' absolute error).
::testing::AssertionResult near_bf16(uint16_t got, float want, int ulps, const std::string& where, float scale = 0.0f) {
  const float g = bf16_bits_to_float(got);
  const float step = std::ldexp(1.0f, std::ilogb(std::max({std::fabs(want), scale, 1e-30f})) - 7);
  if (std::fabs(g - want) <= ulps * step + 1e-30f) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << where << ": got " << g << ", want " << want;
}

struct GluCase {
  int64_t rows, n;
  bool clamped, bias, groups;
};

TEST(CudaRowOps, GluWithClampAndGroupBiasesMatchesTheHost) {
  LLMQ_REQUIRE_GPU();
  const GluCase cases[] = {{5, 256, true, true, true},   {100, 256, true, true, true}, {7, 13, true, true, true},
                           {3, 64, true, true, false},   {9, 40, false, false, false}, {70, 24, false, true, true},
                           {2, 16392, false, true, false},
                           // More than 64 rows: the register GLU kernel with 4, 4 (a short CTA), 3 and 1
                           // chunks a thread, and the shared-memory one past 14336.
                           {80, 14336, false, false, false}, {67, 12288, true, true, true},
                           {66, 8192, false, true, false},   {65, 2888, true, true, true},
                           {65, 14344, false, false, false}};
  const int64_t kGroups = 3, kBegin = 2;  // this rank's experts 2..4 of 0..5
  const float limit = 7.0f, alpha = 1.702f;
  for (const GluCase& c : cases) {
    SCOPED_TRACE(testing::repro(3, c.rows, c.n, std::string(c.clamped ? "clamped" : "silu") + (c.bias ? " bias" : "") +
                                                    (c.groups ? " groups" : "")));
    const std::vector<float> gu = normal(static_cast<size_t>(c.rows * 2 * c.n), 6.0f, 3);  // many past the limit
    const std::vector<float> bias = normal(static_cast<size_t>(kGroups * 2 * c.n), 1.0f, 4);
    std::vector<int32_t> group(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) group[r] = static_cast<int32_t>((r * 7) % 6);
    const std::vector<uint16_t> gu_b = to_bf16(gu);
    DeviceBuffer<uint16_t> d_gu(gu_b.size()), d_out(static_cast<size_t>(c.rows * c.n));
    DeviceBuffer<float> d_bias(bias.size());
    DeviceBuffer<int32_t> d_group(group.size());
    CUDA_ASSERT(d_gu.upload(gu_b));
    CUDA_ASSERT(d_bias.upload(bias));
    CUDA_ASSERT(d_group.upload(group));
    runtime::RowOpArgs a;
    a.fn = c.clamped ? runtime::RowFn::kClampedSwiglu : runtime::RowFn::kSiluMul;
    a.rows = c.rows;
    a.n = c.n;
    a.src = d_gu.get();
    a.out_bf16 = d_out.get();
    a.glu_limit = limit;
    a.glu_alpha = alpha;
    if (c.bias) {
      a.glu_bias = d_bias.get();
      a.bias_group = c.groups ? d_group.get() : nullptr;
      a.group_begin = kBegin;
      a.groups = kGroups;
    }
    const Status st = runtime::row_op(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<uint16_t> out;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_out.download(&out));
    // The same rows quantized per token to E4M3 and to INT8 (codes and one scale a row).
    for (DType format : {DType::kE4M3, DType::kI8}) {
      SCOPED_TRACE(dtype_name(format));
      const bool int8 = format == DType::kI8;
      const float qmax = int8 ? 127.0f : 448.0f;
      DeviceBuffer<uint8_t> d_codes(static_cast<size_t>(c.rows * c.n));
      DeviceBuffer<float> d_scales(static_cast<size_t>(c.rows));
      runtime::RowOpArgs q = a;
      q.out = runtime::RowOut::kCodesPerToken;
      q.out_bf16 = nullptr;
      q.codes = d_codes.get();
      q.scales = d_scales.get();
      q.spec = QuantSpec::per_token(format);
      const Status sq = runtime::row_op(q, nullptr);
      ASSERT_TRUE(sq.ok()) << sq.to_string();
      std::vector<uint8_t> codes;
      std::vector<float> scales;
      CUDA_ASSERT(cudaDeviceSynchronize());
      CUDA_ASSERT(d_codes.download(&codes));
      CUDA_ASSERT(d_scales.download(&scales));
      for (int64_t r = 0; r < c.rows; ++r) {
        // The scale is absmax / qmax of the device's float values, which are within a few float
        // ulps of the host's (and of the BF16 output's within half a BF16 ulp); each code is then
        // within one step of value / scale (E4M3: 3 mantissa bits; INT8: 1).
        float absmax = 0.0f;
        for (int64_t j = 0; j < c.n; ++j) absmax = std::max(absmax, std::fabs(bf16_bits_to_float(out[r * c.n + j])));
        ASSERT_NEAR(scales[r], absmax / qmax, absmax / qmax * 0.01f) << "row " << r;
        for (int64_t j = 0; j < c.n; ++j) {
          const float want = bf16_bits_to_float(out[r * c.n + j]) / scales[r];
          const uint8_t code = codes[r * c.n + j];
          const float got = int8 ? static_cast<float>(static_cast<int8_t>(code)) : fp8_to_float(code, DType::kE4M3);
          const float step = int8 ? 1.0f : std::ldexp(1.0f, std::max(std::ilogb(std::max(std::fabs(want), 1e-30f)), -6) - 3);
          ASSERT_LE(std::fabs(got - want), step) << "row " << r << " col " << j << ": code " << got << ", want " << want;
        }
      }
    }
    for (int64_t r = 0; r < c.rows; ++r) {
      const int64_t e = c.groups ? group[r] - kBegin : 0;
      const float* b = c.bias && e >= 0 && e < kGroups ? &bias[e * 2 * c.n] : nullptr;
      for (int64_t j = 0; j < c.n; ++j) {
        float g = bf16_bits_to_float(gu_b[r * 2 * c.n + j]), u = bf16_bits_to_float(gu_b[r * 2 * c.n + c.n + j]);
        if (b != nullptr) g += b[j], u += b[c.n + j];
        float want;
        if (c.clamped) {  // transformer.cpp's clamped_swiglu
          const float gc = std::min(g, limit), uc = std::min(std::max(u, -limit), limit);
          want = (uc + 1.0f) * (gc * (1.0f / (1.0f + std::exp(-(gc * alpha)))));
        } else {
          want = g * (1.0f / (1.0f + std::exp(-g))) * u;
        }
        ASSERT_TRUE(near_bf16(out[r * c.n + j], want, 1, "row " + std::to_string(r) + " col " + std::to_string(j)));
      }
    }
  }
}

TEST(CudaRowOps, AddRmsNormAddsTheDeltaBiasOnce) {
  LLMQ_REQUIRE_GPU();
  const int64_t shapes[][2] = {{3, 256}, {80, 256}, {3, 100}, {2, 16392}};
  for (const auto& s : shapes) {
    const int64_t R = s[0], n = s[1];
    SCOPED_TRACE(testing::repro(5, R, n, "add + rmsnorm + delta bias"));
    const std::vector<float> x = normal(static_cast<size_t>(R * n), 1.0f, 5), bias = normal(static_cast<size_t>(n), 0.5f, 6);
    const std::vector<float> gain = normal(static_cast<size_t>(n), 0.2f, 7);
    const std::vector<uint16_t> delta = to_bf16(normal(static_cast<size_t>(R * n), 2.0f, 8));
    DeviceBuffer<float> d_x(x.size()), d_bias(bias.size()), d_gain(gain.size());
    DeviceBuffer<uint16_t> d_delta(delta.size()), d_out(x.size());
    CUDA_ASSERT(d_x.upload(x));
    CUDA_ASSERT(d_bias.upload(bias));
    CUDA_ASSERT(d_gain.upload(gain));
    CUDA_ASSERT(d_delta.upload(delta));
    runtime::RowOpArgs a;
    a.fn = runtime::RowFn::kAddRmsNorm;
    a.rows = R;
    a.n = n;
    a.x = d_x.get();
    a.delta = d_delta.get();
    a.delta_bias = d_bias.get();
    a.gain = d_gain.get();
    a.eps = 1e-5f;
    a.out_bf16 = d_out.get();
    const Status st = runtime::row_op(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<float> x_after;
    std::vector<uint16_t> out;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_x.download(&x_after));
    CUDA_ASSERT(d_out.download(&out));
    for (int64_t r = 0; r < R; ++r) {
      double ss = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const float v = x[r * n + j] + (bf16_bits_to_float(delta[r * n + j]) + bias[j]);
        ASSERT_EQ(x_after[r * n + j], v) << "residual row " << r << " col " << j;
        ss += static_cast<double>(v) * v;
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5));
      for (int64_t j = 0; j < n; ++j)
        ASSERT_TRUE(near_bf16(out[r * n + j], gain[j] * (inv * x_after[r * n + j]), 1, "row " + std::to_string(r)));
    }
  }
}

TEST(CudaRowOps, RopeNormalisesEachQkHeadBeforeRotating) {
  LLMQ_REQUIRE_GPU();
  for (const int64_t R : {int64_t{3}, int64_t{70}}) {
    const int64_t H = 4, KVH = 2, hd = 64, half = hd / 2, cap = 96, width = (H + 2 * KVH) * hd, kv_dim = KVH * hd;
    SCOPED_TRACE(testing::repro(9, R, width, "rope + q/k norm"));
    ModelConfig c;
    c.head_dim = hd;
    c.rope_theta = 1e6;
    const std::vector<float> cs = runtime::rope_cos_sin(c, cap);
    const std::vector<uint16_t> qkv = to_bf16(normal(static_cast<size_t>(R * width), 5.0f, 9));  // rms 5: norm matters
    const std::vector<float> bias = normal(static_cast<size_t>(width), 1.0f, 10);
    std::vector<float> q_norm = normal(static_cast<size_t>(hd), 0.2f, 11), k_norm = normal(static_cast<size_t>(hd), 0.2f, 12);
    for (float& g : q_norm) g += 1.0f;
    for (float& g : k_norm) g += 1.0f;
    std::vector<int32_t> pos(static_cast<size_t>(R)), slot(static_cast<size_t>(R), 0);
    for (int64_t r = 0; r < R; ++r) pos[r] = static_cast<int32_t>((r * 13) % cap);  // distinct: R <= cap
    DeviceBuffer<uint16_t> d_qkv(qkv.size()), d_q(static_cast<size_t>(R * H * hd)), d_k(static_cast<size_t>(cap * kv_dim)),
        d_v(static_cast<size_t>(cap * kv_dim));
    DeviceBuffer<float> d_bias(bias.size()), d_cs(cs.size()), d_qn(q_norm.size()), d_kn(k_norm.size());
    DeviceBuffer<int32_t> d_pos(pos.size()), d_slot(slot.size());
    CUDA_ASSERT(d_qkv.upload(qkv));
    CUDA_ASSERT(d_bias.upload(bias));
    CUDA_ASSERT(d_cs.upload(cs));
    CUDA_ASSERT(d_qn.upload(q_norm));
    CUDA_ASSERT(d_kn.upload(k_norm));
    CUDA_ASSERT(d_pos.upload(pos));
    CUDA_ASSERT(d_slot.upload(slot));
    runtime::RopeKvArgs a;
    a.qkv = d_qkv.get();
    a.bias = d_bias.get();
    a.q_norm = d_qn.get();
    a.k_norm = d_kn.get();
    a.norm_eps = 1e-6f;
    a.q_out = d_q.get();
    a.k_cache = d_k.get();
    a.v_cache = d_v.get();
    a.position = d_pos.get();
    a.slot = d_slot.get();
    a.cos_sin = d_cs.get();
    // The identity table of one sequence: blocks 0, 1, 2 of 32 positions.
    const std::vector<int32_t> table = {0, 1, 2};
    DeviceBuffer<int32_t> d_table(table.size());
    CUDA_ASSERT(d_table.upload(table));
    a.pages.block_table = d_table.get();
    a.pages.table_stride = 3;
    a.pages.block_size = 32;
    a.pages.num_blocks = 3;
    a.rows = R, a.n_heads = H, a.n_kv_heads = KVH, a.head_dim = hd;
    const Status st = runtime::rope_kv(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<uint16_t> q, k;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(d_q.download(&q));
    CUDA_ASSERT(d_k.download(&k));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H + KVH; ++h) {
        const bool is_q = h < H;
        const int64_t base = is_q ? h * hd : H * hd + (h - H) * hd;
        std::vector<float> v(static_cast<size_t>(hd));
        float ss = 0.0f;
        for (int64_t d = 0; d < hd; ++d) {
          v[d] = bf16_bits_to_float(qkv[r * width + base + d]) + bias[base + d];
          ss += v[d] * v[d];
        }
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(hd) + 1e-6f);
        for (int64_t d = 0; d < hd; ++d) v[d] = (is_q ? q_norm : k_norm)[d] * (inv * v[d]);
        for (int64_t j = 0; j < half; ++j) {
          const float co = cs[(pos[r] * half + j) * 2], si = cs[(pos[r] * half + j) * 2 + 1];
          const float o0 = v[j] * co - v[j + half] * si, o1 = v[j] * si + v[j + half] * co;
          const uint16_t* got = is_q ? &q[r * H * hd + h * hd] : &k[pos[r] * kv_dim + (h - H) * hd];
          // The rotation's products may be fused on the device: 2 ulps of the operands.
          const float scale = std::max(std::fabs(v[j]), std::fabs(v[j + half]));
          const std::string where = "row " + std::to_string(r) + " head " + std::to_string(h) + " pair " + std::to_string(j);
          ASSERT_TRUE(near_bf16(got[j], o0, 2, where, scale));
          ASSERT_TRUE(near_bf16(got[j + half], o1, 2, where, scale));
        }
      }
  }
}

// rope_kv over one layout: the caches (BF16 or E4M3, every byte `fill` first) after writing the
// tokens, and q_out.
struct RopeKvRun {
  std::vector<uint16_t> q, k, v;
  std::vector<uint8_t> k8, v8;
};

void run_paged_rope_kv(const std::vector<uint16_t>& qkv, const std::vector<int32_t>& pos, const std::vector<int32_t>& slot,
                       const std::vector<float>& cs, const std::vector<float>& scales, const attention::KvPages& shape,
                       const std::vector<int32_t>& table, bool fp8, int fill, int64_t H, int64_t KVH, int64_t hd,
                       RopeKvRun* out, bool scalar_form = false, const std::vector<float>* bias = nullptr,
                       const std::vector<float>* q_norm = nullptr, const std::vector<float>* k_norm = nullptr) {
  const int64_t R = static_cast<int64_t>(pos.size()), kv_dim = KVH * hd;
  const size_t cache = static_cast<size_t>(shape.num_blocks * shape.block_size * kv_dim);
  // scalar_form: q_out one element into its buffer (2-byte aligned), which the vectorized kernel
  // does not take.
  const int64_t q_at = scalar_form ? 1 : 0;
  DeviceBuffer<uint16_t> d_qkv(qkv.size()), d_q(static_cast<size_t>(R * H * hd + q_at)), d_k(fp8 ? 0 : cache), d_v(fp8 ? 0 : cache);
  DeviceBuffer<uint8_t> d_k8(fp8 ? cache : 0), d_v8(fp8 ? cache : 0);
  DeviceBuffer<float> d_cs(cs.size()), d_scales(scales.size());
  DeviceBuffer<float> d_bias(bias ? bias->size() : 0), d_qn(q_norm ? q_norm->size() : 0), d_kn(k_norm ? k_norm->size() : 0);
  if (bias != nullptr) CUDA_ASSERT(d_bias.upload(*bias));
  if (q_norm != nullptr) CUDA_ASSERT(d_qn.upload(*q_norm));
  if (k_norm != nullptr) CUDA_ASSERT(d_kn.upload(*k_norm));
  DeviceBuffer<int32_t> d_pos(pos.size()), d_slot(slot.size()), d_table(table.size());
  CUDA_ASSERT(d_qkv.upload(qkv));
  CUDA_ASSERT(d_cs.upload(cs));
  CUDA_ASSERT(d_scales.upload(scales));
  CUDA_ASSERT(d_pos.upload(pos));
  CUDA_ASSERT(d_slot.upload(slot));
  CUDA_ASSERT(d_table.upload(table));
  if (fp8) {
    CUDA_ASSERT(d_k8.fill_bytes(fill));
    CUDA_ASSERT(d_v8.fill_bytes(fill));
  } else {
    CUDA_ASSERT(d_k.fill_bytes(fill));
    CUDA_ASSERT(d_v.fill_bytes(fill));
  }
  runtime::RopeKvArgs a;
  a.qkv = d_qkv.get();
  a.q_out = d_q.get() + q_at;
  a.bias = bias != nullptr ? d_bias.get() : nullptr;
  a.q_norm = q_norm != nullptr ? d_qn.get() : nullptr;
  a.k_norm = k_norm != nullptr ? d_kn.get() : nullptr;
  a.k_cache = d_k.get();
  a.v_cache = d_v.get();
  if (fp8) {
    a.k_cache8 = d_k8.get();
    a.v_cache8 = d_v8.get();
    a.k_scale = d_scales.get();
    a.v_scale = d_scales.get() + KVH;
  }
  a.position = d_pos.get();
  a.slot = d_slot.get();
  a.cos_sin = d_cs.get();
  a.pages = shape;
  a.pages.block_table = d_table.get();
  a.rows = R, a.n_heads = H, a.n_kv_heads = KVH, a.head_dim = hd;
  const Status st = runtime::rope_kv(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(d_q.download(&out->q));
  out->q.erase(out->q.begin(), out->q.begin() + q_at);
  if (fp8) {
    CUDA_ASSERT(d_k8.download(&out->k8));
    CUDA_ASSERT(d_v8.download(&out->v8));
  } else {
    CUDA_ASSERT(d_k.download(&out->k));
    CUDA_ASSERT(d_v.download(&out->v));
  }
}

// rope_kv's two kernels (rope_kv.cu): the vectorized one (head_dim % 16 == 0, aligned rows) and
// the general one compute the same bits, at decode (<= 64 rows) and prefill CTA shapes, for both
// cache formats, with and without a bias and Qwen3's q/k norm, on inputs with outliers and -0.
TEST(CudaRowOps, RopeKvVectorizedAndGeneralKernelsAgree) {
  LLMQ_REQUIRE_GPU();
  const int64_t H = 8, KVH = 2, hd = 128, cap = 256, width = (H + 2 * KVH) * hd;
  ModelConfig c;
  c.head_dim = hd;
  c.rope_theta = 5e5;
  const std::vector<float> cs = runtime::rope_cos_sin(c, cap);
  std::vector<float> scales = normal(static_cast<size_t>(2 * KVH), 0.3f, 31);
  for (float& x : scales) x = std::fabs(x) + 0.05f;
  const std::vector<float> bias = normal(static_cast<size_t>(width), 0.5f, 33);
  std::vector<float> q_norm = normal(static_cast<size_t>(hd), 0.2f, 34), k_norm = normal(static_cast<size_t>(hd), 0.2f, 35);
  for (float& g : q_norm) g += 1.0f;
  for (float& g : k_norm) g += 1.0f;
  for (int64_t R : {5, 70})
    for (bool fp8 : {false, true})
      for (int extras = 0; extras < 3; ++extras) {  // none, the bias, the bias and the q/k norm
        SCOPED_TRACE(testing::repro(32, R, width, std::string(fp8 ? "e4m3" : "bf16") + " rope_kv forms, extras " +
                                                      std::to_string(extras)));
        std::vector<float> x = normal(static_cast<size_t>(R * width), 2.0f, 32 + static_cast<uint64_t>(R));
        for (size_t i = 0; i < x.size(); i += 97) x[i] *= 40.0f;  // outliers (E4M3 saturates some)
        for (size_t i = 5; i < x.size(); i += 89) x[i] = -0.0f;   // signed zeros keep their sign
        const std::vector<uint16_t> qkv = to_bf16(x);
        std::vector<int32_t> pos(static_cast<size_t>(R)), slot(static_cast<size_t>(R), 0);
        for (int64_t r = 0; r < R; ++r) pos[r] = static_cast<int32_t>((r * 29) % cap);  // distinct: R < cap, 29 odd
        attention::KvPages shape{nullptr, cap / 16, 16, cap / 16};
        std::vector<int32_t> table(static_cast<size_t>(cap / 16));
        for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(table.size() - 1 - i);
        RopeKvRun vec, general;
        const std::vector<float>* b = extras >= 1 ? &bias : nullptr;
        const std::vector<float>* qn = extras >= 2 ? &q_norm : nullptr;
        const std::vector<float>* kn = extras >= 2 ? &k_norm : nullptr;
        run_paged_rope_kv(qkv, pos, slot, cs, scales, shape, table, fp8, 0x5A, H, KVH, hd, &vec, false, b, qn, kn);
        if (HasFatalFailure()) return;
        run_paged_rope_kv(qkv, pos, slot, cs, scales, shape, table, fp8, 0x5A, H, KVH, hd, &general, /*scalar_form=*/true, b,
                          qn, kn);
        if (HasFatalFailure()) return;
        EXPECT_EQ(vec.q, general.q);
        EXPECT_EQ(vec.k, general.k);
        EXPECT_EQ(vec.v, general.v);
        EXPECT_EQ(vec.k8, general.k8);
        EXPECT_EQ(vec.v8, general.v8);
      }
}

TEST(CudaRowOps, RopeKvWritesEachTokenToItsPagedRowOnly) {
  LLMQ_REQUIRE_GPU();
  const int64_t H = 4, KVH = 2, hd = 64, cap = 256, kv_dim = KVH * hd, width = (H + 2 * KVH) * hd, slots = 3;
  ModelConfig c;
  c.head_dim = hd;
  c.rope_theta = 1e4;
  const std::vector<float> cs = runtime::rope_cos_sin(c, cap);
  std::vector<float> scales = normal(static_cast<size_t>(2 * KVH), 0.3f, 21);
  for (float& x : scales) x = std::fabs(x) + 0.05f;
  // 40 tokens: token r of sequence r % 3 (table row (r % 3 + 1) % 3) at a distinct position of it,
  // up to 200 (past several blocks at every size), in no order.
  const int64_t R = 40;
  std::vector<int32_t> pos(R), slot(R), max_pos(slots, -1);
  for (int64_t r = 0; r < R; ++r) {
    slot[r] = static_cast<int32_t>((r % 3 + 1) % 3);
    pos[r] = static_cast<int32_t>((r * 37 + (r % 3) * 11) % 201);
    max_pos[slot[r]] = std::max(max_pos[slot[r]], pos[r]);
  }
  const std::vector<uint16_t> qkv = to_bf16(normal(static_cast<size_t>(R * width), 2.0f, 22));
  for (bool fp8 : {false, true})
    for (int64_t bs : {1, 16, 64}) {
      SCOPED_TRACE(testing::repro(22, R, width, std::string(fp8 ? "e4m3" : "bf16") + " paged rope_kv, block size " + std::to_string(bs)));
      const int64_t stride = cap / bs;
      attention::KvPages identity_shape{nullptr, stride, bs, slots * stride};
      std::vector<int32_t> identity(static_cast<size_t>(slots * stride));
      for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int32_t>(i);
      // Shuffled: each row's used blocks (those up to its last token) drawn from a permutation of
      // the blocks, 5 spare; garbage past them.
      std::mt19937_64 rng(static_cast<uint64_t>(23 + bs));
      int64_t used_total = 0;
      for (int64_t s = 0; s < slots; ++s) used_total += max_pos[s] / bs + 1;
      const int64_t num_blocks = used_total + 5;
      std::vector<int32_t> physical(static_cast<size_t>(num_blocks));
      for (int64_t i = 0; i < num_blocks; ++i) physical[i] = static_cast<int32_t>(i);
      std::shuffle(physical.begin(), physical.end(), rng);
      const int32_t garbage[] = {-1, INT32_MAX, static_cast<int32_t>(num_blocks), INT32_MIN};
      std::vector<int32_t> table(static_cast<size_t>(slots * stride));
      size_t next = 0;
      for (int64_t s = 0; s < slots; ++s)
        for (int64_t i = 0; i < stride; ++i)
          table[s * stride + i] = i <= max_pos[s] / bs ? physical[next++] : garbage[(s + i) % 4];
      attention::KvPages shuffled_shape{nullptr, stride, bs, num_blocks};

      RopeKvRun want, got;
      run_paged_rope_kv(qkv, pos, slot, cs, scales, identity_shape, identity, fp8, 0xFF, H, KVH, hd, &want);
      if (HasFatalFailure()) return;
      run_paged_rope_kv(qkv, pos, slot, cs, scales, shuffled_shape, table, fp8, 0x7F, H, KVH, hd, &got);
      if (HasFatalFailure()) return;
      ASSERT_EQ(want.q, got.q) << "q_out depends on the cache layout";
      // Element size and the caches of both layouts as bytes.
      const size_t elem = fp8 ? 1 : 2, row_bytes = static_cast<size_t>(kv_dim) * elem;
      const auto bytes = [&](const RopeKvRun& run, bool is_k) {
        return fp8 ? reinterpret_cast<const uint8_t*>((is_k ? run.k8 : run.v8).data())
                   : reinterpret_cast<const uint8_t*>((is_k ? run.k : run.v).data());
      };
      std::vector<bool> written(static_cast<size_t>(num_blocks * bs), false);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t want_row = identity[slot[r] * stride + pos[r] / bs] * bs + pos[r] % bs;
        const int64_t got_row = int64_t{table[slot[r] * stride + pos[r] / bs]} * bs + pos[r] % bs;
        written[got_row] = true;
        for (bool is_k : {true, false})
          ASSERT_EQ(0, std::memcmp(bytes(want, is_k) + want_row * row_bytes, bytes(got, is_k) + got_row * row_bytes, row_bytes))
              << (is_k ? "K" : "V") << " of token " << r << " (table row " << slot[r] << ", position " << pos[r]
              << ") differs at cache row " << got_row;
      }
      for (int64_t row = 0; row < num_blocks * bs; ++row) {
        if (written[row]) continue;
        for (bool is_k : {true, false}) {
          const uint8_t* p = bytes(got, is_k) + row * row_bytes;
          ASSERT_TRUE(std::all_of(p, p + row_bytes, [](uint8_t x) { return x == 0x7F; }))
              << (is_k ? "K" : "V") << " cache row " << row << " was written but maps no token";
        }
      }
    }
}

TEST(CudaRowOps, RopeKvRejectsInvalidPages) {
  // Refused before any launch: no GPU needed.
  runtime::RopeKvArgs a;
  a.rows = 1, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 64;
  a.pages.table_stride = 4, a.pages.block_size = 16, a.pages.num_blocks = 4;
  Status st = runtime::rope_kv(a, nullptr);
  EXPECT_NE(st.message().find("rope_kv: pages.block_table is null"), std::string::npos) << st.to_string();
  a.pages.block_table = reinterpret_cast<const int32_t*>(uintptr_t{4096});
  a.pages.block_size = 12;
  st = runtime::rope_kv(a, nullptr);
  EXPECT_NE(st.message().find("pages.block_size 12"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace llmq
