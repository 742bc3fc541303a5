// The tensor-parallel split as a plan (tensor_parallel.hpp): which rows and columns of each linear a
// rank holds. Host only, so the CPU tests check it against the unsplit linears; the GPU loaders
// (src/runtime/shard_linear.cu) copy exactly these slices.
#include "llmq/tensor_parallel.hpp"

namespace llmq {

ModelConfig tensor_parallel_config(const ModelConfig& full, int tp_size, bool expert_parallel) {
  ModelConfig c = full;
  if (tp_size > 1) {
    c.n_heads = full.n_heads / tp_size;
    c.n_kv_heads = full.n_kv_heads / tp_size;
    if (!(expert_parallel && full.is_moe())) c.hidden_dim = full.hidden_dim / tp_size;
  }
  return c;
}

Status check_tensor_parallel(const ModelConfig& full, int tp_size, bool block_scales, bool expert_parallel) {
  if (tp_size < 1 || tp_size > 64) return invalid_argument("--tp: " + std::to_string(tp_size) + " outside [1, 64]");
  if (tp_size == 1) return {};
  const std::string n = std::to_string(tp_size);
  // Whole kv heads per rank (no kv-head replication): GQA groups then stay on one rank.
  if (full.n_kv_heads % tp_size != 0)
    return invalid_argument("--tp " + n + ": num_key_value_heads " + std::to_string(full.n_kv_heads) + " is not divisible by " + n);
  if (full.n_heads % tp_size != 0)
    return invalid_argument("--tp " + n + ": num_attention_heads " + std::to_string(full.n_heads) + " is not divisible by " + n);
  if (expert_parallel) {
    if (!full.is_moe()) return invalid_argument("--ep: expert parallelism needs an MoE model");
    if (full.n_experts % tp_size != 0)
      return invalid_argument("--ep --tp " + n + ": num_local_experts " + std::to_string(full.n_experts) + " is not divisible by " + n);
  } else if (full.hidden_dim % tp_size != 0) {
    return invalid_argument("--tp " + n + ": intermediate_size " + std::to_string(full.hidden_dim) + " is not divisible by " + n);
  }
  if (block_scales) {
    const ModelConfig c = tensor_parallel_config(full, tp_size, expert_parallel);
    const struct {
      const char* what;
      int64_t size;
    } slices[] = {{"q heads x head_dim", c.n_heads * c.head_dim},
                  {"kv heads x head_dim", c.n_kv_heads * c.head_dim},
                  {"intermediate_size", c.hidden_dim}};
    for (const auto& s : slices)
      if (s.size % 128 != 0)
        return invalid_argument("--tp " + n + ": a rank's slice of " + s.what + " is " + std::to_string(s.size) +
                                ", not a multiple of the 128x128 weight blocks");
  }
  return {};
}

const char* sharded_linear_name(ShardedLinear which) {
  switch (which) {
    case ShardedLinear::kQkv: return "qkv";
    case ShardedLinear::kO: return "o_proj";
    case ShardedLinear::kGateUp: return "gate_up";
    case ShardedLinear::kDown: return "down_proj";
    case ShardedLinear::kExpertsGateUp: return "experts.gate_up";
    case ShardedLinear::kExpertsDown: return "experts.down";
    case ShardedLinear::kLmHead: return "lm_head";
  }
  return "?";
}

int64_t LinearShard::n() const {
  int64_t total = 0;
  for (const Rows& r : rows) total += r.count;
  return total;
}

LinearShard linear_shard(const ModelConfig& full, ShardedLinear which, TensorParallelRank tp) {
  const ModelConfig c = tensor_parallel_config(full, tp.size, tp.expert_parallel);
  const int64_t r = tp.rank;
  const int64_t q_full = full.n_heads * full.head_dim, kv_full = full.n_kv_heads * full.head_dim;
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const int64_t h_full = full.hidden_dim, h = c.hidden_dim;
  const int64_t experts = full.is_moe() ? full.n_experts : 1;
  LinearShard s;
  switch (which) {
    case ShardedLinear::kQkv:  // [q_full + 2 kv_full, dim]: this rank's q heads, then its k and v heads
      s.rows = {{r * q, q}, {q_full + r * kv, kv}, {q_full + kv_full + r * kv, kv}};
      s.col_count = full.dim;
      break;
    case ShardedLinear::kO:  // [dim, q_full]: every row, this rank's heads' columns
      s.rows = {{0, full.dim}};
      s.col_begin = r * q;
      s.col_count = q;
      s.partial_sum = true;
      break;
    case ShardedLinear::kExpertsGateUp:  // [experts * 2 h_full, dim]
      if (tp.expert_parallel) {  // this rank's whole experts
        const int64_t local = experts / tp.size;
        s.rows = {{r * local * 2 * h_full, local * 2 * h_full}};
        s.col_count = full.dim;
        break;
      }
      [[fallthrough]];  // else the same as a dense gate/up within every expert
    case ShardedLinear::kGateUp:  // [2 h_full, dim]: this rank's gate columns, then its up columns
      for (int64_t e = 0; e < (which == ShardedLinear::kGateUp ? 1 : experts); ++e) {
        s.rows.push_back({e * 2 * h_full + r * h, h});
        s.rows.push_back({e * 2 * h_full + h_full + r * h, h});
      }
      s.col_count = full.dim;
      break;
    case ShardedLinear::kExpertsDown:  // [experts * dim, h_full]
      if (tp.expert_parallel) {  // this rank's whole experts; its output sums only their share
        const int64_t local = experts / tp.size;
        s.rows = {{r * local * full.dim, local * full.dim}};
        s.col_count = h_full;
        s.partial_sum = true;
        break;
      }
      [[fallthrough]];
    case ShardedLinear::kDown:  // [dim, h_full]
      s.rows = {{0, (which == ShardedLinear::kDown ? 1 : experts) * full.dim}};
      s.col_begin = r * h;
      s.col_count = h;
      s.partial_sum = true;
      break;
    case ShardedLinear::kLmHead:  // [vocab, dim]: this rank's vocabulary rows (whole when N does not divide it)
      if (full.vocab_size % tp.size == 0) s.rows = {{r * (full.vocab_size / tp.size), full.vocab_size / tp.size}};
      else s.rows = {{0, full.vocab_size}};
      s.col_count = full.dim;
      break;
  }
  return s;
}

}  // namespace llmq
