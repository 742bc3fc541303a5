// GpuRuntime (gpu_runtime.hpp): the forward pass and the calls around it (the buffers are
// gpu_runtime_impl.hpp's Impl, the benchmark helpers gpu_runtime_bench.cu's).
//
// One forward step takes T tokens of up to max_batch sequences, packed one sequence after another:
//   embedding -> per layer: [add + RMSNorm + quantize] -> QKV GEMM -> RoPE + KV-cache write ->
//   attention -> [quantize] -> O GEMM -> [add + RMSNorm + quantize] -> gate/up GEMM ->
//   [SiLU * up + quantize] -> down GEMM -> ... -> [add + final RMSNorm, gathered rows] -> lm_head.
// Everything is enqueued on the runtime's stream with no host synchronisation inside the step.
// Per-step metadata (tokens, positions, slots, prefix sums) goes up in one copy from pinned memory.
// Decode steps read their metadata from device arrays that the step itself advances (sampled token
// fed back, positions + 1), so `steps` decode steps are `steps` replays of one CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "llmq/cuda_quantize.hpp"
#include "llmq/device.hpp"
#include "llmq/nonfinite.hpp"
#include "llmq/transformer.hpp"
#include "runtime/gpu_runtime_impl.hpp"

namespace llmq {
GpuRuntime::GpuRuntime() : impl_(std::make_unique<Impl>()) {}
GpuRuntime::~GpuRuntime() = default;


Status GpuRuntime::create(const GpuModel& model, const GpuRuntimeOptions& options, std::unique_ptr<GpuRuntime>* out) {
  std::unique_ptr<GpuRuntime> r(new GpuRuntime());
  LLMQ_RETURN_IF_ERROR(r->impl_->init(model, options));
  *out = std::move(r);
  return {};
}

// Runs `op` (its function and input already set) so that its output is what `consumer` reads.
Status GpuRuntime::Impl::produce(const GpuLinear& consumer, RowOpArgs op, ActBuffers& bufs, LinearInput* in, bool launch) {
  *in = {};
  const int64_t m = op.rows;
  switch (consumer.act) {
    case ActQuant::kNone:
    case ActQuant::kDynamicTensor:
    case ActQuant::kBlock1x128:
      op.out = RowOut::kBF16;
      op.out_bf16 = bufs.bf16.as<uint16_t>();
      break;
    case ActQuant::kPerToken:
      op.out = RowOut::kCodesPerToken;
      op.spec = consumer.act_spec;
      break;
    case ActQuant::kStaticTensor:
      op.out = RowOut::kCodesStatic;
      op.spec = consumer.act_spec;
      op.static_scale = consumer.static_scale;
      break;
  }
  op.codes = bufs.codes.get();
  op.scales = bufs.scales.as<float>();
  // A plain copy into BF16 is the identity: hand the source over instead.
  if (op.fn == RowFn::kCopy && op.out == RowOut::kBF16 && consumer.act == ActQuant::kNone) {
    in->bf16 = op.src;
    return {};
  }
  if (launch) LLMQ_RETURN_IF_ERROR(runtime::row_op(op, stream));
  in->bf16 = op.out == RowOut::kBF16 ? op.out_bf16 : nullptr;
  in->codes = bufs.codes.get();
  in->scales = bufs.scales.as<float>();
  if (consumer.act == ActQuant::kDynamicTensor || consumer.act == ActQuant::kBlock1x128) {
    const int64_t mp = runtime::padded_rows(consumer, m);
    const QuantSpec& s = consumer.act_spec;
    const int64_t scols = consumer.act == ActQuant::kBlock1x128 ? ceil_div(consumer.k, 128) : 1;
    const int64_t srows = consumer.act == ActQuant::kBlock1x128 ? mp : 1;
    TensorView xv{bufs.bf16.get(), DType::kBF16, {mp, consumer.k}, {}, Device::kCuda};
    TensorView qv{bufs.codes.get(), s.format, {mp, consumer.k}, {}, Device::kCuda};
    TensorView sv{bufs.scales.get(), DType::kF32, {srows, scols}, {}, Device::kCuda};
    CudaQuantizeOptions qo;
    qo.stream = stream;
    qo.workspace = quant_workspace.get();
    qo.workspace_bytes = static_cast<size_t>(quant_workspace.bytes());
    if (launch) LLMQ_RETURN_IF_ERROR(cuda_quantize(xv, s, qv, sv, qo));
    if (consumer.act == ActQuant::kDynamicTensor) LLMQ_RETURN_IF_ERROR(runtime::broadcast_scale(bufs.scales.as<float>(), mp, stream));
  }
  return {};
}

Status GpuRuntime::Impl::forward(const StepMeta& m) {
  const int64_t T = m.tokens_count;
  const float eps = static_cast<float>(c.norm_eps);
  float* xr = x.as<float>();
  LLMQ_RETURN_IF_ERROR(runtime::embedding(m.tokens, T, model->embedding.get(), model->embedding_f32, c.dim, xr, stream));
  LinearInput in;
  const bool fused = fused_sum(T);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const GpuLayer& L = model->layers[static_cast<size_t>(l)];
    RowOpArgs norm;
    norm.fn = RowFn::kAddRmsNorm;
    norm.rows = T;
    norm.n = c.dim;
    norm.x = xr;
    norm.delta = l == 0 ? nullptr : down_out.as<uint16_t>();
    if (fused && l > 0) norm.peer = peer;  // the previous layer's down_proj partial sums
    norm.gain = L.attn_norm.as<float>();
    norm.eps = eps;
    LLMQ_RETURN_IF_ERROR(produce(L.qkv, norm, in_attn, &in, run(kStageNorm)));
    if (calibration) LLMQ_RETURN_IF_ERROR(calibration->observe(l, runtime::CalibrationInput::kAttention, in.bf16, T, stream));
    if (run(kStageQkv)) LLMQ_RETURN_IF_ERROR(run_linear(L.qkv, plan.layers[l].qkv, in, T, qkv_out.get(), lin));

    runtime::RopeKvArgs rope;
    rope.qkv = qkv_out.as<uint16_t>();
    rope.bias = L.qkv_bias.as<float>();
    rope.q_norm = L.q_norm.as<float>();  // Qwen3 (null otherwise)
    rope.k_norm = L.k_norm.as<float>();
    rope.norm_eps = eps;
    rope.q_out = q_rot.as<uint16_t>();
    rope.k_cache = k_cache(l);
    rope.v_cache = v_cache(l);
    rope.k_cache8 = k_cache8(l);
    rope.v_cache8 = v_cache8(l);
    rope.k_scale = k_scale(l);
    rope.v_scale = v_scale(l);
    rope.position = m.position;
    rope.slot = m.tok_slot;
    rope.cos_sin = cos_sin.as<float>();
    rope.rows = T;
    rope.n_heads = c.n_heads;
    rope.n_kv_heads = c.n_kv_heads;
    rope.head_dim = c.head_dim;
    rope.pages = pages;
    rope.interleaved = c.rope_style == RopeStyle::kInterleaved;
    if (run(kStageRope)) LLMQ_RETURN_IF_ERROR(runtime::rope_kv(rope, stream));
    if (calibration)
      LLMQ_RETURN_IF_ERROR(calibration->observe_kv(l, k_cache(l), v_cache(l), pages, m.tok_slot, m.position, T, stream));

    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    // One query per sequence, rows = sequences: the whole batch of a decode step, the first
    // decode_rows sequences of a mixed one (a decode row then runs the kernel it runs in a decode step).
    const auto decode_rows_attention = [&](int64_t batch, int64_t max_kv_len) -> Status {
      attention::DecodeAttentionArgs a;
      a.q = q_rot.as<uint16_t>();
      set_cache(l, &a);
      a.out = attn_out.as<uint16_t>();
      a.kv_len = m.kv_len;
      a.slot = m.seq_slot;
      a.batch = batch;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = c.head_dim;
      a.pages = pages;
      a.max_kv_len = max_kv_len;
      a.softmax_scale = softmax_scale;
      a.window = c.layer_window(l);  // each layer's own: gpt-oss alternates windowed and full layers
      a.sinks = L.sinks.bytes() > 0 ? L.sinks.as<float>() : nullptr;
      a.workspace = attn_workspace.get();
      a.workspace_bytes = attn_workspace.bytes();
      return attention::decode_attention(a, stream);
    };
    if (m.decode) {
      if (run(kStageAttention)) LLMQ_RETURN_IF_ERROR(decode_rows_attention(m.batch, m.max_kv_len));
    } else {
      const int64_t d = m.decode_rows;
      if (d > 0) LLMQ_RETURN_IF_ERROR(decode_rows_attention(d, m.decode_max_kv_len));
      attention::PrefillAttentionArgs a;
      a.q = q_rot.as<uint16_t>();
      set_cache(l, &a);
      a.out = attn_out.as<uint16_t>();
      a.q_start = m.q_start + d;  // absolute row offsets: the prefill sequences' rows follow the decode rows
      a.kv_len = m.kv_len + d;
      a.slot = m.seq_slot + d;
      a.batch = m.batch - d;
      a.max_q_len = m.max_q_len;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = c.head_dim;
      a.pages = pages;
      a.softmax_scale = softmax_scale;
      a.causal = true;
      a.window = c.layer_window(l);
      a.sinks = L.sinks.bytes() > 0 ? L.sinks.as<float>() : nullptr;
      if (a.batch > 0 && quant_attention.active()) {  // m.seqs: the prefill sequences alone
        if (run(kStageAttention))
          LLMQ_RETURN_IF_ERROR(quant_attention.run(a.q, k_cache(l), v_cache(l), pages, m.seqs, a.out,
                                                   softmax_scale, stream, a.window, a.sinks));
      } else if (a.batch > 0 && bf16_attention.applies(m.seqs, a.window, a.sinks)) {  // long sequences, Hopper
        if (run(kStageAttention)) LLMQ_RETURN_IF_ERROR(bf16_attention.run(a, m.seqs, stream));
      } else if (a.batch > 0) {
        LLMQ_RETURN_IF_ERROR(attention::prefill_attention(a, stream));
      }
    }

    RowOpArgs copy;
    copy.fn = RowFn::kCopy;
    copy.rows = T;
    copy.n = q_dim;
    copy.src = attn_out.as<uint16_t>();
    LLMQ_RETURN_IF_ERROR(produce(L.o, copy, in_o, &in, run(kStageOQuant)));
    if (calibration) LLMQ_RETURN_IF_ERROR(calibration->observe(l, runtime::CalibrationInput::kO, in.bf16, T, stream));
    if (run(kStageO)) LLMQ_RETURN_IF_ERROR(run_linear(L.o, plan.layers[l].o, in, T, o_out.get(), lin));
    if (!fused) LLMQ_RETURN_IF_ERROR(all_reduce(o_out, T));

    RowOpArgs norm2 = norm;
    norm2.delta = o_out.as<uint16_t>();
    norm2.peer = fused ? peer : runtime::RowPeerSum{};
    norm2.gain = L.ffn_norm.as<float>();
    norm2.delta_bias = L.o_bias.as<float>();  // once, after the ranks' sum (null without a bias)
    if (L.moe.active()) {
      // The router reads the normalised rows in BF16; FP8 experts read their per-token E4M3 codes,
      // written by the same pass.
      RowOpArgs op = norm2;
      op.out_bf16 = in_mlp.bf16.as<uint16_t>();
      if (L.moe.block()) {
        // 1x128 blocks: the norm writes BF16 (the router's input), produce quantizes it.
        LLMQ_RETURN_IF_ERROR(produce(L.moe.gate_up, norm2, in_mlp, &in, run(kStageNorm)));
      } else if (!L.moe.bf16()) {
        op.out = RowOut::kCodesPerToken;
        op.spec = L.moe.gate_up.act_spec;
        op.codes = in_mlp.codes.get();
        op.scales = in_mlp.scales.as<float>();
      }
      if (run(kStageNorm) && !L.moe.block()) LLMQ_RETURN_IF_ERROR(runtime::row_op(op, stream));
      runtime::MoeInput mi;
      mi.x_bf16 = in_mlp.bf16.as<uint16_t>();
      mi.x_codes = in_mlp.codes.get();
      mi.x_scales = in_mlp.scales.as<float>();
      if (calibration) {  // the router reads the norm's BF16 rows; the experts are observed inside
        LLMQ_RETURN_IF_ERROR(calibration->observe(l, runtime::CalibrationInput::kFfn, mi.x_bf16, T, stream));
        mi.calibration = calibration.get();
        mi.layer = l;
      }
      if (run(kStageGateUp)) LLMQ_RETURN_IF_ERROR(runtime::moe_ffn(L.moe, plan.layers[l].router, moe, mi, T, down_out.as<uint16_t>(), lin));
      if (!fused || l + 1 == c.n_layers) LLMQ_RETURN_IF_ERROR(all_reduce(down_out, T));
      continue;
    }
    LLMQ_RETURN_IF_ERROR(produce(L.gate_up, norm2, in_mlp, &in, run(kStageNorm)));
    if (calibration) LLMQ_RETURN_IF_ERROR(calibration->observe(l, runtime::CalibrationInput::kFfn, in.bf16, T, stream));
    if (run(kStageGateUp)) LLMQ_RETURN_IF_ERROR(run_linear(L.gate_up, plan.layers[l].gate_up, in, T, gu_out.get(), lin));

    RowOpArgs silu;
    silu.fn = c.activation == GluActivation::kClampedSwiglu ? RowFn::kClampedSwiglu : RowFn::kSiluMul;
    silu.rows = T;
    silu.n = c.hidden_dim;
    silu.src = gu_out.as<uint16_t>();
    silu.glu_limit = static_cast<float>(c.glu_limit);
    silu.glu_alpha = static_cast<float>(c.glu_alpha);
    LLMQ_RETURN_IF_ERROR(produce(L.down, silu, in_down, &in, run(kStageSilu)));
    if (calibration) LLMQ_RETURN_IF_ERROR(calibration->observe(l, runtime::CalibrationInput::kDown, in.bf16, T, stream));
    if (run(kStageDown)) LLMQ_RETURN_IF_ERROR(run_linear(L.down, plan.layers[l].down, in, T, down_out.get(), lin));
    // The last layer's sums go to the final norm (lm_head), which all-reduces them first.
    if (!fused || l + 1 == c.n_layers) LLMQ_RETURN_IF_ERROR(all_reduce(down_out, T));
  }
  return {};
}

