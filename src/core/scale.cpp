// Scale math of the FP8 paper section 3.2: absmax statistics, absmax scales with backoff (eq. 15a,
// 17a, 18a, 20a), power-of-two and hardware-set rounding (eq. 14), the MSE-optimal search over a
// candidate set (eq. 22a, 24a) and SmoothQuant (eq. 26-28). Shared by compute_scale, calibration
// and the CLI; the CUDA scale kernels reproduce absmax_scale and round_scale bit for bit.
#include "llmq/scale.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/element.hpp"
#include "llmq/format.hpp"

namespace llmq {
namespace {

// ceil(log2 s) for a finite s > 0, exact: frexp gives s = f * 2^e with f in [0.5, 1), so s is a
// power of two exactly when f == 0.5 (then log2 s = e - 1); any other f lies strictly between
// 2^(e-1) and 2^e. log2f would round 2^k +- 1 ulp onto k and misplace such scales.
int ceil_log2(float s) {
  int e = 0;
  const float f = std::frexp(s, &e);
  return f == 0.5f ? e - 1 : e;
}

float pow2f(int e) { return std::ldexp(1.0f, e); }

// Largest first, no duplicates, only usable scales (finite, > 0, with a finite reciprocal so the
// scaled values x * (1 / s) stay finite).
std::vector<float> sorted_unique_desc(std::vector<float> v) {
  const auto unusable = [](float s) {
    return !(s > 0.0f) || std::isinf(s) || std::isinf(detail::reciprocal(s));
  };
  v.erase(std::remove_if(v.begin(), v.end(), unusable), v.end());
  std::sort(v.begin(), v.end(), std::greater<float>());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace

double block_absmax(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  double absmax = 0.0;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) {
      const double a = std::fabs(static_cast<double>(load_float(m, r, c)));
      if (a > absmax) absmax = a;  // false for NaN: NaN is ignored; Inf wins
    }
  return absmax;
}

std::vector<float> column_absmax(const MatrixView& m) {
  std::vector<float> out(static_cast<size_t>(m.cols), 0.0f);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) {
      const float a = std::fabs(load_float(m, r, c));
      if (a > out[static_cast<size_t>(c)]) out[static_cast<size_t>(c)] = a;
    }
  return out;
}

std::vector<float> row_absmax(const MatrixView& m) {
  std::vector<float> out(static_cast<size_t>(m.rows), 0.0f);
  for (int64_t r = 0; r < m.rows; ++r)
    out[static_cast<size_t>(r)] = static_cast<float>(block_absmax(m, r, 1, 0, m.cols));
  return out;
}

float absmax_scale(double absmax, const QuantSpec& spec) {
  const float floor_scale = effective_min_scale(spec);
  const double target = static_cast<double>(spec.backoff) * format_info(spec.format).max_finite;
  const double exact = absmax / target;
  // All-zero (or all-NaN) blocks, and blocks so small the floor is larger, get the floor: a scale
  // of 0 would make 1 / s infinite.
  if (!(exact > static_cast<double>(floor_scale))) return floor_scale;
  // float(absmax / target) is IEEE float division when backoff is 1 (double rounding of a
  // quotient to float is exact), the formula vLLM and the CUDA kernels use. absmax * (1 / s) may
  // then land an ulp above r_q; that is not a clip: it rounds to r_q (see exceeds_range).
  return static_cast<float>(exact);
}

float round_scale(float scale, const QuantSpec& spec) {
  switch (spec.scale_rounding) {
    case ScaleRounding::kNone:
      return scale;
    case ScaleRounding::kPowerOfTwo: {
      if (std::isnan(scale)) return scale;
      const float lo = pow2f(spec.pow2_min_exp), hi = pow2f(spec.pow2_max_exp);
      if (!(scale > 0.0f)) return lo;
      if (std::isinf(scale)) return hi;
      // Rounding up (eq. 14) never shrinks the scale, so rounding adds no clipping.
      const int e = std::clamp(ceil_log2(scale), spec.pow2_min_exp, spec.pow2_max_exp);
      return pow2f(e);
    }
    case ScaleRounding::kHardwareSet: {
      if (std::isnan(scale) || spec.hardware_scales.empty()) return scale;
      // The smallest member that does not clip; if every member is smaller than the scale,
      // the largest (clipping is then unavoidable and the least with it).
      float best_above = std::numeric_limits<float>::infinity();
      float largest = spec.hardware_scales.front();
      for (float h : spec.hardware_scales) {
        if (h >= scale && h < best_above) best_above = h;
        largest = std::max(largest, h);
      }
      return std::isinf(best_above) ? largest : best_above;
    }
  }
  return scale;
}

double block_quant_error(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                         float scale, const QuantSpec& spec) {
  // Quantize exactly as quantize() does (v = x * (1 / s) in float32, RNE, saturating, no zero
  // point), so the search optimises the error the stored tensor will really have.
  const float inverse = detail::reciprocal(scale);
  const double s = static_cast<double>(scale);
  double error = 0.0;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) {
      const float x = load_float(m, r, c);
      if (std::isnan(x)) continue;
      bool clipped = false;
      const int32_t code =
          detail::encode_scaled(x * inverse, spec.format, 0, Rounding::kNearestEven, 0, &clipped);
      const double d = static_cast<double>(x) - s * detail::decode_scaled(code, spec.format, 0);
      error += d * d;
    }
  return error;
}

