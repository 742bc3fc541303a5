// shard_linear.hpp: slicing device weights for one tensor-parallel rank.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "runtime/shard_linear.hpp"
#include "runtime/gpu_model_build.hpp"

namespace llmq::runtime {
namespace {

int64_t element_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    default: return 1;  // e4m3, int8
  }
}

int64_t blocks(int64_t n) { return (n + 127) / 128; }

// Rows [src_row, src_row + count) of one part of the whole linear, going to rows
// [dst_row, dst_row + count) of the slice.
struct Piece {
  size_t part = 0;
  int64_t src_row = 0;  // within the part
  int64_t count = 0;
  int64_t dst_row = 0;  // within the slice
};

Status copy_piece(const GpuLinear& full, const LinearPart& src, const Piece& p, int64_t dst_row_in_part, int64_t col_begin,
                  int64_t col_count, LinearPart* dst) {
  const int64_t es = element_bytes(src.w_dtype), k = full.k;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(dst->w.as<char>() + dst_row_in_part * col_count * es, static_cast<size_t>(col_count * es),
                                         src.w.as<const char>() + (p.src_row * k + col_begin) * es, static_cast<size_t>(k * es),
                                         static_cast<size_t>(col_count * es), static_cast<size_t>(p.count),
                                         cudaMemcpyDeviceToDevice));
  if (src.scale_kind == WeightScale::kChannel) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst->w_scale.as<float>() + dst_row_in_part, src.w_scale.as<const float>() + p.src_row,
                                         static_cast<size_t>(p.count * 4), cudaMemcpyDeviceToDevice));
  } else if (src.scale_kind == WeightScale::kBlock128) {
    const int64_t src_cols = blocks(k), dst_cols = blocks(col_count);
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(dst->w_scale.as<float>() + (dst_row_in_part / 128) * dst_cols,
                                           static_cast<size_t>(dst_cols * 4),
                                           src.w_scale.as<const float>() + (p.src_row / 128) * src_cols + col_begin / 128,
                                           static_cast<size_t>(src_cols * 4), static_cast<size_t>(dst_cols * 4),
                                           static_cast<size_t>(blocks(p.count)), cudaMemcpyDeviceToDevice));
  }
  return {};
}

Status allocate_part(const GpuLinear& full, const LinearPart& like, int64_t n, int64_t k, LinearPart* out) {
  out->n = n;
  out->w_dtype = like.w_dtype;
  out->scale_kind = like.scale_kind;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n * k * element_bytes(like.w_dtype), full.name + ".weight (slice)", &out->w));
  if (like.scale_kind == WeightScale::kChannel)
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(n * 4, full.name + ".weight_scale (slice)", &out->w_scale));
  if (like.scale_kind == WeightScale::kBlock128)
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(blocks(n) * blocks(k) * 4, full.name + ".weight_scale (slice)", &out->w_scale));
  return {};
}

// Whether the slice's per-channel scales are one value (pieces of several parts may differ).
Status note_uniform_scale(LinearPart* part) {
  part->uniform_scale = false;
  if (part->scale_kind != WeightScale::kChannel) return {};
  std::vector<float> host(static_cast<size_t>(part->w_scale.bytes() / 4));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), part->w_scale.get(), host.size() * 4, cudaMemcpyDeviceToHost));
  part->uniform_scale = one_scale(host);
  return {};
}

// Block scales in cuBLASLt's order, from the slice's own scales.
Status finish_blocks(const std::string& name, int64_t k, LinearPart* part) {
  if (part->scale_kind != WeightScale::kBlock128) return {};
  std::vector<float> host(static_cast<size_t>(part->w_scale.bytes() / 4));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), part->w_scale.get(), host.size() * 4, cudaMemcpyDeviceToHost));
  return finish_block_part(part, k, host, name);
}

Status slice_f32(const DeviceAllocation& full, const LinearShard& s, const std::string& what, DeviceAllocation* out) {
  if (full.empty()) return {};
  DeviceAllocation d;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(s.n() * 4, what, &d));
  int64_t dst = 0;
  for (const LinearShard::Rows& r : s.rows) {
    if ((r.begin + r.count) * 4 > full.bytes()) return Status(StatusCode::kInternal, what + ": slice past the end");
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(d.as<float>() + dst, full.as<const float>() + r.begin, static_cast<size_t>(r.count * 4),
                                         cudaMemcpyDeviceToDevice));
    dst += r.count;
  }
  *out = std::move(d);
  return {};
}

}  // namespace

Status begin_tensor_parallel(const ModelConfig& full, TensorParallelRank tp, bool block_scales, ModelConfig* local) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    return invalid_argument("tensor parallel rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size));
  LLMQ_RETURN_IF_ERROR(check_tensor_parallel(full, tp.size, block_scales, tp.expert_parallel));
  *local = tensor_parallel_config(full, tp.size, tp.expert_parallel);
  return {};
}

