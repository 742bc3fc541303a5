// Device queries: on a machine without a GPU (or a CPU-only build) the query reports why and the
// test SKIPS visibly; with a GPU it checks the facts FP8 kernels rely on.
#include <gtest/gtest.h>

#include "llmq/device.hpp"

namespace llmq {
namespace {

TEST(Device, QueryAndFp8Requirement) {
  CudaDeviceInfo info;
  const Status st = query_cuda_device(0, &info);
  if (!st.ok()) {
    EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
    EXPECT_FALSE(require_fp8_device(0).ok());
    GTEST_SKIP() << st.message();
  }
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GT(info.global_memory_bytes, 0);
  EXPECT_EQ(require_fp8_device(0).ok(), info.supports_fp8()) << info.name;
  std::printf("device 0: %s, sm_%d%d, %d SMs\n", info.name.c_str(), info.major, info.minor, info.multiprocessors);
}

TEST(Device, BadOrdinalIsAnError) {
  CudaDeviceInfo info;
  const Status st = query_cuda_device(1000, &info);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace llmq
