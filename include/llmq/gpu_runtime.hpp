// The GPU runtime: a Llama-family model (Llama 2/3, Mistral, Qwen2) on one CUDA device, its linear
// layers in BF16/F32 or in any 8-bit scheme llmq exports, a KV cache per sequence in device memory,
// batched prefill and decode, greedy sampling on the device and CUDA graphs for decode.
//
// Two objects: GpuModel holds the weights on the device (immutable once loaded through
// GpuModel::load: a checkpoint streamed from its memory map, a model on the host, a QuantizedModel,
// or synthetic weights with the shapes of a real model generated on the device), GpuRuntime holds
// what one stream of work needs (KV cache, activations, graphs).
//
// What runs where (src/runtime/): the linears of decode steps (<= 16 tokens, more in W8A8) go through llmq's
// decode GEMM (8-bit weights streamed at memory speed) or cuBLASLt BF16; prefill through cuBLASLt
// FP8 (outer-vector or block scales), llmq's INT8 GEMM or cuBLASLt BF16; shapes none of them take
// (a tiny model's K = 172, say) through a plain CUDA-core kernel with the same arithmetic. RMSNorm,
// the residual add and the per-token activation quantize are one kernel; so are SiLU * up and its
// quantize; QKV and gate/up are one GEMM each. Activations between kernels are BF16 (the CPU
// reference keeps float32), the residual stream float32.
//
// No CUDA headers here. Library code: errors come back as Status, nothing prints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/quant_attention.hpp"
#include "llmq/scheme.hpp"
#include "llmq/status.hpp"

namespace llmq {

struct QuantizedModel;
struct CalibrationStats;
class TensorParallelGroup;

// What the linear layers of a model on the GPU are: the one meaning of a precision name (the CLI's
// --precision and --scheme, every loader).
struct GpuPrecision {
  enum class Kind {
    kAsStored,  // "checkpoint": a quantized model's codes and scales as they are; float weights as BF16
    kBF16,      // "bf16": unquantized linears in BF16
    kF32,       // "f32": unquantized linears in float32 (models loaded on the host)
    kScheme,    // a scheme's name (scheme.hpp): linears quantized under it
  };
  Kind kind = Kind::kAsStored;
  Scheme scheme;             // kScheme
  std::string name() const;  // "checkpoint", "bf16", "f32" or the scheme's name
};
// "checkpoint", "bf16", "f32" or a scheme name; errors list them.
Status parse_gpu_precision(const std::string& text, GpuPrecision* out);
GpuPrecision gpu_precision(GpuPrecision::Kind kind);  // the named kinds (not kScheme)

// Where a model's weights come from (GpuModel::load).
struct GpuModelSource {
  enum class Kind {
    kSynthetic,      // seeded weights of `config`'s shape, generated on the device
    kCheckpoint,     // a Hugging Face directory `dir`
    kHost,           // `weights`, a float model in host memory (llama2.c files, the default models)
    kHostQuantized,  // `quantized`, a model quantized on the host (runs as stored)
  };
  Kind kind = Kind::kCheckpoint;
  ModelConfig config;  // kSynthetic
  uint64_t seed = 1;   // kSynthetic
  std::string dir;     // kCheckpoint
  const ModelWeights* weights = nullptr;      // kHost
  const QuantizedModel* quantized = nullptr;  // kHostQuantized
};

// Rank `rank` of a tensor-parallel split over `size` GPUs (tensor_parallel.hpp): the loaders below
// then keep only that rank's slice of every split linear. size 1: the whole model.
struct TensorParallelRank {
  int rank = 0;
  int size = 1;
  // MoE layers: whole experts per rank (experts [rank E / size, (rank + 1) E / size)) instead of
  // every expert's FFN columns (expert parallelism; attention stays split by heads).
  bool expert_parallel = false;
};

// Called with (done, total, what) while weights load or generate.
using GpuProgressFn = std::function<void(int64_t done, int64_t total, const std::string& what)>;

// Shapes of real models for synthetic weights: "llama3-8b", "llama3-70b", "llama2-7b",
// "mistral-7b", "qwen2-7b", "tiny" (a small Llama for smoke tests). Errors list the known names.
Status synthetic_model_config(const std::string& name, ModelConfig* out);
std::vector<std::string> synthetic_model_names();

class GpuModel {
 public:
  // The one way in: every route from a source to device weights under a precision.
  //   kSynthetic: bf16 / checkpoint (BF16) or a scheme, generated and quantized on the device;
  //   kCheckpoint: streamed from the memory map as stored, as BF16 or quantized on the device under
  //     a dynamic scheme; f32 and calibrated schemes (static activations, SmoothQuant, MSE weights)
  //     read the model to the host and quantize it there (`stats` from calibration), and a
  //     quantized checkpoint runs only as stored;
  //   kHost: BF16 / F32 linears, or quantized on the host under a scheme (`stats` when it needs them);
  //   kHostQuantized: as stored.
  // For a tensor-parallel split, TensorParallelRuntime::load prepares a host route once for all ranks.
  static Status load(const GpuModelSource& source, const GpuPrecision& precision, int device,
                     std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress = {}, TensorParallelRank tp = {},
                     const CalibrationStats* stats = nullptr);