// The final norm of rows first .. first + count - 1 of the step's lm rows, then lm_head into
// `logits` rows 0 .. count - 1.
Status GpuRuntime::Impl::lm_head(const StepMeta& m, int64_t first, int64_t count) {
  RowOpArgs norm;
  norm.fn = RowFn::kAddRmsNorm;
  norm.rows = count;
  norm.n = c.dim;
  norm.x = x.as<float>();
  norm.delta = down_out.as<uint16_t>();
  norm.gain = model->final_norm.as<float>();
  norm.eps = static_cast<float>(c.norm_eps);
  norm.row_index = m.lm_rows != nullptr ? m.lm_rows + first : nullptr;
  LinearInput in;
  LLMQ_RETURN_IF_ERROR(produce(model->lm_head, norm, in_lm, &in));
  if (calibration) LLMQ_RETURN_IF_ERROR(calibration->observe_lm_head(in.bf16, count, stream));
  if (!run(kStageLmHead)) return {};
  const int64_t vl = model->lm_head.n;
  if (vl == c.vocab_size) return run_linear(model->lm_head, plan.lm_head, in, count, logits.get(), lin);
  // Vocabulary split over the ranks: this rank's [count, vl] block of the gather buffer, all-gathered
  // rank-major, then laid out as rows of the whole vocabulary.
  const int64_t ranks = c.vocab_size / vl;
  float* chunk = lm_gather.as<float>() + tp_rank * count * vl;
  LLMQ_RETURN_IF_ERROR(run_linear(model->lm_head, plan.lm_head, in, count, chunk, lin));
  LLMQ_RETURN_IF_ERROR(group->all_gather_f32(tp_rank, chunk, lm_gather.get(), count * vl, stream));
  for (int64_t r = 0; r < ranks; ++r)
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(logits.as<float>() + r * vl, static_cast<size_t>(c.vocab_size * 4),
                                                lm_gather.as<float>() + r * count * vl, static_cast<size_t>(vl * 4),
                                                static_cast<size_t>(vl * 4), static_cast<size_t>(count), cudaMemcpyDeviceToDevice,
                                                stream));
  return {};
}

