// GPU tests of the runtime's attention kernels (src/attention/attention.hpp), the parts that are
// not a sweep of shapes: every non-NaN E4M3 code through each kernel (a single key: the output is
// the widened code times v_scale, exact), and argument errors, which name the field and are rejected
// before any launch, so they need no GPU (BF16 and E4M3 caches, prefill and decode, the paged
// cache's KvPages). The numerics are tested in test_cuda_attention_prefill.cpp and
// test_cuda_attention_decode.cpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "attention/attention.hpp"
#include "cuda_attention_support.hpp"
#include "cuda_support.hpp"
#include "llmq/format.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using namespace cuda_attention_test;  // NOLINT: the suite's shared helpers

// ---------------------------------------------------------------------------------------------
// E4M3: every code widens exactly. One sequence, ONE key (so the softmax weight is exactly 1 and
// the output is the value row times v_scale), d = 128, 2 kv heads: the value rows of the two heads
// hold the 254 non-NaN codes (0x00-0x7E, 0x80-0xFE; slot 127 of each repeats +-1.0), keys are all
// +-0 (score 0: P = 2^0 = 1 exactly on every kernel). v_scale 1 and 3/8: decode_e4m3(code) * 3/8
// has at most 6 significant bits, so the BF16 output is exact whatever the rounding. The 1-ulp
// slack below only covers an approximate 2^0 that this test does not expect; any mis-decoded
// code (a subnormal read as a normal, a lost sign, a wrong exponent) is off by far more.
// Positions >= 1 and the other slot hold NaN codes. Paged: table rows {1}, {0} (one block of
// kCapacity positions each), so sequence 0 reading table row 1 finds its key in block 0.
struct EveryCodeProblem {
  static constexpr int64_t kDim = 128, kKvHeads = 2, kCapacity = 4, kSlots = 2;
  std::vector<uint8_t> k8, v8;
  std::vector<float> k_scale = {0.75f, 2.5f}, v_scale = {1.0f, 0.375f};
  std::vector<uint16_t> q;
  std::vector<float> expect;  // [kKvHeads * kDim]: decode(code) * v_scale, exact
  EveryCodeProblem() {
    k8.assign(kSlots * kCapacity * kKvHeads * kDim, kNanCodeK);
    v8.assign(k8.size(), kNanCodeV);
    const int64_t base = (0 * kCapacity + 0) * kKvHeads * kDim;  // block 0 (table row 1), position 0
    for (int64_t h = 0; h < kKvHeads; ++h)
      for (int64_t i = 0; i < kDim; ++i) {
        const uint8_t code = static_cast<uint8_t>(i == 127 ? h * 128 + 0x38 : h * 128 + i);  // 0x38 = 1.0
        v8[base + h * kDim + i] = code;
        k8[base + h * kDim + i] = static_cast<uint8_t>((i % 2) * 0x80);  // +0, -0
        expect.push_back(e4m3_value(code) * v_scale[h]);
      }
    q = to_bf16(testing::outlier_matrix(1, kKvHeads * kDim, kSeed + 900, 4.0f));
  }
};

void expect_every_code(const std::vector<uint16_t>& out, const std::vector<float>& expect, const std::string& what) {
  ASSERT_EQ(out.size(), expect.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < out.size() && bad < 10; ++i) {
    const float o = bf16_bits_to_float(out[i]), e = expect[i];
    const bool ok = std::fabs(o - e) <= std::fabs(e) * 0x1p-8f;
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << what << ": head " << i / EveryCodeProblem::kDim << " dim " << i % EveryCodeProblem::kDim
                    << " got " << o << " expected " << e;
  }
}