  // Linear layers in `linear_dtype` (kBF16 or kF32), everything else as the CPU model has it
  // (norm gains float32; embeddings and lm_head BF16, or F32 when linear_dtype is kF32).
  static Status from_float(const ModelWeights& weights, DType linear_dtype, int device,
                           std::unique_ptr<GpuModel>* out, TensorParallelRank tp = {});
  // The codes and scales of a QuantizedModel as they are (so the GPU computes the same quantized
  // model as the CPU reference), its smoothed norm gains, lm_head BF16 unless quantized.
  // Weight scales: per-tensor, per-channel or 128x128 blocks; activations: none (W8A16), dynamic
  // per-token / per-tensor / 1x128, or static per-tensor. Other schemes give kUnsupported.
  static Status from_quantized(const QuantizedModel& model, int device, std::unique_ptr<GpuModel>* out,
                               TensorParallelRank tp = {});
  // An unquantized Hugging Face checkpoint (BF16 / F16 / F32 safetensors, sharded or not) read
  // tensor by tensor from the memory map straight into device memory and quantized there under
  // `precision` ("bf16", a dynamic scheme, or with `stats` a dense model under a scheme with static
  // per-tensor activation scales and absmax weights, e.g. fp8-tensor-static): the host never holds
  // the model. The codes and scales equal those of the CPU path (cuda_quantize is bit for bit the
  // CPU quantize of the same values; a static scale is the statistics' as quantize_model takes it,
  // the largest of a fused linear's parts').
  static Status from_checkpoint(const std::string& dir, const GpuPrecision& precision, int device,
                                std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress = {},
                                TensorParallelRank tp = {}, const CalibrationStats* stats = nullptr);
  // The same with the precision by name (parse_gpu_precision).
  static Status from_checkpoint(const std::string& dir, const std::string& precision, int device,
                                std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress = {},
                                TensorParallelRank tp = {});
  // Seeded synthetic weights generated on the device (never zeros: normal-like values with a few
  // outlier input channels), quantized on the device under `precision`: "bf16" or a dynamic
  // scheme name ("fp8-dynamic", "fp8-block", "int8-w8a8", "fp8-tensor-dynamic", "fp8-weight-only"),
  // or "fp8-tensor-static" with a static activation scale of 1/448 x 8 (synthetic inputs are
  // bounded). Fails with the bytes needed and free when the model does not fit. Every rank of a
  // split generates the whole of each tensor and keeps its slice, so rank r of N holds exactly the
  // weights of the same seed's single-GPU model.
  static Status synthetic(const ModelConfig& config, const GpuPrecision& precision, uint64_t seed, int device,
                          std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress = {},
                          TensorParallelRank tp = {});
  // The same with the precision by name (parse_gpu_precision).
  static Status synthetic(const ModelConfig& config, const std::string& precision, uint64_t seed, int device,
                          std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress = {},
                          TensorParallelRank tp = {});

  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const ModelConfig& config() const;        // the whole model's
  const ModelConfig& local_config() const;  // what this rank computes (tensor_parallel_config)
  TensorParallelRank tensor_parallel() const;
  const std::string& precision() const;  // "bf16", "f32" or the scheme name
  int device() const;
  int64_t weight_bytes() const;          // device bytes of every weight and scale (this rank's)

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  GpuModel();
  std::unique_ptr<Impl> impl_;
};

struct GpuRuntimeOptions {
  int64_t max_batch = 1;           // sequences held at once (KV-cache slots)
  int64_t max_context = 2048;      // positions per sequence (KV-cache capacity)
  int64_t max_step_tokens = 2048;  // tokens one forward call takes (longer prefills are chunked)
  bool cuda_graphs = true;         // capture decode steps (one graph per batch size)
  // KV cache elements: kBF16, or kE4M3 (half the bytes: twice the batch x context, and half the
  // attention reads at long contexts). E4M3 codes are value / scale with one scale per layer and
  // kv head, 1.0 unless set_kv_scales gives calibrated ones (vLLM's default too: E4M3 keeps 3
  // mantissa bits from 2^-6 to 448, and K/V of the models we know stay inside that).
  DType kv_cache_dtype = DType::kBF16;
  // Prefill attention: kBf16 (the BF16 flash-attention kernel), or 8-bit (kHalfInt8, kFullInt8,
  // kFp8: the INT8 / FP8 kernels of cuda_attention_int8.hpp on Q, K and V quantized per step, with
  // the options kernel_attention_options gives, except that the Hopper kernel takes V in blocks of
  // 128 keys (INT8) or per channel (FP8): cuda_attention_v_block; head_dim 64 or 128, BF16 KV
  // cache). Decode attention stays BF16.
  AttentionVariant prefill_attention = AttentionVariant::kBf16;
  // The KV cache is paged (blocks of kv_block_size positions, addressed through block tables by
  // every attention kernel). A power of two in [1, 1024]; 16 by default: the kernels address each
  // key row through the table, so a block's size costs them nothing, and 16 wastes at most 15
  // positions per sequence and shares prefixes at a finer grain than 32 (docs/engine.md).
  int64_t kv_block_size = 16;
  // 0: fixed slots: sequence b (< max_batch) owns max_context positions (prefill, decode, generate).
  // > 0: the serving engine's mode: a pool of kv_blocks blocks that the caller assigns to sequences
  // and passes as block tables with every step (step()); max_batch is then the sequences of one
  // step and max_context the positions of one sequence. kv_blocks_that_fit sizes it from memory.
  int64_t kv_blocks = 0;
  // A model split over several GPUs: its group's communicators (TensorParallelRuntime sets it).
  // Needed, and only allowed, when the model's tensor_parallel().size > 1.
  const TensorParallelGroup* tp_group = nullptr;
  // Benchmarks only: stages left out of every forward pass ("rope,attention"; names: norm, qkv,
  // rope, attention, oquant, o, gateup, silu, down, lmhead, allreduce), so a stage's share of a
  // step is measured by difference. The outputs are meaningless then. Empty: every stage runs.
  std::string skip_stages;
  // cuBLASLt's algorithm per GEMM shape: 1 takes its heuristic's first answer; N > 1 times its first
  // N answers on first use of each M class and keeps the fastest (CudaGemmOptions: tuning adds a
  // few milliseconds per new shape class, and results may differ across processes in the last bits).
  int gemm_autotune = 1;
  // CudaGemmOptions::tile_search_max_m: FP8 GEMMs of up to this many rows time a few tiles of
  // cuBLASLt's first algorithm on first use of each M class and keep the fastest (0: the
  // heuristic's tile). Not past 256: timed alone, a GEMM of 512 rows re-reads weights that stay in
  // L2, and the tile that won there made a 512-token prefill 5% slower (H200).
  int64_t gemm_tile_search_max_m = 256;
  // CudaGemmOptions::fp8_fast_accumulation for the model's cuBLASLt FP8 GEMMs, and
  // MoeGroupedGemm::fast_accumulation for per-channel FP8 experts in the wgmma grouped kernel
  // (block-scaled experts still promote every 128 of K).
  bool fp8_fast_accumulation = false;
};

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax, ties to the lowest id)
  float top_p = 1.0f;        // nucleus sampling when temperature > 0
  uint64_t seed = 1;
};

