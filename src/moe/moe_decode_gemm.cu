// moe::decode_grouped_gemm (moe_decode_gemm.hpp): the MoE expert GEMM at decode sizes, as the
// decode GEMM's grouped mode (cuda/decode_gemm_grouped.hpp) with one group per expert.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/decode_gemm_grouped.hpp"
#include "moe/moe_decode_gemm.hpp"

namespace llmq {

namespace moe {

Status decode_grouped_gemm(const MoeGroupedGemm& g, CudaStream stream) {
  // Chunks of 16 rows over all experts: sum of ceil(rows_e / 16) <= rows / 16 + (experts with
  // rows). The grid has one slice per possible
  // chunk, so that CTAs of empty experts are never launched (at gpt-oss's 32 experts and 64 tokens
  // the empty (expert, chunk) slices of a per-expert grid cost more than the GEMM).
  // Both bounds come from `rows` (always valid), not from max_rows_per_expert (a caller's promise).
  const int64_t slices = g.rows / kDecodeGemmGroupRows + std::min(g.experts, g.rows);
  if (slices > 65535)
    return unsupported("max_rows_per_expert: " + std::to_string(g.max_rows_per_expert) + " rows x " +
                       std::to_string(g.experts) + " experts is past the decode kernel's grid (use the wgmma kernel)");
  DecodeGemmProblem p;
  p.m = std::min(g.rows, kDecodeGemmGroupRows);  // picks the variant (> 8: 16-row chunks); rows come from offsets
  p.n = g.n;
  p.k = g.k;
  p.a = g.a;
  p.a_dtype = g.a_dtype;
  p.a_scale = g.a_scale;
  p.w = g.w;
  p.w_dtype = DType::kE4M3;
  p.w_scale = g.w_scale;
  p.d = g.d;
  decode_gemm::GroupLaunch group;
  group.offsets = g.expert_offsets;
  group.rows = g.a_rows;
  group.w_stride = g.n * g.k;
  group.w_scale_stride = g.n;
  if (g.w_dtype == DType::kBF16) {
    // BF16 x BF16 as its byte view (kW16): K and the weight stride in bytes, no scales (the kernel
    // reads none; the W8A8 checks want pointers, so they get a valid device one).
    p.k = 2 * g.k;
    p.a_dtype = DType::kE4M3;
    p.a_scale = reinterpret_cast<const float*>(g.expert_offsets);
    p.w_scale = reinterpret_cast<const float*>(g.expert_offsets);
    group.w_stride = 2 * g.n * g.k;
    group.w_scale_stride = 0;
    group.w16 = true;
  }
  if (g.block_scales) {
    // Block scales: the grids [n / 128, ceil(k / 128)] per expert, [rows of A, ceil(k / 128)].
    group.block = true;
    group.scale_k_blocks = static_cast<int>((g.k + 127) / 128);
    group.w_scale_stride = (g.n / 128) * group.scale_k_blocks;
  }
  group.experts = static_cast<int>(g.experts);
  group.slices = static_cast<int>(slices);
  // The planner counts the CTAs that will run: one N-range per expert the rows can reach
  // (min(experts, rows); at decode each routed expert is about one chunk). Measured on an H200
  // (scripts/gpu-moe-tune): planning for one slice chose 1-2 tiles per CTA where 4 ran 15-22%
  // faster (gpt-oss-20b, 1-64 tokens, measured before the runtime kept this kernel to <= 4 tokens:
  // kMoeDecodeMaxRows), and left a down projection's few CTAs unsplit.
  group.busy_slices = std::max<int64_t>(1, std::min(g.experts, g.rows));
  DecodeGemmConfig cfg;
  cfg.tiles_per_cta = g.decode_tiles_per_cta;  // checked by the planner: 0, 1, 2, 3 or 4
  return decode_gemm::launch(p, stream, cfg, &group);
}

}  // namespace moe

}  // namespace llmq
