// The quantization_config export_quantized writes (compressed-tensors config groups, vLLM's fp8
// keys, the KV cache's scheme) and the checks of which scheme each format can hold; and the KV
// cache scales written from calibration statistics. Internal to export.cpp.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"

namespace llmq::export_detail {

bool is_block(const QuantSpec& s);
// Can `scheme` be written in its export_format, read the same by every loader of that format?
Status check_scheme_format(const Scheme& scheme);
// One scheme for every quantized linear (`ignored`: the linears kept), or several (compressed-
// tensors groups by exact module name). kv_cache_scales: declare the KV cache's static FP8 scales.
nlohmann::ordered_json quantization_config(const Scheme& scheme, const std::vector<std::string>& ignored,
                                           bool kv_cache_scales);
nlohmann::ordered_json mixed_quantization_config(const std::map<std::string, Scheme>& scheme_of,
                                                 const std::vector<std::string>& ignored, bool kv_cache_scales);

// The KV cache's static scales, per layer: "model.layers.L.self_attn.k_scale" and ".v_scale" (the
// attention module's name as the checkpoint has it), each the layer's absmax over its KV heads
// divided by E4M3's 448: what vLLM multiplies the cached codes by. Refused (naming the flag): no
// statistics, statistics without the KV cache, a layer whose keys or values were all zero.
Status kv_cache_scales(const ModelConfig& config, const CalibrationStats* stats,
                       std::vector<std::pair<std::string, float>>* out);

}  // namespace llmq::export_detail
