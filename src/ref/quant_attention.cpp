// quant_attention_reference (include/llmq/quant_attention.hpp): the tiled 8-bit attention forward
// pass on the CPU, the specification the GPU kernels are held to.
#include "llmq/quant_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "llmq/format.hpp"

namespace llmq {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Inputs as one variant sees them: per element a code (or a BF16-rounded value) and the scale that
// turns it back into a float.
struct Operand {
  std::vector<float> value;  // decoded element (integer code, E4M3 value or BF16 value)
  std::vector<float> scale;  // per row ([tokens * heads]) or [1]; empty: no scale (BF16)
  bool integer = false;      // value holds integers (exact INT32 products)
};

float absmax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// 8-bit codes of x * (1 / scale), round to nearest even, saturating (the runtime's quantizer).
float encode8(float x, float inverse, bool int8) {
  const float y = x * inverse;
  if (int8) return static_cast<float>(encode_int(y, DType::kI8));
  return fp8_to_float(float_to_fp8(y, DType::kE4M3), DType::kE4M3);
}

float scale_of(float amax, bool int8) {
  const float s = amax / (int8 ? 127.0f : 448.0f);
  return s > 0.0f ? s : 1.0f;
}

// Q or K ([rows, d] with rows = tokens * heads): per-row or per-tensor 8-bit, or BF16.
Operand quantize_rows(const float* x, int64_t rows, int64_t d, AttentionVariant v, QkScaling qk) {
  Operand o;
  o.value.resize(static_cast<size_t>(rows * d));
  const bool bf16 = v == AttentionVariant::kBf16 || v == AttentionVariant::kFloat;
  if (bf16) {
    for (int64_t i = 0; i < rows * d; ++i)
      o.value[i] = v == AttentionVariant::kFloat ? x[i] : bf16_bits_to_float(float_to_bf16_bits(x[i]));
    return o;
  }
  const bool int8 = v != AttentionVariant::kFp8;
  o.integer = int8;
  const float tensor_scale = scale_of(absmax(x, rows * d), int8);
  o.scale.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = qk == QkScaling::kPerTensor ? tensor_scale : scale_of(absmax(x + r * d, d), int8);
    const float inv = 1.0f / s;
    o.scale[r] = s;
    for (int64_t c = 0; c < d; ++c) o.value[r * d + c] = encode8(x[r * d + c], inv, int8);
  }
  return o;
}

// V ([kv_len, kv_heads, d]): 8-bit with the chosen scaling (scale index: see v_scale_at), or BF16.
Operand quantize_v(const float* x, const AttentionProblem& p, const QuantAttentionOptions& o) {
  const int64_t n = p.kv_len, hk = p.kv_heads, d = p.head_dim, width = hk * d;
  Operand v;
  v.value.resize(static_cast<size_t>(n * width));
  const AttentionVariant var = o.variant;
  if (var == AttentionVariant::kFloat || var == AttentionVariant::kBf16 || var == AttentionVariant::kHalfInt8) {
    for (int64_t i = 0; i < n * width; ++i)
      v.value[i] = var == AttentionVariant::kFloat ? x[i] : bf16_bits_to_float(float_to_bf16_bits(x[i]));
    return v;
  }
  const bool int8 = var == AttentionVariant::kFullInt8;
  v.integer = int8;
  const int64_t tiles = (n + o.block_kv - 1) / o.block_kv;
  auto scale_index = [&](int64_t t, int64_t col) -> int64_t {
    switch (o.v_scaling) {
      case VScaling::kPerTensor: return 0;
      case VScaling::kPerChannel: return col;
      case VScaling::kPerBlock: return (t / o.block_kv) * width + col;
    }
    return 0;
  };
  const int64_t count = o.v_scaling == VScaling::kPerTensor ? 1 : (o.v_scaling == VScaling::kPerChannel ? width : tiles * width);
  std::vector<float> amax(static_cast<size_t>(count), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t col = 0; col < width; ++col) {
      float& m = amax[static_cast<size_t>(scale_index(t, col))];
      m = std::max(m, std::fabs(x[t * width + col]));
    }
  v.scale.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v.scale[i] = scale_of(amax[i], int8);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t col = 0; col < width; ++col) {
      const float s = v.scale[static_cast<size_t>(scale_index(t, col))];
      v.value[t * width + col] = encode8(x[t * width + col], 1.0f / s, int8);
    }
  return v;
}

