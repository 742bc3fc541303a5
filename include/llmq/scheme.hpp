// Quantization schemes for whole models: how weights and activations of every linear layer are
// quantized (the methods of the FP8 paper, section 3.2) and which checkpoint format they export to.
#pragma once

#include <string>
#include <vector>

#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"

namespace llmq {

// The on-disk format a scheme exports to. Both load in vLLM (and SGLang); in Hugging Face
// transformers the fp8 format loads as FineGrainedFP8, compressed-tensors through the
// compressed-tensors package (without it transformers refuses it with an ImportError).
enum class ExportFormat {
  kVllmFp8,            // quant_method "fp8": 128x128 blocks, weight_scale_inv, weight_block_size
                       // (per-tensor FP8 is not written in it: transformers reads it as blocks)
  kCompressedTensors,  // quant_method "compressed-tensors": float-quantized / int-quantized,
                       // tensor or channel weights, token or tensor activations
  kNone,               // evaluation only (formats no engine loads, e.g. hardware scale sets)
};

struct Scheme {
  std::string name;         // "fp8-dynamic"
  std::string description;  // one line for --help and tables
  QuantSpec weight;
  bool quantize_activations = true;  // false: weight-only (W8A16)
  QuantSpec activation;              // source kStatic: scales from calibration statistics
  float smooth_alpha = -1.0f;        // >= 0: SmoothQuant with this alpha (needs statistics)
  ExportFormat export_format = ExportFormat::kCompressedTensors;

  bool needs_statistics() const {
    return smooth_alpha >= 0.0f || (quantize_activations && activation.source == ScaleSource::kStatic);
  }
};

// Every scheme llmq knows, in the order tables print them. The default is "fp8-dynamic".
const std::vector<Scheme>& all_schemes();
Status find_scheme(const std::string& name, Scheme* out);  // error lists the known names
inline const char* kDefaultScheme = "fp8-dynamic";
// The one name of each format, everywhere (tables, --format, messages): the quant_method its
// config.json holds ("fp8", "compressed-tensors"), or "none".
const char* export_format_name(ExportFormat f);
Status parse_export_format(const std::string& name, ExportFormat* out);  // the names above but "none"

}  // namespace llmq