Status GpuRuntime::Impl::upload_meta(const std::vector<int32_t>& ints) {
  if (static_cast<int64_t>(ints.size()) > meta_ints) return Status(StatusCode::kInternal, "step metadata overflow");
  // The previous step's copy must be done reading the pinned buffer before it is refilled.
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::copy(ints.begin(), ints.end(), static_cast<int32_t*>(meta_host.ptr));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta.get(), meta_host.ptr, ints.size() * 4, cudaMemcpyHostToDevice, stream));
  return {};
}

// One prefill step over segments (sequence, begin, end) of `tokens`: packs the metadata, runs the
// forward pass and writes the logits of the rows asked for at row *out_rows of `out` onwards,
// advancing it (out null: computed, not copied).
Status GpuRuntime::Impl::prefill_step(const std::vector<std::tuple<int64_t, int64_t, int64_t>>& segs,
                                      const std::vector<std::vector<int32_t>>& tokens, bool all_positions,
                                      float* out, int64_t* out_rows) {
  std::vector<int32_t> tok, pos, tslot, qstart{0}, kvlen, sslot, lmrows;
  std::vector<attention::PrefillSequence> seqs;
  int64_t max_q = 0;
  for (const auto& [b, begin, end] : segs) {
    const int64_t start = lengths[static_cast<size_t>(b)];
    for (int64_t i = begin; i < end; ++i) {
      if (all_positions || i == static_cast<int64_t>(tokens[static_cast<size_t>(b)].size()) - 1)
        lmrows.push_back(static_cast<int32_t>(tok.size()));
      tok.push_back(tokens[static_cast<size_t>(b)][static_cast<size_t>(i)]);
      pos.push_back(static_cast<int32_t>(start + i - begin));
      tslot.push_back(static_cast<int32_t>(b));
    }
    seqs.push_back({qstart.back(), end - begin, start + end - begin, b});
    qstart.push_back(static_cast<int32_t>(tok.size()));
    kvlen.push_back(static_cast<int32_t>(start + end - begin));
    sslot.push_back(static_cast<int32_t>(b));
    max_q = std::max(max_q, end - begin);
  }
  const int64_t T = static_cast<int64_t>(tok.size()), B = static_cast<int64_t>(segs.size());
  std::vector<int32_t> ints;
  ints.reserve(static_cast<size_t>(meta_ints));
  for (auto* v : {&tok, &pos, &tslot, &qstart, &kvlen, &sslot, &lmrows}) ints.insert(ints.end(), v->begin(), v->end());
  LLMQ_RETURN_IF_ERROR(upload_meta(ints));
  const int32_t* d = meta.as<int32_t>();
  StepMeta m;
  m.tokens = d;
  m.position = d + T;
  m.tok_slot = d + 2 * T;
  m.q_start = d + 3 * T;
  m.kv_len = m.q_start + B + 1;
  m.seq_slot = m.kv_len + B;
  m.lm_rows = m.seq_slot + B;
  m.tokens_count = T;
  m.batch = B;
  m.max_q_len = max_q;
  m.seqs = std::move(seqs);
  m.lm_count = static_cast<int64_t>(lmrows.size());
  LLMQ_RETURN_IF_ERROR(forward(m));
  for (int64_t first = 0; first < m.lm_count; first += lm_rows) {
    const int64_t count = std::min(lm_rows, m.lm_count - first);
    LLMQ_RETURN_IF_ERROR(lm_head(m, first, count));
    if (out == nullptr) continue;  // computed (calibration observes lm_head's input), not wanted
    // Straight into the caller's vector (sized once by prefill): no row copies.
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + *out_rows * c.vocab_size, logits.get(),
                                              static_cast<size_t>(count * c.vocab_size) * 4, cudaMemcpyDeviceToHost, stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    *out_rows += count;
  }
  for (const auto& [b, begin, end] : segs) lengths[static_cast<size_t>(b)] += end - begin;
  return {};
}

