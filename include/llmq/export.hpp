// Quantized checkpoints out (and back in): Hugging Face directories in the formats vLLM and
// transformers load. Export streams tensor by tensor from a WeightSource, so quantizing a
// checkpoint larger than RAM needs memory for one tensor at a time (plus the OS page cache).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llmq/calibration.hpp"
#include "llmq/model.hpp"
#include "llmq/nonfinite.hpp"
#include "llmq/quant_recipe.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"

namespace llmq {

// Float32 weights by Hugging Face tensor name.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const ModelConfig& config() const = 0;      // in Hugging Face conventions (rotate-half RoPE)
  virtual std::vector<std::string> tensor_names() const = 0;  // in checkpoint order
  virtual Status shape(const std::string& name, std::vector<int64_t>* out) const = 0;
  virtual Status read(const std::string& name, Tensor* out) const = 0;  // float32
  // Rows [row_begin, row_begin + rows) of dimension 0 as float32. The default reads the whole
  // tensor; a checkpoint reads only those rows, so the exporter streams large tensors.
  virtual Status read_rows(const std::string& name, int64_t row_begin, int64_t rows, Tensor* out) const;
  virtual std::string config_json() const = 0;  // the config.json to extend with quantization_config
  virtual std::string directory() const { return ""; }  // where tokenizer files may be copied from
  // What identifies the weights (file names, sizes, modification times, or a checksum of
  // in-memory weights): --resume reuses finished shards only for the same identity. "" (a source
  // that cannot say) makes every run's plan unique, so nothing is ever reused for it.
  virtual std::string identity() const { return ""; }
};

// An in-memory model under Hugging Face names. llama2.c models (interleaved RoPE) have their q/k
// rows permuted to the rotate-half layout, as Hugging Face's conversion does.
std::unique_ptr<WeightSource> memory_weight_source(const ModelWeights& model);
// A Hugging Face directory (memory-mapped). Refuses an already-quantized checkpoint.
Status checkpoint_weight_source(const std::string& dir, std::unique_ptr<WeightSource>* out);

// Config JSON (text) for a model that came without one, and the model_type it is written as
// (Phi-3, whose fused tensors llmq writes unfused, as Llama or Mistral; a Llama-shaped MoE as Mixtral).
std::string hf_config_json(const ModelConfig& config);
std::string hf_written_model_type(const ModelConfig& config);

// A file export_quantized writes into the output beside config.json, as the text given (a
// tokenizer converted from llama2.c's: tokenizer.hpp's llama2c_tokenizer_to_hf).
struct ExportSideFile {
  std::string name;  // a plain file name: no folder, not hidden, none of the files export writes
  std::string content;
};

struct ExportOptions {
  QuantizeModelOptions quantize;
  // The scheme's own format unless set; a format the scheme cannot be written in, or one a loader
  // would read wrong (per-tensor FP8 as quant_method "fp8"), is refused with the reason.
  std::optional<ExportFormat> format;
  DType keep_dtype = DType::kBF16;  // embeddings, norms, lm_head and routers
  int64_t max_shard_bytes = int64_t{4} << 30;
  bool dry_run = false;             // plan and report, write nothing
  bool overwrite = false;           // replace a previous llmq output directory (never anything else)
  // Every path the run reads besides source.directory(), which is always one (--model as a
  // llama2.c file, a tokenizer beside it, --stats): the output is never one of them, inside one or
  // around one (check_output_path in output_dir.hpp decides).
  std::vector<std::string> inputs;
  bool resume = false;              // reuse shards a killed run finished (same inputs and options)
  NonFinitePolicy nonfinite = NonFinitePolicy::kError;  // NaN / Inf in a weight (nonfinite.hpp)
  // Static FP8 scales for the KV cache from the statistics' KV absmax (CalibrationStats::kv_cache),
  // one per layer for keys and one for values: compressed-tensors' kv_cache_scheme and each
  // attention module's k_scale / v_scale, as vLLM reads them (--kv-cache-scales).
  bool kv_cache_scales = false;
  bool unquantized = false;         // write every tensor in keep_dtype: a plain HF checkpoint
                                    // (llama2.c -> Hugging Face conversion); the scheme is ignored
  // Called as tensor bytes are produced (read, quantized and written), with the total to write.
  std::function<void(int64_t bytes_done, int64_t bytes_total)> progress;
  // Written with the checkpoint, in the same transaction. A name export writes itself (config.json,
  // a shard, the index) or copies from source.directory() (tokenizer.json there) is refused.
  std::vector<ExportSideFile> side_files;
};

