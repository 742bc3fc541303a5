// Checked CUDA calls for library code: a failing call returns a Status naming the call, the file
// and line (library code never exits). Internal header; CUDA sources only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "llmq/status.hpp"

namespace llmq::detail {

inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err) + " (" + file + ":" +
                                      std::to_string(line) + ")"};
}

}  // namespace llmq::detail

// Return a Status from the enclosing function when a CUDA runtime call fails.
#define LLMQ_CUDA_RETURN_IF_ERROR(call) \
  LLMQ_RETURN_IF_ERROR(::llmq::detail::cuda_status((call), #call, __FILE__, __LINE__))
// After a kernel launch: the launch error (bad configuration), not the kernel's completion.
#define LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR(name) \
  LLMQ_RETURN_IF_ERROR(::llmq::detail::cuda_status(cudaGetLastError(), "launch " name, __FILE__, __LINE__))