// How one row of a paged step is sampled, on the device (runtime/row_sampling.hpp has the kernel's
// exact definition): temperature 0 is greedy; otherwise softmax at the temperature, the top_k most
// probable (0: all), then the nucleus of mass top_p, drawn with a uniform that depends only on
// (seed, draw), so a request's tokens do not depend on what it is batched with.
struct RowSampling {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  uint64_t seed = 1;
  int64_t draw = 0;  // tokens the request sampled before this one
  int32_t logprobs = -1;  // -1: none; K in [0, kMaxTopLogprobs]: the sampled token's and the top K's (RowLogprobs)
};

// The log-probabilities of one sampled row that asked for them (RowSampling::logprobs >= 0), computed
// on the device in the step (runtime/row_logprobs.hpp has the definition): log_softmax of the row's
// logits, the model's distribution before temperature, top-k and top-p.
constexpr int32_t kMaxTopLogprobs = 20;
struct RowLogprobs {
  float token = 0.0f;  // the sampled token's
  int32_t count = 0;   // entries of top_ids / top: min(logprobs, vocab)
  int32_t top_ids[kMaxTopLogprobs] = {};  // most likely first; equal logits: lower id first
  float top[kMaxTopLogprobs] = {};
};

// One sequence's share of a paged step (GpuRuntimeOptions::kv_blocks > 0): compute positions
// [start, start + count) of `tokens`; their K/V go to the blocks `table` lists (table_blocks of
// them, covering positions [0, start + count)), earlier positions are read from there.
struct PagedChunk {
  const int32_t* tokens = nullptr;
  int64_t start = 0, count = 0;
  const int32_t* table = nullptr;
  int64_t table_blocks = 0;
  bool sample = false;    // sample the token after the chunk's last position
  RowSampling sampling;   // when sample
};