Status GpuRuntime::prefill(const std::vector<std::vector<int32_t>>& tokens, bool all_positions, std::vector<float>* logits) {
  Impl& g = *impl_;
  // Whatever happens below, no earlier call's rows stay (kept only as capacity: see the resize below).
  std::vector<float> earlier;
  if (logits != nullptr) earlier.swap(*logits);
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("prefill"));
  if (static_cast<int64_t>(tokens.size()) > g.options.max_batch)
    return invalid_argument("prefill: " + std::to_string(tokens.size()) + " sequences, the runtime holds " +
                            std::to_string(g.options.max_batch));
  for (size_t b = 0; b < tokens.size(); ++b) {
    if (g.lengths[b] + static_cast<int64_t>(tokens[b].size()) > g.options.max_context)
      return invalid_argument("prefill: sequence " + std::to_string(b) + " would hold " +
                              std::to_string(g.lengths[b] + static_cast<int64_t>(tokens[b].size())) +
                              " positions, the KV cache has " + std::to_string(g.options.max_context));
    for (size_t i = 0; i < tokens[b].size(); ++i)
      if (tokens[b][i] < 0 || tokens[b][i] >= g.c.vocab_size)
        return invalid_argument("prefill: token " + std::to_string(tokens[b][i]) + " (sequence " + std::to_string(b) +
                                ", position " + std::to_string(i) + ") is outside the vocabulary [0, " +
                                std::to_string(g.c.vocab_size) + ")");
  }
  // Pack segments of at most max_step_tokens tokens per step, splitting long sequences. Rows come
  // out in step order, which is sequence order, then position order.
  int64_t rows = 0;
  for (const auto& t : tokens) rows += all_positions ? static_cast<int64_t>(t.size()) : (t.empty() ? 0 : 1);
  // The rows' vector at its final size at once: a caller passing the same vector for windows of
  // one length (an evaluation) gets its memory back with no zero fill (resize of an equal size).
  if (logits != nullptr) {
    earlier.resize(static_cast<size_t>(rows * g.c.vocab_size));
    logits->swap(earlier);
  }
  float* out = logits == nullptr ? nullptr : logits->data();
  int64_t out_rows = 0;
  auto run_steps = [&]() -> Status {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> segs;
    int64_t used = 0;
    for (size_t b = 0; b < tokens.size(); ++b) {
      const int64_t n = static_cast<int64_t>(tokens[b].size());
      for (int64_t begin = 0; begin < n;) {
        const int64_t take = std::min(n - begin, g.options.max_step_tokens - used);
        segs.emplace_back(static_cast<int64_t>(b), begin, begin + take);
        begin += take;
        used += take;
        if (used == g.options.max_step_tokens) {
          LLMQ_RETURN_IF_ERROR(g.prefill_step(segs, tokens, all_positions, out, &out_rows));
          segs.clear();
          used = 0;
        }
      }
    }
    if (!segs.empty()) LLMQ_RETURN_IF_ERROR(g.prefill_step(segs, tokens, all_positions, out, &out_rows));
    if (out_rows != (out == nullptr ? 0 : rows))
      return Status(StatusCode::kInternal, "prefill: " + std::to_string(out_rows) + " rows of logits for " + std::to_string(rows));
    // Without logits nothing waited for the stream: its errors belong to this call, not a later one.
    if (logits == nullptr) LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
    return {};
  };
  if (Status st = run_steps(); !st.ok()) {
    if (logits != nullptr) logits->clear();  // no partial rows
    return st;
  }
  if (logits == nullptr) return {};
  const Status checked = check_logits(logits->data(), rows, g.c.vocab_size, "prefill row ", 0);
  if (!checked.ok()) logits->clear();
  return checked;
}