Status shard_linear(const LinearShard& s, GpuLinear* linear) {
  GpuLinear& l = *linear;
  if (l.parts.empty()) return {};
  if (s.col_begin < 0 || s.col_count < 1 || s.col_begin + s.col_count > l.k)
    return Status(StatusCode::kInternal, l.name + ": columns [" + std::to_string(s.col_begin) + ", +" +
                                             std::to_string(s.col_count) + ") outside K = " + std::to_string(l.k));
  std::vector<Piece> pieces;
  int64_t dst = 0;
  for (const LinearShard::Rows& r : s.rows) {
    for (size_t i = 0; i < l.parts.size(); ++i) {
      const LinearPart& p = l.parts[i];
      const int64_t lo = std::max(r.begin, p.n_offset), hi = std::min(r.begin + r.count, p.n_offset + p.n);
      if (lo < hi) pieces.push_back({i, lo - p.n_offset, hi - lo, dst + lo - r.begin});
    }
    dst += r.count;
  }
  if (dst > l.n || pieces.empty()) return Status(StatusCode::kInternal, l.name + ": slice rows outside N = " + std::to_string(l.n));
  bool same = true, blocks_aligned = true, any_block = false;
  for (const Piece& p : pieces) {
    const LinearPart& src = l.parts[p.part];
    same = same && src.w_dtype == l.parts[0].w_dtype && src.scale_kind == l.parts[0].scale_kind;
    if (src.scale_kind == WeightScale::kBlock128) {
      any_block = true;
      if (p.src_row % 128 != 0) return invalid_argument(l.name + ": a tensor-parallel slice starts inside a 128x128 weight block (row " + std::to_string(p.src_row) + ")");
      blocks_aligned = blocks_aligned && p.dst_row % 128 == 0 && (p.count % 128 == 0 || &p == &pieces.back());
    }
  }
  if (any_block && (s.col_begin % 128 != 0 || (s.col_count % 128 != 0 && s.col_begin + s.col_count != l.k)))
    return invalid_argument(l.name + ": tensor-parallel columns [" + std::to_string(s.col_begin) + ", +" +
                            std::to_string(s.col_count) + ") are not on 128x128 weight-block boundaries");
  std::vector<LinearPart> parts;
  if (same && blocks_aligned) {
    LinearPart part;
    LLMQ_RETURN_IF_ERROR(allocate_part(l, l.parts[0], dst, s.col_count, &part));
    for (const Piece& p : pieces)
      LLMQ_RETURN_IF_ERROR(copy_piece(l, l.parts[p.part], p, p.dst_row, s.col_begin, s.col_count, &part));
    parts.push_back(std::move(part));
  } else {
    for (const Piece& p : pieces) {
      LinearPart part;
      LLMQ_RETURN_IF_ERROR(allocate_part(l, l.parts[p.part], p.count, s.col_count, &part));
      part.n_offset = p.dst_row;
      LLMQ_RETURN_IF_ERROR(copy_piece(l, l.parts[p.part], p, 0, s.col_begin, s.col_count, &part));
      parts.push_back(std::move(part));
    }
  }
  for (LinearPart& part : parts) {
    LLMQ_RETURN_IF_ERROR(finish_blocks(l.name, s.col_count, &part));
    LLMQ_RETURN_IF_ERROR(note_uniform_scale(&part));
  }
  l.parts = std::move(parts);  // frees the whole linear
  l.n = dst;
  l.k = s.col_count;
  return {};
}

Status shard_lm_head(const ModelConfig& full, TensorParallelRank tp, GpuLinear* lm_head) {
  if (tp.size <= 1 || full.vocab_size % tp.size != 0) return {};
  return shard_linear(linear_shard(full, ShardedLinear::kLmHead, tp), lm_head);
}

Status shard_layer(const ModelConfig& full, TensorParallelRank tp, GpuLayer* layer) {
  if (tp.size <= 1) return {};
  GpuLayer& L = *layer;
  const LinearShard qkv = linear_shard(full, ShardedLinear::kQkv, tp);
  LLMQ_RETURN_IF_ERROR(shard_linear(qkv, &L.qkv));
  LLMQ_RETURN_IF_ERROR(slice_f32(L.qkv_bias, qkv, L.qkv.name + ".bias (slice)", &L.qkv_bias));
  // Sinks go with their query heads; q/k norms (per head_dim) and o_proj's bias (added once, after
  // the ranks' partial sums) stay whole.
  LinearShard heads;
  heads.rows = {{tp.rank * (full.n_heads / tp.size), full.n_heads / tp.size}};
  LLMQ_RETURN_IF_ERROR(slice_f32(L.sinks, heads, L.qkv.name + ".sinks (slice)", &L.sinks));
  LLMQ_RETURN_IF_ERROR(shard_linear(linear_shard(full, ShardedLinear::kO, tp), &L.o));
  if (L.moe.active()) {
    const LinearShard gate_up = linear_shard(full, ShardedLinear::kExpertsGateUp, tp);
    const LinearShard down = linear_shard(full, ShardedLinear::kExpertsDown, tp);
    LLMQ_RETURN_IF_ERROR(shard_linear(gate_up, &L.moe.gate_up));
    LLMQ_RETURN_IF_ERROR(shard_linear(down, &L.moe.down));
    // Expert biases follow the rows of their linears. down's output rows are whole on every rank
    // unless the ranks hold whole experts: then rank 0 alone adds them, as the sum adds the ranks'.
    LLMQ_RETURN_IF_ERROR(slice_f32(L.moe.gate_up_bias, gate_up, L.moe.gate_up.name + ".bias (slice)", &L.moe.gate_up_bias));
    if (tp.expert_parallel) {
      L.moe.local_experts = L.moe.experts / tp.size;
      L.moe.expert_begin = tp.rank * L.moe.local_experts;
      LLMQ_RETURN_IF_ERROR(slice_f32(L.moe.down_bias, down, L.moe.down.name + ".bias (slice)", &L.moe.down_bias));
    } else if (tp.rank != 0) {
      L.moe.down_bias = DeviceAllocation();
    }
    LLMQ_RETURN_IF_ERROR(check_moe_linear(L.moe.gate_up));
    return check_moe_linear(L.moe.down);
  }
  LLMQ_RETURN_IF_ERROR(shard_linear(linear_shard(full, ShardedLinear::kGateUp, tp), &L.gate_up));
  LLMQ_RETURN_IF_ERROR(shard_linear(linear_shard(full, ShardedLinear::kDown, tp), &L.down));
  return {};
}

}  // namespace llmq::runtime
