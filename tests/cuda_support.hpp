// GPU test helpers: skip visibly without a device, RAII device buffers, host<->device copies.
// Only test files built with CUDA include this (they are named test_cuda_*.cpp / .cu).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmq/device.hpp"

namespace llmq::testing {

// GTEST_SKIP()s the calling test, with the reason, when no FP8-capable GPU is present.
#define LLMQ_REQUIRE_GPU()                                                           \
  do {                                                                               \
    ::llmq::CudaDeviceInfo llmq_info_;                                               \
    const ::llmq::Status llmq_st_ = ::llmq::query_cuda_device(0, &llmq_info_);       \
    if (!llmq_st_.ok()) GTEST_SKIP() << "no GPU: " << llmq_st_.to_string();          \
    if (!llmq_info_.supports_fp8()) GTEST_SKIP() << "GPU without FP8: " << llmq_info_.name; \
  } while (0)

}  // namespace llmq::testing