class GpuRuntime {
 public:
  // Allocates the KV cache and activation buffers on the model's device; errors say how many bytes
  // were needed and how many are free.
  static Status create(const GpuModel& model, const GpuRuntimeOptions& options, std::unique_ptr<GpuRuntime>* out);
  ~GpuRuntime();
  GpuRuntime(const GpuRuntime&) = delete;
  GpuRuntime& operator=(const GpuRuntime&) = delete;

  // Appends tokens[b] to sequence b (tokens.size() <= max_batch; empty rows add nothing). Logits
  // (float32, row-major, vocab wide) of the last new token of every sequence that got tokens, in
  // order of b, or of every new token when all_positions. logits may be null: the rows are computed
  // (calibration observes lm_head's input) and not copied back. On an error *logits is emptied.
  Status prefill(const std::vector<std::vector<int32_t>>& tokens, bool all_positions, std::vector<float>* logits);
  // One new token for each of sequences 0 .. tokens.size() - 1: logits [tokens.size(), vocab].
  Status decode(const std::vector<int32_t>& tokens, std::vector<float>* logits);
  // `steps` tokens for each of sequences 0 .. first.size() - 1: step 0 feeds first[b], every later
  // step the token sampled before it, all on the device (a CUDA graph per step when enabled).
  // out[b] holds the `steps` sampled tokens.
  Status generate(const std::vector<int32_t>& first, int64_t steps, const SamplingOptions& sampling,
                  std::vector<std::vector<int32_t>>* out);

  // Benchmark helpers. Sets sequences 0 .. batch - 1 to `length` positions whose K/V are seeded
  // random values (no prefill run: decode time depends on the length, not on the values).
  Status fill_context_for_benchmark(int64_t batch, int64_t length, uint64_t seed);
  // Times `steps` greedy decode steps of sequences 0 .. batch - 1 (each step one graph replay
  // when graphs are on), milliseconds per step from CUDA events; `warmup` untimed steps first.
  Status time_decode(int64_t batch, int64_t warmup, int64_t steps, std::vector<double>* step_ms);
  // Times a prefill of `tokens` random ids into sequence 0 (emptied first), in milliseconds.
  Status time_prefill(int64_t tokens, uint64_t seed, double* ms);