TEST(CudaAttentionE4m3, EveryCodeWidensExactly) {
  LLMQ_REQUIRE_GPU();
  const EveryCodeProblem p;
  using P = EveryCodeProblem;
  DeviceBuffer<uint8_t> k8(p.k8.size()), v8(p.v8.size());
  DeviceBuffer<float> k_scale(P::kKvHeads), v_scale(P::kKvHeads);
  DeviceBuffer<uint16_t> q(p.q.size()), out(p.q.size());
  DeviceBuffer<int32_t> meta(6);  // q_start {0, 1}, kv_len 1, slot (table row) 1, block table {1}, {0}
  const std::vector<int32_t> host_meta = {0, 1, 1, 1, 1, 0};
  CUDA_ASSERT(k8.upload(p.k8));
  CUDA_ASSERT(v8.upload(p.v8));
  CUDA_ASSERT(k_scale.upload(p.k_scale));
  CUDA_ASSERT(v_scale.upload(p.v_scale));
  CUDA_ASSERT(q.upload(p.q));
  CUDA_ASSERT(meta.upload(host_meta));

  attention::DecodeAttentionArgs d;
  d.q = q.get();
  d.kv_dtype = KvCacheDType::kE4M3;
  d.k_cache8 = k8.get();
  d.v_cache8 = v8.get();
  d.k_scale = k_scale.get();
  d.v_scale = v_scale.get();
  d.out = out.get();
  d.kv_len = meta.get() + 2;
  d.slot = meta.get() + 3;
  d.batch = 1;
  d.n_heads = d.n_kv_heads = P::kKvHeads;
  d.head_dim = P::kDim;
  d.pages.block_table = meta.get() + 4;
  d.pages.table_stride = 1;
  d.pages.block_size = P::kCapacity;
  d.pages.num_blocks = P::kSlots;
  d.max_kv_len = 1;
  d.softmax_scale = 0.125f;
  ASSERT_EQ(attention::decode_attention_workspace_bytes(1, P::kKvHeads, P::kDim, 1), 0);
  std::vector<uint16_t> result;
  CUDA_ASSERT(out.fill_bytes(0xFF));
  const Status st = attention::decode_attention(d, nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(out.download(&result));
  expect_every_code(result, p.expect, "decode");

  for (PrefillKernel kernel : {PrefillKernel::kTensorCore, PrefillKernel::kCudaCore}) {
    attention::PrefillAttentionArgs a;
    a.q = q.get();
    a.kv_dtype = KvCacheDType::kE4M3;
    a.k_cache8 = k8.get();
    a.v_cache8 = v8.get();
    a.k_scale = k_scale.get();
    a.v_scale = v_scale.get();
    a.out = out.get();
    a.q_start = meta.get();
    a.kv_len = meta.get() + 2;
    a.slot = meta.get() + 3;
    a.batch = 1;
    a.max_q_len = 1;
    a.n_heads = a.n_kv_heads = P::kKvHeads;
    a.head_dim = P::kDim;
    a.pages = d.pages;
    a.softmax_scale = 0.125f;
    a.kernel = kernel;
    CUDA_ASSERT(out.fill_bytes(0xFF));
    const Status pst = attention::prefill_attention(a, nullptr);
    ASSERT_TRUE(pst.ok()) << pst.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(out.download(&result));
    expect_every_code(result, p.expect, kernel == PrefillKernel::kTensorCore ? "prefill mma" : "prefill simt");
  }
}

// ---------------------------------------------------------------------------------------------
// Argument errors: each is rejected before anything is launched (the pointers are never used).

template <typename T> T* fake_device_pointer() { return reinterpret_cast<T*>(uintptr_t{4096}); }

attention::PrefillAttentionArgs valid_prefill_args() {
  attention::PrefillAttentionArgs a;
  a.q = a.k_cache = a.v_cache = fake_device_pointer<const uint16_t>();
  a.out = fake_device_pointer<uint16_t>();
  a.q_start = a.kv_len = a.slot = fake_device_pointer<const int32_t>();
  a.batch = 1;
  a.max_q_len = 16;
  a.n_heads = 8;
  a.n_kv_heads = 2;
  a.head_dim = 128;
  a.pages.block_table = fake_device_pointer<const int32_t>();
  a.pages.table_stride = 4;
  a.pages.block_size = 16;
  a.pages.num_blocks = 8;
  a.softmax_scale = 0.125f;
  return a;
}

void expect_invalid(const Status& st, const std::string& field) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(field), std::string::npos) << "message does not name " << field << ": " << st.message();
}

