// The GPU runtime's MoE models against the CPU reference (runtime_compare.hpp): the sparse top-k
// path in FP8 (per-channel and block scales) and BF16, CUDA graphs against step-by-step decoding,
// and MoE checkpoints streamed to the device against the same model loaded on the host. SKIPPED
// without a GPU.
#include "runtime_compare.hpp"

namespace llmq {
namespace {

// A Mixtral-style model (8 experts, top-2; dim 256, expert hidden 512) in fp8-dynamic through the
// sparse top-k path: routing, grouped expert GEMMs and the combine, judged as every scheme is
// (check_scheme) against the CPU reference of the same quantized model. The decode steps of one or two
// rows take the decode-size grouped kernel; the 24-token prompt and a 160-token prefill the gather + wgmma
// kernel (on sm_90). Then greedy generation in CUDA graphs equals step-by-step decoding: the MoE
// block has no host sync, so it is captured like a dense layer.
TEST(GpuRuntime, MoeModelMatchesCpuReference) {
  LLMQ_REQUIRE_GPU();
  DefaultModelOptions opt;
  opt.hidden_dim = 512;
  opt.n_layers = 2;
  opt.n_experts = 8;
  opt.n_experts_per_token = 2;
  opt.seed = 3;
  const ModelWeights w = make_default_model(opt);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  QuantizedModel qm;
  Status st = quantize_model(w, scheme, nullptr, {}, &qm);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::unique_ptr<GpuModel> gm;
  st = GpuModel::from_quantized(qm, 0, &gm);
  ASSERT_TRUE(st.ok()) << st.to_string();
  QuantizedLinearBackend backend(qm);
  Transformer cpu(qm.weights, &backend);
  Transformer cpu_float(w);
  check_scheme(*gm, &cpu, &cpu_float, "moe 8x top-2 fp8-dynamic");
  {
    // 128x128 weight blocks and 1x128 activation blocks (the decode kernel in the decode steps).
    CudaDeviceInfo info;
    ASSERT_TRUE(query_cuda_device(0, &info).ok());
    Scheme block;
    ASSERT_TRUE(find_scheme("fp8-block", &block).ok());
    QuantizedModel qb;
    ASSERT_TRUE(quantize_model(w, block, nullptr, {}, &qb).ok());
    std::unique_ptr<GpuModel> gb;
    ASSERT_TRUE(GpuModel::from_quantized(qb, 0, &gb).ok());
    QuantizedLinearBackend block_backend(qb);
    Transformer cpu_block(qb.weights, &block_backend);
    check_scheme(*gb, &cpu_block, &cpu_float, "moe 8x top-2 fp8-block");
  }
  {
    // BF16 experts against the float model: BF16 rounding only, except rows whose routing flips.
    std::unique_ptr<GpuModel> bf16;
    ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &bf16).ok());
    RunLogits gpu;
    std::vector<RunLogits> ref;
    run_gpu_and_cpu(*bf16, {&cpu_float}, &gpu, &ref);
    if (::testing::Test::HasFatalFailure()) return;
    const Compare cmp = compare_runs(gpu, ref[0], w.config.vocab_size);
    std::printf("  moe 8x top-2 bf16 experts vs CPU float: worst rel %.2e rms rel %.2e (%lld rows > %.2f) top1 %lld/%lld\n",
                cmp.worst_rel, cmp.rms_rel(), static_cast<long long>(cmp.over_garbage_bound), kSchemeGarbageBound,
                static_cast<long long>(cmp.top1_agree), static_cast<long long>(cmp.rows));
    EXPECT_LE(cmp.rms_rel(), kFloatLogitRelTolerance);
    EXPECT_LE(cmp.over_garbage_bound, cmp.rows / 16);
  }

