// The tensors a quantized linear has on disk, per export format: their names, dtypes and scale
// shapes, decided once. export.cpp writes from this table; both readers look names up and check
// shapes through it: quantized_checkpoint.cpp (codes and scales as stored, for eval --quantized and
// the GPU loader) and hf_model.cpp (dequantized to float). Before, each reader had its own lookup
// and they tried weight_scale and weight_scale_inv in opposite orders, so a file holding both was
// two different models; such a file is now refused, naming the tensors.
//
// Per linear module M ("model.layers.0.self_attn.q_proj"), weight [N, K]:
//   M.weight             E4M3, E5M2 or I8 [N, K] (float when the linear is not quantized)
//   M.bias               float [N], never quantized (which linears have one: checkpoint_check.cpp)
//   M.weight_scale       float; per tensor [], [1] or [1, 1]; per channel [N] or [N, 1]; or blocks
//                        [ceil(N / bm), ceil(K / bk)] (compressed-tensors' "block" strategy)
//   M.weight_scale_inv   float; blocks only (vLLM / DeepSeek "fp8": the value multiplies, whatever
//                        the name says)
//   M.input_scale        float, per tensor ([], [1] or [1, 1]): static activations
//   M.weight_zero_point  on the weight scale's grid (asymmetric INT8): read by the dequantizing
//                        loader; the as-stored reader refuses it (its consumers are symmetric)
// Per attention module A ("model.layers.0.self_attn"), when kv_cache_scheme is declared:
//   A.k_scale, A.v_scale static FP8 KV-cache scales, one value each ("tensor") or [n_kv_heads]
//                        ("attn_head"): written by export --kv-cache-scales, read by
//                        read_kv_cache_scales for an E4M3 cache (a BF16 cache needs none)
// bm x bk is config.json's weight_block_size (128 x 128 when absent).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/dtype.hpp"
#include "llmq/model.hpp"
#include "llmq/quant_spec.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// Suffixes after the module name.
inline constexpr char kWeightSuffix[] = ".weight";
inline constexpr char kBiasSuffix[] = ".bias";
inline constexpr char kWeightScaleSuffix[] = ".weight_scale";
inline constexpr char kWeightScaleInvSuffix[] = ".weight_scale_inv";
inline constexpr char kInputScaleSuffix[] = ".input_scale";
inline constexpr char kZeroPointSuffix[] = ".weight_zero_point";
inline constexpr char kKvKeyScaleSuffix[] = ".k_scale";    // after the attention module
inline constexpr char kKvValueScaleSuffix[] = ".v_scale";  // after the attention module
// Layer `layer`'s attention module, the one its k_scale / v_scale follow: q_proj's module
// ("model.layers.3.self_attn"), as LinearId::hf_name spells it for the config's family.
std::string attention_module_name(const ModelConfig& config, int64_t layer);

// Which weight elements one scale element covers.
enum class ScaleLayout { kTensor, kChannel, kBlock };
const char* scale_layout_name(ScaleLayout layout);

// The names a weight scale may have on disk and the layouts each may hold when read. A file with
// more than one of them for a linear is refused: no lookup order decides between them.
struct WeightScaleName {
  const char* suffix;
  bool tensor, channel, block;  // layouts this name may hold
};
inline constexpr WeightScaleName kWeightScaleNames[] = {
    {kWeightScaleSuffix, true, true, true},
    {kWeightScaleInvSuffix, false, false, true},
};

// The tensors that come with a quantized weight (scales, zero point), each named by its suffix.
inline constexpr const char* kCompanionSuffixes[] = {kWeightScaleSuffix, kWeightScaleInvSuffix, kInputScaleSuffix,
                                                     kZeroPointSuffix};

// What one export format writes per quantized linear: one row per weight scale layout it holds.
struct WrittenLinear {
  ExportFormat format;
  const char* quant_method;   // config.json quantization_config.quant_method
  ScaleLayout layout;
  const char* scale_suffix;   // weight scale name; F32, shape from written_scale_shape
  bool static_input;          // may carry a static M.input_scale, F32 [1]
};
inline constexpr WrittenLinear kWrittenLinears[] = {
    // Blocks must be whole (export.cpp refuses partial edge blocks): [N / bm, K / bk].
    {ExportFormat::kVllmFp8, "fp8", ScaleLayout::kBlock, kWeightScaleInvSuffix, false},
    {ExportFormat::kCompressedTensors, "compressed-tensors", ScaleLayout::kTensor, kWeightScaleSuffix, true},
    {ExportFormat::kCompressedTensors, "compressed-tensors", ScaleLayout::kChannel, kWeightScaleSuffix, true},
};

// The quant_method string of an export format ("" for kNone).
const char* quant_method_name(ExportFormat format);

// The layout a weight QuantSpec is written in; unsupported for granularities no format holds.
Status scale_layout_of(const QuantSpec& weight, ScaleLayout* out);

// Scale shape as written: [1], [N, 1], or [ceil(N / bm), ceil(K / bk)].
std::vector<int64_t> written_scale_shape(ScaleLayout layout, int64_t n, int64_t k, int64_t block_rows,
                                         int64_t block_cols);

// One tensor as it lies on disk.
struct DiskTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// The tensors export writes for the quantized linear `module` [n, k] in `format`, in this order:
// weight, weight scale, and (static_input) input scale. Refuses a (format, layout) pair the table
// has no row for, or a static input scale the format does not carry.
Status written_linear_tensors(ExportFormat format, const QuantSpec& weight, bool static_input,
                              const std::string& module, int64_t n, int64_t k, std::vector<DiskTensor>* out);

// ---- reading

// The weight scale of an 8-bit linear as found in a checkpoint.
struct FoundWeightScale {
  std::string name;  // module + suffix
  ScaleLayout layout = ScaleLayout::kTensor;
  const SafetensorsTensorInfo* info = nullptr;
};

// Which layout a scale of `shape` stored as `name` holds for weight [n, k] in bm x bk blocks;
// invalid_argument naming `name` and the shapes expected when it fits none. Tensor is tried before
// channel before block (N == 1: [1] is per tensor; they agree then anyway).
Status classify_weight_scale(const WeightScaleName& name, const std::string& tensor_name,
                             const std::vector<int64_t>& shape, int64_t n, int64_t k, int64_t block_rows,
                             int64_t block_cols, ScaleLayout* out);

// The scale of the 8-bit weight `module` [n, k]: exactly one name from kWeightScaleNames present
// (none, or more than one, is an error naming the tensors), stored in a float dtype, with a shape
// its name allows. Errors read "<dir>: tensor '<name>': ...".
Status find_weight_scale(const Checkpoint& ckpt, const std::string& module, int64_t n, int64_t k,
                         int64_t block_rows, int64_t block_cols, FoundWeightScale* out);

// Its values as float32 in the shape stored, each checked finite.
Status read_weight_scale(const Checkpoint& ckpt, const FoundWeightScale& found, Tensor* out);

// The static per-tensor activation scale of `module`: present, float, one element.
Status read_input_scale(const Checkpoint& ckpt, const std::string& module, float* out);

}  // namespace llmq
