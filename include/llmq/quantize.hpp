// The first of llmq's two entry points: quantize a checkpoint. Find and read a model
// (model_io.hpp, safetensors.hpp), measure calibration statistics (calibration.hpp), pick a scheme
// (scheme.hpp), quantize it (quantized_model.hpp), measure what that cost (evaluate.hpp) and write
// a checkpoint engines load (export.hpp). The second entry point, running a model on the GPU, is
// runtime.hpp. An umbrella for programs; llmq's own sources include the headers they use.
#pragma once

#include "llmq/calibration.hpp"
#include "llmq/eval_metrics.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/export.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scheme.hpp"
#include "llmq/tokenizer.hpp"
