// Umbrella header for the whole llmq public API: the numerics, and both entry points (quantize.hpp:
// quantize a checkpoint; runtime.hpp: run a model on the GPU). No CUDA headers are included from here.
#pragma once

#include "llmq/dtype.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/quantize.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/runtime.hpp"
#include "llmq/scale.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"
#include "llmq/tokenizer.hpp"