std::vector<float> candidate_scales(float absmax_scale_value, const QuantSpec& spec) {
  std::vector<float> c;
  switch (spec.candidates) {
    case CandidateSet::kGrid: {
      // n scales evenly spaced from the absmax scale (factor 1, no clipping) down to grid_min x
      // it: factor_i = 1 - i (1 - grid_min) / (n - 1), i = 0 .. n - 1. Smaller scales trade
      // clipping of the few largest values for finer steps on the bulk (the point of eq. 22a).
      const int n = std::max(spec.grid_points, 1);
      const double step = n > 1 ? (1.0 - static_cast<double>(spec.grid_min)) / (n - 1) : 0.0;
      for (int i = 0; i < n; ++i)
        c.push_back(static_cast<float>(static_cast<double>(absmax_scale_value) * (1.0 - i * step)));
      c.insert(c.end(), spec.explicit_candidates.begin(), spec.explicit_candidates.end());
      break;
    }
    case CandidateSet::kPowerOfTwo: {
      // 2^e from the power of two at or above the absmax scale (no clipping) down
      // pow2_search_below octaves, inside the hardware's exponent range.
      const int top = (absmax_scale_value > 0.0f && std::isfinite(absmax_scale_value))
                          ? ceil_log2(absmax_scale_value)
                          : spec.pow2_min_exp;
      const int below = std::max(spec.pow2_search_below, 0);
      for (int e = top; e >= top - below; --e)
        c.push_back(pow2f(std::clamp(e, spec.pow2_min_exp, spec.pow2_max_exp)));
      break;
    }
    case CandidateSet::kHardwareSet:
      c = spec.hardware_scales;
      break;
  }
  return sorted_unique_desc(std::move(c));
}

float mse_optimal_scale(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                        const QuantSpec& spec) {
  const double absmax = block_absmax(m, r0, nr, c0, nc);
  // Every scale represents an all-zero block exactly; the floor is the canonical one.
  if (absmax == 0.0) return effective_min_scale(spec);
  const float s_absmax = absmax_scale(absmax, spec);
  if (std::isinf(s_absmax)) return s_absmax;  // Inf in the block: the caller reports it
  const std::vector<float> candidates = candidate_scales(s_absmax, spec);
  if (candidates.empty()) return s_absmax;
  // Largest first and replace only on a strictly smaller error: ties keep the larger scale,
  // which clips less on data the search has not seen.
  float best = candidates.front();
  double best_error = block_quant_error(m, r0, nr, c0, nc, best, spec);
  for (size_t i = 1; i < candidates.size(); ++i) {
    const double e = block_quant_error(m, r0, nr, c0, nc, candidates[i], spec);
    if (e < best_error) {
      best_error = e;
      best = candidates[i];
    }
  }
  return best;
}