Status GpuRuntime::decode(const std::vector<int32_t>& tokens, std::vector<float>* logits) {
  Impl& g = *impl_;
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("decode"));
  const int64_t B = static_cast<int64_t>(tokens.size());
  if (B == 0 || B > g.options.max_batch)
    return invalid_argument("decode: " + std::to_string(B) + " sequences, the runtime holds 1 .. " +
                            std::to_string(g.options.max_batch));
  std::vector<int32_t> tok, pos, slot, qstart{0}, kvlen;
  int64_t max_kv = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t t = tokens[static_cast<size_t>(b)];
    if (t < 0 || t >= g.c.vocab_size)
      return invalid_argument("decode: token " + std::to_string(t) + " is outside the vocabulary");
    if (g.lengths[static_cast<size_t>(b)] + 1 > g.options.max_context)
      return invalid_argument("decode: sequence " + std::to_string(b) + " is full (" + std::to_string(g.options.max_context) +
                              " positions)");
    tok.push_back(t);
    pos.push_back(static_cast<int32_t>(g.lengths[static_cast<size_t>(b)]));
    slot.push_back(static_cast<int32_t>(b));
    qstart.push_back(static_cast<int32_t>(b + 1));
    kvlen.push_back(static_cast<int32_t>(g.lengths[static_cast<size_t>(b)] + 1));
    max_kv = std::max<int64_t>(max_kv, kvlen.back());
  }
  std::vector<int32_t> ints;
  for (auto* v : {&tok, &pos, &slot, &qstart, &kvlen, &slot}) ints.insert(ints.end(), v->begin(), v->end());
  LLMQ_RETURN_IF_ERROR(g.upload_meta(ints));
  const int32_t* d = g.meta.as<int32_t>();
  StepMeta m;
  m.tokens = d;
  m.position = d + B;
  m.tok_slot = d + 2 * B;
  m.q_start = d + 3 * B;
  m.kv_len = m.q_start + B + 1;
  m.seq_slot = m.kv_len + B;
  m.tokens_count = B;
  m.batch = B;
  m.max_q_len = 1;
  m.max_kv_len = max_kv;
  m.lm_count = B;
  m.decode = true;
  LLMQ_RETURN_IF_ERROR(g.forward(m));
  LLMQ_RETURN_IF_ERROR(g.lm_head(m, 0, B));
  logits->resize(static_cast<size_t>(B * g.c.vocab_size));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), g.logits.get(), logits->size() * 4, cudaMemcpyDeviceToHost, g.stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  for (int64_t b = 0; b < B; ++b) ++g.lengths[static_cast<size_t>(b)];
  return check_logits(logits->data(), B, g.c.vocab_size, "decode row ", 0);
}