// What a probability of 1 (a score equal to the running maximum) weighs in a variant's row sum l:
// the unit the attention sink joins l in.
float sink_unit(const QuantAttentionOptions& o) {
  switch (o.variant) {
    case AttentionVariant::kFullInt8: return static_cast<float>(o.p_max);
    case AttentionVariant::kFp8: return std::exp2(o.p_offset);
    default: return 1.0f;
  }
}

struct Prepared {
  Operand q, k, v;
};

// Query rows [i0, i1) of head h: the online softmax over KV tiles.
void attend_rows(const AttentionProblem& p, const QuantAttentionOptions& o, const Prepared& in, int64_t h, int64_t i0,
                 int64_t i1, float* out) {
  const int64_t d = p.head_dim, hk = h / (p.heads / p.kv_heads), width = p.kv_heads * d;
  const float scale = p.softmax_scale > 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(d));
  const float scale_log2 = scale * kLog2e;
  const AttentionVariant var = o.variant;
  const bool eight_bit_qk = var == AttentionVariant::kFullInt8 || var == AttentionVariant::kHalfInt8 || var == AttentionVariant::kFp8;
  std::vector<float> s(static_cast<size_t>(o.block_kv));
  std::vector<double> acc_o(static_cast<size_t>(d));
  std::vector<float> o_row(static_cast<size_t>(d));

  for (int64_t i = i0; i < i1; ++i) {
    const int64_t qrow = i * p.heads + h;
    const float* qv = &in.q.value[qrow * d];
    const int64_t pos = p.kv_len - p.q_len + i;
    const int64_t visible = p.causal ? std::min(p.kv_len, pos + 1) : p.kv_len;
    const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;  // the window's oldest key
    float* dst = out + qrow * d;
    if (var == AttentionVariant::kFloat) {
      // Ground truth: exact scores, max-subtracted softmax in double; the sink joins the maximum
      // and the denominator.
      std::vector<double> sc(static_cast<size_t>(visible));
      double mx = p.sinks != nullptr ? static_cast<double>(p.sinks[h]) : -std::numeric_limits<double>::infinity();
      for (int64_t t = first; t < visible; ++t) {
        const float* kv = &in.k.value[(t * p.kv_heads + hk) * d];
        double a = 0;
        for (int64_t c = 0; c < d; ++c) a += static_cast<double>(qv[c]) * kv[c];
        sc[t] = a * scale;
        mx = std::max(mx, sc[t]);
      }
      double l = p.sinks != nullptr ? std::exp(static_cast<double>(p.sinks[h]) - mx) : 0.0;
      std::fill(acc_o.begin(), acc_o.end(), 0.0);
      for (int64_t t = first; t < visible; ++t) {
        const double e = std::exp(sc[t] - mx);
        l += e;
        const float* vv = &in.v.value[t * width + hk * d];
        for (int64_t c = 0; c < d; ++c) acc_o[c] += e * vv[c];
      }
      for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<float>(acc_o[c] / l);
      continue;
    }
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    std::fill(o_row.begin(), o_row.end(), 0.0f);
    // Tiles stay at multiples of block_kv (V's block scales are per absolute tile); keys before the
    // window are left out of the tile, tiles wholly before it skipped.
    for (int64_t t0 = first / o.block_kv * o.block_kv; t0 < visible; t0 += o.block_kv) {
      const int64_t t1 = std::min(visible, t0 + o.block_kv), ta = std::max(t0, first);
      // Scores in the log2 domain: (Q K^T) * sq * sk * scale * log2(e), one multiply per score.
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = ta; t < t1; ++t) {
        const int64_t krow = t * p.kv_heads + hk;
        const float* kv = &in.k.value[krow * d];
        float acc;
        if (in.q.integer) {
          int64_t a = 0;
          for (int64_t c = 0; c < d; ++c) a += static_cast<int64_t>(qv[c]) * static_cast<int64_t>(kv[c]);
          acc = static_cast<float>(a);
        } else {
          acc = 0.0f;
          for (int64_t c = 0; c < d; ++c) acc += qv[c] * kv[c];
        }
        const float fold = eight_bit_qk ? (in.q.scale[qrow] * in.k.scale[krow]) * scale_log2 : scale_log2;
        s[t - t0] = acc * fold;
        tile_max = std::max(tile_max, s[t - t0]);
      }
      const float m_new = std::max(m, tile_max);
      const float alpha = std::exp2(m - m_new);  // 0 on the first tile (m = -inf)
      // The reference P is taken against m_ref: the running maximum, or the tile's own (then the
      // tile's contributions carry 2^(m_ref - m_new) <= 1).
      const bool tile_ref = o.p_tile_max && var == AttentionVariant::kFullInt8;
      const float m_ref = tile_ref ? tile_max : m_new;
      const float carry = tile_ref ? std::exp2(tile_max - m_new) : 1.0f;
      float tile_l = 0.0f;
      std::vector<double> pv(static_cast<size_t>(d), 0.0);  // integer-exact for INT8 P*V
      for (int64_t t = ta; t < t1; ++t) {
        const float e = std::exp2(s[t - t0] - m_ref);
        float pq;
        switch (var) {
          case AttentionVariant::kFullInt8: pq = std::nearbyint(static_cast<float>(o.p_max) * e); break;
          case AttentionVariant::kFp8:
            pq = fp8_to_float(float_to_fp8(std::exp2(s[t - t0] - m_new + o.p_offset), DType::kE4M3), DType::kE4M3);
            break;
          default: pq = bf16_bits_to_float(float_to_bf16_bits(e)); break;
        }
        tile_l += pq;
        if (pq == 0.0f) continue;
        const float* vv = &in.v.value[t * width + hk * d];
        for (int64_t c = 0; c < d; ++c) pv[c] += static_cast<double>(pq) * vv[c];
      }
      l = l * alpha + tile_l * carry;
      for (int64_t c = 0; c < d; ++c) {
        float sv = 1.0f;
        if (!in.v.scale.empty()) {
          const int64_t col = hk * d + c;
          switch (o.v_scaling) {
            case VScaling::kPerTensor: sv = in.v.scale[0]; break;
            case VScaling::kPerChannel: sv = in.v.scale[static_cast<size_t>(col)]; break;
            case VScaling::kPerBlock: sv = in.v.scale[static_cast<size_t>((t0 / o.block_kv) * width + col)]; break;
          }
        }
        o_row[c] = o_row[c] * alpha + static_cast<float>(pv[c]) * (sv * carry);
      }
      m = m_new;
    }
    // The sink, once, in P's units against the running maximum m (a row that saw no key stays 0).
    if (p.sinks != nullptr && l > 0.0f) l += sink_unit(o) * std::exp2(p.sinks[h] * kLog2e - m);
    for (int64_t c = 0; c < d; ++c) dst[c] = l > 0.0f ? o_row[c] / l : 0.0f;
  }
}

