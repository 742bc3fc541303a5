// Umbrella header for the llmq public API. No CUDA headers are included from here.
#pragma once

#include "llmq/dtype.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/quantize.hpp"
#include "llmq/scale.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"
#include "llmq/tokenizer.hpp"
