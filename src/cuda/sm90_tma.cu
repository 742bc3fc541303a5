// Host side of src/cuda/sm90_tma.cuh: cuTensorMapEncodeTiled, reached through the runtime's
// driver entry point once per process, so that the library does not link libcuda itself.
#include "cuda/sm90_tma.cuh"

#include <string>

#include "cuda/cuda_check.cuh"

namespace llmq::int8_gemm {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

struct EncoderLookup {
  EncodeTiledFn fn = nullptr;
  Status status;
};

EncoderLookup lookup_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  // Version 12000: the ABI of cuTensorMapEncodeTiled as introduced in CUDA 12.0 (unchanged since).
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &query);
  if (err != cudaSuccess)
    return {nullptr, detail::cuda_status(err, "cudaGetDriverEntryPointByVersion")};
  if (query != cudaDriverEntryPointSuccess || fn == nullptr)
    return {nullptr, unsupported("the CUDA driver has no cuTensorMapEncodeTiled (driver older than 12.0?)")};
  return {reinterpret_cast<EncodeTiledFn>(fn), Status()};
}

}  // namespace

Status encode_int8_tensor_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols,
                              uint32_t box_rows, uint32_t box_cols) {
  return encode_u8_tensor_map(map, data, rows, cols, cols, box_rows, box_cols, 128);
}

Status encode_u8_tensor_map(CUtensorMap* map, const void* data, int64_t rows, int64_t cols, int64_t row_stride,
                            uint32_t box_rows, uint32_t box_cols, int swizzle_bytes) {
  static const EncoderLookup encoder = lookup_encoder();  // thread-safe, once per process
  LLMQ_RETURN_IF_ERROR(encoder.status);
  if (swizzle_bytes != 64 && swizzle_bytes != 128)
    return invalid_argument("encode_u8_tensor_map: swizzle must be 64 or 128 bytes");
  // Dimension 0 is the contiguous one (columns, i.e. K); strides are given for dimensions >= 1.
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride)};  // bytes per row
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult res = encoder.fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims,
                                  strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    return {StatusCode::kCudaError, "cuTensorMapEncodeTiled failed with CUresult " +
                                        std::to_string(static_cast<int>(res)) + " for an int8 [" +
                                        std::to_string(rows) + ", " + std::to_string(cols) +
                                        "] matrix in boxes of [" + std::to_string(box_rows) + ", " +
                                        std::to_string(box_cols) + "]"};
  return {};
}

}  // namespace llmq::int8_gemm