  // A long prefill: every position's logits.
  const int64_t n = 160, V = w.config.vocab_size;
  {
    GpuRuntimeOptions o;
    o.max_context = 256;
    o.max_step_tokens = 256;
    std::unique_ptr<GpuRuntime> rt;
    ASSERT_TRUE(GpuRuntime::create(*gm, o, &rt).ok());
    std::printf("  1 token:   %s\n", rt->describe_linears(1).back().c_str());
    // --fp8-fast-accum reaches the experts' wgmma GEMMs (the runner's option is the one switch).
    EXPECT_EQ(rt->describe_linears(256).back().find("fast accumulation"), std::string::npos);
    o.fp8_fast_accumulation = true;
    std::unique_ptr<GpuRuntime> fast;
    ASSERT_TRUE(GpuRuntime::create(*gm, o, &fast).ok());
    EXPECT_NE(fast->describe_linears(256).back().find("wgmma (fast accumulation) gate/up"), std::string::npos)
        << fast->describe_linears(256).back();
  }
  LongPrefill lp;
  long_prefill(*gm, &cpu, &cpu_float, n, "moe 8x top-2 fp8-dynamic", &lp);
  if (::testing::Test::HasFatalFailure()) return;
  const Compare &vs_ref = lp.vs_ref, &gpu_cost = lp.gpu_cost, &ref_cost = lp.ref_cost;
  // A token whose top-2 experts are near a tie may take the other expert on the GPU (its router
  // reads BF16 activations, the CPU's float): that row then differs as much as two experts do
  // (measured: 1 row of 160 at 0.91). A wrong scale, layout or permutation hits every row.
  EXPECT_LE(vs_ref.over_garbage_bound, n / 40) << "rows further than " << kSchemeGarbageBound << " from the CPU reference";
  EXPECT_LE(gpu_cost.rms_rel(), kSchemeAccuracyFactor * ref_cost.rms_rel() + kSchemeAccuracySlack);
  {
    // --fp8-fast-accum: the experts' wgmma GEMMs (MoeGroupedGemm::fast_accumulation) and the dense
    // FP8 GEMMs accumulate in the tensor core over all of K: held to the same bounds.
    LongPrefill fast;
    long_prefill(*gm, &cpu, &cpu_float, n, "moe 8x top-2 fp8-dynamic fast-accum", &fast, true);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(fast.vs_ref.over_garbage_bound, n / 40);
    EXPECT_LE(fast.gpu_cost.rms_rel(), kSchemeAccuracyFactor * fast.ref_cost.rms_rel() + kSchemeAccuracySlack);
  }

