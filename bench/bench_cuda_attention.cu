// Benchmark of the runtime's attention kernels (src/attention/attention.hpp): prefill TFLOP/s of one
// long prompt (Llama-3-8B heads: 32 q / 8 kv, head_dim 128; causal and not) and decode GB/s of the
// KV cache streamed (batch 1 and 8 at 8k context), each decode case also over an E4M3 cache with
// per-kv-head scales (lines ending "e4m3": half the bytes, GB/s counts the bytes actually read;
// compare the times). CUDA events around each run, warm-up first,
// median of the runs. FLOPs counted as 4 * q * k * d per head over the (q, k) pairs computed:
// nq * nk for full attention, nq * (nk + 1) / 2 for causal (FlashAttention's convention for the
// square causal case). The fused quantize (cuda_quantize_attention_inputs: BF16 Q, K, V slices of one
// QKV projection -> INT8 or E4M3 codes, scales and the transposed V) alone, in GB/s of bytes read
// and written beside a device-to-device copy of its input, and in front of the full-INT8 and FP8
// kernels (lines "+quantize", beside the same kernel alone on the quantize's outputs).
// --window W / --sinks: every causal prefill case (BF16 and 8-bit) and every decode case with a
// sliding window of W keys / attention sinks (0.5 for every head); FLOPs and bytes are still
// counted as without the window, so compare the times.
// The BF16 / E4M3-cache kernels read a paged cache (attention.hpp's KvPages): --block-size B
// positions a block (default 16), the identity table (each sequence's blocks in order) or with
// --shuffle-blocks a seeded random permutation of the blocks (scattered rows; compare the times).
// --decode B:L,B:L-L2,..: only decode cases, batch B at L keys each or with lengths spread evenly
// over [L, L2] in a seeded order (a serving step's: the longest sequences finish last); GB/s counts
// the keys read (as every decode case, without --window's cut).
// Usage: bench_cuda_attention [iterations] [--quick] [--json FILE] [--8bit-lengths N,N,..] [--decode B:L[-L2],..]
//        [--window W] [--sinks] [--block-size B] [--shuffle-blocks]
// (--json: one JSON line per printed row; --quick: 5 iterations unless a count is given)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_support.cuh"
#include "llmq/cuda_attention_int8.hpp"
#include "attention/attention.hpp"
#include "attention/bf16_attention_sm90.hpp"

