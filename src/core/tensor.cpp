// TensorView / Tensor helpers and element loads of high-precision matrices.
#include "llmq/tensor.hpp"

#include <cstring>
#include <sstream>

#include "llmq/format.hpp"

namespace llmq {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::stride(int64_t dim) const {
  if (!strides.empty()) return strides[dim];
  int64_t s = 1;
  for (int64_t d = rank() - 1; d > dim; --d) s *= shape[d];
  return s;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int64_t d = rank() - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride(d) != expect) return false;
    expect *= shape[d];
  }
  return true;
}

std::string TensorView::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "] (" << (device == Device::kCpu ? "cpu" : "cuda") << ")";
  return os.str();
}

Status as_matrix(const TensorView& view, const char* name, MatrixView* out) {
  if (view.data == nullptr && view.numel() != 0)
    return invalid_argument(std::string(name) + ": data pointer is null");
  if (view.rank() < 1) return invalid_argument(std::string(name) + ": tensor has rank 0");
  if (!view.strides.empty() && view.strides.size() != view.shape.size())
    return invalid_argument(std::string(name) + ": strides and shape differ in rank");
  for (int64_t d : view.shape)
    if (d < 0) return invalid_argument(std::string(name) + ": negative extent in " + view.describe());
  if (view.device != Device::kCpu)
    return invalid_argument(std::string(name) + ": the CPU reference needs a host tensor, got " +
                            view.describe());
  MatrixView m;
  m.data = view.data;
  m.dtype = view.dtype;
  const int64_t r = view.rank();
  m.cols = view.shape[r - 1];
  m.col_stride = view.stride(r - 1);
  if (r == 1) {
    m.rows = 1;
    m.row_stride = m.cols * m.col_stride;
  } else {
    // Leading dimensions must collapse into one: stride(d) == stride(d + 1) * shape(d + 1).
    m.rows = 1;
    for (int64_t d = 0; d < r - 1; ++d) m.rows *= view.shape[d];
    m.row_stride = view.stride(r - 2);
    for (int64_t d = 0; d + 1 < r - 1; ++d)
      if (view.shape[d] != 1 && view.stride(d) != view.stride(d + 1) * view.shape[d + 1])
        return invalid_argument(std::string(name) + ": leading dimensions of " + view.describe() +
                                " cannot be flattened into rows");
  }
  if (view.dtype == DType::kI4 && !view.is_contiguous())
    return invalid_argument(std::string(name) + ": an int4 tensor must be contiguous");
  *out = m;
  return {};
}

float load_float(const MatrixView& m, int64_t r, int64_t c) {
  const int64_t i = r * m.row_stride + c * m.col_stride;
  switch (m.dtype) {
    case DType::kF32: return static_cast<const float*>(m.data)[i];
    case DType::kF64: return static_cast<float>(static_cast<const double*>(m.data)[i]);
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(m.data)[i]);
    case DType::kF16: return fp16_bits_to_float(static_cast<const uint16_t*>(m.data)[i]);
    default: return 0.0f;  // callers check is_high_precision first
  }
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)), allocated_(true) {
  storage_.assign(static_cast<size_t>(dtype_storage_bytes(dtype_, numel())), 0);
}

int64_t Tensor::numel() const {
  if (!allocated_) return 0;
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

TensorView Tensor::view() {
  TensorView v;
  v.data = storage_.data();
  v.dtype = dtype_;
  v.shape = shape_;
  return v;
}

TensorView Tensor::view() const {
  TensorView v;
  v.data = const_cast<uint8_t*>(storage_.data());
  v.dtype = dtype_;
  v.shape = shape_;
  return v;
}

TensorView matrix_view(float* data, int64_t rows, int64_t cols) {
  TensorView v;
  v.data = data;
  v.dtype = DType::kF32;
  v.shape = {rows, cols};
  return v;
}

TensorView matrix_view(const float* data, int64_t rows, int64_t cols) {
  return matrix_view(const_cast<float*>(data), rows, cols);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace llmq
