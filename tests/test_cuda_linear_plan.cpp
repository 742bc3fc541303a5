// The runtime's linear plans (src/runtime/linear.cu), host only: which rows of a step the decode
// GEMM takes. The decode-sized class ends where the decode GEMM stops beating cuBLASLt for the
// linear's operands (decode_gemm_preferred_max_tokens): every M up to it runs the decode GEMM in one
// call, whatever the runtime's largest step, and no M past it does; past it the decode GEMM runs in
// chunks of the class's rows only where the CUDA-core kernel is the only other choice. Planning touches no
// device (the decode GEMM's and the INT8 GEMM's can_implement are host checks; without a cuBLASLt
// runner its paths are never offered), so this runs on machines without a GPU too.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "llmq/cuda_decode_gemm.hpp"
#include "runtime/linear.hpp"

namespace llmq::runtime {
namespace {

GpuLinear linear_of(DType w_dtype, ActQuant act, DType act_dtype) {
  GpuLinear l;
  l.name = "layers.0.o";
  l.n = 4096;
  l.k = 4096;
  l.act = act;
  l.act_dtype = act_dtype;
  LinearPart part;
  part.n = l.n;
  part.w_dtype = w_dtype;
  part.scale_kind = w_dtype == DType::kBF16 ? WeightScale::kNone : WeightScale::kChannel;
  l.parts.push_back(std::move(part));
  return l;
}

TEST(LinearPlan, TheDecodeGemmTakesExactlyTheRowsItIsPreferredFor) {
  LinearContext ctx;  // no cuBLASLt runner; an sm_90 device's FP8
  ctx.sm_major = 9;
  ctx.sm_minor = 0;
  struct Case {
    const char* what;
    DType w;
    ActQuant act;
    DType a;
    int64_t decode_rows;  // 0: never the decode GEMM
    int64_t class_rows;
    bool chunks_past;     // past decode_rows: the decode GEMM in chunks
  };
  const Case cases[] = {
      {"W8A8 E4M3 per token", DType::kE4M3, ActQuant::kPerToken, DType::kE4M3, 8, 8, true},
      {"W8A8 E4M3 static tensor", DType::kE4M3, ActQuant::kStaticTensor, DType::kE4M3, 8, 8, true},
      {"W8A8 INT8 per token", DType::kI8, ActQuant::kPerToken, DType::kI8, 32, 32, false},
      {"W8A16 E4M3", DType::kE4M3, ActQuant::kNone, DType::kBF16, 16, 16, true},
      {"W8A16 INT8", DType::kI8, ActQuant::kNone, DType::kBF16, 16, 16, true},
      {"BF16", DType::kBF16, ActQuant::kNone, DType::kBF16, 0, 16, false},
  };
  for (const Case& c : cases) {
    const GpuLinear l = linear_of(c.w, c.act, c.a);
    EXPECT_EQ(decode_gemm_preferred_max_tokens(c.a, c.w), c.class_rows) << c.what;
    for (int64_t max_rows : {int64_t{8}, c.class_rows, c.class_rows + 6, int64_t{64}}) {
      const LinearPlan plan = plan_linear(l, max_rows, LinearOut::kBF16, l.n, ctx);
      EXPECT_EQ(plan.small_max_rows, c.class_rows) << c.what;
      for (int64_t m = 1; m <= max_rows; ++m) {
        const std::string path = linear_path(l, plan, m);
        const bool whole = path.rfind("decode-gemm ", 0) == 0 && path.find("chunks") == std::string::npos;
        const bool chunks = path.rfind("decode-gemm in row chunks", 0) == 0;
        EXPECT_EQ(whole, m <= c.decode_rows) << c.what << ", a runtime of " << max_rows << " rows, M = " << m << ": " << path;
        // Past its class the decode GEMM runs in chunks only where nothing but the CUDA-core kernel
        // would: W8A16 always; here also E4M3 W8A8, whose cuBLASLt GEMM needs the runner this test
        // does not make; INT8 W8A8 has llmq's INT8 GEMM.
        EXPECT_EQ(chunks, m > c.decode_rows && c.chunks_past) << c.what << ", M = " << m << ": " << path;
      }
    }
  }
}

}  // namespace
}  // namespace llmq::runtime
