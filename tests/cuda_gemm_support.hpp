// Helpers shared by the GPU tests of the cuBLASLt GEMM runner (test_cuda_fp8_gemm.cu: exact and
// realistic numerics; test_cuda_fp8_gemm_plumbing.cu: scale layouts, strided batches, the plan
// cache, output strides, BF16 x BF16, can_implement): device buffers and copies, NaN-poisoned
// outputs, grid operands per scale mode, the CPU reference on the same quantized operands, and the
// fixture (a runner, a stream, a workspace).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/int_math.hpp"
#include "cuda_support.hpp"
#include "llmq/cuda_gemm.hpp"
#include "llmq/format.hpp"
#include "llmq/gemm.hpp"
#include "llmq/quantize_tensor.hpp"
#include "support.hpp"

namespace llmq {
namespace cuda_gemm_test {

// Relative Frobenius error of the GPU output against the CPU reference on the same quantized
// operands. Both accumulate exact FP8 products in FP32 but in different orders (and Hopper's FP8
// MMA keeps fewer accumulator bits between cuBLASLt's FP32 promotions); a BF16 output adds one
// rounding of 2^-9 relative on either side. Measured errors are printed; a wrong scale, block or
// stride gives errors of 1e-1 and up.
constexpr double kRelFrobError = 1e-2;

constexpr int64_t kWorkspaceBytes = int64_t{64} << 20;  // cuBLASLt's 32 MiB plus scale scratch

// ---------------------------------------------------------------------------------------------
// Device memory and copies

inline std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << bytes << "): " << cuda_text(e);
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

inline DeviceBuffer upload(const void* host, size_t bytes) {
  DeviceBuffer d(bytes);
  if (bytes > 0 && d.get() != nullptr) {
    const cudaError_t e = cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice);
    EXPECT_EQ(e, cudaSuccess) << "upload: " << cuda_text(e);
  }
  return d;
}
template <typename T> DeviceBuffer upload(const std::vector<T>& v) {
  return upload(v.data(), v.size() * sizeof(T));
}

inline std::vector<uint8_t> download(const DeviceBuffer& d) {
  std::vector<uint8_t> host(d.bytes());
  const cudaError_t e = cudaMemcpy(host.data(), d.get(), d.bytes(), cudaMemcpyDeviceToHost);
  EXPECT_EQ(e, cudaSuccess) << "download: " << cuda_text(e);
  return host;
}

// 0xFF bytes: NaN in BF16 (0xFFFF) and FP32 (0xFFFFFFFF). Every element the GEMM writes loses it.
inline DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer d(bytes);
  const cudaError_t e = cudaMemset(d.get(), 0xFF, bytes);
  EXPECT_EQ(e, cudaSuccess) << "poison: " << cuda_text(e);
  return d;
}

// Element i of an output (BF16 or F32 bytes) as float.
inline float output_value(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
  if (dtype == DType::kBF16) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    return bf16_bits_to_float(bits);
  }
  float v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

inline uint32_t output_bits(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
  uint32_t bits = 0;
  const size_t eb = dtype == DType::kBF16 ? 2 : 4;
  std::memcpy(&bits, bytes.data() + eb * i, eb);
  return bits;
}

inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16_bits(x[i]);
  return b;
}

// Biases on the BF16 grid, so the reference (float32 bias) and cuBLASLt (BF16 bias) add the same.
inline std::vector<float> bf16_grid_bias(int64_t n, uint64_t seed) {
  std::vector<float> b = testing::normal_vector(n, seed, 2.0f);
  for (float& v : b) v = bf16_bits_to_float(float_to_bf16_bits(v));
  return b;
}

// ---------------------------------------------------------------------------------------------
// Operands

inline BlockShape block_of(GemmScaleMode mode, int64_t rows, int64_t k) {
  switch (mode) {
    case GemmScaleMode::kTensor: return {rows, k};
    case GemmScaleMode::kOuterVector: return {1, k};
    case GemmScaleMode::kBlock1x128: return {1, 128};
    case GemmScaleMode::kBlock128x128: return {128, 128};
  }
  return {rows, k};
}

inline QuantSpec spec_of(GemmScaleMode mode, DType format, bool is_weight) {
  switch (mode) {
    case GemmScaleMode::kTensor: return QuantSpec::per_tensor(format);
    case GemmScaleMode::kOuterVector:
      return is_weight ? QuantSpec::per_channel(format) : QuantSpec::per_token(format);
    case GemmScaleMode::kBlock1x128: return QuantSpec::per_block(format, 1, 128);
    case GemmScaleMode::kBlock128x128: return QuantSpec::per_block(format, 128, 128);
  }
  return QuantSpec::per_tensor(format);
}

