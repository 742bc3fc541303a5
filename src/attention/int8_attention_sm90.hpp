// The Hopper (sm_90a) kernel behind cuda_full_int8_attention and cuda_fp8_attention: internal host
// entry, no CUDA headers. The public functions validate the arguments and pick it when
// sm90_attention_applies.
#pragma once

#include "cuda/device_facts.cuh"
#include "llmq/cuda_attention_int8.hpp"

namespace llmq::attention {

// Head_dim 128, an sm_90 device, and the library built with sm_90a code.
bool sm90_attention_runs(int64_t head_dim, const cuda::DeviceFacts& dev);
// ... and V given transposed (v_t) in blocks of 128 keys (the kernel's tile), or (FP8: the caller
// checks) with one scale per channel (v_block 0).
bool sm90_attention_applies(const FullInt8AttentionArgs& f, const cuda::DeviceFacts& dev);

// Arguments already validated; scale_log2 = softmax scale * log2(e).
Status sm90_8bit_attention(const FullInt8AttentionArgs& f, bool fp8, float scale_log2, const cuda::DeviceFacts& dev,
                           CudaStream stream);

}  // namespace llmq::attention
