// Checked CUDA calls for library code: a failing call returns a Status that a user can read,
// "cudaMemcpy: an illegal memory access was encountered (cudaErrorIllegalAddress)": the operation
// (the called function's name, or "launch <kernel>"), CUDA's sentence and its error name, which is
// what a search or a bug report needs. No source path or expression text: the operation names the
// call site well enough to find it, and users see these messages. Library code never exits.
// A machine without a CUDA driver or GPU gets one message wherever it is found (cuda_no_gpu_status).
// Internal header; CUDA sources only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "llmq/status.hpp"

namespace llmq::detail {

// Ok for cudaSuccess; else the Status above, for the operation `call` names (operation_name).
Status cuda_status(cudaError_t err, const char* call);

// The operation a call's text names: "cudaMemcpy(dst, src, n, kind)" -> "cudaMemcpy",
// "llmq::detail::launch_pdl(rope_kernel<T>, grid, ...)" -> "launch rope_kernel"; text that is no
// call ("launch rope_kernel") is kept as it is.
std::string operation_name(const char* call);

// Whether `err` means there is no usable CUDA driver or device here (no driver, a stub or too old
// a driver, no GPU): reported as kUnsupported, not as a failed call.
bool cuda_means_no_gpu(cudaError_t err);
// "no CUDA driver or GPU on this machine (cudaErrorNoDevice)"; a driver older than the runtime is
// named as such.
Status cuda_no_gpu_status(cudaError_t err);

}  // namespace llmq::detail

// Return a Status from the enclosing function when a CUDA runtime call fails.
#define LLMQ_CUDA_RETURN_IF_ERROR(call) LLMQ_RETURN_IF_ERROR(::llmq::detail::cuda_status((call), #call))
// After a kernel launch: the launch error (bad configuration), not the kernel's completion.
#define LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR(name) \
  LLMQ_RETURN_IF_ERROR(::llmq::detail::cuda_status(cudaGetLastError(), "launch " name))
