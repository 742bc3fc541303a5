// The second of llmq's two entry points: run a model on the GPU. GpuModel::load takes weights
// from a checkpoint, a host model or a seeded synthetic model to the device under a GpuPrecision;
// GpuRuntime prefills, decodes and samples on it (gpu_runtime.hpp); TensorParallelRuntime does the
// same over several GPUs (tensor_parallel.hpp). The first entry point, quantizing a checkpoint, is
// quantize.hpp. An umbrella for programs; llmq's own sources include the headers they use.
#pragma once

#include "llmq/device.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/tensor_parallel.hpp"
#include "llmq/tensor_parallel_group.hpp"