// An FP8 tensor on the grid: every code is an integer in [-2, 2], every scale 2^[-2, 1], one
// scale per block of `mode`. The GEMM of two such tensors is exact in FP32.
inline QuantizedTensor grid_operand(DType format, GemmScaleMode mode, int64_t rows, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> value(-2, 2), exponent(-2, 1);
  const BlockShape block = block_of(mode, rows, k);
  QuantizedTensor q;
  q.spec = spec_of(mode, format, false);
  q.rows = rows;
  q.cols = k;
  q.data = Tensor(format, {rows, k});
  q.scales.block = block;
  q.scales.scales = Tensor(DType::kF32, {ceil_div(rows, block.rows), ceil_div(k, block.cols)});
  float* s = q.scales.scales.data_as<float>();
  for (int64_t i = 0; i < q.scales.scales.numel(); ++i) s[i] = std::ldexp(1.0f, exponent(rng));
  uint8_t* codes = q.data.data_as<uint8_t>();
  for (int64_t i = 0; i < rows * k; ++i) codes[i] = float_to_fp8(static_cast<float>(value(rng)), format);
  return q;
}

// The quantized operands, uploaded: codes and scales in llmq's row-major layout.
struct DeviceOperand {
  DeviceBuffer data;
  DeviceBuffer scales;
};

inline DeviceOperand upload_operand(const QuantizedTensor& q) {
  DeviceOperand d;
  d.data = upload(q.data.data(), static_cast<size_t>(q.data.nbytes()));
  d.scales = upload(q.scales.scales.data(), static_cast<size_t>(q.scales.scales.nbytes()));
  return d;
}

inline CudaGemmInput input_of(const DeviceOperand& d, DType format, GemmScaleMode mode) {
  CudaGemmInput x;
  x.data = d.data.get();
  x.dtype = format;
  x.scale_mode = mode;
  x.scales = d.scales.as<float>();
  return x;
}

// An m x n x k problem over two uploaded operands into d (the other fields at their defaults).
inline CudaGemmProblem problem_of(int64_t m, int64_t n, int64_t k, const CudaGemmInput& a, const CudaGemmInput& b, void* d) {
  CudaGemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a;
  p.b = b;
  p.d = d;
  return p;
}

// CPU reference into an output of `dtype`, read back as float.
inline std::vector<float> reference(const QuantizedTensor& a, const QuantizedTensor& b, DType dtype,
                                    const std::vector<float>* bias) {
  Tensor out(dtype, {a.rows, b.rows});
  GemmOptions options;
  options.bias = bias != nullptr ? bias->data() : nullptr;
  const Status st = quantized_gemm(GemmOperand::of(a), GemmOperand::of(b), out.view(), options);
  EXPECT_TRUE(st.ok()) << "reference: " << st.to_string();
  std::vector<uint8_t> bytes(static_cast<size_t>(out.nbytes()));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  std::vector<float> v(static_cast<size_t>(a.rows * b.rows));
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) v[i] = output_value(bytes, dtype, i);
  return v;
}

inline double rel_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

// ---------------------------------------------------------------------------------------------
// Fixture: a runner, a stream, a workspace.

class CudaGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LLMQ_REQUIRE_GPU();
    const Status st = CudaGemmRunner::create(0, &runner_);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    workspace_ = DeviceBuffer(static_cast<size_t>(kWorkspaceBytes));
    ASSERT_NE(workspace_.get(), nullptr);
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  // Runs p on the fixture's stream and waits; the Status of the run or of the stream.
  Status run(const CudaGemmProblem& p, CudaGemmRunner* runner = nullptr) {
    CudaGemmRunner* r = runner != nullptr ? runner : runner_.get();
    const Status st = r->run(p, workspace_.get(), kWorkspaceBytes, stream_);
    if (!st.ok()) return st;
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return {StatusCode::kCudaError, "stream: " + cuda_text(e)};
    return {};
  }

  std::unique_ptr<CudaGemmRunner> runner_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer workspace_;
};

// Output [m, n] of a problem (row stride ldd) as floats, and the number of NaNs in it.
inline std::vector<float> read_output(const std::vector<uint8_t>& bytes, DType dtype, int64_t m, int64_t n,
                                      int64_t ldd, int64_t offset, int64_t* nan_count) {
  std::vector<float> v(static_cast<size_t>(m * n));
  *nan_count = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const float x = output_value(bytes, dtype, offset + r * ldd + c);
      *nan_count += std::isnan(x) ? 1 : 0;
      v[r * n + c] = x;
    }
  return v;
}

// ---------------------------------------------------------------------------------------------
// The scale-mode pairs the runner documents as supported.

struct ModePair {
  GemmScaleMode a;
  GemmScaleMode b;
};
const ModePair kSupportedPairs[] = {
    {GemmScaleMode::kTensor, GemmScaleMode::kTensor},
    {GemmScaleMode::kOuterVector, GemmScaleMode::kOuterVector},
    {GemmScaleMode::kBlock1x128, GemmScaleMode::kBlock128x128},
    {GemmScaleMode::kBlock1x128, GemmScaleMode::kBlock1x128},
    {GemmScaleMode::kBlock128x128, GemmScaleMode::kBlock1x128},
};

}  // namespace cuda_gemm_test
}  // namespace llmq
