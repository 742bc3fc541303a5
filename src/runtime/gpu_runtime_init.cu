// GpuRuntime::Impl::init (gpu_runtime.hpp): checks the options against the model and the device,
// sizes and allocates the paged KV cache, the activation buffers and the workspaces, and plans
// every linear's kernels. Also the byte counts that kv_blocks_that_fit sizes a paged cache with.
#include <cuda_runtime.h>

#include <algorithm>

#include "llmq/cuda_quantize.hpp"
#include "llmq/device.hpp"
#include "runtime/gpu_runtime_impl.hpp"

namespace llmq {
namespace {

int64_t step_rows(const GpuRuntimeOptions& o) { return round_up(std::max(o.max_step_tokens, o.max_batch), 4); }
int64_t logits_rows(const GpuRuntimeOptions& o) {
  return round_up(std::max<int64_t>(o.max_batch, std::min<int64_t>(step_rows(o), 256)), 4);
}

// Bytes of one KV block: K and V of every layer's kv heads (this rank's) at block_size positions.
int64_t kv_block_bytes(const GpuModel& gm, const GpuRuntimeOptions& o) {
  const ModelConfig& c = gm.impl().config;
  return 2 * c.n_layers * o.kv_block_size * c.n_kv_heads * c.head_dim * (o.kv_cache_dtype == DType::kE4M3 ? 1 : 2);
}

// Positions a sequence may hold: max_context rounded up to whole blocks.
int64_t capacity_of(const GpuRuntimeOptions& o) { return ceil_div(o.max_context, o.kv_block_size) * o.kv_block_size; }

// Decode attention's split-K partials: smaller batches split their keys into more chunks, so the
// largest need of any batch size.
int64_t attention_workspace_bytes(const ModelConfig& c, const GpuRuntimeOptions& o) {
  int64_t bytes = 0;
  for (int64_t b = 1; b <= o.max_batch; ++b)
    bytes = std::max(bytes, attention::decode_attention_workspace_bytes(b, c.n_heads, c.head_dim, capacity_of(o)));
  return bytes;
}

// Whether the BF16 prefill attention's Hopper path may run (over a BF16 or an E4M3 cache; --attention
// 8-bit takes the quantized path instead), and the keys its packed buffers hold: a step's
// sequences together, at least one sequence's positions.
bool bf16_prefill(const GpuRuntimeOptions& o) { return o.prefill_attention == AttentionVariant::kBf16; }
int64_t bf16_prefill_keys(const GpuRuntimeOptions& o) { return std::max(capacity_of(o), o.max_step_tokens); }

// The BF16 scratch W8A16 linears may take at prefill sizes (linear.hpp), at most: the layers'
// linears write BF16 rows, lm_head float32 logits (never dequantized).
int64_t dequant_scratch_bound(const GpuModel::Impl& m, int64_t rows) {
  int64_t bytes = 0;
  for (const GpuLayer& L : m.layers)
    for (const GpuLinear* l : {&L.qkv, &L.o, &L.gate_up, &L.down})
      bytes = std::max(bytes, runtime::dequant_scratch_bound(*l, rows, runtime::LinearOut::kBF16));
  return bytes;
}

// Device bytes of a runtime of `o` besides the KV cache: activations, logits, the MoE buffers, the
// rope table, the block tables, the attention workspace (the allocations that grow with the
// step, the batch or the context) and the W8A16 scratch.
int64_t bytes_besides_cache(const GpuModel& gm, const GpuRuntimeOptions& o) {
  const GpuModel::Impl& m = gm.impl();
  const ModelConfig& c = m.config;
  const int64_t q_dim = c.n_heads * c.head_dim, qkv_n = q_dim + 2 * c.n_kv_heads * c.head_dim;
  const int64_t rows = step_rows(o), lm_rows = logits_rows(o);
  const int64_t table_bytes = o.max_batch * ceil_div(o.max_context, o.kv_block_size) * 4;
  return rows * (c.dim * 4 + 4 * c.dim * 3 + qkv_n * 2 + 2 * q_dim * 2 + q_dim * 3 + c.dim * 4 + 2 * c.hidden_dim * 2 +
                 c.hidden_dim * 3) +
         lm_rows * c.vocab_size * 4 * (m.lm_head.n < c.vocab_size ? 2 : 1) +
         (c.is_moe() ? runtime::MoeBuffers::bytes_for(rows, c, m.layers.front().moe.block()) : 0) +
         capacity_of(o) * c.head_dim * 4 + table_bytes + attention_workspace_bytes(c, o) +
         attention::Bf16PrefillAttention::bytes_for(c.n_kv_heads, c.head_dim, bf16_prefill_keys(o), bf16_prefill(o)) +
         dequant_scratch_bound(m, rows);
}

// The option checks that sizing needs (init repeats them with the rest).
Status check_sizes(const GpuRuntimeOptions& o) {
  if (o.max_batch < 1 || o.max_batch > 1024) return invalid_argument("--batch: " + std::to_string(o.max_batch) + " outside [1, 1024]");
  if (o.max_context < 1 || o.max_context > (int64_t{1} << 30))
    return invalid_argument("--context: " + std::to_string(o.max_context) + " positions outside [1, 2^30]");
  if (o.max_step_tokens < 1 || o.max_step_tokens > (int64_t{1} << 24))
    return invalid_argument("max_step_tokens: " + std::to_string(o.max_step_tokens) + " outside [1, 2^24]");
  if (o.kv_block_size < 1 || o.kv_block_size > 1024 || (o.kv_block_size & (o.kv_block_size - 1)) != 0)
    return invalid_argument("kv_block_size: " + std::to_string(o.kv_block_size) + " is not a power of two in [1, 1024]");
  if (o.kv_blocks < 0 || o.kv_blocks == 1)
    return invalid_argument("kv_blocks: " + std::to_string(o.kv_blocks) + " (0: fixed slots; paged: at least 2, block 0 pads)");
  return {};
}

}  // namespace

Status GpuRuntime::kv_blocks_that_fit(const GpuModel& model, const GpuRuntimeOptions& options, double gpu_memory_utilization,
                                      int64_t* blocks) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
    return invalid_argument("--gpu-memory-utilization: " + std::to_string(gpu_memory_utilization) + " outside (0, 1]");
  LLMQ_RETURN_IF_ERROR(check_sizes(options));
  int previous = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(model.device()));
  int64_t free_b = 0, total_b = 0;
  const Status info = runtime::device_memory_info(&free_b, &total_b);
  // Asked on the model's device: what a runtime allocates there depends on it (the Hopper BF16
  // prefill path's buffers).
  const int64_t besides = bytes_besides_cache(model, options);
  LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(previous));
  LLMQ_RETURN_IF_ERROR(info);
  // Workspaces, graphs and cuBLASLt's own memory: a fixed margin beside the activations.
  constexpr int64_t kMargin = int64_t{512} << 20;
  const int64_t budget = static_cast<int64_t>(static_cast<double>(total_b) * gpu_memory_utilization) - (total_b - free_b) -
                         besides - kMargin;
  const int64_t per_block = kv_block_bytes(model, options);
  *blocks = budget > 0 ? std::min<int64_t>(budget / per_block, (int64_t{1} << 31) / options.kv_block_size - 1) : 0;
  if (*blocks < 2)
    return invalid_argument("--gpu-memory-utilization " + std::to_string(gpu_memory_utilization) + ": no room for a KV cache (" +
                            runtime::format_bytes(free_b) + " free of " + runtime::format_bytes(total_b) + ", activations " +
                            runtime::format_bytes(besides) + ")");
  return {};
}

