// What a failed CUDA or cuBLASLt call says (cuda/cuda_check.cuh, cublas_check.cuh) and what a
// machine without a GPU is told: words for users, no source path or C++ expression. Host only, so
// these run with or without a GPU; the last test checks the no-GPU message where there is none.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "cuda/cublas_check.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/device.hpp"

namespace llmq {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CudaCheck, AFailedCallNamesTheOperationAndTheErrorNotTheSource) {
  const Status st = detail::cuda_status(cudaErrorIllegalAddress, "cudaMemcpy(out->get(), host, static_cast<size_t>(bytes))");
  EXPECT_EQ(st.code(), StatusCode::kCudaError);
  EXPECT_EQ(st.message(), std::string("cudaMemcpy: ") + cudaGetErrorString(cudaErrorIllegalAddress) +
                              " (cudaErrorIllegalAddress)");
  EXPECT_TRUE(detail::cuda_status(cudaSuccess, "cudaMemcpy(a, b, c)").ok());
}

TEST(CudaCheck, OperationNames) {
  EXPECT_EQ(detail::operation_name("cudaSetDevice(devices_[static_cast<size_t>(r)])"), "cudaSetDevice");
  EXPECT_EQ(detail::operation_name("  llmq::detail::launch_pdl(row_op_kernel<F, O, V>, dim3(1), dim3(2), 0, s)"),
            "launch row_op_kernel");
  EXPECT_EQ(detail::operation_name("detail::launch_pdl(argmax_kernel, grid, block, 0, stream, a)"), "launch argmax_kernel");
  EXPECT_EQ(detail::operation_name("launch embedding_kernel"), "launch embedding_kernel");
  EXPECT_EQ(detail::operation_name("cudaStreamEndCapture"), "cudaStreamEndCapture");
}

TEST(CudaCheck, NoDriverOrDeviceIsOneMessageAndUnsupported) {
  for (cudaError_t err : {cudaErrorNoDevice, cudaErrorInitializationError, cudaErrorStubLibrary}) {
    const Status st = detail::cuda_status(err, "cudaSetDevice(devices_[r])");
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
    EXPECT_EQ(st.message(), std::string("no CUDA driver or GPU on this machine (") + cudaGetErrorName(err) + ")");
  }
  // Under an older driver than the runtime the message says so instead; without one it is the above.
  const Status old = detail::cuda_status(cudaErrorInsufficientDriver, "cudaGetDeviceCount(&n)");
  EXPECT_EQ(old.code(), StatusCode::kUnsupported);
  EXPECT_TRUE(contains(old.message(), "(cudaErrorInsufficientDriver)")) << old.message();
  EXPECT_FALSE(contains(old.message(), "cudaGetDeviceCount")) << old.message();
}

TEST(CudaCheck, CublasFailuresNameTheOperationAndTheStatus) {
  const Status st = detail::cublas_status(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate(&raw, compute, scale)");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_TRUE(contains(st.message(), "cublasLtMatmulDescCreate: ")) << st.message();
  EXPECT_TRUE(contains(st.message(), "(CUBLAS_STATUS_NOT_SUPPORTED)")) << st.message();
  EXPECT_FALSE(contains(st.message(), "&raw")) << st.message();
  EXPECT_EQ(detail::cublas_status(CUBLAS_STATUS_EXECUTION_FAILED, "cublasLtMatmul").code(), StatusCode::kCudaError);
}

// The first device touch of every entry point (query_cuda_device, model loading, a group) goes
// through device_count: without a GPU they all say the same, and an absent ordinal is named.
TEST(CudaCheck, EveryDeviceQuerySaysTheSameWithoutAGpu) {
  int count = 0;
  const Status counted = cuda::device_count(&count);
  if (counted.ok()) {
    ASSERT_GT(count, 0);
    const Status absent = cuda::select_device(count);
    EXPECT_EQ(absent.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(absent.message(), "CUDA device " + std::to_string(count) + " does not exist")) << absent.message();
    return;
  }
  EXPECT_EQ(counted.code(), StatusCode::kUnsupported) << counted.to_string();
  EXPECT_TRUE(contains(counted.message(), "CUDA driver")) << counted.message();
  CudaDeviceInfo info;
  EXPECT_EQ(query_cuda_device(0, &info).message(), counted.message());
  EXPECT_EQ(cuda::select_device(0).message(), counted.message());
  EXPECT_EQ(require_fp8_device(0).message(), counted.message());
}

}  // namespace
}  // namespace llmq