Status smoothquant_factors(const std::vector<float>& act_absmax,
                           const std::vector<float>& weight_absmax, float alpha,
                           std::vector<float>* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (!(alpha >= 0.0f && alpha <= 1.0f))
    return invalid_argument("alpha: must be in [0, 1], got " + std::to_string(alpha));
  if (act_absmax.size() != weight_absmax.size())
    return invalid_argument("weight_absmax: length " + std::to_string(weight_absmax.size()) +
                            " differs from act_absmax length " + std::to_string(act_absmax.size()) +
                            " (one entry per input channel K)");
  for (size_t k = 0; k < act_absmax.size(); ++k) {
    if (act_absmax[k] < 0.0f)
      return invalid_argument("act_absmax: entry " + std::to_string(k) + " is negative (" +
                              std::to_string(act_absmax[k]) + "); an absmax is >= 0");
    if (weight_absmax[k] < 0.0f)
      return invalid_argument("weight_absmax: entry " + std::to_string(k) + " is negative (" +
                              std::to_string(weight_absmax[k]) + "); an absmax is >= 0");
  }
  std::vector<float> s(act_absmax.size(), 1.0f);
  const double a = static_cast<double>(alpha);
  for (size_t k = 0; k < s.size(); ++k) {
    const double rx = static_cast<double>(act_absmax[k]), rw = static_cast<double>(weight_absmax[k]);
    // A dead channel (never activated, or an all-zero weight column) carries no information to
    // balance: leave it unscaled rather than divide by zero.
    if (!(rx > 0.0) || !(rw > 0.0) || std::isinf(rx) || std::isinf(rw)) continue;
    const float f = static_cast<float>(std::pow(rx, a) / std::pow(rw, 1.0 - a));
    // Extreme ratios can leave float range; such a factor would make X / s_c or W s_c overflow.
    if (f > 0.0f && std::isfinite(f)) s[k] = f;
  }
  *out = std::move(s);
  return {};
}

Status smooth_weight(const TensorView& w, const std::vector<float>& smooth, Tensor* out) {
  if (out == nullptr) return invalid_argument("out: null");
  MatrixView m;
  LLMQ_RETURN_IF_ERROR(as_matrix(w, "w", &m));
  if (!is_high_precision(m.dtype))
    return invalid_argument(std::string("w: dtype ") + dtype_name(m.dtype) +
                            " is not f32, f64, bf16 or f16");
  if (static_cast<int64_t>(smooth.size()) != m.cols)
    return invalid_argument("smooth: length " + std::to_string(smooth.size()) +
                            " does not match the " + std::to_string(m.cols) +
                            " input channels (K) of w " + w.describe());
  Tensor result(DType::kF32, {m.rows, m.cols});  // (N, K)
  float* p = result.data_as<float>();
  for (int64_t n = 0; n < m.rows; ++n)
    for (int64_t k = 0; k < m.cols; ++k)
      p[n * m.cols + k] = load_float(m, n, k) * smooth[static_cast<size_t>(k)];
  *out = std::move(result);
  return {};
}

float smoothed_activation_scale(const std::vector<float>& act_absmax,
                                const std::vector<float>& smooth, const QuantSpec& spec) {
  // No Status in this signature: a length mismatch is a caller bug, so return NaN, which every
  // later validation of the scale rejects, rather than a plausible wrong number.
  if (act_absmax.size() != smooth.size()) return std::numeric_limits<float>::quiet_NaN();
  double r = 0.0;
  for (size_t k = 0; k < act_absmax.size(); ++k) {
    // The smoothed activation is computed in float (x / s_c), so its absmax is too.
    const double v = static_cast<double>(std::fabs(act_absmax[k] / smooth[k]));
    if (v > r) r = v;  // NaN ignored, as in block_absmax
  }
  return absmax_scale(r, spec);
}

}  // namespace llmq
