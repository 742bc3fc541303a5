// The small per-row kernels of the GPU runtime's forward pass (row_kernels.cu), each one pass over
// its rows, launched one CTA per row:
//   embedding   x[t] = float(table[token[t]])
//   row_op      y = f(row) then written as BF16 or quantized (codes + one scale per row), where f is
//               add + RMSNorm (x += delta (+ bias), written back, then gain * x / rms), the GLU
//               (SiLU(gate) * up or gpt-oss's clamped SwiGLU, gate/up biases first), or a copy; the
//               quantize is llmq's per-token absmax (or a static per-tensor scale), bit for bit the
//               CPU reference's on the same float values
//   rope_kv     q/k per-head RMSNorm (Qwen3), rotated (interleaved or rotate-half pairs), k and v
//               written into the KV cache
// and the bookkeeping of device-side decoding (greedy argmax, advancing positions).
// No CUDA headers here.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/model.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"
#include "parallel/peer_sum.hpp"

namespace llmq::runtime {

Status embedding(const int32_t* tokens, int64_t rows, const void* table, bool table_f32, int64_t dim, float* x,
                 CudaStream stream);

// kClampedSwiglu is its own function (not a flag of kSiluMul) so that the SiLU kernels stay the code
// they were: the clamps compile into the gpt-oss instances only.
enum class RowFn { kAddRmsNorm, kSiluMul, kClampedSwiglu, kCopy };

// Tensor parallelism (src/parallel/p2p_all_reduce.hpp's scheme inside the norm): with ranks > 1,
// kAddRmsNorm's delta is the sum over the ranks of every rank's delta (their row-parallel partial
// sums). Each CTA writes its row of `delta` into its slot of every peer's staging buffer, raises its
// flag there, waits for the peers' flags and adds the rows in rank order, rounded to BF16 once as
// the all-reduce kernel rounds: the all-reduce costs no launch of its own. Only the decode form of
// the kernel does it (row_op_fuses_peer_sum).
using parallel::kRowPeerMaxRanks;
using parallel::kRowPeerMaxRows;
using parallel::RowPeerSum;
// Whether a kAddRmsNorm of `rows` x `n` sums its delta over `ranks` itself (the decode kernel's
// shapes): what each GPU pushes, (ranks - 1) x rows x n, at most slot_elements (a ring all-reduce
// sends about 2 x rows x n whatever the ranks, so more ranks fuse fewer rows).
bool row_op_fuses_peer_sum(int64_t rows, int64_t n, int ranks, int64_t slot_elements);
enum class RowOut { kBF16, kCodesPerToken, kCodesStatic };

struct RowOpArgs {
  RowFn fn = RowFn::kCopy;
  int64_t rows = 0;
  int64_t n = 0;                    // output columns
  // kAddRmsNorm: residual x f32 [*, n]; delta bf16 [rows, n] or null (added to x and written back);
  // row_index (optional) gathers input rows: output row r reads row row_index[r].
  float* x = nullptr;
  const uint16_t* delta = nullptr;
  // f32 [n] or null: the bias of the linear that produced delta (o_proj's), x += delta + bias. Added
  // after the tensor-parallel sum of delta, so once whatever the ranks.
  const float* delta_bias = nullptr;
  const float* gain = nullptr;      // [n]
  float eps = 1e-5f;
  const int32_t* row_index = nullptr;
  // kSiluMul, kClampedSwiglu (the GLUs): gate_up bf16 [rows, 2n] (gate = columns 0..n-1, up =
  // n..2n-1); silu(g) * u, or gpt-oss's g = min(g, limit), u = clamp(u, -limit, limit),
  // (u + 1) * g * sigmoid(alpha g). kCopy: src bf16 [rows, n].
  const uint16_t* src = nullptr;
  float glu_limit = 7.0f;
  float glu_alpha = 1.702f;
  // The GLUs' gate/up biases, f32 [groups, 2n] (gate bias, then up bias), added before the
  // activation. bias_group null: group 0 for every row. Else row r takes group bias_group[r] -
  // group_begin, and none when that is outside [0, groups) (MoE: the expert of each permuted row;
  // under expert parallelism rows of other ranks' experts, which no one reads).
  const float* glu_bias = nullptr;
  const int32_t* bias_group = nullptr;
  int64_t group_begin = 0;
  int64_t groups = 1;
  // Output.
  RowOut out = RowOut::kBF16;
  uint16_t* out_bf16 = nullptr;     // [rows, n]; with a codes output, when set, the BF16 values too
  void* codes = nullptr;            // [rows, n] e4m3 or int8
  float* scales = nullptr;          // [rows]
  QuantSpec spec;                   // format and scale rules (kCodesPerToken)
  float static_scale = 0.0f;        // kCodesStatic
  RowPeerSum peer;                  // kAddRmsNorm under tensor parallelism: delta summed over ranks
};
Status row_op(const RowOpArgs& args, CudaStream stream);

// scales[0 .. rows-1] = scales[0] (a dynamic per-tensor scale broadcast to per-row form).
Status broadcast_scale(float* scales, int64_t rows, CudaStream stream);

struct RopeKvArgs {
  const uint16_t* qkv = nullptr;    // [rows, q_dim + 2 kv_dim] bf16 (q, then k, then v)
  const float* bias = nullptr;      // [q_dim + 2 kv_dim] or null (Qwen2), added before rotating
  // Qwen3: RMSNorm over each q head and each k head (gains f32 [head_dim] each, eps norm_eps), after
  // the bias and before rotating, as the CPU reference's rmsnorm. Both or neither.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  uint16_t* q_out = nullptr;        // [rows, n_heads, head_dim]
  uint16_t* k_cache = nullptr;      // this layer's paged cache (attention::KvPages), [cache rows, n_kv_heads, head_dim]
  uint16_t* v_cache = nullptr;
  const int32_t* position = nullptr;  // [rows]: the token's position in its sequence (< pages.capacity())
  const int32_t* slot = nullptr;      // [rows]: the block-table row of the token's sequence
  attention::KvPages pages;         // the token's K/V go to the cache row its position maps to
  const float* cos_sin = nullptr;   // [pages.capacity(), head_dim / 2, 2]
  int64_t rows = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool interleaved = false;         // llama2.c pairs (2j, 2j+1); else (j, j + head_dim/2)
  // FP8 E4M3 cache (k_cache8 / v_cache8 instead of k_cache / v_cache): code = e4m3(value / scale),
  // round to nearest even, saturating, one scale per kv head ([n_kv_heads] each).
  uint8_t* k_cache8 = nullptr;
  uint8_t* v_cache8 = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
};
Status rope_kv(const RopeKvArgs& args, CudaStream stream);
// RopeKvArgs::cos_sin for positions 0 .. positions - 1 ([positions, head_dim / 2, 2]), computed
// exactly as the CPU reference computes it (rope_inv_freq; YaRN's attention factor on both).
std::vector<float> rope_cos_sin(const ModelConfig& c, int64_t positions);

// tokens[r] = argmax of logits row r (float32 [rows, vocab]); ties go to the lowest id; NaN never
// wins. With a workspace (argmax_workspace_bytes, zeroed once when allocated; every call leaves it
// zeroed) a row is split over several CTAs that combine through one 64-bit atomicMax, the last one
// writing the token: one CTA reading a 128k vocabulary alone took 58 us (ncu, H100).
int64_t argmax_workspace_bytes(int64_t rows);
Status argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, void* workspace, CudaStream stream);