// One decode step of sequences 0 .. batch - 1 from the device state, then sample and advance.
Status GpuRuntime::Impl::decode_body(int64_t batch, const SamplingOptions& s) {
  StepMeta m;
  m.tokens = dec_ptr(0);
  m.position = dec_ptr(1);
  m.kv_len = dec_ptr(2);
  m.tok_slot = m.seq_slot = dec_ptr(3);
  m.tokens_count = batch;
  m.batch = batch;
  m.max_q_len = 1;
  m.max_kv_len = options.max_context;  // the graph serves every length up to the capacity
  m.lm_count = batch;
  m.decode = true;
  LLMQ_RETURN_IF_ERROR(forward(m));
  LLMQ_RETURN_IF_ERROR(lm_head(m, 0, batch));
  LLMQ_RETURN_IF_ERROR(runtime::flag_unusable_rows(logits.as<float>(), batch, c.vocab_size, logits_flag.as<int32_t>(), stream));
  LLMQ_RETURN_IF_ERROR(runtime::sample_rows(logits.as<float>(), batch, c.vocab_size, s.temperature, s.top_p, s.seed,
                                            dec_step(), dec_ptr(4), argmax_workspace.get(), stream));
  return runtime::advance_decode(dec_ptr(4), batch, dec_ptr(0), dec_ptr(1), dec_ptr(2), dec_step(), history.as<int32_t>(),
                                 history_rows, stream);
}

