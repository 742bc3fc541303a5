// Synthetic Hugging Face checkpoints, generated while they are written (synthetic_checkpoint.hpp).
#include "llmq/synthetic_checkpoint.hpp"

#include <cmath>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/export.hpp"
#include "llmq/format.hpp"
#include "llmq/output_dir.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"

namespace llmq {
namespace {

// One in this many input channels is an outlier channel, scaled by kOutlierGain (LLM.int8()'s
// observation: a few hidden dimensions carry magnitudes 20-60x the rest).
constexpr uint64_t kOutlierChannelEvery = 211;
constexpr float kOutlierGain = 30.0f;
// Isolated spikes: one element in 2^14, 8x.
constexpr uint64_t kSpikeMask = (uint64_t{1} << 14) - 1;
constexpr float kSpikeGain = 8.0f;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Element i of tensor `tensor_seed`: a counter-based draw, so any row block is generated alone.
// Irwin-Hall of four 16-bit uniforms, rescaled to unit variance: close enough to a Gaussian for
// weights, and never exactly zero after the offset below.
float draw(uint64_t tensor_seed, uint64_t i) {
  const uint64_t r = splitmix64(tensor_seed ^ (i * 0xD6E8FEB86659FD93ULL));
  const double sum = static_cast<double>(r & 0xFFFF) + static_cast<double>((r >> 16) & 0xFFFF) +
                     static_cast<double>((r >> 32) & 0xFFFF) + static_cast<double>(r >> 48) + 2.0;
  const double u = sum / 65536.0 - 2.0;  // mean 0 (+ 2^-15), variance 1/3
  float v = static_cast<float>(u * 1.7320508075688772);
  if ((r & kSpikeMask) == 0) v *= kSpikeGain;  // reuses low bits: spikes are a fixed subset
  return v;
}

void store(float v, DType dtype, uint8_t* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, &v, 4);
    return;
  }
  const uint16_t bits = dtype == DType::kBF16 ? float_to_bf16_bits(v) : float_to_fp16_bits(v);
  std::memcpy(dst, &bits, 2);
}

// Fill rows [row_begin, row_begin + rows) of a tensor: norm gains near 1 (a few large, as real
// RMSNorm gains feeding outlier channels are), matrices N(0, 1/cols) with outlier input channels.
// A 1-D tensor is one row.
Status fill_tensor(const HfTensorSpec& spec, DType dtype, uint64_t tensor_seed, int64_t row_begin, int64_t rows,
                   uint8_t* dst) {
  const int64_t cols = spec.shape.size() == 1 ? spec.shape[0] : spec.shape.back();
  const int64_t elem = dtype_storage_bytes(dtype, 1);
  const bool vector = spec.shape.size() == 1;
  const float sigma = vector ? 0.1f : static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)));
  std::vector<uint8_t> outlier_column(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c)
    outlier_column[static_cast<size_t>(c)] = splitmix64(tensor_seed + 1 + static_cast<uint64_t>(c)) % kOutlierChannelEvery == 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t i = static_cast<uint64_t>((row_begin + r) * cols + c);
      float v = draw(tensor_seed, i) * sigma;
      const bool outlier = outlier_column[static_cast<size_t>(c)] != 0;
      if (vector) v += outlier ? kOutlierGain * 0.2f : 1.0f;
      else if (outlier) v *= kOutlierGain;
      store(v, dtype, dst + (r * cols + c) * elem);
    }
  }
  return {};
}

}  // namespace

Status write_synthetic_checkpoint(const std::string& dir, const SyntheticCheckpointOptions& options, int64_t* bytes) {
  LLMQ_RETURN_IF_ERROR(options.config.validate());
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF16 && options.dtype != DType::kF32)
    return invalid_argument("synthetic checkpoint: dtype must be bf16, f16 or f32");
  std::vector<SafetensorsWriteEntry> entries;
  uint64_t tensor_seed = splitmix64(options.seed);
  for (const HfTensorSpec& spec : hf_tensor_specs(options.config)) {
    tensor_seed = splitmix64(tensor_seed);
    const DType dtype = options.dtype;
    SafetensorsWriteEntry entry{spec.name, dtype, spec.shape, nullptr, nullptr};
    if (spec.shape.size() == 1)
      entry.fill = [spec, dtype, tensor_seed](uint8_t* dst) { return fill_tensor(spec, dtype, tensor_seed, 0, 1, dst); };
    else
      entry.fill_rows = [spec, dtype, tensor_seed](int64_t r, int64_t n, uint8_t* dst) {
        return fill_tensor(spec, dtype, tensor_seed, r, n, dst);
      };
    entries.push_back(std::move(entry));
  }
  const std::vector<std::vector<SafetensorsWriteEntry>> shards = split_into_shards(entries, options.max_shard_bytes);
  const std::string config_text = hf_config_json(options.config) + "\n";

  // Written as every llmq output directory is (output_dir.hpp): staged, marked and swapped into
  // place, so it never writes into a directory it did not make. An existing path is refused
  // unless it is a previous llmq output and options.overwrite (--force) is set.
  OutputRules rules;
  rules.writer = "llmq make-checkpoint";
  rules.overwrite = options.overwrite;
  const std::string plan_text = config_text + dtype_name(options.dtype) + " " + std::to_string(options.seed) + " " +
                                std::to_string(options.max_shard_bytes);
  Checksum plan;
  plan.update(plan_text.data(), static_cast<int64_t>(plan_text.size()));
  std::unique_ptr<OutputDir> out;
  LLMQ_RETURN_IF_ERROR(OutputDir::begin(dir, rules, checksum_hex(plan.digest()), /*resume=*/false, &out));
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  Status st;
  for (size_t i = 0; i < shards.size() && st.ok(); ++i) {
    const std::string file = shard_file_name(i, shards.size());
    for (const auto& e : shards[i]) {
      weight_map[e.name] = file;
      total += safetensors_entry_bytes(e);
    }
    SafetensorsWritten written;
    st = write_safetensors(out->path(file), shards[i], {{"format", "pt"}}, &written);
    if (st.ok()) st = out->mark_complete(file, written.bytes, written.checksum);
  }
  if (st.ok() && shards.size() > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    st = write_file_atomic(out->path("model.safetensors.index.json"), index.dump(2) + "\n");
  }
  if (st.ok()) st = write_file_atomic(out->path("config.json"), config_text);
  if (st.ok()) st = fsync_directory(out->staging());
  if (st.ok()) st = out->commit();
  if (!st.ok()) {
    out->abandon();  // nothing to resume: a rerun generates the same bytes
    return st;
  }
  if (bytes != nullptr) *bytes = total;
  return {};
}

}  // namespace llmq