// Set *flag to 1 (never back to 0) when any of `rows` rows of logits holds a NaN/Inf or is
// constant: the device-side check_logits for rows sampled without coming to the host. valid_rows
// (device, or null for all): only rows below *valid_rows count (a graph's padding rows do not).
Status flag_unusable_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* flag, CudaStream stream,
                          const int32_t* valid_rows = nullptr);

// Temperature + top-p sampling of each row, a counter hash of (seed, *step, row); temperature 0
// is argmax_rows (with the workspace).
Status sample_rows(const float* logits, int64_t rows, int64_t vocab, float temperature, float top_p, uint64_t seed,
                   const int32_t* step, int32_t* tokens, void* argmax_workspace, CudaStream stream);

// After a decode step of `rows` sequences: history[step * rows + b] = next[b]; tokens[b] = next[b];
// position[b] += 1; kv_len[b] += 1; *step += 1 (by one thread, after the others read it).
Status advance_decode(const int32_t* next, int64_t rows, int32_t* tokens, int32_t* position, int32_t* kv_len,
                      int32_t* step, int32_t* history, int64_t history_rows, CudaStream stream);

// Seeded pseudo-random fills (a hash of seed and index; roughly normal with std `std`, never 0).
Status fill_random_bf16(uint16_t* data, int64_t count, float std, uint64_t seed, CudaStream stream);
Status fill_random_e4m3(uint8_t* data, int64_t count, float std, uint64_t seed, CudaStream stream);
Status fill_random_f32(float* data, int64_t count, float mean, float std, uint64_t seed, CudaStream stream);

}  // namespace llmq::runtime
