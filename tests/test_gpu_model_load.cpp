// GpuModel::load's decisions that come before any device work (gpu_model_load.cpp): the one parser
// of precision names, and the routes it refuses with the reason. These hold in CPU-only builds and
// on machines without a GPU alike; the device routes themselves are tested in test_cuda_runtime.
#include <gtest/gtest.h>

#include <string>

#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/scheme.hpp"
#include "llmq/tensor_parallel.hpp"

namespace llmq {
namespace {

using Kind = GpuPrecision::Kind;

TEST(GpuPrecision, NamesParseToTheirKinds) {
  const struct {
    const char* text;
    Kind kind;
  } cases[] = {{"checkpoint", Kind::kAsStored}, {"bf16", Kind::kBF16}, {"f32", Kind::kF32}};
  for (const auto& c : cases) {
    GpuPrecision p;
    ASSERT_TRUE(parse_gpu_precision(c.text, &p).ok()) << c.text;
    EXPECT_EQ(p.kind, c.kind) << c.text;
    EXPECT_EQ(p.name(), c.text);
  }
}

TEST(GpuPrecision, EverySchemeParsesToItself) {
  ASSERT_FALSE(all_schemes().empty());
  for (const Scheme& s : all_schemes()) {
    GpuPrecision p;
    ASSERT_TRUE(parse_gpu_precision(s.name, &p).ok()) << s.name;
    EXPECT_EQ(p.kind, Kind::kScheme);
    EXPECT_EQ(p.scheme.name, s.name);
    EXPECT_EQ(p.name(), s.name);
  }
}

TEST(GpuPrecision, UnknownNamesAreRefusedWithTheChoices) {
  for (const char* text : {"", "BF16", "fp8", "checkpoint ", "f16"}) {
    GpuPrecision p;
    const Status st = parse_gpu_precision(text, &p);
    ASSERT_FALSE(st.ok()) << "'" << text << "'";
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("checkpoint (as stored), bf16, f32"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(kDefaultScheme), std::string::npos) << st.message();  // the scheme names too
  }
}

TEST(GpuModelLoad, AHostQuantizedModelRunsOnlyAsStored) {
  ModelWeights w;
  ASSERT_TRUE(load_model("default", &w).ok());
  Scheme scheme;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &scheme).ok());
  QuantizedModel qm;
  ASSERT_TRUE(quantize_model(w, scheme, nullptr, {}, &qm).ok());
  GpuModelSource source;
  source.kind = GpuModelSource::Kind::kHostQuantized;
  source.quantized = &qm;
  for (const char* text : {"bf16", "f32", "int8-w8a8"}) {
    GpuPrecision p;
    ASSERT_TRUE(parse_gpu_precision(text, &p).ok());
    std::unique_ptr<GpuModel> m;
    const Status st = GpuModel::load(source, p, 0, &m);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("runs as stored, not as '" + std::string(text) + "'"), std::string::npos) << st.message();
    EXPECT_EQ(m, nullptr);
  }
}

TEST(GpuModelLoad, ACalibratedSchemeWithoutStatisticsIsRefusedBeforeAnyDeviceWork) {
  ModelWeights w;
  ASSERT_TRUE(load_model("default", &w).ok());
  GpuModelSource source;
  source.kind = GpuModelSource::Kind::kHost;
  source.weights = &w;
  int calibrated = 0;
  for (const Scheme& s : all_schemes()) {
    if (!s.needs_statistics()) continue;
    ++calibrated;
    GpuPrecision p;
    ASSERT_TRUE(parse_gpu_precision(s.name, &p).ok());
    std::unique_ptr<GpuModel> m;
    const Status st = GpuModel::load(source, p, 0, &m);
    ASSERT_FALSE(st.ok()) << s.name;
    EXPECT_NE(st.message().find("needs calibration statistics"), std::string::npos) << st.message();
    // The split's loader takes the same decision, once.
    std::unique_ptr<TensorParallelRuntime> tp;
    const Status st2 = TensorParallelRuntime::load(2, 0, source, p, &tp);
    EXPECT_EQ(st2.message(), st.message());
  }
  EXPECT_GT(calibrated, 0);
}

TEST(GpuModelLoad, AMissingSourceIsNamed) {
  std::unique_ptr<GpuModel> m;
  GpuModelSource host;
  host.kind = GpuModelSource::Kind::kHost;
  Status st = GpuModel::load(host, gpu_precision(Kind::kBF16), 0, &m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("kHost without weights"), std::string::npos) << st.message();

  GpuModelSource dir;
  dir.kind = GpuModelSource::Kind::kCheckpoint;
  dir.dir = "/nonexistent/llmq-model";
  // f32 takes the host route, which reads the checkpoint before any device work in every build
  // (streamed routes leave the reading to the device loader).
  st = GpuModel::load(dir, gpu_precision(Kind::kF32), 0, &m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent/llmq-model"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace llmq
