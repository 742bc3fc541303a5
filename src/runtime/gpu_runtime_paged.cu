// GpuRuntime::step (gpu_runtime.hpp): the serving engine's steps over a paged KV cache. The caller
// (the engine's scheduler) owns the blocks; each step brings every sequence's block table along
// with its tokens, so sequences join and leave between any two steps and a prefill chunk runs in
// the same forward pass as the decodes beside it.
//
// A step's metadata (tokens, positions, table rows, prefix sums, the sampled rows and their
// sampling parameters, the block tables) goes up in one copy from pinned memory into fixed offsets
// of one device block. A decode-only step (one token per sequence, every one sampled) pads its
// batch to a capture size and replays that size's CUDA graph, which reads the same offsets: the
// padding rows compute garbage into the null block (block 0, which the pool never hands out) and
// are never sampled from. Mixed steps run eagerly. The sampled tokens (and a flag raised when a
// sampled row's logits are NaN/Inf or constant) come back in one copy: the step's only host sync,
// which the scheduler needs anyway to decide the next step. Rows that ask for log-probabilities get
// them from one more kernel after the sampling (outside any graph, so a step where none asks runs
// exactly as before), copied back with the tokens.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "runtime/gpu_runtime_impl.hpp"
#include "runtime/row_logprobs.hpp"
#include "runtime/row_sampling.hpp"

namespace llmq {
namespace {

// Graph capture sizes: 1, 2, 4, then multiples of 8 to 32, of 16 to 128, of 32 beyond (vLLM
// captures a similar ladder): a few dozen graphs at most, and at most about 1/8 padding rows.
int64_t capture_size(int64_t batch, int64_t max_batch) {
  int64_t p = batch;
  if (batch == 3) p = 4;
  else if (batch > 4 && batch <= 32) p = round_up(batch, 8);
  else if (batch > 32 && batch <= 128) p = round_up(batch, 16);
  else if (batch > 128) p = round_up(batch, 32);
  return std::min(p, max_batch);
}

runtime::RowSamplingParams device_params(const RowSampling& s) {
  runtime::RowSamplingParams p{};
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
  p.seed = s.seed;
  p.draw = s.draw;
  return p;
}

}  // namespace

Status GpuRuntime::Impl::init_paged() {
  const int64_t B = options.max_batch;
  PagedLayout& at = paged_at;
  const auto take = [&](int64_t bytes) {
    const int64_t offset = at.bytes;
    at.bytes += round_up(bytes, 16);
    return offset;
  };
  at.tokens = take(rows * 4);
  at.position = take(rows * 4);
  at.tok_slot = take(rows * 4);
  at.q_start = take((B + 1) * 4);
  at.kv_len = take(B * 4);
  at.seq_slot = take(B * 4);
  at.lm_rows = take(B * 4);
  at.params = take(B * static_cast<int64_t>(sizeof(runtime::RowSamplingParams)));
  at.valid_rows = take(4);
  at.logprobs_k = take(B * 4);
  at.table = take(B * pages.table_stride * 4);
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(at.bytes, "paged step metadata", &paged_meta));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(paged_meta.get(), 0, static_cast<size_t>(at.bytes)));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMallocHost(&paged_meta_host.ptr, static_cast<size_t>(at.bytes)));
  std::memset(paged_meta_host.ptr, 0, static_cast<size_t>(at.bytes));
  pages.block_table = reinterpret_cast<const int32_t*>(paged_meta.as<char>() + at.table);
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate((B + 1) * 4, "sampled tokens", &sampled));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(sampled.get(), 0, static_cast<size_t>((B + 1) * 4)));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMallocHost(&sampled_host.ptr, static_cast<size_t>((B + 1) * 4)));
  const int64_t ws = runtime::sample_rows_each_workspace_bytes(B, c.vocab_size);
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(std::max<int64_t>(ws, 16), "sampling workspace", &sample_workspace));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(sample_workspace.get(), 0, static_cast<size_t>(sample_workspace.bytes())));
  const int64_t lp_bytes = B * static_cast<int64_t>(sizeof(RowLogprobs));
  LLMQ_RETURN_IF_ERROR(DeviceAllocation::allocate(lp_bytes, "logprobs", &logprobs_out));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(logprobs_out.get(), 0, static_cast<size_t>(lp_bytes)));
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMallocHost(&logprobs_host.ptr, static_cast<size_t>(lp_bytes)));
  return {};
}