Status GpuRuntime::Impl::decode_graph(int64_t batch, const SamplingOptions& s, cudaGraphExec_t* exec) {
  const auto key = std::make_tuple(batch, s.temperature, s.top_p, s.seed);
  auto it = graphs.find(key);
  if (it != graphs.end()) {
    *exec = it->second;
    return {};
  }
  if (calibration)  // the graph would keep the observer's launches and buffers past end_calibration
    return invalid_argument("decode graphs are not captured while calibrating (end_calibration first)");
  cudaGraph_t graph = nullptr;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status body = decode_body(batch, s);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  LLMQ_RETURN_IF_ERROR(body);
  LLMQ_RETURN_IF_ERROR(detail::cuda_status(end, "cudaStreamEndCapture"));
  const cudaError_t inst = cudaGraphInstantiate(exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  LLMQ_RETURN_IF_ERROR(detail::cuda_status(inst, "cudaGraphInstantiate"));
  graphs.emplace(key, *exec);
  return {};
}

Status GpuRuntime::Impl::start_decode_state(const std::vector<int32_t>& first) {
  const int64_t B = static_cast<int64_t>(first.size());
  std::vector<int32_t> state(static_cast<size_t>(5 * options.max_batch + 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    state[static_cast<size_t>(b)] = first[static_cast<size_t>(b)];
    state[static_cast<size_t>(options.max_batch + b)] = static_cast<int32_t>(lengths[static_cast<size_t>(b)]);
    state[static_cast<size_t>(2 * options.max_batch + b)] = static_cast<int32_t>(lengths[static_cast<size_t>(b)] + 1);
    state[static_cast<size_t>(3 * options.max_batch + b)] = static_cast<int32_t>(b);
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dec.get(), state.data(), state.size() * 4, cudaMemcpyHostToDevice, stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return {};
}

Status GpuRuntime::generate(const std::vector<int32_t>& first, int64_t steps, const SamplingOptions& sampling,
                            std::vector<std::vector<int32_t>>* out) {
  Impl& g = *impl_;
  LLMQ_RETURN_IF_ERROR(g.fixed_slots("generate"));
  const int64_t B = static_cast<int64_t>(first.size());
  if (B == 0 || B > g.options.max_batch)
    return invalid_argument("generate: " + std::to_string(B) + " sequences, the runtime holds 1 .. " +
                            std::to_string(g.options.max_batch));
  if (steps < 0) return invalid_argument("generate: steps = " + std::to_string(steps));
  for (int64_t b = 0; b < B; ++b) {
    if (first[static_cast<size_t>(b)] < 0 || first[static_cast<size_t>(b)] >= g.c.vocab_size)
      return invalid_argument("generate: first token " + std::to_string(first[static_cast<size_t>(b)]) + " is outside the vocabulary");
    if (g.lengths[static_cast<size_t>(b)] + steps > g.options.max_context)
      return invalid_argument("generate: sequence " + std::to_string(b) + " would hold " +
                              std::to_string(g.lengths[static_cast<size_t>(b)] + steps) + " positions, the KV cache has " +
                              std::to_string(g.options.max_context));
  }
  if (sampling.temperature > 0.0f && !(sampling.top_p > 0.0f && sampling.top_p <= 1.0f))
    return invalid_argument("--top-p: " + std::to_string(sampling.top_p) + " outside (0, 1]");
  LLMQ_RETURN_IF_ERROR(g.start_decode_state(first));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.logits_flag.get(), 0, 4, g.stream));
  cudaGraphExec_t exec = nullptr;
  for (int64_t s = 0; s < steps; ++s) {
    // The first step of a new graph key runs eagerly: it makes cuBLASLt's plans and the kernels'
    // attributes before capture, so that the captured step only enqueues work.
    if (s > 0 && exec == nullptr && g.options.cuda_graphs && !g.calibration) LLMQ_RETURN_IF_ERROR(g.decode_graph(B, sampling, &exec));
    if (exec != nullptr) LLMQ_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, g.stream));
    else LLMQ_RETURN_IF_ERROR(g.decode_body(B, sampling));
  }
  std::vector<int32_t> hist(static_cast<size_t>(steps * B));
  if (steps > 0)
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(hist.data(), g.history.get(), hist.size() * 4, cudaMemcpyDeviceToHost, g.stream));
  int32_t unusable = 0;
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&unusable, g.logits_flag.get(), 4, cudaMemcpyDeviceToHost, g.stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  if (unusable != 0)
    return invalid_argument("generate: the model's logits held NaN/Inf or were all equal in a sampled row: the weights "
                            "overflow or are degenerate, and the tokens are no answer");
  out->assign(static_cast<size_t>(B), {});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < steps; ++s) (*out)[static_cast<size_t>(b)].push_back(hist[static_cast<size_t>(s * B + b)]);
    g.lengths[static_cast<size_t>(b)] += steps;
  }
  return {};
}

