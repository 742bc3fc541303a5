// The CUDA stream type of llmq's public API, declared without CUDA headers: cudaStream_t is a
// pointer to the opaque CUstream_st, so this alias is the same type (nullptr = the legacy default
// stream). Every CUDA entry point takes the stream it runs on; the caller owns it.
#pragma once

struct CUstream_st;

namespace llmq {

using CudaStream = CUstream_st*;

}  // namespace llmq