namespace {

using llmq::bench::DeviceMem;

// --json FILE: each printed row also as a JSON object on its own line (the keys of
// bench/results/*-attention-*.jsonl).
std::FILE* g_json = nullptr;
std::string g_device;
int64_t g_window = 0;                  // --window
const float* g_sink_logits = nullptr;  // --sinks: device [kHeads]
int64_t g_block_size = 16;             // --block-size
bool g_shuffle_blocks = false;         // --shuffle-blocks

// The block table of `rows` sequences of `capacity` positions each (a multiple of g_block_size):
// row r lists blocks r * stride .. (the identity), or a seeded permutation of all of them.
struct BenchPages {
  DeviceMem table;
  llmq::attention::KvPages pages;
  BenchPages(int64_t rows, int64_t capacity) : table(static_cast<size_t>(rows * (capacity / g_block_size) * 4)) {
    const int64_t stride = capacity / g_block_size;
    std::vector<int32_t> host(static_cast<size_t>(rows * stride));
    std::iota(host.begin(), host.end(), 0);
    if (g_shuffle_blocks) std::shuffle(host.begin(), host.end(), std::mt19937_64(31));
    BENCH_CHECK(cudaMemcpy(table.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    pages.block_table = table.as<int32_t>();
    pages.table_stride = stride;
    pages.block_size = g_block_size;
    pages.num_blocks = rows * stride;
  }
};

// The sliding window (causal cases only: a window needs the causal mask) and the sinks.
template <typename Args> void set_window_and_sinks(Args* a, bool causal) {
  a->window = causal ? g_window : 0;
  a->sinks = g_sink_logits;
}

void json_row(const std::string& fields);

// Median milliseconds of `iters` runs of fn (after 3 warm-up runs).
template <typename Fn> double time_ms(int iters, Fn fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK(cudaEventRecord(start));
    fn();
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return llmq::bench::median(ms);
}

constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128;

void json_row(const std::string& fields) {
  if (g_json == nullptr) return;
  std::fprintf(g_json, "{%s, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"window\": %lld, \"sinks\": %s, \"block_size\": %lld, \"shuffled_blocks\": %s, \"device\": \"%s\", \"source\": \"bench_cuda_attention\"}\n",
               fields.c_str(), static_cast<long long>(kHeads), static_cast<long long>(kKvHeads),
               static_cast<long long>(kHeadDim), static_cast<long long>(g_window), g_sink_logits != nullptr ? "true" : "false",
               static_cast<long long>(g_block_size), g_shuffle_blocks ? "true" : "false", g_device.c_str());
}

std::string prefill_fields(const char* kernel, int64_t n, bool causal, double ms, double tflops) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "\"bench\": \"attention_prefill\", \"kernel\": \"%s\", \"n\": %lld, \"causal\": %s, \"ms\": %.4f, \"tflops\": %.1f",
                kernel, static_cast<long long>(n), causal ? "true" : "false", ms, tflops);
  return buf;
}

// An E4M3 cache of kv_elems codes per tensor and n_kv_heads scales (codes of values in
// [-300, 300] times scales around 0.01), the code and scale fields of `a` pointing at it.
struct E4m3Cache {
  DeviceMem k, v, scales;
  E4m3Cache(int64_t kv_elems, int64_t n_kv_heads) : k(kv_elems), v(kv_elems), scales(2 * n_kv_heads * 4) {
    if (kv_elems == 0) return;  // unused (a BF16 case)
    llmq::bench::fill_e4m3<<<llmq::bench::grid_for(kv_elems), 256>>>(k.as<uint8_t>(), kv_elems, 7);
    llmq::bench::fill_e4m3<<<llmq::bench::grid_for(kv_elems), 256>>>(v.as<uint8_t>(), kv_elems, 8);
    llmq::bench::fill_scales<<<1, 256>>>(scales.as<float>(), 2 * n_kv_heads, 9);
    BENCH_CHECK(cudaGetLastError());
  }
  template <typename Args> void set(Args* a, int64_t n_kv_heads) const {
    a->kv_dtype = llmq::attention::KvCacheDType::kE4M3;
    a->k_cache = a->v_cache = nullptr;
    a->k_cache8 = k.as<uint8_t>();
    a->v_cache8 = v.as<uint8_t>();
    a->k_scale = scales.as<float>();
    a->v_scale = scales.as<float>() + n_kv_heads;
  }
};

void bench_prefill(int64_t n, bool causal, llmq::attention::PrefillKernel kernel, int iters, bool e4m3 = false) {
  const int64_t q_elems = n * kHeads * kHeadDim, kv_elems = n * kKvHeads * kHeadDim;
  const int64_t kv_bytes = e4m3 ? 0 : kv_elems * 2;  // the BF16 cache (none for E4M3)
  DeviceMem q(q_elems * 2), k(kv_bytes), v(kv_bytes), out(q_elems * 2), meta(64);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(q_elems), 256>>>(q.as<__nv_bfloat16>(), q_elems, 1);
  if (!e4m3) {
    llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(k.as<__nv_bfloat16>(), kv_elems, 2);
    llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(v.as<__nv_bfloat16>(), kv_elems, 3);
  }
  const E4m3Cache cache8(e4m3 ? kv_elems : 0, kKvHeads);
  const int32_t host_meta[4] = {0, static_cast<int32_t>(n), static_cast<int32_t>(n), 0};  // q_start[2], kv_len, slot
  BENCH_CHECK(cudaMemcpy(meta.p, host_meta, sizeof(host_meta), cudaMemcpyHostToDevice));
  llmq::attention::PrefillAttentionArgs a;
  a.q = q.as<uint16_t>();
  a.k_cache = k.as<uint16_t>();
  a.v_cache = v.as<uint16_t>();
  a.out = out.as<uint16_t>();
  a.q_start = meta.as<int32_t>();
  a.kv_len = meta.as<int32_t>() + 2;
  a.slot = meta.as<int32_t>() + 3;
  const BenchPages pages(1, n);
  a.pages = pages.pages;
  a.batch = 1;
  a.max_q_len = n;
  a.n_heads = kHeads;
  a.n_kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.softmax_scale = 0.08838834764831845f;
  a.causal = causal;
  a.kernel = kernel;
  set_window_and_sinks(&a, causal);
  if (e4m3) cache8.set(&a, kKvHeads);
  const double ms = time_ms(iters, [&] { BENCH_CHECK(llmq::attention::prefill_attention(a, nullptr)); });
  const double pairs = causal ? 0.5 * static_cast<double>(n) * static_cast<double>(n + 1) : static_cast<double>(n) * n;
  const double tflops = 4.0 * pairs * kHeadDim * kHeads / (ms * 1e-3) / 1e12;
  std::printf("prefill  n=%-5lld %-6s %-4s  %8.3f ms  %7.1f TFLOP/s%s\n", static_cast<long long>(n),
              causal ? "causal" : "full", kernel == llmq::attention::PrefillKernel::kCudaCore ? "simt" : "mma", ms, tflops,
              e4m3 ? "  e4m3" : "");
  std::string kname = kernel == llmq::attention::PrefillKernel::kCudaCore ? "simt" : "mma";
  json_row(prefill_fields((kname + (e4m3 ? "-e4m3" : "")).c_str(), n, causal, ms, tflops));
}

// The Hopper BF16 wgmma kernel (attention/bf16_attention_sm90.hpp) on the same shapes: Q, K and V^T
// as its inputs (V^T's values arbitrary: timing only, the tests check the values).
void bench_bf16_sm90(int64_t n, bool causal, int iters) {
  const int64_t q_elems = n * kHeads * kHeadDim, kv_elems = n * kKvHeads * kHeadDim;
  const int64_t vt_elems = kKvHeads * kHeadDim * llmq::attention_v_t_stride(n);
  DeviceMem q(q_elems * 2), k(kv_elems * 2), vt(vt_elems * 2), out(q_elems * 2);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(q_elems), 256>>>(q.as<__nv_bfloat16>(), q_elems, 1);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(k.as<__nv_bfloat16>(), kv_elems, 2);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(vt_elems), 256>>>(vt.as<__nv_bfloat16>(), vt_elems, 3);
  llmq::attention::Bf16AttentionArgs a;
  a.q_len = a.kv_len = n;
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.causal = causal;
  a.q = q.as<uint16_t>();
  a.k = k.as<uint16_t>();
  a.v_t = vt.as<uint16_t>();
  a.out = out.as<uint16_t>();
  const double ms = time_ms(iters, [&] { BENCH_CHECK(llmq::attention::sm90_bf16_attention(a, nullptr)); });
  const double pairs = causal ? 0.5 * static_cast<double>(n) * static_cast<double>(n + 1) : static_cast<double>(n) * n;
  const double tflops = 4.0 * pairs * kHeadDim * kHeads / (ms * 1e-3) / 1e12;
  std::printf("prefill  n=%-5lld %-6s wgmma %8.3f ms  %7.1f TFLOP/s  bf16\n", static_cast<long long>(n),
              causal ? "causal" : "full", ms, tflops);
  json_row(prefill_fields("bf16-wgmma", n, causal, ms, tflops));
}

// The INT8 kernels (llmq/cuda_attention_int8.hpp) on the same shapes: INT8 Q, K with per-token
// scales; BF16 V (half) or INT8 V with per-(tile, channel) scales (full); FLOPs counted as for the
// BF16 kernel.
void bench_half_int8(int64_t n, bool causal, int iters, int mode = 0) {  // 0 half-INT8, 1 full-INT8, 2 FP8
  const int64_t q_elems = n * kHeads * kHeadDim, kv_elems = n * kKvHeads * kHeadDim;
  DeviceMem q(q_elems), k(kv_elems), v(kv_elems * 2), qs(n * kHeads * 4), ks(n * kKvHeads * 4), out(q_elems * 2);
  llmq::bench::fill_e4m3<<<llmq::bench::grid_for(q_elems), 256>>>(q.as<uint8_t>(), q_elems, 11);  // any non-zero bytes
  llmq::bench::fill_e4m3<<<llmq::bench::grid_for(kv_elems), 256>>>(k.as<uint8_t>(), kv_elems, 12);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(v.as<__nv_bfloat16>(), kv_elems, 13);
  llmq::bench::fill_scales<<<llmq::bench::grid_for(n * kHeads), 256>>>(qs.as<float>(), n * kHeads, 14);
  llmq::bench::fill_scales<<<llmq::bench::grid_for(n * kKvHeads), 256>>>(ks.as<float>(), n * kKvHeads, 15);
  llmq::HalfInt8AttentionArgs a;
  a.q_len = n;
  a.kv_len = n;
  a.heads = kHeads;
  a.kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.causal = causal;
  a.q = q.as<int8_t>();
  a.q_scale = qs.as<float>();
  a.k = k.as<int8_t>();
  a.k_scale = ks.as<float>();
  a.v = v.as<uint16_t>();
  a.out = out.as<uint16_t>();
  set_window_and_sinks(&a, causal);
  // Full-INT8: the same codes read as INT8 V, scales per (tile, channel).
  const int64_t tiles = (n + 63) / 64;
  DeviceMem vs(kKvHeads * tiles * kHeadDim * 4);
  llmq::bench::fill_scales<<<llmq::bench::grid_for(kKvHeads * tiles * kHeadDim), 256>>>(vs.as<float>(), kKvHeads * tiles * kHeadDim, 16);
  llmq::FullInt8AttentionArgs f;
  f.qk = a;
  f.v = k.as<int8_t>();
  f.v_scale = vs.as<float>();
  const double ms = mode == 2   ? time_ms(iters, [&] { BENCH_CHECK(llmq::cuda_fp8_attention(f, nullptr)); })
                    : mode == 1 ? time_ms(iters, [&] { BENCH_CHECK(llmq::cuda_full_int8_attention(f, nullptr)); })
                                : time_ms(iters, [&] { BENCH_CHECK(llmq::cuda_half_int8_attention(a, nullptr)); });
  const double pairs = causal ? 0.5 * static_cast<double>(n) * static_cast<double>(n + 1) : static_cast<double>(n) * n;
  const double tops = 4.0 * pairs * kHeadDim * kHeads / (ms * 1e-3) / 1e12;
  std::printf("prefill  n=%-5lld %-6s %s  %8.3f ms  %7.1f TOP/s\n", static_cast<long long>(n), causal ? "causal" : "full",
              mode == 2 ? "fp8      " : mode == 1 ? "full-int8" : "half-int8", ms, tops);
  json_row(prefill_fields(mode == 2 ? "fp8" : mode == 1 ? "full-int8" : "half-int8", n, causal, ms, tops));
}

// spread_to > kv_len: the sequences' lengths spread evenly over [kv_len, spread_to] in a seeded order (a
// serving step's mixed lengths: the longest sequences finish last); the cache holds the longest, in whole blocks.
void bench_decode(int64_t batch, int64_t kv_len, int iters, bool e4m3 = false, int64_t spread_to = 0) {
  int64_t kv_max = spread_to;
  kv_max = std::max(kv_max, kv_len);
  kv_max = (kv_max + g_block_size - 1) / g_block_size * g_block_size;  // whole blocks (BenchPages)
  std::vector<int64_t> lengths(static_cast<size_t>(batch), kv_len);
  for (int64_t b = 0; b < batch && batch > 1 && spread_to > kv_len; ++b) lengths[b] = kv_len + (spread_to - kv_len) * b / (batch - 1);
  std::shuffle(lengths.begin(), lengths.end(), std::mt19937_64(7));
  int64_t keys = 0;
  for (int64_t l : lengths) keys += l;
  const int64_t q_elems = batch * kHeads * kHeadDim, kv_elems = batch * kv_max * kKvHeads * kHeadDim;
  const int64_t kv_bytes = e4m3 ? 0 : kv_elems * 2;  // the BF16 cache (none for E4M3)
  DeviceMem q(q_elems * 2), k(kv_bytes), v(kv_bytes), out(q_elems * 2), meta(2 * batch * 4);
  llmq::bench::fill_bf16<<<llmq::bench::grid_for(q_elems), 256>>>(q.as<__nv_bfloat16>(), q_elems, 4);
  if (!e4m3) {
    llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(k.as<__nv_bfloat16>(), kv_elems, 5);
    llmq::bench::fill_bf16<<<llmq::bench::grid_for(kv_elems), 256>>>(v.as<__nv_bfloat16>(), kv_elems, 6);
  }
  const E4m3Cache cache8(e4m3 ? kv_elems : 0, kKvHeads);
  std::vector<int32_t> host_meta(2 * batch);
  for (int64_t b = 0; b < batch; ++b) {
    host_meta[b] = static_cast<int32_t>(lengths[b]);
    host_meta[batch + b] = static_cast<int32_t>(b);
  }
  BENCH_CHECK(cudaMemcpy(meta.p, host_meta.data(), host_meta.size() * 4, cudaMemcpyHostToDevice));
  const int64_t ws_bytes = llmq::attention::decode_attention_workspace_bytes(batch, kHeads, kHeadDim, kv_max);
  DeviceMem ws(ws_bytes);
  llmq::attention::DecodeAttentionArgs a;
  a.q = q.as<uint16_t>();
  a.k_cache = k.as<uint16_t>();
  a.v_cache = v.as<uint16_t>();
  a.out = out.as<uint16_t>();
  a.kv_len = meta.as<int32_t>();
  a.slot = meta.as<int32_t>() + batch;
  const BenchPages pages(batch, kv_max);
  a.pages = pages.pages;
  a.batch = batch;
  a.n_heads = kHeads;
  a.n_kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.max_kv_len = kv_max;
  a.softmax_scale = 0.08838834764831845f;
  a.workspace = ws.p;
  a.workspace_bytes = ws_bytes;
  set_window_and_sinks(&a, true);
  if (e4m3) cache8.set(&a, kKvHeads);
  const double ms = time_ms(iters, [&] { BENCH_CHECK(llmq::attention::decode_attention(a, nullptr)); });
  // K and V of every key read, BF16 or E4M3
  const double gbs = 2.0 * static_cast<double>(keys) * kKvHeads * kHeadDim * (e4m3 ? 1 : 2) / (ms * 1e-3) / 1e9;
  const std::string lens = spread_to > kv_len ? std::to_string(kv_len) + "-" + std::to_string(spread_to) : std::to_string(kv_len);
  std::printf("decode   batch=%-3lld kv=%-9s  %8.1f us  %7.0f GB/s (KV cache read)%s\n", static_cast<long long>(batch),
              lens.c_str(), ms * 1e3, gbs, e4m3 ? "  e4m3" : "");
  char buf[320];
  std::snprintf(buf, sizeof buf, "\"bench\": \"attention_decode\", \"kv_cache\": \"%s\", \"batch\": %lld, \"kv_len\": %lld, \"kv_max\": %lld, \"us\": %.2f, \"gbs\": %.0f",
                e4m3 ? "e4m3" : "bf16", static_cast<long long>(batch), static_cast<long long>(kv_len), static_cast<long long>(std::max(spread_to, kv_len)), ms * 1e3, gbs);
  json_row(buf);
}

// BF16 Q, K, V as slices of one fused QKV projection [n, (heads + 2 kv_heads) * d] (N(0, 1)-ish
// values), the buffers cuda_quantize_attention_inputs writes, and the 8-bit attention arguments
// that read them (V through v_t; `v` is a dummy of the token-major size for kernels that still
// want it: timing only, the tests check the values).
struct QuantizedInputs {
  static constexpr int64_t kWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
  int64_t n;
  int64_t v_block = 64;
  DeviceMem qkv, q8, k8, v_t, v_dummy, qs, ks, vs, k_mean, out;  // vs: room for 64-key blocks
  llmq::AttentionQuantizeArgs qa;
  llmq::FullInt8AttentionArgs f;
  QuantizedInputs(int64_t n_, bool fp8, bool causal, bool v_channel = false)
      : n(n_), qkv(n_ * kWidth * 2), q8(n_ * kHeads * kHeadDim), k8(n_ * kKvHeads * kHeadDim),
        v_t(kKvHeads * kHeadDim * llmq::attention_v_t_stride(n_)), v_dummy(n_ * kKvHeads * kHeadDim),
        qs(n_ * kHeads * 4), ks(n_ * kKvHeads * 4), vs(kKvHeads * ((n_ + 63) / 64) * kHeadDim * 4),
        k_mean(kKvHeads * kHeadDim * 4), out(n_ * kHeads * kHeadDim * 2) {
    llmq::bench::fill_bf16<<<llmq::bench::grid_for(n * kWidth), 256>>>(qkv.as<__nv_bfloat16>(), n * kWidth, 21);
    BENCH_CHECK(cudaGetLastError());
    const uint16_t* x = qkv.as<uint16_t>();
    qa.q_len = qa.kv_len = n;
    qa.heads = kHeads;
    qa.kv_heads = kKvHeads;
    qa.head_dim = kHeadDim;
    qa.fp8 = fp8;
    qa.q = x;
    qa.k = x + kHeads * kHeadDim;
    qa.v = x + (kHeads + kKvHeads) * kHeadDim;
    qa.q_row_stride = qa.k_row_stride = qa.v_row_stride = kWidth;
    qa.q8 = q8.as<int8_t>();
    qa.q_scale = qs.as<float>();
    qa.k8 = k8.as<int8_t>();
    qa.k_scale = ks.as<float>();
    qa.v_t = v_t.as<int8_t>();
    qa.v_scale = vs.as<float>();
    qa.k_mean = k_mean.as<float>();
    BENCH_CHECK(llmq::cuda_attention_v_block(kHeadDim, &v_block));  // 128 where the Hopper kernel runs
    if (v_channel) v_block = 0;  // V per channel (FP8, Hopper)
    qa.v_block = f.v_block = v_block;
    f.qk.q_len = f.qk.kv_len = n;
    f.qk.heads = kHeads;
    f.qk.kv_heads = kKvHeads;
    f.qk.head_dim = kHeadDim;
    f.qk.causal = causal;
    set_window_and_sinks(&f.qk, causal);
    f.qk.q = q8.as<int8_t>();
    f.qk.q_scale = qs.as<float>();
    f.qk.k = k8.as<int8_t>();
    f.qk.k_scale = ks.as<float>();
    f.qk.out = out.as<uint16_t>();
    f.v = v_dummy.as<int8_t>();
    f.v_t = v_t.as<int8_t>();
    f.v_scale = vs.as<float>();
    BENCH_CHECK(cudaMemset(v_dummy.p, 1, static_cast<size_t>(n * kKvHeads * kHeadDim)));
  }
  // Bytes the quantize reads and writes: BF16 Q, K, V in; codes, v_t's padding and scales out.
  int64_t input_bytes() const { return n * kWidth * 2; }
  int64_t bytes_moved() const {
    const int64_t tiles = v_block == 0 ? 1 : (n + v_block - 1) / v_block;
    return input_bytes() + n * (kHeads + kKvHeads) * kHeadDim + kKvHeads * kHeadDim * llmq::attention_v_t_stride(n) +
           n * (kHeads + kKvHeads) * 4 + kKvHeads * tiles * kHeadDim * 4;
  }
};

// The quantize alone, and a device-to-device copy of its BF16 input (reads and writes as many
// bytes: its GB/s is the bound a memory-bound kernel can reach), both queued behind a spin kernel.
// At n = 2048 the 25 MB input and the outputs fit in an H100's 50 MB L2; from 8192 on they do not.
void bench_quantize(int64_t n, bool fp8, bool smooth_k, int iters) {
  QuantizedInputs in(n, fp8, false);
  in.qa.smooth_k = smooth_k;
  DeviceMem copy_dst(in.input_bytes());
  const double us =
      llmq::bench::queued_median_us([&] { BENCH_CHECK(llmq::cuda_quantize_attention_inputs(in.qa, nullptr)); }, iters);
  const double copy_us = llmq::bench::queued_median_us(
      [&] {
        BENCH_CHECK(cudaMemcpyAsync(copy_dst.p, in.qkv.p, static_cast<size_t>(in.input_bytes()), cudaMemcpyDeviceToDevice));
      },
      iters);
  const double gbs = static_cast<double>(in.bytes_moved()) / (us * 1e-6) / 1e9;
  const double copy_gbs = 2.0 * static_cast<double>(in.input_bytes()) / (copy_us * 1e-6) / 1e9;
  const char* format = fp8 ? "e4m3" : "int8";
  std::printf("quantize n=%-5lld %s%s  %8.1f us  %7.0f GB/s  (copy %7.0f GB/s: %3.0f%%)\n", static_cast<long long>(n),
              format, smooth_k ? " smooth_k" : "         ", us, gbs, copy_gbs, 100.0 * gbs / copy_gbs);
  char buf[320];
  std::snprintf(buf, sizeof buf, "\"bench\": \"attention_quantize\", \"format\": \"%s\", \"smooth_k\": %s, \"n\": %lld, \"us\": %.2f, \"gbs\": %.0f, \"bytes\": %lld, \"copy_gbs\": %.0f",
                format, smooth_k ? "true" : "false", static_cast<long long>(n), us, gbs,
                static_cast<long long>(in.bytes_moved()), copy_gbs);
  json_row(buf);
}

// Full-INT8 or FP8 attention on the quantize's outputs (V as v_t), alone and with the quantize in
// front of it: what quantizing BF16 Q, K, V on the fly costs.
void bench_quantized_attention(int64_t n, bool causal, int iters, bool fp8, bool v_channel = false) {
  QuantizedInputs in(n, fp8, causal, v_channel);
  BENCH_CHECK(llmq::cuda_quantize_attention_inputs(in.qa, nullptr));
  auto attention = [&] {
    BENCH_CHECK(fp8 ? llmq::cuda_fp8_attention(in.f, nullptr) : llmq::cuda_full_int8_attention(in.f, nullptr));
  };
  const double alone = time_ms(iters, attention);
  const double both = time_ms(iters, [&] {
    BENCH_CHECK(llmq::cuda_quantize_attention_inputs(in.qa, nullptr));
    attention();
  });
  const double pairs = causal ? 0.5 * static_cast<double>(n) * static_cast<double>(n + 1) : static_cast<double>(n) * n;
  const double flops = 4.0 * pairs * kHeadDim * kHeads;
  const char* name = v_channel ? "fp8-vch  " : fp8 ? "fp8      " : "full-int8";
  std::printf("prefill  n=%-5lld %-6s %s  %8.3f ms  %7.1f TOP/s  v_t\n", static_cast<long long>(n), causal ? "causal" : "full",
              name, alone, flops / (alone * 1e-3) / 1e12);
  std::printf("prefill  n=%-5lld %-6s %s  %8.3f ms  %7.1f TOP/s  +quantize\n", static_cast<long long>(n),
              causal ? "causal" : "full", name, both, flops / (both * 1e-3) / 1e12);
  const std::string kernel = v_channel ? "fp8-v-channel" : fp8 ? "fp8" : "full-int8";
  json_row(prefill_fields((kernel + "-v_t").c_str(), n, causal, alone, flops / (alone * 1e-3) / 1e12));
  json_row(prefill_fields((kernel + "+quantize").c_str(), n, causal, both, flops / (both * 1e-3) / 1e12));
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  bool quick = false;
  std::string json_path;
  std::vector<int64_t> only_8bit;  // --8bit-lengths: just the Hopper-path 8-bit prefill at these lengths
  CLI::App app{"bench_cuda_attention: prefill and decode attention kernels, the fused 8-bit quantize"};
  llmq::bench::last_value_wins(app);
  CLI::Option* count = app.add_option("iterations", iters, "timed runs per case")
                           ->capture_default_str()
                           ->check(llmq::bench::at_least(1, "a run at least"));
  app.add_flag("--quick", quick, "5 timed runs per case (a count given wins)");
  app.add_option("--json", json_path, "also write each printed row as a JSON object on its own line to FILE")
      ->type_name("FILE");
  app.add_option("--window", g_window, "sliding window of the causal prefill and the decode cases (0: none)")
      ->check(llmq::bench::at_least(0, "0 (no window) or more"));
  bool sinks = false;
  app.add_flag("--sinks", sinks, "attention sinks (0.5 for every head) in every prefill and decode case");
  app.add_option("--block-size", g_block_size, "positions per block of the paged cache: a power of two in [1, 1024]")
      ->capture_default_str()
      ->check([](const std::string& s) -> std::string {
        const long long v = std::strtoll(s.c_str(), nullptr, 10);
        return v >= 1 && v <= 1024 && (v & (v - 1)) == 0 ? "" : "'" + s + "' is not a power of two in [1, 1024]";
      });
  app.add_flag("--shuffle-blocks", g_shuffle_blocks, "the cache's blocks in a seeded random order (else in sequence order)");
  llmq::bench::comma_list(app.add_option("--8bit-lengths", only_8bit,
                                         "only the full-INT8 and FP8 prefill (v_t, +quantize) at these lengths"))
      ->check(llmq::bench::at_least(1, "a token at least"));
  std::vector<std::string> only_decode;  // --decode: just these decode cases
  llmq::bench::comma_list(app.add_option("--decode", only_decode,
                                         "only decode, at these B:L or B:L-L2 (batch B, L keys each, or spread over [L, L2]), "
                                         "both caches"));
  llmq::bench::parse_command_line(app, argc, argv);
  if (quick && count->count() == 0) iters = 5;
  struct DecodeCase {
    long long batch, keys, max_keys;
  };
  std::vector<DecodeCase> decode_cases;
  for (const std::string& c : only_decode) {
    long long b = 0, l = 0, l2 = 0;
    int end = 0, end2 = 0;
    const int got = std::sscanf(c.c_str(), "%lld:%lld%n-%lld%n", &b, &l, &end, &l2, &end2);
    const size_t used = static_cast<size_t>(got == 3 ? end2 : end);
    if (got < 2 || used != c.size() || b < 1 || b > 65535 || l < 1 || (got == 3 && l2 < l)) {
      std::fprintf(stderr, "--decode: '%s' is not B:L or B:L-L2 (1 <= B <= 65535, 1 <= L <= L2)\n", c.c_str());
      return 2;
    }
    decode_cases.push_back({b, l, got == 3 ? l2 : 0});
  }
  if (!json_path.empty()) {
    g_json = std::fopen(json_path.c_str(), "w");
    if (g_json == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_device = prop.name;
  std::printf("device: %s, %d SMs; heads %lld/%lld, head_dim %lld; window %lld, sinks %s; KV blocks of %lld, %s\n",
              prop.name, prop.multiProcessorCount, static_cast<long long>(kHeads), static_cast<long long>(kKvHeads),
              static_cast<long long>(kHeadDim), static_cast<long long>(g_window), sinks ? "on" : "off",
              static_cast<long long>(g_block_size), g_shuffle_blocks ? "shuffled" : "in order");
  DeviceMem sink_logits(sinks ? kHeads * 4 : 0);
  if (sinks) {
    const std::vector<float> host(static_cast<size_t>(kHeads), 0.5f);
    BENCH_CHECK(cudaMemcpy(sink_logits.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    g_sink_logits = sink_logits.as<float>();
  }
  if (!decode_cases.empty()) {
    for (const DecodeCase& c : decode_cases)
      for (bool e4m3 : {false, true}) bench_decode(c.batch, c.keys, iters, e4m3, c.max_keys);
    if (g_json != nullptr) std::fclose(g_json);
    return 0;
  }
  int64_t hopper_v_block = 64;
  BENCH_CHECK(llmq::cuda_attention_v_block(kHeadDim, &hopper_v_block));
  const bool hopper_8bit = hopper_v_block == 128;  // the Hopper kernel runs: FP8 with V per channel too
  if (!only_8bit.empty()) {
    for (int64_t n : only_8bit)
      for (bool causal : {false, true})
        for (int mode : {0, 1, 2}) {  // full-INT8, FP8, FP8 with V per channel (Hopper only)
          if (mode == 2 && !hopper_8bit) continue;
          bench_quantized_attention(n, causal, iters, mode > 0, mode == 2);
        }
    for (int64_t n : only_8bit)  // beside them, BF16: the mma.sync kernel and (Hopper) the wgmma one
      for (bool causal : {false, true}) {
        bench_prefill(n, causal, llmq::attention::PrefillKernel::kAuto, iters);
        if (hopper_8bit) bench_bf16_sm90(n, causal, iters);
      }
    if (g_json != nullptr) std::fclose(g_json);
    return 0;
  }
  for (int64_t n : {2048, 4096, 8192})
    for (bool causal : {false, true}) {
      bench_prefill(n, causal, llmq::attention::PrefillKernel::kAuto, iters);
      bench_half_int8(n, causal, iters);
      bench_half_int8(n, causal, iters, 1);
      bench_half_int8(n, causal, iters, 2);
      bench_quantized_attention(n, causal, iters, false);
      bench_quantized_attention(n, causal, iters, true);
      if (hopper_8bit) bench_quantized_attention(n, causal, iters, true, true);
    }
  for (int64_t n : {2048, 8192, 32768})
    for (bool fp8 : {false, true}) bench_quantize(n, fp8, false, iters);
  bench_quantize(8192, false, true, iters);
  bench_prefill(2048, true, llmq::attention::PrefillKernel::kCudaCore, 3);
  for (int64_t n : {2048, 8192}) bench_prefill(n, true, llmq::attention::PrefillKernel::kAuto, iters, true);
  for (int64_t batch : {1, 8})
    for (int64_t kv : {1024, 8192, 32768}) {
      bench_decode(batch, kv, iters);
      bench_decode(batch, kv, iters, true);
    }
  if (g_json != nullptr) std::fclose(g_json);
  return 0;
}
