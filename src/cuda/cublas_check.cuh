// Checked cuBLASLt calls for library code: a failing call returns a Status naming the call, the
// cuBLAS status (CUBLAS_STATUS_NOT_SUPPORTED, ...) and the file and line. NOT_SUPPORTED and
// ARCH_MISMATCH mean "valid request this library or device cannot do" and map to kUnsupported;
// every other failure is kCudaError. Internal header; CUDA sources only.
#pragma once

#include <cublasLt.h>

#include <string>

#include "llmq/status.hpp"

namespace llmq::detail {

inline Status cublas_status(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  const StatusCode code =
      (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH)
          ? StatusCode::kUnsupported
          : StatusCode::kCudaError;
  return {code, std::string(what) + ": " + cublasLtGetStatusName(status) + " (" +
                    cublasLtGetStatusString(status) + ") (" + file + ":" + std::to_string(line) + ")"};
}

}  // namespace llmq::detail

// Return a Status from the enclosing function when a cuBLAS / cuBLASLt call fails.
#define LLMQ_CUBLAS_RETURN_IF_ERROR(call) \
  LLMQ_RETURN_IF_ERROR(::llmq::detail::cublas_status((call), #call, __FILE__, __LINE__))
