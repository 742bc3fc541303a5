// GpuModel::load and TensorParallelRuntime::load (gpu_runtime.hpp, tensor_parallel.hpp): which
// route takes a source to the device under a precision, decided here and nowhere else, and the one
// parser of precision names. Host-only code: the routes themselves are gpu_model.cu
// (from_float, from_quantized, synthetic) and checkpoint_loader.cu (from_checkpoint).
#include <memory>
#include <string>

#include "llmq/calibration.hpp"
#include "llmq/device.hpp"
#include "llmq/export.hpp"
#include "llmq/gpu_runtime.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/tensor_parallel.hpp"
#include "model/checkpoint/model_family.hpp"
#include "runtime/gpu_model_build.hpp"

namespace llmq {

std::string GpuPrecision::name() const {
  switch (kind) {
    case Kind::kAsStored: return "checkpoint";
    case Kind::kBF16: return "bf16";
    case Kind::kF32: return "f32";
    case Kind::kScheme: return scheme.name;
  }
  return "?";
}

GpuPrecision gpu_precision(GpuPrecision::Kind kind) {
  GpuPrecision p;
  p.kind = kind;
  return p;
}

Status parse_gpu_precision(const std::string& text, GpuPrecision* out) {
  GpuPrecision p;
  if (text == "checkpoint") p.kind = GpuPrecision::Kind::kAsStored;
  else if (text == "bf16") p.kind = GpuPrecision::Kind::kBF16;
  else if (text == "f32") p.kind = GpuPrecision::Kind::kF32;
  else {
    p.kind = GpuPrecision::Kind::kScheme;
    const Status st = find_scheme(text, &p.scheme);
    if (!st.ok())
      return invalid_argument("precision '" + text + "': checkpoint (as stored), bf16, f32 or a scheme (" + st.message() + ")");
  }
  *out = std::move(p);
  return {};
}

Status GpuModel::from_checkpoint(const std::string& dir, const std::string& precision, int device,
                                 std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress, TensorParallelRank tp) {
  GpuPrecision p;
  LLMQ_RETURN_IF_ERROR(parse_gpu_precision(precision, &p));
  return from_checkpoint(dir, p, device, out, progress, tp);
}

Status GpuModel::synthetic(const ModelConfig& config, const std::string& precision, uint64_t seed, int device,
                           std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress, TensorParallelRank tp) {
  GpuPrecision p;
  LLMQ_RETURN_IF_ERROR(parse_gpu_precision(precision, &p));
  return synthetic(config, p, seed, device, out, progress, tp);
}

namespace {

// A source after its host work (reading a checkpoint to the host, quantizing there), which a split
// does once for all its ranks: what the device routes take.
struct Prepared {
  GpuModelSource source;
  GpuPrecision precision;
  const CalibrationStats* stats = nullptr;    // a checkpoint streamed under a static scheme
  std::unique_ptr<ModelWeights> weights;      // host routes: the float model
  std::unique_ptr<QuantizedModel> quantized;  // host routes under a scheme
};

// What from_checkpoint takes: as stored, BF16, or runtime::scheme_streams_from_checkpoint.
bool streams_from_checkpoint(const GpuPrecision& p, bool have_stats, bool moe) {
  if (p.kind != GpuPrecision::Kind::kScheme) return p.kind != GpuPrecision::Kind::kF32;
  return runtime::scheme_streams_from_checkpoint(p.scheme, have_stats, moe);
}

// The devices a load will use, [first, first + count): checked before the host reads or quantizes
// a whole model for them, so that a machine without a GPU (or a build without CUDA) says so first
// rather than after minutes of work. Argument checks still come before it.
struct Devices {
  int first = 0, count = 1;
};

Status check_devices(const Devices& d) {
  for (int i = d.first; i < d.first + d.count; ++i) {
    CudaDeviceInfo info;
    LLMQ_RETURN_IF_ERROR(query_cuda_device(i, &info));
  }
  return {};
}

Status quantize_on_host(const ModelWeights& w, const GpuPrecision& p, const CalibrationStats* stats, const Devices& devices,
                        Prepared* out) {
  if (p.scheme.needs_statistics() && stats == nullptr)
    return invalid_argument(p.scheme.name + ": needs calibration statistics (llmq calibrate; then `run --stats`, or quantize "
                            "with them and run the checkpoint)");
  LLMQ_RETURN_IF_ERROR(check_devices(devices));
  out->quantized = std::make_unique<QuantizedModel>();
  LLMQ_RETURN_IF_ERROR(quantize_model(w, p.scheme, stats, {}, out->quantized.get()));
  out->source.kind = GpuModelSource::Kind::kHostQuantized;
  out->source.quantized = out->quantized.get();
  out->precision = gpu_precision(GpuPrecision::Kind::kAsStored);
  return {};
}

Status prepare(const GpuModelSource& s, const GpuPrecision& p, const CalibrationStats* stats, const Devices& devices,
               Prepared* out) {
  out->source = s;
  out->precision = p;
  // Statistics are used by calibrated schemes only, and never silently dropped for them.
  const bool calibrated = p.kind == GpuPrecision::Kind::kScheme && p.scheme.needs_statistics();
  switch (s.kind) {
    case GpuModelSource::Kind::kSynthetic:
      if (calibrated && stats != nullptr)
        return invalid_argument(p.scheme.name + " on synthetic weights: their static activation scales are fixed (8/448), "
                                "not taken from the statistics; give a checkpoint, or no statistics");
      if (stats != nullptr) LLMQ_RETURN_IF_ERROR(stats->check_matches(s.config));
      return {};
    case GpuModelSource::Kind::kHostQuantized:
      return {};
    case GpuModelSource::Kind::kCheckpoint: {
      // Families stored fused (Phi-3's qkv_proj, gpt-oss's experts, MXFP4) take the host route:
      // the float loader splits them into the unfused linears every device route takes. Only the
      // header and config.json are read here: the loader the route leads to checks the tensors.
      std::unique_ptr<Checkpoint> ckpt;
      LLMQ_RETURN_IF_ERROR(Checkpoint::open(s.dir, &ckpt));
      ModelConfig config;
      if (Status st = parse_hf_config(ckpt->config_json(), &config); !st.ok())
        return Status(st.code(), s.dir + "/" + st.message());
      if (stats != nullptr) LLMQ_RETURN_IF_ERROR(stats->check_matches(config));  // measured on this model?
      const bool streams = family_layout(config).streams();
      if (streams && streams_from_checkpoint(p, stats != nullptr, config.is_moe())) {
        out->stats = stats;  // static activation scales, when the scheme has them
        return {};           // from_checkpoint reads the header itself
      }
      // A quantized checkpoint streams even then (as stored; from_checkpoint refuses any other
      // scheme): the header is read here only on the way to the host route.
      if (is_quantized_checkpoint(*ckpt)) {
        if (streams) return {};
        return unsupported(s.dir + ": an 8-bit " + config.model_type + " checkpoint (fused tensors) cannot run on the GPU "
                           "as stored yet; run its float checkpoint under a scheme instead");
      }
      // f32 and calibrated schemes: the float model on the host first.
      LLMQ_RETURN_IF_ERROR(check_devices(devices));
      out->weights = std::make_unique<ModelWeights>();
      LLMQ_RETURN_IF_ERROR(load_model(s.dir, out->weights.get()));
      out->source.kind = GpuModelSource::Kind::kHost;
      out->source.weights = out->weights.get();
      break;
    }
    case GpuModelSource::Kind::kHost:
      break;
  }
  if (out->source.weights == nullptr) return invalid_argument("GpuModelSource: kHost without weights");
  if (p.kind == GpuPrecision::Kind::kScheme) return quantize_on_host(*out->source.weights, p, stats, devices, out);
  return {};
}

Status load_prepared(const Prepared& pr, int device, std::unique_ptr<GpuModel>* out, const GpuProgressFn& progress,
                     TensorParallelRank tp) {
  const GpuModelSource& s = pr.source;
  const GpuPrecision& p = pr.precision;
  switch (s.kind) {
    case GpuModelSource::Kind::kSynthetic:
      return GpuModel::synthetic(s.config, p, s.seed, device, out, progress, tp);
    case GpuModelSource::Kind::kCheckpoint:
      return GpuModel::from_checkpoint(s.dir, p, device, out, progress, tp, pr.stats);
    case GpuModelSource::Kind::kHost:
      return GpuModel::from_float(*s.weights, p.kind == GpuPrecision::Kind::kF32 ? DType::kF32 : DType::kBF16, device, out,
                                  tp);
    case GpuModelSource::Kind::kHostQuantized:
      if (s.quantized == nullptr) return invalid_argument("GpuModelSource: kHostQuantized without a model");
      if (p.kind != GpuPrecision::Kind::kAsStored && !(p.kind == GpuPrecision::Kind::kScheme && p.scheme.name == s.quantized->scheme.name))
        return invalid_argument("a model quantized under " + s.quantized->scheme.name + " runs as stored, not as '" + p.name() + "'");
      return GpuModel::from_quantized(*s.quantized, device, out, tp);
  }
  return invalid_argument("GpuModelSource: unknown kind");
}

}  // namespace

Status GpuModel::load(const GpuModelSource& source, const GpuPrecision& precision, int device, std::unique_ptr<GpuModel>* out,
                      const GpuProgressFn& progress, TensorParallelRank tp, const CalibrationStats* stats) {
  Prepared pr;
  LLMQ_RETURN_IF_ERROR(prepare(source, precision, stats, {device, 1}, &pr));
  return load_prepared(pr, device, out, progress, tp);
}

Status TensorParallelRuntime::load(int tp, int first_device, const GpuModelSource& source, const GpuPrecision& precision,
                                   std::unique_ptr<TensorParallelRuntime>* out, const TensorParallelLoadOptions& options) {
  Prepared pr;
  // An out-of-range --tp is refused by the load below, before any device is touched.
  const Devices devices{first_device, tp >= 1 && tp <= 64 ? tp : 0};
  LLMQ_RETURN_IF_ERROR(prepare(source, precision, options.stats, devices, &pr));
  return load(
      tp, first_device,
      [&](TensorParallelRank r, int device, std::unique_ptr<GpuModel>* m) {
        r.expert_parallel = options.expert_parallel;
        return load_prepared(pr, device, m, r.rank == 0 ? options.progress : GpuProgressFn{}, r);
      },
      out, options.group);
}

}  // namespace llmq
