// The decode-size grouped expert GEMM (MoeGemmKernel::kDecode). Its kernel is the decode GEMM's
// (src/cuda/decode_gemm.cu) run in grouped mode (cuda/decode_gemm_grouped.hpp; moe_decode_gemm.cu): the grid gains a slice per
// (expert, 16-row chunk) and each CTA reads its expert's row range before touching anything, so
// only routed experts' weights are streamed. Internal; no CUDA headers.
#pragma once

#include "llmq/cuda_moe.hpp"

namespace llmq::moe {

Status decode_grouped_gemm(const MoeGroupedGemm& g, CudaStream stream);

}  // namespace llmq::moe