Status check(const AttentionProblem& p, const QuantAttentionOptions& o) {
  if (p.q_len < 0 || p.kv_len < 0) return invalid_argument("q_len, kv_len: must be >= 0");
  if (p.q_len > p.kv_len) return invalid_argument("q_len: " + std::to_string(p.q_len) + " queries past kv_len " + std::to_string(p.kv_len));
  if (p.heads <= 0 || p.kv_heads <= 0 || p.heads % p.kv_heads != 0)
    return invalid_argument("heads, kv_heads: heads must be a positive multiple of kv_heads");
  if (p.head_dim <= 0) return invalid_argument("head_dim: must be > 0");
  if (p.window < 0) return invalid_argument("window: must be >= 0 (0: no sliding window), got " + std::to_string(p.window));
  if (p.window > 0 && !p.causal) return invalid_argument("window: a sliding window needs causal attention");
  if (o.block_kv <= 0) return invalid_argument("block_kv: must be > 0");
  if (o.p_max != 127 && o.p_max != 255) return invalid_argument("p_max: 127 (signed P) or 255 (unsigned P), got " + std::to_string(o.p_max));
  if (!(o.p_offset >= 0.0f && std::exp2(o.p_offset) <= 448.0f))
    return invalid_argument("p_offset: 2^p_offset must be in [1, 448] (E4M3's largest value)");
  return {};
}

}  // namespace

const char* attention_variant_name(AttentionVariant v) {
  switch (v) {
    case AttentionVariant::kFloat: return "float";
    case AttentionVariant::kBf16: return "bf16";
    case AttentionVariant::kHalfInt8: return "half-int8";
    case AttentionVariant::kFullInt8: return "int8";
    case AttentionVariant::kFp8: return "fp8";
  }
  return "unknown";
}