struct ExportSummary {
  int64_t tensors = 0;
  int64_t quantized_linears = 0;
  int64_t bytes = 0;       // of all tensors written
  int64_t shards = 0;
  int64_t reused_shards = 0;        // --resume: shards kept from the interrupted run
  int64_t nonfinite_replaced = 0;   // --nonfinite zero: NaN / Inf values written as 0
  std::string quantization_config;  // JSON text
  // The fingerprint of everything that decides the bytes written (empty for a dry run): --resume
  // keeps an interrupted run's shards only under the same plan.
  std::string plan;
};

Status export_quantized(const WeightSource& source, const Scheme& scheme, const CalibrationStats* stats,
                        const std::string& out_dir, const ExportOptions& options, ExportSummary* summary);
// The same under a recipe (quant_recipe.hpp): each linear under its group's scheme, kept linears in
// options.keep_dtype and listed in `ignore`. One scheme in use: written as that scheme is (its
// format, or options.format), with the kept modules ignored. Several: compressed-tensors with one
// config group per scheme whose targets are the exact module names (every loader's matching finds
// each module in one group), "llmq_scheme": "mixed"; a scheme compressed-tensors cannot hold
// (128x128 blocks) and --format fp8 are refused, naming the scheme. MoE models are exported with
// one scheme over every expert (vLLM's FusedMoE reads one); options.quantize must be left unset
// (the recipe names lm_head and routers) and options.unquantized false.
Status export_quantized(const WeightSource& source, const QuantRecipe& recipe, const CalibrationStats* stats,
                        const std::string& out_dir, const ExportOptions& options, ExportSummary* summary);

// Read a directory written by export_quantized (or another tool in the same formats) into a
// QuantizedModel for evaluation: the FP8/INT8 codes and scales as stored, the activation
// quantization from its quantization_config.
Status load_quantized_checkpoint(const std::string& dir, QuantizedModel* out);

// Does config.json carry a quantization_config? And the scheme it names ("llmq_scheme", else
// "checkpoint"; "" when unquantized).
bool is_quantized_checkpoint(const Checkpoint& ckpt);
std::string quantized_checkpoint_scheme(const Checkpoint& ckpt);

// The linear `module` ("model.layers.0.self_attn.q_proj") of a quantized checkpoint, read as
// load_quantized_checkpoint reads it: weight spec and scales, activation quantization, static input
// scale. *quantized is false (and *out untouched) when its weight is stored in float or absent
// (a tied lm_head). Without
// with_codes weight.data stays empty: a loader that streams the codes takes them from
// ckpt.view(module + ".weight"). Tensor names and scale shapes are those load_hf_model reads
// (src/model/checkpoint/checkpoint_names.hpp): both weight_scale and weight_scale_inv, a scale of no known
// layout, or a weight_zero_point (asymmetric) is an error naming the tensor.
Status read_quantized_linear(const Checkpoint& ckpt, const std::string& module, bool with_codes, bool* quantized,
                             QuantizedLinear* out);

// The KV cache's static FP8 scales a checkpoint declares (quantization_config.kv_cache_scheme:
// 8-bit float, static; strategy "tensor", each attention module's k_scale and v_scale one value,
// or "attn_head", [n_kv_heads] each), per layer and KV head, layer-major ([n_layers * n_kv_heads]
// each; a per-tensor scale repeated). *declared false and the vectors empty when it declares none
// (no quantization_config, or kv_cache_scheme null). Refused, naming the field or tensor: another
// kind of scheme, a missing scale, one of another shape, one that is not finite and positive.
Status read_kv_cache_scales(const Checkpoint& ckpt, const ModelConfig& config, bool* declared, std::vector<float>* k_scales,
                            std::vector<float>* v_scales);

// read_quantized_linear for many linears of one checkpoint: its quantization_config is parsed and
// its targets compiled once at open (refusing, naming the field, what no loader reads alike), and
// the matching of regular-expression targets against module names is bounded over every read, so
// a hostile config.json cannot make loading take hours. `ckpt` must outlive the reader.
class QuantizedLinearReader {
 public:
  static Status open(const Checkpoint& ckpt, std::unique_ptr<QuantizedLinearReader>* out);
  ~QuantizedLinearReader();
  QuantizedLinearReader(const QuantizedLinearReader&) = delete;
  QuantizedLinearReader& operator=(const QuantizedLinearReader&) = delete;
  // As read_quantized_linear; also refused: a module stored 8-bit that the ignore list keeps, or
  // that no config group (or two) targets.
  Status read(const std::string& module, bool with_codes, bool* quantized, QuantizedLinear* out);
  const std::string& scheme() const;  // llmq_scheme, else "checkpoint"

 private:
  QuantizedLinearReader();
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace llmq