  // Graphs vs no graphs: the same greedy tokens.
  std::vector<std::vector<int32_t>> with_graphs, without;
  for (const bool graphs : {true, false}) {
    GpuRuntimeOptions go;
    go.max_batch = 2;
    go.max_context = 96;
    go.max_step_tokens = 32;
    go.cuda_graphs = graphs;
    std::unique_ptr<GpuRuntime> r;
    ASSERT_TRUE(GpuRuntime::create(*gm, go, &r).ok());
    std::vector<float> logits;
    ASSERT_TRUE(r->prefill({prompt(20, V, 21), prompt(9, V, 22)}, false, &logits).ok());
    SamplingOptions greedy;
    st = r->generate({5, 7}, 24, greedy, graphs ? &with_graphs : &without);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_EQ(with_graphs, without);
}

// An MoE checkpoint streamed to the device: unquantized (BF16 safetensors, quantized there under
// fp8-dynamic) and as llmq exports it quantized (compressed-tensors, read as stored), each against
// the same model quantized or loaded on the host and uploaded: identical logits. BF16 experts are
// refused with the reason.
TEST(GpuRuntime, MoeCheckpointStreamedEqualsHostLoaded) {
  LLMQ_REQUIRE_GPU();
  testing::TempDir tmp("llmq-gpu-moe-ckpt");
  DefaultModelOptions opt;
  opt.hidden_dim = 256;
  opt.n_layers = 2;
  opt.n_experts = 4;
  opt.n_experts_per_token = 2;
  const ModelWeights w = make_default_model(opt);
  const auto source = memory_weight_source(w);
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  const std::string float_dir = tmp.file("bf16"), quant_dir = tmp.file("fp8");
  ExportOptions eo;
  eo.unquantized = true;
  eo.keep_dtype = DType::kBF16;
  ExportSummary summary;
  Status st = export_quantized(*source, scheme, nullptr, float_dir, eo, &summary);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = export_quantized(*source, scheme, nullptr, quant_dir, {}, &summary);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<int32_t> p = prompt(20, w.config.vocab_size, 9);
  for (const bool stored : {false, true}) {
    SCOPED_TRACE(stored ? "REPRO quantized checkpoint" : "REPRO bf16 checkpoint under fp8-dynamic");
    std::unique_ptr<GpuModel> streamed, uploaded;
    st = GpuModel::from_checkpoint(stored ? quant_dir : float_dir, stored ? "checkpoint" : "fp8-dynamic", 0, &streamed);
    ASSERT_TRUE(st.ok()) << st.to_string();
    QuantizedModel qm;
    if (stored) {
      ASSERT_TRUE(load_quantized_checkpoint(quant_dir, &qm).ok());
    } else {
      ModelWeights host;
      ASSERT_TRUE(load_hf_model(float_dir, &host).ok());
      ASSERT_TRUE(quantize_model(host, scheme, nullptr, {}, &qm).ok());
    }
    st = GpuModel::from_quantized(qm, 0, &uploaded);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(streamed->weight_bytes(), uploaded->weight_bytes());
    const std::vector<float> a = prefill_logits(*streamed, p), b = prefill_logits(*uploaded, p);
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] == b[i] ? 0 : 1;
    std::printf("  moe %s checkpoint: streamed vs host-loaded logits: %zu of %zu differ\n", stored ? "fp8" : "bf16",
                differ, a.size());
    EXPECT_EQ(differ, 0u);
  }
  {
    // Block-scaled experts quantized on the device vs on the host (128x128 weight blocks).
    Scheme block;
    ASSERT_TRUE(find_scheme("fp8-block", &block).ok());
    std::unique_ptr<GpuModel> streamed, uploaded;
    st = GpuModel::from_checkpoint(float_dir, "fp8-block", 0, &streamed);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ModelWeights host;
    ASSERT_TRUE(load_hf_model(float_dir, &host).ok());
    QuantizedModel qm;
    ASSERT_TRUE(quantize_model(host, block, nullptr, {}, &qm).ok());
    st = GpuModel::from_quantized(qm, 0, &uploaded);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const std::vector<float> a = prefill_logits(*streamed, p), b = prefill_logits(*uploaded, p);
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] == b[i] ? 0 : 1;
    std::printf("  moe bf16 checkpoint under fp8-block: streamed vs host-loaded logits: %zu of %zu differ\n", differ, a.size());
    EXPECT_EQ(differ, 0u);
  }
  // BF16 experts: the checkpoint as stored vs the host-loaded float model uploaded as BF16.
  std::unique_ptr<GpuModel> streamed, uploaded;
  st = GpuModel::from_checkpoint(float_dir, "bf16", 0, &streamed);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ModelWeights host;
  ASSERT_TRUE(load_hf_model(float_dir, &host).ok());
  st = GpuModel::from_float(host, DType::kBF16, 0, &uploaded);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const std::vector<float> a = prefill_logits(*streamed, p), b = prefill_logits(*uploaded, p);
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] == b[i] ? 0 : 1;
  std::printf("  moe bf16 checkpoint as bf16: streamed vs host-loaded logits: %zu of %zu differ\n", differ, a.size());
  EXPECT_EQ(differ, 0u);
  std::unique_ptr<GpuModel> f32;
  st = GpuModel::from_float(host, DType::kF32, 0, &f32);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("F32"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace llmq