TEST(CudaPrefillAttention, RejectsInvalidArguments) {
  auto a = valid_prefill_args();
  a.q = nullptr;
  expect_invalid(attention::prefill_attention(a, nullptr), "q is null");
  a = valid_prefill_args();
  a.slot = nullptr;
  expect_invalid(attention::prefill_attention(a, nullptr), "slot");
  a = valid_prefill_args();
  a.n_kv_heads = 3;
  expect_invalid(attention::prefill_attention(a, nullptr), "n_kv_heads");
  a = valid_prefill_args();
  a.head_dim = 96;
  expect_invalid(attention::prefill_attention(a, nullptr), "head_dim 96");
  a = valid_prefill_args();
  a.head_dim = 8;
  a.kernel = PrefillKernel::kTensorCore;
  expect_invalid(attention::prefill_attention(a, nullptr), "head_dim 8");
  a = valid_prefill_args();
  a.softmax_scale = 0.f;
  expect_invalid(attention::prefill_attention(a, nullptr), "softmax_scale");
  a = valid_prefill_args();
  a.out = reinterpret_cast<uint16_t*>(uintptr_t{4098});
  expect_invalid(attention::prefill_attention(a, nullptr), "aligned");
  a = valid_prefill_args();
  a.pages.block_table = nullptr;
  expect_invalid(attention::prefill_attention(a, nullptr), "pages.block_table is null");
  a = valid_prefill_args();
  a.pages.block_size = 24;
  expect_invalid(attention::prefill_attention(a, nullptr), "pages.block_size 24");
  a = valid_prefill_args();
  a.window = -1;
  expect_invalid(attention::prefill_attention(a, nullptr), "window -1");
  a = valid_prefill_args();
  a.window = 8;
  a.causal = false;  // the window is defined against the causal mask
  expect_invalid(attention::prefill_attention(a, nullptr), "window 8 needs causal");
}

attention::DecodeAttentionArgs valid_decode_args() {
  attention::DecodeAttentionArgs a;
  a.q = a.k_cache = a.v_cache = fake_device_pointer<const uint16_t>();
  a.out = fake_device_pointer<uint16_t>();
  a.kv_len = a.slot = fake_device_pointer<const int32_t>();
  a.batch = 1;
  a.n_heads = 32;
  a.n_kv_heads = 8;
  a.head_dim = 128;
  a.pages.block_table = fake_device_pointer<const int32_t>();
  a.pages.table_stride = 512;
  a.pages.block_size = 16;
  a.pages.num_blocks = 512;
  a.max_kv_len = 8192;
  a.softmax_scale = 0.088f;
  a.workspace = fake_device_pointer<void>();
  a.workspace_bytes = attention::decode_attention_workspace_bytes(1, 32, 128, 8192);
  return a;
}

TEST(CudaDecodeAttention, RejectsInvalidArguments) {
  auto a = valid_decode_args();
  EXPECT_GT(a.workspace_bytes, 0);
  a.k_cache = nullptr;
  expect_invalid(attention::decode_attention(a, nullptr), "k_cache is null");
  a = valid_decode_args();
  a.kv_len = nullptr;
  expect_invalid(attention::decode_attention(a, nullptr), "kv_len is null");
  a = valid_decode_args();
  a.n_kv_heads = 5;
  expect_invalid(attention::decode_attention(a, nullptr), "n_kv_heads");
  a = valid_decode_args();
  a.head_dim = 80;
  expect_invalid(attention::decode_attention(a, nullptr), "head_dim 80");
  a = valid_decode_args();
  a.workspace_bytes -= 4;
  expect_invalid(attention::decode_attention(a, nullptr), "workspace_bytes");
  a = valid_decode_args();
  a.workspace = nullptr;
  expect_invalid(attention::decode_attention(a, nullptr), "workspace is null");
  a = valid_decode_args();
  a.max_kv_len = 0;
  expect_invalid(attention::decode_attention(a, nullptr), "max_kv_len");
  a = valid_decode_args();
  a.window = -5;
  expect_invalid(attention::decode_attention(a, nullptr), "window -5");
  a = valid_decode_args();
  a.pages.table_stride = 0;
  expect_invalid(attention::decode_attention(a, nullptr), "pages.table_stride 0");
  a = valid_decode_args();
  a.pages.num_blocks = 0;
  expect_invalid(attention::decode_attention(a, nullptr), "pages.num_blocks 0");
}

