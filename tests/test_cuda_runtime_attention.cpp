// The GPU runtime's 8-bit prefill attention (GpuRuntimeOptions::prefill_attention: half-INT8, INT8,
// FP8) against the CPU reference computing its attention by the same specification
// (Transformer::set_attention_options): judged like the 8-bit weight schemes (runtime_compare.hpp),
// the GPU model must be about as close to the float model as the specification is, and no row may be
// garbage. Seeded default models with head_dim 64 and 128 (the kernels' sizes: 128 takes the Hopper
// kernel on sm_90), one prompt prefilled in chunks so that later chunks attend over a cached prefix.
// Skips visibly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model.hpp"
#include "llmq/quant_attention.hpp"
#include "llmq/transformer.hpp"
#include "runtime_compare.hpp"

namespace llmq {
namespace {

constexpr int64_t kPrompt = 150;  // three 64-key tiles; chunks of kChunk queries
constexpr int64_t kChunk = 64;

ModelWeights model_with_head_dim(int64_t head_dim, int64_t max_seq_len = 256) {
  DefaultModelOptions o;
  o.dim = 256;
  o.n_heads = o.dim / head_dim;
  o.n_kv_heads = o.n_heads / 2;
  o.n_layers = 2;
  o.max_seq_len = max_seq_len;
  return make_default_model(o);
}

std::vector<float> gpu_prefill(const GpuModel& gm, AttentionVariant attention, const std::vector<int32_t>& p) {
  GpuRuntimeOptions o;
  o.max_context = kPrompt;
  o.max_step_tokens = kChunk;
  o.prefill_attention = attention;
  std::unique_ptr<GpuRuntime> rt;
  Status st = GpuRuntime::create(gm, o, &rt);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::vector<float> out;
  if (!st.ok()) return out;
  st = rt->prefill({p}, true, &out);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

std::vector<float> cpu_prefill(const ModelWeights& w, AttentionVariant attention, const std::vector<int32_t>& p) {
  Transformer t(w);
  t.set_attention_options(kernel_attention_options(attention));
  std::vector<float> out(static_cast<size_t>(kPrompt * w.config.vocab_size));
  EXPECT_TRUE(t.forward(p.data(), kPrompt, 0, out.data()).ok());
  return out;
}

TEST(GpuRuntimeAttention, EightBitPrefillAsAccurateAsTheSpecification) {
  LLMQ_REQUIRE_GPU();
  for (int64_t hd : {64, 128}) {
    const ModelWeights w = model_with_head_dim(hd);
    const int64_t vocab = w.config.vocab_size;
    std::unique_ptr<GpuModel> gm;
    ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &gm).ok());
    const std::vector<int32_t> p = prompt(kPrompt, vocab, 11);
    const std::vector<float> cpu_float = cpu_prefill(w, AttentionVariant::kFloat, p);
    const std::vector<float> gpu_bf16 = gpu_prefill(*gm, AttentionVariant::kBf16, p);
    Compare bf16_cost;
    compare_rows(gpu_bf16, cpu_float, vocab, &bf16_cost);
    for (AttentionVariant v : {AttentionVariant::kHalfInt8, AttentionVariant::kFullInt8, AttentionVariant::kFp8}) {
      SCOPED_TRACE("head_dim " + std::to_string(hd) + " " + attention_variant_name(v));
      const std::vector<float> gpu = gpu_prefill(*gm, v, p);
      const std::vector<float> spec = cpu_prefill(w, v, p);
      Compare gpu_cost, spec_cost, gpu_vs_spec;
      compare_rows(gpu, cpu_float, vocab, &gpu_cost);
      compare_rows(spec, cpu_float, vocab, &spec_cost);
      compare_rows(gpu, spec, vocab, &gpu_vs_spec);
      std::printf("  head_dim %lld %-9s: RMS rel distance from float: GPU %.4f, CPU spec %.4f, GPU BF16 attention %.4f; "
                  "GPU vs spec worst %.4f, top-1 %lld / %lld\n",
                  static_cast<long long>(hd), attention_variant_name(v), gpu_cost.rms_rel(), spec_cost.rms_rel(),
                  bf16_cost.rms_rel(), gpu_vs_spec.worst_rel, static_cast<long long>(gpu_vs_spec.top1_agree),
                  static_cast<long long>(gpu_vs_spec.rows));
      // The GPU adds BF16 activations on top of the specification's 8-bit attention.
      EXPECT_LT(gpu_cost.rms_rel(), kSchemeAccuracyFactor * (spec_cost.rms_rel() + bf16_cost.rms_rel()) + kSchemeAccuracySlack);
      // Row by row the GPU and the specification part further than the 8-bit weight schemes do
      // on these outlier-heavy models (measured on the H100: worst row 0.39 at head_dim 64, 0.90-0.93
      // at 128, RMS as above), from BF16 activations flipping 8-bit codes of Q, K and V: allow a
      // few such rows, not a pattern (a wrong layout or scale puts every row past the bound).
      EXPECT_LE(gpu_vs_spec.over_garbage_bound, gpu_vs_spec.rows / 50);
      EXPECT_GE(gpu_vs_spec.top1_agree, kMinTop1Agreement * static_cast<double>(gpu_vs_spec.rows));
    }
  }
}

// BF16 prefill of long prompts on Hopper takes the wgmma kernel (attention/bf16_prefill_attention.hpp:
// a step whose sequences' queries, weighted by keys, average >= 256, head_dim 128), one prompt or
// several in one step, over a BF16 or an E4M3 cache; prefilled in steps of 128 tokens the same
// prompts take the batched mma.sync kernel. The two runs' logits agree to BF16 attention's rounding,
// and both stay as close to the float model as BF16 attention is. (Elsewhere both runs take the
// mma.sync kernel: the comparison then holds trivially.)
void check_whole_against_chunked(const std::vector<int64_t>& lengths, DType kv_cache) {
  int64_t total = 0, longest = 0;
  for (int64_t n : lengths) total += n, longest = std::max(longest, n);
  SCOPED_TRACE(std::to_string(lengths.size()) + " prompts, " + std::to_string(total) + " tokens, " + dtype_name(kv_cache) +
               " cache");
  const ModelWeights w = model_with_head_dim(128, 1024);
  const int64_t vocab = w.config.vocab_size;
  std::unique_ptr<GpuModel> gm;
  ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &gm).ok());
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(prompt(lengths[i], vocab, 17 + i));
  const auto run = [&](int64_t chunk) {
    GpuRuntimeOptions o;
    o.max_context = longest;
    o.max_batch = static_cast<int64_t>(lengths.size());
    o.max_step_tokens = chunk;
    o.kv_cache_dtype = kv_cache;
    std::unique_ptr<GpuRuntime> rt;
    std::vector<float> out;
    const Status st = GpuRuntime::create(*gm, o, &rt);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (st.ok()) {
      const Status sp = rt->prefill(prompts, true, &out);
      EXPECT_TRUE(sp.ok()) << sp.to_string();
    }
    return out;
  };
  const std::vector<float> whole = run(total), chunked = run(128);
  // The float model, prompt by prompt (rows in sequence order, as prefill returns them).
  Transformer t(w);
  std::vector<float> cpu;
  for (const std::vector<int32_t>& p : prompts) {
    std::vector<float> rows(p.size() * static_cast<size_t>(vocab));
    ASSERT_TRUE(t.forward(p.data(), static_cast<int64_t>(p.size()), 0, rows.data()).ok());
    cpu.insert(cpu.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(whole.size(), cpu.size());
  ASSERT_EQ(chunked.size(), cpu.size());
  Compare between, whole_cost, chunked_cost;
  compare_rows(whole, chunked, vocab, &between);
  compare_rows(whole, cpu, vocab, &whole_cost);
  compare_rows(chunked, cpu, vocab, &chunked_cost);
  std::printf("  BF16 prefill of %zu prompts (%lld tokens, %s cache): whole vs chunked RMS rel %.4f (worst %.4f, top-1 %lld / "
              "%lld); from float: whole %.4f, chunked %.4f\n",
              lengths.size(), static_cast<long long>(total), dtype_name(kv_cache), between.rms_rel(), between.worst_rel,
              static_cast<long long>(between.top1_agree), static_cast<long long>(between.rows), whole_cost.rms_rel(),
              chunked_cost.rms_rel());
  EXPECT_LT(whole_cost.rms_rel(), 1.25 * chunked_cost.rms_rel() + 1e-3);
  EXPECT_LT(between.rms_rel(), chunked_cost.rms_rel());
  EXPECT_GE(between.top1_agree, kMinTop1Agreement * static_cast<double>(between.rows));
}

TEST(GpuRuntimeAttention, LongBf16PrefillMatchesChunkedPrefill) {
  LLMQ_REQUIRE_GPU();
  check_whole_against_chunked({320}, DType::kBF16);
}

// Several prompts in one step (the serving engine's prefill chunks): one gather and one launch for
// all of them, keys packed at multiples of 128; a short prompt rides along; more sequences than one
// launch takes. And an E4M3 cache, whose codes the gather widens and whose scales fold into the
// kernel.
TEST(GpuRuntimeAttention, BatchedBf16PrefillMatchesChunkedPrefill) {
  LLMQ_REQUIRE_GPU();
  check_whole_against_chunked({300, 520, 260, 40}, DType::kBF16);
  check_whole_against_chunked({300, 520, 260, 40}, DType::kE4M3);
  check_whole_against_chunked({700}, DType::kE4M3);
  // 66 prompts: more than one launch's table (64) takes.
  check_whole_against_chunked(std::vector<int64_t>(66, 256), DType::kBF16);
}

TEST(GpuRuntimeAttention, RefusesWhatTheKernelsCannotTake) {
  LLMQ_REQUIRE_GPU();
  {
    const ModelWeights w = model_with_head_dim(32);  // head_dim 32: not a kernel size
    std::unique_ptr<GpuModel> gm;
    ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &gm).ok());
    GpuRuntimeOptions o;
    o.max_context = 64;
    o.prefill_attention = AttentionVariant::kFullInt8;
    std::unique_ptr<GpuRuntime> rt;
    const Status st = GpuRuntime::create(*gm, o, &rt);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    EXPECT_NE(st.message().find("head_dim"), std::string::npos) << st.to_string();
  }
  {
    const ModelWeights w = model_with_head_dim(64);
    std::unique_ptr<GpuModel> gm;
    ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &gm).ok());
    GpuRuntimeOptions o;
    o.max_context = 64;
    o.kv_cache_dtype = DType::kE4M3;
    o.prefill_attention = AttentionVariant::kFp8;
    std::unique_ptr<GpuRuntime> rt;
    const Status st = GpuRuntime::create(*gm, o, &rt);
    EXPECT_NE(st.message().find("--kv-cache bf16"), std::string::npos) << st.to_string();
  }
}

}  // namespace
}  // namespace llmq