Status parse_attention_variant(const std::string& name, AttentionVariant* out) {
  for (AttentionVariant v : {AttentionVariant::kFloat, AttentionVariant::kBf16, AttentionVariant::kHalfInt8,
                             AttentionVariant::kFullInt8, AttentionVariant::kFp8})
    if (name == attention_variant_name(v)) {
      *out = v;
      return {};
    }
  return invalid_argument("attention variant '" + name + "': float, bf16, half-int8, int8 or fp8");
}

QuantAttentionOptions kernel_attention_options(AttentionVariant v) {
  QuantAttentionOptions o;
  o.variant = v;
  if (v == AttentionVariant::kFullInt8 || v == AttentionVariant::kFp8) {
    o.v_scaling = VScaling::kPerBlock;
    o.p_max = 255;
    o.p_tile_max = v == AttentionVariant::kFullInt8;
    o.block_kv = 64;
  }
  return o;
}

Status quant_attention_reference(const AttentionProblem& p, const QuantAttentionOptions& o, const float* q,
                                 const float* k, const float* v, float* out, int threads) {
  LLMQ_RETURN_IF_ERROR(check(p, o));
  if (p.q_len == 0) return {};
  if (q == nullptr || k == nullptr || v == nullptr || out == nullptr) return invalid_argument("q, k, v, out: null pointer");
  const int64_t d = p.head_dim;
  std::vector<float> k_used(k, k + p.kv_len * p.kv_heads * d);
  if (o.smooth_k) {
    for (int64_t hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t c = 0; c < d; ++c) {
        double mean = 0;
        for (int64_t t = 0; t < p.kv_len; ++t) mean += k_used[(t * p.kv_heads + hk) * d + c];
        mean /= static_cast<double>(std::max<int64_t>(p.kv_len, 1));
        for (int64_t t = 0; t < p.kv_len; ++t) k_used[(t * p.kv_heads + hk) * d + c] -= static_cast<float>(mean);
      }
  }
  Prepared in;
  in.q = quantize_rows(q, p.q_len * p.heads, d, o.variant, o.qk_scaling);
  in.k = quantize_rows(k_used.data(), p.kv_len * p.kv_heads, d, o.variant, o.qk_scaling);
  in.v = quantize_v(v, p, o);
  // Work items of 64 query rows of one head, dealt round-robin to the threads.
  const int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  constexpr int64_t kRows = 64;
  const int64_t chunks = (p.q_len + kRows - 1) / kRows, items = chunks * p.heads;
  std::vector<std::thread> pool;
  for (int w = 0; w < std::min<int64_t>(n, items); ++w)
    pool.emplace_back([&, w] {
      for (int64_t it = w; it < items; it += n) {
        const int64_t h = it % p.heads, c = it / p.heads;
        attend_rows(p, o, in, h, c * kRows, std::min(p.q_len, (c + 1) * kRows), out);
      }
    });
  for (std::thread& t : pool) t.join();
  return {};
}

AttentionError attention_error(const float* got, const float* want, int64_t n) {
  AttentionError e;
  if (n <= 0) return e;
  double sum_abs_want = 0, sum_abs_diff = 0, dot = 0, gg = 0, ww = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i], diff = g - w;
    sum_abs_want += std::fabs(w);
    sum_abs_diff += std::fabs(diff);
    dot += g * w;
    gg += g * g;
    ww += w * w;
    sq += diff * diff;
    e.max_abs = std::max(e.max_abs, std::fabs(diff));
  }
  const double floor_abs = 0.1 * sum_abs_want / static_cast<double>(n);
  double mre = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = std::fabs(want[i]);
    if (w < floor_abs) continue;
    mre += std::fabs(static_cast<double>(got[i]) - want[i]) / w;
    ++counted;
  }
  e.mre = counted > 0 ? mre / static_cast<double>(counted) : 0.0;
  e.mre_excluded = n - counted;
  e.rel_l1 = sum_abs_want > 0 ? sum_abs_diff / sum_abs_want : 0.0;
  e.cosine = gg > 0 && ww > 0 ? dot / std::sqrt(gg * ww) : 0.0;
  e.rmse = std::sqrt(sq / static_cast<double>(n));
  return e;
}

}  // namespace llmq