// Each KvPages bound in turn, by name (validate_kv_pages: what both entry points, rope_kv and the
// 8-bit prefill path check).
TEST(CudaKvPages, RejectsInvalidPagesByName) {
  attention::KvPages good;
  good.block_table = fake_device_pointer<const int32_t>();
  good.table_stride = 64;
  good.block_size = 16;
  good.num_blocks = 100;
  EXPECT_TRUE(attention::validate_kv_pages(good, "f: ").ok());
  for (int64_t bs : {1, 2, 64, 65536}) {
    attention::KvPages p = good;
    p.block_size = bs;
    EXPECT_TRUE(attention::validate_kv_pages(p, "f: ").ok()) << "block_size " << bs;
  }
  const struct {
    const char* field;
    void (*spoil)(attention::KvPages*);
  } cases[] = {
      {"f: pages.block_table is null", [](attention::KvPages* p) { p->block_table = nullptr; }},
      {"pages.table_stride 0", [](attention::KvPages* p) { p->table_stride = 0; }},
      {"pages.table_stride -3", [](attention::KvPages* p) { p->table_stride = -3; }},
      {"pages.block_size 0", [](attention::KvPages* p) { p->block_size = 0; }},
      {"pages.block_size 48", [](attention::KvPages* p) { p->block_size = 48; }},
      {"pages.block_size 131072", [](attention::KvPages* p) { p->block_size = 131072; }},
      {"pages.num_blocks 0", [](attention::KvPages* p) { p->num_blocks = 0; }},
      // 2^16 blocks of 2^15 rows: 2^31 cache rows, one too many for int row indices.
      {"cache rows", [](attention::KvPages* p) { p->num_blocks = int64_t{1} << 16, p->block_size = int64_t{1} << 15; }},
      // 2^15 blocks a row of 2^16 positions: a sequence of 2^31 positions.
      {"capacity", [](attention::KvPages* p) { p->table_stride = int64_t{1} << 15, p->block_size = int64_t{1} << 16; }},
  };
  for (const auto& c : cases) {
    attention::KvPages p = good;
    c.spoil(&p);
    expect_invalid(attention::validate_kv_pages(p, "f: "), c.field);
  }
}

// An E4M3 cache: the BF16 pointers null (allowed), the code and scale pointers set.
template <typename Args> Args with_e4m3_cache(Args a) {
  a.k_cache = a.v_cache = nullptr;
  a.kv_dtype = KvCacheDType::kE4M3;
  a.k_cache8 = a.v_cache8 = fake_device_pointer<const uint8_t>();
  a.k_scale = a.v_scale = fake_device_pointer<const float>();
  return a;
}

// Each E4M3 field in turn made invalid: null codes or scales, misaligned codes; a kv_dtype out of
// the enum. `call` runs the entry point on the arguments.
template <typename Args, typename Call> void expect_e4m3_rejections(const Args& valid, Call call) {
  Args a = valid;
  a.k_cache8 = nullptr;
  expect_invalid(call(a), "k_cache8 is null");
  a = valid;
  a.v_cache8 = nullptr;
  expect_invalid(call(a), "v_cache8 is null");
  a = valid;
  a.k_scale = nullptr;
  expect_invalid(call(a), "k_scale is null");
  a = valid;
  a.v_scale = nullptr;
  expect_invalid(call(a), "v_scale is null");
  a = valid;
  a.k_cache8 = reinterpret_cast<const uint8_t*>(uintptr_t{4096 + 8});
  expect_invalid(call(a), "k_cache8, v_cache8");
  a = valid;
  a.v_cache8 = reinterpret_cast<const uint8_t*>(uintptr_t{4096 + 1});
  expect_invalid(call(a), "16-byte aligned");
  a = valid;
  a.kv_dtype = static_cast<KvCacheDType>(7);
  expect_invalid(call(a), "kv_dtype");
  // Shape checks still apply.
  a = valid;
  a.head_dim = 96;
  expect_invalid(call(a), "head_dim 96");
  // A BF16 cache with only the E4M3 pointers set names the BF16 field.
  a = valid;
  a.kv_dtype = KvCacheDType::kBF16;
  expect_invalid(call(a), "k_cache is null");
}

TEST(CudaPrefillAttentionE4m3, RejectsInvalidArguments) {
  expect_e4m3_rejections(with_e4m3_cache(valid_prefill_args()),
                         [](const attention::PrefillAttentionArgs& a) { return attention::prefill_attention(a, nullptr); });
}

TEST(CudaDecodeAttentionE4m3, RejectsInvalidArguments) {
  expect_e4m3_rejections(with_e4m3_cache(valid_decode_args()),
                         [](const attention::DecodeAttentionArgs& a) { return attention::decode_attention(a, nullptr); });
}

}  // namespace
}  // namespace llmq