  // Paged mode: computes every chunk in one forward pass (decode-only steps replay a CUDA graph of
  // their padded batch when graphs are on) and samples the chunks with `sample` set: `sampled` gets
  // their tokens in chunk order; with `logits` non-null also their float32 logits [samples, vocab]
  // (the step then runs without a graph); with `logprobs` non-null one RowLogprobs per sampled
  // chunk, filled for those whose sampling.logprobs >= 0 (computed only when some chunk asks, after
  // the sampling, and copied back with the tokens). Refused: table entries outside [1, kv_blocks)
  // (block 0 pads the tables of a graph's padding rows), positions past max_context, more
  // sequences than max_batch or tokens than max_step_tokens, logprobs outside [-1, kMaxTopLogprobs].
  Status step(const std::vector<PagedChunk>& chunks, std::vector<int32_t>* sampled, std::vector<float>* logits = nullptr,
              std::vector<RowLogprobs>* logprobs = nullptr);
  // Blocks of `options.kv_block_size` positions that fit in `gpu_memory_utilization` (0, 1] of the
  // device's memory besides what is in use now (the weights) and what a runtime of `options` needs
  // for everything but the cache.
  static Status kv_blocks_that_fit(const GpuModel& model, const GpuRuntimeOptions& options, double gpu_memory_utilization,
                                   int64_t* blocks);

  // Calibration (`llmq calibrate --device cuda`; runtime/calibration_observer.hpp): from
  // begin_calibration on, every forward pass (prefill, decode, generate's steps) folds each linear's
  // BF16 input into per-input-channel absmax on the device, measured as the CPU CalibrationBackend
  // measures (calibration.hpp: same module names, rows_seen counting the rows each linear read; the
  // weights' statistics from the weights this runtime holds, BF16-rounded under precision bf16).
  // end_calibration waits for the stream and folds the result into *stats (nullptr: discards it)
  // and detaches the observer; it refuses inputs that held NaN/Inf. Only BF16 / F32 models (dense or
  // MoE) in fixed-slot mode without skip_stages; a tensor-parallel rank's statistics are its slices
  // (local widths, under the whole model's names: merge_tensor_parallel_calibration puts the ranks'
  // together; TensorParallelRuntime::end_calibration does); while calibrating, generate runs without CUDA
  // graphs and a graph-capturing time_decode is refused (a captured graph would keep the
  // observer's kernels).
  // Off (the default), the forward pass does no extra work.
  Status begin_calibration();
  Status end_calibration(CalibrationStats* stats);

  // FP8 KV cache: per-(layer, kv head) scales, k_scales and v_scales [n_layers * n_kv_heads] (> 0).
  Status set_kv_scales(const std::vector<float>& k_scales, const std::vector<float>& v_scales);

  void reset();                                 // every sequence back to length 0
  int64_t length(int64_t sequence) const;       // positions held
  int64_t device_bytes() const;                 // KV cache + activations + workspaces
  int64_t kv_cache_bytes() const;
  const GpuRuntimeOptions& options() const;
  // The path each linear of a step with `tokens` rows takes, e.g. "qkv: decode-gemm w8a8 e4m3".
  std::vector<std::string> describe_linears(int64_t tokens) const;

  struct Impl;

 private:
  GpuRuntime();
  std::unique_ptr<Impl> impl_;
};

// The GPU counterpart of calibrate() (calibration.hpp) over several sequences: each in windows of
// `chunk` positions, every window from position 0 of a sequence slot of its own with every
// position's row through lm_head (as on the CPU), up to max_batch windows per prefill, observed
// between one begin_calibration and end_calibration; out->tokens grows by the count. chunk in
// [1, the runtime's max_context]; `progress` (optional) gets (tokens done, tokens in all). Leaves
// the runtime reset and not calibrating; a failure discards what it saw and leaves *out as it was.
using CalibrationProgressFn = std::function<void(int64_t done, int64_t total)>;
Status calibrate_on_gpu(GpuRuntime& runtime, const std::vector<std::vector<int32_t>>& sequences, int64_t chunk,
                        CalibrationStats* out, const CalibrationProgressFn& progress = {});

// Device-to-device copy bandwidth of `device` (bytes read + written per second, median of several
// copies of `bytes`): the memory ceiling decode is measured against.
Status measure_copy_bandwidth(int device, int64_t bytes, double* bytes_per_second);

// Peak device memory in use (cudaMemGetInfo: total - free) as seen now, for reports.
Status gpu_memory_in_use(int device, int64_t* used_bytes, int64_t* total_bytes);

}  // namespace llmq
