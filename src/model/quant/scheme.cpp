// The scheme table: each row is one method of the FP8 paper (or a common serving recipe).
#include "llmq/scheme.hpp"

namespace llmq {
namespace {


QuantSpec static_tensor(DType d, float backoff = 1.0f) {
  QuantSpec s = QuantSpec::per_tensor(d);
  s.source = ScaleSource::kStatic;
  s.backoff = backoff;
  return s;
}

std::vector<Scheme> build_schemes() {
  std::vector<Scheme> v;
  const DType e4m3 = DType::kE4M3;
  {
    Scheme s{"fp8-dynamic", "FP8 per-token dynamic activations x per-channel weights (vLLM W8A8 default)",
             QuantSpec::per_channel(e4m3), true, QuantSpec::per_token(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    QuantSpec unit = QuantSpec::per_tensor(e4m3);
    unit.method = ScaleMethod::kUnit;
    QuantSpec act = unit;
    act.source = ScaleSource::kStatic;
    Scheme s{"fp8-unit", "FP8 unit scale (s = 1) for weights and activations", unit, true, act};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-tensor-static", "FP8 per-tensor static (calibrated) activations x per-tensor weights",
             QuantSpec::per_tensor(e4m3), true, static_tensor(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-tensor-dynamic", "FP8 per-tensor dynamic activations x per-tensor weights",
             QuantSpec::per_tensor(e4m3), true, QuantSpec::per_tensor(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-channel-static", "FP8 per-tensor static activations x per-channel weights",
             QuantSpec::per_channel(e4m3), true, static_tensor(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-block", "FP8 1x128 dynamic activations x 128x128 block weights (DeepSeek-V3 recipe)",
             QuantSpec::per_block(e4m3, 128, 128), true, QuantSpec::per_block(e4m3, 1, 128)};
    s.export_format = ExportFormat::kVllmFp8;
    v.push_back(s);
  }
  {
    QuantSpec w = QuantSpec::per_channel(e4m3);
    w.method = ScaleMethod::kMseSearch;
    Scheme s{"fp8-mse", "FP8 per-token dynamic activations x MSE-optimal per-channel weights (eq. 24)", w, true,
             QuantSpec::per_token(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    QuantSpec w = QuantSpec::per_tensor(e4m3);
    w.scale_rounding = ScaleRounding::kPowerOfTwo;
    QuantSpec a = static_tensor(e4m3);
    a.scale_rounding = ScaleRounding::kPowerOfTwo;
    Scheme s{"fp8-pow2", "FP8 per-tensor static, power-of-two scales for both (eq. 14)", w, true, a};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    const std::vector<float> gaudi2 = {0x1p-8f, 0x1p-4f, 1.0f, 16.0f};
    QuantSpec w = QuantSpec::per_tensor(e4m3);
    w.method = ScaleMethod::kMseSearch;
    w.candidates = CandidateSet::kHardwareSet;
    w.hardware_scales = gaudi2;
    QuantSpec a = static_tensor(e4m3);
    a.scale_rounding = ScaleRounding::kHardwareSet;
    a.hardware_scales = gaudi2;
    Scheme s{"fp8-hwset", "FP8 per-tensor static, Gaudi 2 hardware scales {2^-8,2^-4,1,16}; MSE weights", w, true, a};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-smoothquant", "FP8 SmoothQuant a=0.5: static per-tensor activations x per-channel weights",
             QuantSpec::per_channel(e4m3), true, static_tensor(e4m3)};
    s.smooth_alpha = 0.5f;
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"fp8-weight-only", "FP8 per-channel weights, BF16 activations (W8A16)", QuantSpec::per_channel(e4m3),
             false, QuantSpec::per_token(e4m3)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"int8-w8a8", "INT8 per-token dynamic activations x per-channel weights (INT32 accumulation)",
             QuantSpec::per_channel(DType::kI8), true, QuantSpec::per_token(DType::kI8)};
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  {
    Scheme s{"int8-smoothquant", "INT8 SmoothQuant a=0.5: per-token dynamic activations x per-channel weights",
             QuantSpec::per_channel(DType::kI8), true, QuantSpec::per_token(DType::kI8)};
    s.smooth_alpha = 0.5f;
    s.export_format = ExportFormat::kCompressedTensors;
    v.push_back(s);
  }
  return v;
}

}  // namespace

const std::vector<Scheme>& all_schemes() {
  static const std::vector<Scheme> schemes = build_schemes();
  return schemes;
}

Status find_scheme(const std::string& name, Scheme* out) {
  std::string known;
  for (const Scheme& s : all_schemes()) {
    if (s.name == name) {
      *out = s;
      return {};
    }
    known += (known.empty() ? "" : ", ") + s.name;
  }
  return invalid_argument("--scheme: unknown scheme '" + name + "'; known: " + known);
}

const char* export_format_name(ExportFormat f) {
  switch (f) {
    case ExportFormat::kVllmFp8: return "fp8";
    case ExportFormat::kCompressedTensors: return "compressed-tensors";
    case ExportFormat::kNone: return "none";
  }
  return "?";
}

Status parse_export_format(const std::string& name, ExportFormat* out) {
  for (ExportFormat f : {ExportFormat::kCompressedTensors, ExportFormat::kVllmFp8})
    if (name == export_format_name(f)) {
      *out = f;
      return {};
    }
  return invalid_argument("--format: unknown format '" + name + "' (compressed-tensors or fp8)");
}

}  // namespace llmq