Status GpuRuntime::Impl::init(const GpuModel& gm, const GpuRuntimeOptions& o) {
  model = &gm.impl();
  options = o;
  c = model->config;
  LLMQ_RETURN_IF_ERROR(check_sizes(o));
  LLMQ_RETURN_IF_ERROR(parse_skip_stages(o.skip_stages, &skip));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(model->device));
  CudaDeviceInfo info;
  LLMQ_RETURN_IF_ERROR(query_cuda_device(model->device, &info));
  // What the config switches on must be on the device: a layer without its sinks or q/k norms
  // would run as another model (every loader uploads them; this keeps it so).
  for (size_t l = 0; l < model->layers.size(); ++l) {
    const GpuLayer& L = model->layers[l];
    if ((c.attention_sinks && L.sinks.bytes() == 0) || (c.qk_norm && (L.q_norm.bytes() == 0 || L.k_norm.bytes() == 0)))
      return invalid_argument("GpuModel: layer " + std::to_string(l) + " lacks its " +
                              (c.attention_sinks && L.sinks.bytes() == 0 ? "attention sinks" : "q/k norms") +
                              " on the device, which the config switches on");
  }
  q_dim = c.n_heads * c.head_dim;
  kv_dim = c.n_kv_heads * c.head_dim;
  qkv_n = q_dim + 2 * kv_dim;
  rows = step_rows(o);
  lm_rows = logits_rows(o);
  lengths.assign(static_cast<size_t>(o.max_batch), 0);
  const TensorParallelRank tp = gm.tensor_parallel();
  if (tp.size > 1) {
    if (o.tp_group == nullptr || o.tp_group->size() != tp.size || o.tp_group->device(tp.rank) != model->device)
      return invalid_argument("the model is rank " + std::to_string(tp.rank) + " of a " + std::to_string(tp.size) +
                              "-way tensor-parallel split: its runtime needs the group of those devices (TensorParallelRuntime)");
    group = o.tp_group;
    tp_rank = tp.rank;
    if (const parallel::P2pAllReduce* p = one_shot_all_reduce(*group)) peer = p->row_sum(tp_rank);
  } else if (o.tp_group != nullptr && o.tp_group->size() > 1) {
    return invalid_argument("a tensor-parallel group was given for a model that is not split");
  }

  // Refuse early, with the numbers, when the cache and activations cannot fit.
  if (o.kv_cache_dtype != DType::kBF16 && o.kv_cache_dtype != DType::kE4M3)
    return invalid_argument(std::string("--kv-cache: bf16 or e4m3, got ") + dtype_name(o.kv_cache_dtype));
  kv_fp8 = o.kv_cache_dtype == DType::kE4M3;
  paged = o.kv_blocks > 0;
  pages.block_size = o.kv_block_size;
  pages.table_stride = ceil_div(o.max_context, o.kv_block_size);
  pages.num_blocks = paged ? o.kv_blocks : o.max_batch * pages.table_stride;
  // In double first: a huge --context must read "does not fit", not overflow.
  const double kv_bytes_exact = static_cast<double>(pages.num_blocks) * static_cast<double>(kv_block_bytes(gm, o));
  const int64_t kv_bytes = kv_bytes_exact < 0x1p62 ? pages.num_blocks * kv_block_bytes(gm, o) : int64_t{1} << 62;
  const int64_t act_bytes = bytes_besides_cache(gm, o);
  int64_t free_b = 0, total_b = 0;
  LLMQ_RETURN_IF_ERROR(runtime::device_memory_info(&free_b, &total_b));
  if (kv_bytes + act_bytes > free_b)
    return {StatusCode::kInvalidArgument,
            "does not fit: KV cache of " + std::to_string(pages.num_blocks) + " blocks x " + std::to_string(pages.block_size) +
                " positions needs " + runtime::format_bytes(kv_bytes) + " and activations " + runtime::format_bytes(act_bytes) +
                "; the GPU has " + runtime::format_bytes(free_b) + " free of " + runtime::format_bytes(total_b) +
                " after the weights (" + runtime::format_bytes(model->bytes()) + ")"};

  if (pages.num_blocks > (int64_t{1} << 31) / pages.block_size - 1)
    return invalid_argument("KV cache: " + std::to_string(pages.num_blocks) + " blocks of " + std::to_string(pages.block_size) +
                            " positions exceed 2^31 cache rows");
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CudaGemmOptions gemm_options;
  gemm_options.autotune_candidates = o.gemm_autotune;
  gemm_options.tile_search_max_m = o.gemm_tile_search_max_m;
  gemm_options.fp8_fast_accumulation = o.fp8_fast_accumulation;
  LLMQ_RETURN_IF_ERROR(CudaGemmRunner::create(model->device, gemm_options, &gemm));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(kCublasLtWorkspaceBytes * 2, "cuBLASLt workspace", &gemm_workspace));
  lin.gemm = gemm.get();
  lin.workspace = gemm_workspace.get();
  lin.workspace_bytes = gemm_workspace.bytes();
  lin.stream = stream;
  lin.sm_major = info.major;
  lin.sm_minor = info.minor;
  plan = runtime::plan_model(*model, rows, lm_rows, lin);
  int64_t dequant_bytes = runtime::dequant_scratch_bytes(model->lm_head, plan.lm_head);
  for (size_t l = 0; l < model->layers.size(); ++l) {
    const GpuLayer& L = model->layers[l];
    const runtime::LayerPlan& P = plan.layers[l];
    for (const auto& [linear, lp] : {std::make_pair(&L.qkv, &P.qkv), std::make_pair(&L.o, &P.o),
                                     std::make_pair(&L.gate_up, &P.gate_up), std::make_pair(&L.down, &P.down)})
      dequant_bytes = std::max(dequant_bytes, runtime::dequant_scratch_bytes(*linear, *lp));
  }
  if (dequant_bytes > 0) {
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(dequant_bytes, "W8A16 prefill scratch (dequantized codes, FP32 sums)", &dequant_scratch));
    lin.dequant = dequant_scratch.get();
    lin.dequant_bytes = dequant_scratch.bytes();
  }

  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * c.dim * 4, "residual stream", &x));
  LLMQ_RETURN_IF_ERROR(in_attn.allocate(rows, c.dim, "qkv input"));
  LLMQ_RETURN_IF_ERROR(in_o.allocate(rows, q_dim, "o_proj input"));
  LLMQ_RETURN_IF_ERROR(in_mlp.allocate(rows, c.dim, "gate_up input"));
  LLMQ_RETURN_IF_ERROR(in_down.allocate(rows, c.hidden_dim, "down_proj input"));
  LLMQ_RETURN_IF_ERROR(in_lm.allocate(rows, c.dim, "lm_head input"));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * qkv_n * 2, "qkv output", &qkv_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * q_dim * 2, "rotated q", &q_rot));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * q_dim * 2, "attention output", &attn_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * c.dim * 2, "o_proj output", &o_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * 2 * c.hidden_dim * 2, "gate_up output", &gu_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(rows * c.dim * 2, "down_proj output", &down_out));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(lm_rows * c.vocab_size * 4, "logits", &logits));
  if (model->lm_head.n < c.vocab_size)
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(lm_rows * c.vocab_size * 4, "gathered logits", &lm_gather));
  if (c.is_moe()) LLMQ_RETURN_IF_ERROR(moe.allocate(rows, c, model->layers.front().moe.block()));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(kv_bytes, "KV cache", &kv_cache));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(kv_cache.get(), 0, static_cast<size_t>(kv_bytes)));
  if (!paged) {
    // Fixed slots: table row b lists slot b's own blocks, b * table_stride onwards.
    std::vector<int32_t> table(static_cast<size_t>(o.max_batch * pages.table_stride));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(table.data(), static_cast<int64_t>(table.size() * 4), "block table", &block_table));
    pages.block_table = block_table.as<int32_t>();
  }
  if (kv_fp8) {
    // The checkpoint's calibrated scales when it declares them, else 1.0 (vLLM's default too);
    // set_kv_scales replaces either.
    std::vector<float> scales(static_cast<size_t>(2 * c.n_layers * c.n_kv_heads), 1.0f);
    const size_t half = scales.size() / 2;
    if (model->kv_k_scales.size() == half && model->kv_v_scales.size() == half) {
      std::copy(model->kv_k_scales.begin(), model->kv_k_scales.end(), scales.begin());
      std::copy(model->kv_v_scales.begin(), model->kv_v_scales.end(), scales.begin() + static_cast<std::ptrdiff_t>(half));
    } else if (!model->kv_k_scales.empty()) {
      return Status(StatusCode::kInternal, "the model's KV scales are not [layers x KV heads]");
    }
    LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(scales.data(), static_cast<int64_t>(scales.size() * 4), "KV scales", &kv_scales));
  }

  size_t qws = 0;
  for (const GpuLayer& L : model->layers)
    for (const GpuLinear* l : {&L.qkv, &L.o, &L.gate_up, &L.down, &L.moe.gate_up})
      if (l->act == ActQuant::kDynamicTensor || l->act == ActQuant::kBlock1x128)
        qws = std::max(qws, cuda_quantize_workspace_bytes(rows, l->k, l->act_spec));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(static_cast<int64_t>(qws), "quantize workspace", &quant_workspace));
  const int64_t aws = attention_workspace_bytes(c, o);
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(aws, "attention workspace", &attn_workspace));
  if (o.prefill_attention != AttentionVariant::kBf16 && kv_fp8)
    return unsupported("--attention " + std::string(attention_variant_name(o.prefill_attention)) +
                       " quantizes the BF16 KV cache per step: use --kv-cache bf16");
  LLMQ_RETURN_IF_ERROR(quant_attention.allocate(o.prefill_attention, c.n_heads, c.n_kv_heads, c.head_dim,
                                                o.max_step_tokens, pages.capacity()));
  LLMQ_RETURN_IF_ERROR(bf16_attention.allocate(c.n_heads, c.n_kv_heads, c.head_dim, bf16_prefill_keys(o), bf16_prefill(o)));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(runtime::argmax_workspace_bytes(o.max_batch), "argmax workspace",
                                                  &argmax_workspace));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(argmax_workspace.get(), 0, static_cast<size_t>(argmax_workspace.bytes())));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(4, "logits flag", &logits_flag));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(logits_flag.get(), 0, 4));

  // RoPE (cos, sin) per position and pair, computed exactly as the CPU reference computes them.
  const std::vector<float> cs = runtime::rope_cos_sin(c, pages.capacity());
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::upload(cs.data(), static_cast<int64_t>(cs.size() * 4), "rope table", &cos_sin));

  meta_ints = 3 * rows + 3 * o.max_batch + 1 + rows;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(meta_ints * 4, "step metadata", &meta));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMallocHost(&meta_host.ptr, static_cast<size_t>(meta_ints * 4)));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate((5 * o.max_batch + 1) * 4, "decode state", &dec));
  if (paged) return init_paged();  // the step's own metadata and tables (gpu_runtime_paged.cu)
  history_rows = o.max_context;
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(history_rows * o.max_batch * 4, "decode history", &history));
  return {};
}

}  // namespace llmq