Status GpuRuntime::set_kv_scales(const std::vector<float>& k_scales, const std::vector<float>& v_scales) {
  Impl& g = *impl_;
  if (!g.kv_fp8) return invalid_argument("set_kv_scales: the KV cache is not e4m3");
  const size_t want = static_cast<size_t>(g.c.n_layers * g.c.n_kv_heads);
  if (k_scales.size() != want || v_scales.size() != want)
    return invalid_argument("set_kv_scales: want " + std::to_string(want) + " scales each (layers x kv heads), got " +
                            std::to_string(k_scales.size()) + " and " + std::to_string(v_scales.size()));
  for (size_t i = 0; i < want; ++i)
    if (!(k_scales[i] > 0.0f) || !(v_scales[i] > 0.0f) || !std::isfinite(k_scales[i]) || !std::isfinite(v_scales[i]))
      return invalid_argument("set_kv_scales: scale " + std::to_string(i) + " is not finite and positive");
  std::vector<float> both(k_scales);
  both.insert(both.end(), v_scales.begin(), v_scales.end());
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy(g.kv_scales.get(), both.data(), both.size() * 4, cudaMemcpyHostToDevice));
  return {};
}

void GpuRuntime::reset() { std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0); }
int64_t GpuRuntime::length(int64_t sequence) const { return impl_->lengths.at(static_cast<size_t>(sequence)); }
const GpuRuntimeOptions& GpuRuntime::options() const { return impl_->options; }
int64_t GpuRuntime::kv_cache_bytes() const { return impl_->kv_cache.bytes(); }

int64_t GpuRuntime::device_bytes() const {
  const Impl& g = *impl_;
  int64_t b = g.x.bytes() + g.in_attn.bytes() + g.in_o.bytes() + g.in_mlp.bytes() + g.in_down.bytes() + g.in_lm.bytes();
  b += g.moe.bytes();
  for (const DeviceAllocation* a : {&g.qkv_out, &g.q_rot, &g.attn_out, &g.o_out, &g.gu_out, &g.down_out, &g.logits, &g.lm_gather,
                                    &g.kv_cache, &g.cos_sin, &g.meta, &g.dec, &g.history, &g.gemm_workspace,
                                    &g.quant_workspace, &g.attn_workspace, &g.argmax_workspace, &g.logits_flag, &g.dequant_scratch})
    b += a->bytes();
  return b;
}

std::vector<std::string> GpuRuntime::describe_linears(int64_t tokens) const {
  const Impl& g = *impl_;
  const GpuLayer& L = g.model->layers.front();
  const runtime::LayerPlan& P = g.plan.layers.front();
  std::vector<std::string> out;
  const std::pair<const GpuLinear*, const runtime::LinearPlan*> linears[] = {
      {&L.qkv, &P.qkv}, {&L.o, &P.o}, {&L.gate_up, &P.gate_up}, {&L.down, &P.down}, {&g.model->lm_head, &g.plan.lm_head}};
  for (const auto& [l, plan] : linears) {
    if (l->parts.empty()) continue;  // gate_up / down of an MoE layer
    out.push_back(l->name + ": " + runtime::linear_path(*l, *plan, tokens));
  }
  if (L.moe.active()) out.push_back(runtime::describe_moe(L.moe, P.router, tokens, g.lin));
  return out;
}

}  // namespace llmq
