// Checked cuBLASLt calls for library code: a failing call returns a Status naming the operation
// (the called function), cuBLAS's sentence and the status name, "cublasLtMatmul: the requested
// functionality is not supported (CUBLAS_STATUS_NOT_SUPPORTED)", in the form of cuda_check.cuh (no
// source path or expression text). NOT_SUPPORTED and ARCH_MISMATCH mean "valid request this
// library or device cannot do" and map to kUnsupported; every other failure is kCudaError.
// Internal header; CUDA sources only.
#pragma once

#include <cublasLt.h>

#include <string>

#include "cuda/cuda_check.cuh"
#include "llmq/status.hpp"

namespace llmq::detail {

// `call` is the call's text or an operation name; only the function's name is kept.
inline Status cublas_status(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  const StatusCode code =
      (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH)
          ? StatusCode::kUnsupported
          : StatusCode::kCudaError;
  return {code, operation_name(call) + ": " + cublasLtGetStatusString(status) + " (" + cublasLtGetStatusName(status) + ")"};
}

}  // namespace llmq::detail

// Return a Status from the enclosing function when a cuBLAS / cuBLASLt call fails.
#define LLMQ_CUBLAS_RETURN_IF_ERROR(call) \
  LLMQ_RETURN_IF_ERROR(::llmq::detail::cublas_status((call), #call))
