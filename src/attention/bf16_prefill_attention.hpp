// The runtime's BF16 prefill attention on Hopper for steps of one long prefill sequence (a prompt's
// prefill, `bench e2e --prefill`): its K rows are gathered from the paged cache into a contiguous
// buffer and its V rows transposed into V^T in the same kernel, then the wgmma kernel
// (bf16_attention_sm90.hpp) runs. A step whose prefill part is several sequences (the serving
// engine's batches of short prompts) keeps the batched mma.sync kernel of attention.hpp: a gather and
// a launch per sequence would cost it more than the faster kernel saves. (A step of decode rows and
// one prefill chunk of >= 256 queries takes this path for the chunk.) Internal host header, no CUDA
// headers.
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
  // Keys a sequence may have on this path (longer ones keep the mma.sync kernel): its buffers are
  // 2 x 2 bytes x kv_heads x head_dim a key, 128 MB at 8 kv heads.
  static constexpr int64_t kMaxKeys = 32768;
  // Queries from which a lone sequence takes this path: below, the gather and the extra launch
  // are not worth it.
  static constexpr int64_t kMinQueries = 256;
  // Device bytes allocate takes for these shapes on the current device (0 where it stays
  // inactive, or where the device cannot be asked); `max_keys`: the positions a sequence may hold.
  static int64_t bytes_for(int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool bf16_cache);

  // Active where the Hopper kernel runs (head_dim 128, an sm_90 GPU, sm_90a code) and the cache is
  // BF16; otherwise allocates nothing.
  Status allocate(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t max_keys, bool bf16_cache);
  bool active() const { return active_; }
  // Whether a step with these prefill sequences, window and sinks runs here.
  bool applies(const std::vector<PrefillSequence>& seqs, int64_t window, const float* sinks) const;

  // As QuantPrefillAttention::run (causal), for a step `applies` accepted.
  Status run(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const KvPages& pages,
             const std::vector<PrefillSequence>& seqs, uint16_t* out, float softmax_scale, CudaStream stream) const;

 private:
  bool active_ = false;
  int64_t heads_ = 0, kv_heads_ = 0, max_keys_ = 0;
  cuda::DeviceAllocation k_rows_, v_t_;  // [max_keys, kv_heads, 128], [kv_heads, 128, stride(max_keys)] BF16
};

}  // namespace llmq::attention
