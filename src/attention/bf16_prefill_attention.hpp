// The runtime's BF16 prefill attention on Hopper for steps of long prefill sequences (a prompt's
// prefill, `bench e2e --prefill`, the serving engine's prefill chunks): the sequences' K rows are
// gathered from the paged cache into one packed buffer and their V rows transposed into V^T by one
// kernel (E4M3 codes widened to BF16 exactly, their scales folded into the attention), then one
// launch of the wgmma kernel (bf16_attention_sm90.hpp) runs them all. Steps of short sequences (the
// queries, weighted by keys, average under kMinQueries) keep the batched mma.sync kernel of
// attention.hpp, for which the gather would cost more than the faster kernel saves. Decode rows of
// a mixed step are not here (the decode kernel takes them). Internal host header, no CUDA headers.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention.hpp"
#include "attention/quant_prefill_attention.hpp"
#include "cuda/device_memory.hpp"
#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq::attention {

class Bf16PrefillAttention {
 public:
  // Packed keys of one launch (the buffers: 2 x 2 bytes x kv_heads x head_dim a key, 128 MB at 8
  // kv heads); a step's sequences that do not fit together go in several launches.
  static constexpr int64_t kMaxKeys = 32768;
  // A step takes this path when its sequences' queries, weighted by their keys, average at least
  // this many: below, the gather and the extra launch cost more than the faster kernel saves.
  static constexpr int64_t kMinQueries = 256;
  // Device bytes allocate takes for these shapes on the current device (0 where it stays
  // inactive, or where the device cannot be asked); `max_keys`: the keys a step's sequences may
  // hold together (at least one sequence's positions).
  static int64_t bytes_for(int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool enabled);

  // Active where the Hopper kernel runs (head_dim 128, an sm_90 GPU, sm_90a code) and `enabled`
  // (the runtime's prefill attention is BF16, over a BF16 or an E4M3 cache); otherwise allocates
  // nothing.
  Status allocate(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool enabled);
  bool active() const { return active_; }
  // Whether a step with these prefill sequences, window and sinks runs here.
  bool applies(const std::vector<PrefillSequence>& seqs, int64_t window, const float* sinks) const;

  // The step's prefill attention (causal), for a step `applies` accepted: q, out, the cache
  // (kv_dtype, BF16 or E4M3 with its scales), pages and softmax_scale from `a` (its device
  // per-sequence arrays are not read: `seqs` says the same on the host).
  Status run(const PrefillAttentionArgs& a, const std::vector<PrefillSequence>& seqs, CudaStream stream) const;

 private:
  Status launch(const PrefillAttentionArgs& a, const PrefillSequence* seqs, int count, CudaStream stream) const;
  bool active_ = false;
  int64_t heads_ = 0, kv_heads_ = 0, keys_ = 0;  // keys_: packed rows, a multiple of 128
  cuda::DeviceAllocation k_rows_, v_t_;  // [keys_, kv_heads, 128], [kv_heads, 128, keys_] BF16
};

}  // namespace llmq::attention
