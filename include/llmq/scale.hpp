// Scale math shared by compute_scale, calibration and the CLI: statistics (absmax per tensor,
// per row, per column), the scale formulas of the FP8 paper section 3.2, scale rounding (power of
// two, hardware sets), the MSE-optimal search and SmoothQuant.
#pragma once

#include <cstdint>
#include <vector>

#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// absmax over the block [r0, r0 + nr) x [c0, c0 + nc) of a high-precision matrix; NaN ignored.
double block_absmax(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc);
// Per-column absmax (r_{x|} / r_{w|} of eq. 8b / 10c) and per-row absmax (r_{x-} / r_{w-}).
std::vector<float> column_absmax(const MatrixView& m);
std::vector<float> row_absmax(const MatrixView& m);

// s = absmax / (backoff * r_q), floored at min_scale (eq. 15a, 17a, 18a, 20a).
float absmax_scale(double absmax, const QuantSpec& spec);
// Apply spec.scale_rounding (eq. 14 and the hardware sets of section 2.4).
float round_scale(float scale, const QuantSpec& spec);

// Squared error || x - s Q(x / s) ||^2 of quantizing a block with scale s (spec's format).
double block_quant_error(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                         float scale, const QuantSpec& spec);
// MSE-optimal scale of a block over spec's candidate set (eq. 22a / 24a).
float mse_optimal_scale(const MatrixView& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                        const QuantSpec& spec);
// The candidate scales of a block whose absmax scale is `absmax_scale`, largest first.
std::vector<float> candidate_scales(float absmax_scale, const QuantSpec& spec);

// SmoothQuant (eq. 26): s_c[k] = r_x[k]^alpha / r_w[k]^(1 - alpha) from per-input-channel absmax
// of activations (calibrated) and weights. A channel with r_x == 0 or r_w == 0 gets s_c = 1.
Status smoothquant_factors(const std::vector<float>& act_absmax,
                           const std::vector<float>& weight_absmax, float alpha,
                           std::vector<float>* out);
// W_bar = W S_c (eq. 28): multiply each input-channel column of W [N, K] by s_c[k], in place
// into `out` (float32 [N, K]).
Status smooth_weight(const TensorView& w, const std::vector<float>& smooth, Tensor* out);
// Per-tensor activation scale after smoothing (eq. 27): max_k(r_x[k] / s_c[k]) / (backoff r_q).
float smoothed_activation_scale(const std::vector<float>& act_absmax,
                                const std::vector<float>& smooth, const QuantSpec& spec);

}  // namespace llmq
