// RAII owners of cuBLASLt objects (handle, matmul descriptor, matrix layout, preference), in the
// style of FlashInfer's bmm_fp8: each destroys its object exactly once, moves but never copies,
// and is made by a create_* function that returns a Status instead of throwing. Attribute setters
// are typed so that the size passed to cuBLASLt is always sizeof the value. CUDA sources only.
#pragma once

#include <cublasLt.h>

#include <utility>

#include "cuda/cublas_check.cuh"

namespace llmq::detail {

// Owns one cuBLASLt object of pointer type T, destroyed with `destroy`. A destroy status cannot be
// reported from a destructor; it fails only for an invalid object, which this class never holds.
template <typename T, cublasStatus_t (*destroy)(T)>
class LtObject {
 public:
  LtObject() = default;
  explicit LtObject(T raw) : raw_(raw) {}
  ~LtObject() { reset(); }
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  LtObject(LtObject&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  LtObject& operator=(LtObject&& other) noexcept {
    if (this != &other) {
      reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  T get() const { return raw_; }
  explicit operator bool() const { return raw_ != nullptr; }
  void reset() {
    if (raw_ != nullptr) (void)destroy(raw_);
    raw_ = nullptr;
  }

 private:
  T raw_ = nullptr;
};

using LtHandle = LtObject<cublasLtHandle_t, cublasLtDestroy>;
using LtMatmulDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtMatrixLayout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

inline Status create_lt_handle(LtHandle* out) {
  cublasLtHandle_t raw = nullptr;
  LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&raw));
  *out = LtHandle(raw);
  return {};
}

inline Status create_matmul_desc(cublasComputeType_t compute, cudaDataType_t scale_type,
                                 LtMatmulDesc* out) {
  cublasLtMatmulDesc_t raw = nullptr;
  LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw, compute, scale_type));
  *out = LtMatmulDesc(raw);
  return {};
}

// A column-major rows x cols matrix with leading dimension ld, optionally a strided batch.
inline Status create_matrix_layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                                   int32_t batch, int64_t batch_stride, LtMatrixLayout* out) {
  cublasLtMatrixLayout_t raw = nullptr;
  LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&raw, type, rows, cols, ld));
  LtMatrixLayout layout(raw);  // owns it from here, also on the error paths below
  if (batch > 1) {
    LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  *out = std::move(layout);
  return {};
}

inline Status create_preference(LtPreference* out) {
  cublasLtMatmulPreference_t raw = nullptr;
  LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw));
  *out = LtPreference(raw);
  return {};
}

template <typename V>
Status set_desc_attribute(const LtMatmulDesc& desc, cublasLtMatmulDescAttributes_t attr,
                          const V& value) {
  LLMQ_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc.get(), attr, &value, sizeof(V)));
  return {};
}

template <typename V>
Status set_preference_attribute(const LtPreference& pref, cublasLtMatmulPreferenceAttributes_t attr,
                                const V& value) {
  LLMQ_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(V)));
  return {};
}

}  // namespace llmq::detail
