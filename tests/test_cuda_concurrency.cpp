// Concurrent use of one GPU from one process (issue 11): several host threads, each with its own
// GpuRuntime over one shared GpuModel, prefilling and decoding at once, must get the logits a
// single thread gets, bit for bit (the library's process-wide caches of device facts, cuBLASLt
// handles and kernel attributes are filled on first use, possibly from two threads at once).
// Separate processes are separate CUDA contexts; what they could share is files, which the
// quantize's locked staging directory covers (docs/reliability.md). SKIPPED without a GPU.
#include <thread>

#include "runtime_compare.hpp"

namespace llmq {
namespace {

// Logits of a prefill of `tokens` and then `steps` greedy decode steps (the argmax fed back).
Status run_sequence(const GpuModel& gm, const std::vector<int32_t>& tokens, int steps, std::vector<float>* out) {
  GpuRuntimeOptions o;
  o.max_context = 256;
  o.max_step_tokens = 128;
  std::unique_ptr<GpuRuntime> rt;
  LLMQ_RETURN_IF_ERROR(GpuRuntime::create(gm, o, &rt));
  std::vector<float> logits;
  LLMQ_RETURN_IF_ERROR(rt->prefill({tokens}, false, &logits));
  out->assign(logits.begin(), logits.end());
  for (int s = 0; s < steps; ++s) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    LLMQ_RETURN_IF_ERROR(rt->decode({next}, &logits));
    out->insert(out->end(), logits.begin(), logits.end());
  }
  return {};
}

// kThreads threads at once, three rounds, against each sequence run alone.
void check_threads(const GpuModel& gm, int64_t vocab) {
  constexpr int kThreads = 4, kSteps = 6;
  std::vector<std::vector<int32_t>> prompts(kThreads);
  std::mt19937_64 rng(42);
  for (int i = 0; i < kThreads; ++i)
    for (int t = 0; t < 40 + 17 * i; ++t) prompts[i].push_back(static_cast<int32_t>(rng() % vocab));
  std::vector<std::vector<float>> alone(kThreads), together(kThreads);
  for (int i = 0; i < kThreads; ++i) ASSERT_TRUE(run_sequence(gm, prompts[i], kSteps, &alone[i]).ok());
  for (int round = 0; round < 3; ++round) {
    std::vector<Status> st(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] { st[i] = run_sequence(gm, prompts[i], kSteps, &together[i]); });
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) {
      ASSERT_TRUE(st[i].ok()) << "thread " << i << ": " << st[i].to_string();
      ASSERT_EQ(together[i].size(), alone[i].size());
      int64_t differ = 0;
      for (size_t j = 0; j < alone[i].size(); ++j) differ += together[i][j] != alone[i][j];
      EXPECT_EQ(differ, 0) << "round " << round << ", thread " << i << ": " << differ << " of " << alone[i].size()
                           << " logits differ from the same sequence run alone";
    }
  }
  std::printf("  %d threads x 3 rounds, prefill %zu..%zu tokens + %d decode steps each: logits equal\n", kThreads,
              prompts.front().size(), prompts.back().size(), kSteps);
}

TEST(GpuConcurrency, ThreadsSharingAModelGetTheSingleThreadLogits) {
  LLMQ_REQUIRE_GPU();
  const ModelWeights w = make_default_model();
  // BF16 linears (cuBLASLt) and FP8 ones (llmq's GEMM and decode kernels).
  std::unique_ptr<GpuModel> bf16, fp8;
  ASSERT_TRUE(GpuModel::from_float(w, DType::kBF16, 0, &bf16).ok());
  ASSERT_TRUE(GpuModel::synthetic(w.config, "fp8-dynamic", 7, 0, &fp8).ok());
  for (const GpuModel* gm : {bf16.get(), fp8.get()}) check_threads(*gm, w.config.vocab_size);
}

}  // namespace
}  // namespace llmq
