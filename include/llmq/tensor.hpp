// TensorView (non-owning: pointer, dtype, int64_t shape and strides, device) and Tensor (an owning
// host buffer). Strides count elements; an INT4 tensor must be contiguous (two per byte).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/dtype.hpp"
#include "llmq/status.hpp"

namespace llmq {

enum class Device { kCpu, kCuda };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty means contiguous row-major
  Device device = Device::kCpu;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  int64_t stride(int64_t dim) const;  // resolves empty strides to row-major
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[4, 19] (cpu)"
};

// View of a 2-D matrix [rows, cols] (rank 1 is read as [1, n]; higher ranks are flattened into
// rows when the leading dimensions are contiguous). `name` appears in the error.
struct MatrixView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements
  int64_t col_stride = 1;  // elements
};
Status as_matrix(const TensorView& view, const char* name, MatrixView* out);

// Read element (r, c) of a high-precision matrix (F32, F64, BF16, F16) as float / double.
float load_float(const MatrixView& m, int64_t r, int64_t c);

// An owning, contiguous host tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;  // 0 for a default-constructed tensor (which holds nothing, not a scalar)
  bool empty() const { return numel() == 0; }
  int64_t nbytes() const { return static_cast<int64_t>(storage_.size()); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  template <typename T> T* data_as() { return reinterpret_cast<T*>(storage_.data()); }
  template <typename T> const T* data_as() const {
    return reinterpret_cast<const T*>(storage_.data());
  }
  TensorView view();
  TensorView view() const;  // data pointer is const-cast; do not write through it

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> storage_;
  bool allocated_ = false;  // false: default-constructed; shape [] then means "no tensor"
};

// Convenience: wrap a float vector as a 2-D view.
// "[4096, 14336]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

TensorView matrix_view(float* data, int64_t rows, int64_t cols);
TensorView matrix_view(const float* data, int64_t rows, int64_t cols);

}  // namespace llmq