// The step's work after its metadata is on the device: forward, lm_head of the sampled rows, the
// unusable-logits flag and per-row sampling into `sampled`. Capturable.
Status GpuRuntime::Impl::paged_body(const StepMeta& m, int64_t samples) {
  LLMQ_RETURN_IF_ERROR(forward(m));
  LLMQ_RETURN_IF_ERROR(lm_head(m, 0, samples));
  int32_t* flag = sampled.as<int32_t>() + options.max_batch;
  // Only the real rows count: a graph's padding rows may well give constant logits. The sampling
  // pass flags them as it reads the logits (no second pass over [rows, vocab] floats).
  const auto* valid = reinterpret_cast<const int32_t*>(paged_meta.as<char>() + paged_at.valid_rows);
  const auto* params = reinterpret_cast<const runtime::RowSamplingParams*>(paged_meta.as<char>() + paged_at.params);
  return runtime::sample_rows_each(logits.as<float>(), samples, c.vocab_size, params, sampled.as<int32_t>(),
                                   sample_workspace.get(), sample_workspace.bytes(), stream, flag, valid);
}

Status GpuRuntime::step(const std::vector<PagedChunk>& chunks, std::vector<int32_t>* sampled, std::vector<float>* logits,
                        std::vector<RowLogprobs>* logprobs) {
  Impl& g = *impl_;
  if (!g.paged) return invalid_argument("step: the runtime has fixed slots (kv_blocks 0): use prefill / decode / generate");
  // The pinned metadata is rewritten below: no copy of an earlier step (one that failed before
  // its sync) may still be reading it.
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  sampled->clear();
  if (logits != nullptr) logits->clear();
  if (logprobs != nullptr) logprobs->clear();
  const int64_t B = static_cast<int64_t>(chunks.size());
  if (B == 0) return {};
  if (B > g.options.max_batch)
    return invalid_argument("step: " + std::to_string(B) + " sequences, the runtime takes " + std::to_string(g.options.max_batch));
  const attention::KvPages& pages = g.pages;
  int64_t T = 0, samples = 0, max_q = 0, max_kv = 0, width = 1;  // width: table columns this step uses
  bool decode_only = true;
  bool want_logprobs = false;  // some sampled chunk asks (computed only when the caller takes them)
  for (int64_t b = 0; b < B; ++b) {
    const PagedChunk& ch = chunks[static_cast<size_t>(b)];
    const auto which = [b] { return "step: sequence " + std::to_string(b) + ": "; };  // built only for an error
    if (ch.tokens == nullptr || ch.table == nullptr) return invalid_argument(which() + "tokens or table is null");
    if (ch.count < 1 || ch.start < 0 || ch.start + ch.count > g.options.max_context)
      return invalid_argument(which() + "positions [" + std::to_string(ch.start) + ", " + std::to_string(ch.start + ch.count) +
                              ") outside [0, " + std::to_string(g.options.max_context) + ")");
    const int64_t need = ceil_div(ch.start + ch.count, pages.block_size);
    if (ch.table_blocks < need || ch.table_blocks > pages.table_stride)
      return invalid_argument(which() + "a table of " + std::to_string(ch.table_blocks) + " blocks for " +
                              std::to_string(ch.start + ch.count) + " positions (needs " + std::to_string(need) + ", at most " +
                              std::to_string(pages.table_stride) + ")");
    for (int64_t i = 0; i < need; ++i)
      if (ch.table[i] < 1 || ch.table[i] >= pages.num_blocks)
        return invalid_argument(which() + "table entry " + std::to_string(i) + " = " + std::to_string(ch.table[i]) +
                                " outside [1, " + std::to_string(pages.num_blocks) + ")");
    for (int64_t i = ch.start; i < ch.start + ch.count; ++i)
      if (ch.tokens[i] < 0 || ch.tokens[i] >= g.c.vocab_size)
        return invalid_argument(which() + "token " + std::to_string(ch.tokens[i]) + " is outside the vocabulary");
    if (ch.sample && ch.sampling.temperature > 0.0f && !(ch.sampling.top_p > 0.0f && ch.sampling.top_p <= 1.0f))
      return invalid_argument(which() + "top_p " + std::to_string(ch.sampling.top_p) + " outside (0, 1]");
    if (ch.sample && (ch.sampling.top_k < 0 || !(ch.sampling.temperature >= 0.0f)))
      return invalid_argument(which() + "negative top_k or temperature");
    if (ch.sample && (ch.sampling.logprobs < -1 || ch.sampling.logprobs > kMaxTopLogprobs))
      return invalid_argument(which() + "logprobs " + std::to_string(ch.sampling.logprobs) + " outside [-1, " +
                              std::to_string(kMaxTopLogprobs) + "]");
    want_logprobs = want_logprobs || (ch.sample && ch.sampling.logprobs >= 0);
    T += ch.count;
    samples += ch.sample ? 1 : 0;
    max_q = std::max(max_q, ch.count);
    max_kv = std::max(max_kv, ch.start + ch.count);
    width = std::max(width, ch.table_blocks);
    decode_only = decode_only && ch.count == 1 && ch.sample;
  }
  if (T > g.rows || T > g.options.max_step_tokens)
    return invalid_argument("step: " + std::to_string(T) + " tokens, the runtime takes " + std::to_string(g.options.max_step_tokens));
  const bool graph = decode_only && g.options.cuda_graphs && logits == nullptr;
  const int64_t rows_b = graph ? capture_size(B, g.options.max_batch) : B;  // padded for the graph

  // The chunks of one query go first (stable), so that in a mixed step the decode rows' attention
  // runs in the decode kernel, rows = sequences, as in a decode step (a decode row of a mixed step
  // then costs what it costs there: the prefill kernel would give it a query tile of its own per
  // head); the others follow. Sampled rows are packed in that order and handed back in the caller's.
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    if (chunks[static_cast<size_t>(b)].count == 1) order.push_back(b);
  const int64_t decode_rows = static_cast<int64_t>(order.size());
  for (int64_t b = 0; b < B; ++b)
    if (chunks[static_cast<size_t>(b)].count != 1) order.push_back(b);
  std::vector<int64_t> sample_of(static_cast<size_t>(B), -1);  // a chunk's sampled row, in the caller's order
  for (int64_t b = 0, r = 0; b < B; ++b)
    if (chunks[static_cast<size_t>(b)].sample) sample_of[static_cast<size_t>(b)] = r++;
  std::vector<int64_t> unpack;  // packed sampled row -> the caller's
  unpack.reserve(static_cast<size_t>(samples));
  int64_t decode_max_kv = 0;

  // Pack the metadata into the pinned block. Table rows: only the first `width` columns go up
  // (entries past a sequence's positions are never read).
  char* host = static_cast<char*>(g.paged_meta_host.ptr);
  const Impl::PagedLayout& at = g.paged_at;
  auto* tok = reinterpret_cast<int32_t*>(host + at.tokens);
  auto* pos = reinterpret_cast<int32_t*>(host + at.position);
  auto* tslot = reinterpret_cast<int32_t*>(host + at.tok_slot);
  auto* qstart = reinterpret_cast<int32_t*>(host + at.q_start);
  auto* kvlen = reinterpret_cast<int32_t*>(host + at.kv_len);
  auto* sslot = reinterpret_cast<int32_t*>(host + at.seq_slot);
  auto* lmrows = reinterpret_cast<int32_t*>(host + at.lm_rows);
  auto* params = reinterpret_cast<runtime::RowSamplingParams*>(host + at.params);
  auto* logprobs_k = reinterpret_cast<int32_t*>(host + at.logprobs_k);
  auto* table = reinterpret_cast<int32_t*>(host + at.table);
  std::vector<attention::PrefillSequence> seqs;
  int64_t t = 0, s = 0;
  qstart[0] = 0;
  for (int64_t b = 0; b < rows_b; ++b) {
    int32_t* row = table + b * pages.table_stride;
    if (b >= B) {  // a graph's padding row: one token at position 0 of the null block, greedy
      tok[t] = 0;
      pos[t] = 0;
      tslot[t] = static_cast<int32_t>(b);
      ++t;
      qstart[b + 1] = static_cast<int32_t>(t);
      kvlen[b] = 1;
      sslot[b] = static_cast<int32_t>(b);
      logprobs_k[s] = -1;
      params[s++] = runtime::RowSamplingParams{};
      std::fill(row, row + width, 0);
      continue;
    }
    const size_t c = static_cast<size_t>(order[static_cast<size_t>(b)]);
    const PagedChunk& ch = chunks[c];
    if (b < decode_rows) decode_max_kv = std::max(decode_max_kv, ch.start + 1);
    else if (!graph) seqs.push_back({t, ch.count, ch.start + ch.count, b});
    for (int64_t i = ch.start; i < ch.start + ch.count; ++i) {
      tok[t] = ch.tokens[i];
      pos[t] = static_cast<int32_t>(i);
      tslot[t] = static_cast<int32_t>(b);
      ++t;
    }
    qstart[b + 1] = static_cast<int32_t>(t);
    kvlen[b] = static_cast<int32_t>(ch.start + ch.count);
    sslot[b] = static_cast<int32_t>(b);
    if (ch.sample) {
      unpack.push_back(sample_of[c]);
      lmrows[s] = static_cast<int32_t>(t - 1);
      logprobs_k[s] = ch.sampling.logprobs;
      params[s++] = device_params(ch.sampling);
    }
    std::copy(ch.table, ch.table + ch.table_blocks, row);
    std::fill(row + ch.table_blocks, row + width, 0);
  }
  *reinterpret_cast<int32_t*>(host + at.valid_rows) = static_cast<int32_t>(graph ? B : s);
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g.paged_meta.get(), host, static_cast<size_t>(at.table), cudaMemcpyHostToDevice, g.stream));
  const size_t pitch = static_cast<size_t>(pages.table_stride * 4);
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(g.paged_meta.as<char>() + at.table, pitch, host + at.table, pitch,
                                              static_cast<size_t>(width * 4), static_cast<size_t>(rows_b),
                                              cudaMemcpyHostToDevice, g.stream));

  const char* d = g.paged_meta.as<char>();
  StepMeta m;
  m.tokens = reinterpret_cast<const int32_t*>(d + at.tokens);
  m.position = reinterpret_cast<const int32_t*>(d + at.position);
  m.tok_slot = reinterpret_cast<const int32_t*>(d + at.tok_slot);
  m.q_start = reinterpret_cast<const int32_t*>(d + at.q_start);
  m.kv_len = reinterpret_cast<const int32_t*>(d + at.kv_len);
  m.seq_slot = reinterpret_cast<const int32_t*>(d + at.seq_slot);
  m.lm_rows = graph ? nullptr : reinterpret_cast<const int32_t*>(d + at.lm_rows);  // a graph samples every row
  m.tokens_count = t;
  m.batch = rows_b;
  m.max_q_len = max_q;
  // A graph serves every length up to the capacity (the decode split is fixed by it).
  m.max_kv_len = graph ? pages.capacity() : max_kv;
  m.lm_count = s;
  m.decode = decode_only;
  m.decode_rows = decode_only ? 0 : decode_rows;
  m.decode_max_kv_len = decode_max_kv;
  m.seqs = std::move(seqs);

  if (graph) {
    auto it = g.paged_graphs.find(rows_b);
    if (it == g.paged_graphs.end()) {
      // The first step of a size runs eagerly (cuBLASLt plans and kernel attributes are made
      // outside the capture); the next one captures.
      const bool fresh = g.paged_warmed.insert(rows_b).second;
      if (fresh) {
        LLMQ_RETURN_IF_ERROR(g.paged_body(m, s));
      } else {
        cudaGraph_t cg = nullptr;
        cudaGraphExec_t exec = nullptr;
        LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
        const Status body = g.paged_body(m, s);
        const cudaError_t end = cudaStreamEndCapture(g.stream, &cg);
        if (!body.ok() || end != cudaSuccess) {
          if (cg != nullptr) (void)cudaGraphDestroy(cg);
          LLMQ_RETURN_IF_ERROR(body);
          return detail::cuda_status(end, "cudaStreamEndCapture");
        }
        const cudaError_t inst = cudaGraphInstantiate(&exec, cg, 0);
        (void)cudaGraphDestroy(cg);
        LLMQ_RETURN_IF_ERROR(detail::cuda_status(inst, "cudaGraphInstantiate"));
        g.paged_graphs.emplace(rows_b, exec);
        LLMQ_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, g.stream));
      }
    } else {
      LLMQ_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, g.stream));
    }
  } else {
    LLMQ_RETURN_IF_ERROR(g.paged_body(m, s));
  }

  // Log-probabilities of the rows that asked, from the logits and tokens the body left (the real
  // rows come first, before a graph's padding rows).
  want_logprobs = want_logprobs && logprobs != nullptr;
  if (want_logprobs) {
    LLMQ_RETURN_IF_ERROR(runtime::row_logprobs(g.logits.as<float>(), samples, g.c.vocab_size,
                                               reinterpret_cast<const int32_t*>(d + at.logprobs_k), g.sampled.as<int32_t>(),
                                               g.logprobs_out.as<RowLogprobs>(), g.stream));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(g.logprobs_host.ptr, g.logprobs_out.get(),
                                              static_cast<size_t>(samples) * sizeof(RowLogprobs), cudaMemcpyDeviceToHost, g.stream));
  }
  auto* out = static_cast<int32_t*>(g.sampled_host.ptr);
  LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, g.sampled.get(), static_cast<size_t>((g.options.max_batch + 1) * 4),
                                            cudaMemcpyDeviceToHost, g.stream));
  if (logits != nullptr) {
    logits->resize(static_cast<size_t>(samples * g.c.vocab_size));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), g.logits.get(), logits->size() * 4, cudaMemcpyDeviceToHost, g.stream));
  }
  LLMQ_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g.stream));
  if (out[g.options.max_batch] != 0) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g.sampled.as<int32_t>() + g.options.max_batch, 0, 4, g.stream));
    return invalid_argument("step: the model's logits held NaN/Inf or were all equal in a sampled row: the weights "
                            "overflow or are degenerate, and the tokens are no answer");
  }
  sampled->assign(static_cast<size_t>(samples), 0);
  for (int64_t r = 0; r < samples; ++r) (*sampled)[static_cast<size_t>(unpack[static_cast<size_t>(r)])] = out[r];
  if (logprobs != nullptr) {
    logprobs->assign(static_cast<size_t>(samples), RowLogprobs{});
    const auto* got = static_cast<const RowLogprobs*>(g.logprobs_host.ptr);
    for (int64_t r = 0; want_logprobs && r < samples; ++r)
      if (logprobs_k[r] >= 0) (*logprobs)[static_cast<size_t>(unpack[static_cast<size_t>(r)])] = got[r];
  }
  if (logits != nullptr) {  // rows back into the caller's order
    bool moved = false;
    for (int64_t r = 0; r < samples; ++r) moved = moved || unpack[static_cast<size_t>(r)] != r;
    if (moved) {
      const std::vector<float> packed = *logits;
      const size_t v = static_cast<size_t>(g.c.vocab_size);
      for (int64_t r = 0; r < samples; ++r)
        std::copy(packed.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * v),
                  packed.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r + 1) * v),
                  logits->begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(unpack[static_cast<size_t>(r)]) * v));
    }
  }
  return {};
}

}  // namespace llmq
