// WeightSources: an in-memory model under Hugging Face names, and a memory-mapped HF checkpoint.
#include <sys/stat.h>

#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"
#include "model/checkpoint/model_family.hpp"

namespace llmq {
namespace {

// Interleaved RoPE pairs (2i, 2i+1) of each head move to (i, i + head_dim/2): the row
// permutation Hugging Face's Llama conversion applies to q and k.
Tensor interleaved_to_half(const Tensor& w, int64_t heads, int64_t head_dim) {
  Tensor out(DType::kF32, w.shape());
  const int64_t cols = w.shape()[1];
  const float* src = w.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < head_dim / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t from = h * head_dim + 2 * i + j;
        const int64_t to = h * head_dim + j * (head_dim / 2) + i;
        std::copy(src + from * cols, src + (from + 1) * cols, dst + to * cols);
      }
  return out;
}

class MemorySource : public WeightSource {
 public:
  explicit MemorySource(const ModelWeights& m) : model_(m), config_(m.config) {
    const ModelConfig& c = m.config;
    const bool permute = c.rope_style == RopeStyle::kInterleaved;
    config_.rope_style = RopeStyle::kHalf;
    // Written unfused, under the family that reads them so (Phi-3 as Llama or Mistral).
    config_.model_type = hf_written_model_type(c);
    // The tensors the written config implies (model_family.hpp's one enumeration), each from its
    // place in memory. gpt-oss's fused experts have no such place (its export is refused).
    (void)visit_model_tensors(config_, [&](const ModelTensor& t) -> Status {
      if (t.layer >= static_cast<int64_t>(m.layers.size())) return Status();
      const LayerWeights* l = t.layer >= 0 ? &m.layers[static_cast<size_t>(t.layer)] : nullptr;
      const Tensor* tensor = nullptr;
      switch (t.role) {
        case TensorRole::kEmbedding: tensor = &m.token_embedding; break;
        case TensorRole::kAttnNorm: tensor = &l->attn_norm; break;
        case TensorRole::kFfnNorm: tensor = &l->ffn_norm; break;
        case TensorRole::kQNorm: tensor = &l->q_norm; break;
        case TensorRole::kKNorm: tensor = &l->k_norm; break;
        case TensorRole::kSinks: tensor = &l->sinks; break;
        case TensorRole::kFinalNorm: tensor = &m.final_norm; break;
        case TensorRole::kLinearBias:
          if (const Linear* lin = m.find_linear(t.linear)) tensor = &lin->bias;
          break;
        case TensorRole::kLinearWeight: {
          const Linear* lin = m.find_linear(t.linear);
          if (lin == nullptr) break;
          const bool q = t.linear.role == LinearRole::kQ, k = t.linear.role == LinearRole::kK;
          if (permute && (q || k)) {
            owned_.push_back(std::make_unique<Tensor>(interleaved_to_half(lin->weight, q ? c.n_heads : c.n_kv_heads, c.head_dim)));
            tensor = owned_.back().get();
          } else {
            tensor = &lin->weight;
          }
          break;
        }
        default: break;  // fused layouts: written unfused (Phi-3) or not at all (gpt-oss)
      }
      if (tensor != nullptr && tensor->nbytes() > 0) add(t.name, tensor);
      return Status();
    });
  }

  const ModelConfig& config() const override { return config_; }
  std::vector<std::string> tensor_names() const override { return names_; }
  Status shape(const std::string& name, std::vector<int64_t>* out) const override {
    const Tensor* t = lookup(name);
    if (t == nullptr) return invalid_argument("model: no tensor " + name);
    *out = t->shape();
    return {};
  }
  Status read(const std::string& name, Tensor* out) const override {
    const Tensor* t = lookup(name);
    if (t == nullptr) return invalid_argument("model: no tensor " + name);
    *out = *t;
    return {};
  }
  std::string config_json() const override { return hf_config_json(config_); }
  // In-memory models are small (llama2.c files, the default model): a checksum of every weight.
  std::string identity() const override {
    Checksum sum;
    for (const std::string& name : names_) {
      const Tensor* t = lookup(name);
      sum.update(name.data(), static_cast<int64_t>(name.size()));
      sum.update(t->data(), t->nbytes());
    }
    return "memory " + checksum_hex(sum.digest());
  }

 private:
  void add(const std::string& name, const Tensor* t) {
    names_.push_back(name);
    tensors_[name] = t;
  }
  const Tensor* lookup(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : it->second;
  }
  const ModelWeights& model_;
  ModelConfig config_;
  std::vector<std::string> names_;
  std::map<std::string, const Tensor*> tensors_;
  std::vector<std::unique_ptr<Tensor>> owned_;
};

class CheckpointSource : public WeightSource {
 public:
  CheckpointSource(std::unique_ptr<Checkpoint> ckpt, ModelConfig config)
      : ckpt_(std::move(ckpt)), config_(std::move(config)) {}
  const ModelConfig& config() const override { return config_; }
  std::vector<std::string> tensor_names() const override { return ckpt_->tensor_names(); }
  Status shape(const std::string& name, std::vector<int64_t>* out) const override {
    const SafetensorsTensorInfo* info = ckpt_->find(name);
    if (info == nullptr) return invalid_argument(ckpt_->dir() + ": no tensor " + name);
    *out = info->shape;
    return {};
  }
  Status read(const std::string& name, Tensor* out) const override { return ckpt_->read_f32(name, out); }
  Status read_rows(const std::string& name, int64_t row_begin, int64_t rows, Tensor* out) const override {
    return ckpt_->read_f32_rows(name, row_begin, rows, out);
  }
  std::string config_json() const override { return ckpt_->config_json(); }
  std::string directory() const override { return ckpt_->dir(); }
  // Hashing a checkpoint of many GB would cost a full read; name, size and modification time of
  // each file say whether it changed, as make and rsync decide.
  std::string identity() const override {
    std::string id = "checkpoint " + ckpt_->config_json();
    for (const std::string& path : ckpt_->file_paths()) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) return "";  // unknown: never resumable
      id += "\n" + path + " " + std::to_string(static_cast<long long>(st.st_size)) + " " +
            std::to_string(static_cast<long long>(st.st_mtim.tv_sec)) + "." +
            std::to_string(static_cast<long long>(st.st_mtim.tv_nsec));
    }
    return id;
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
  ModelConfig config_;
};

}  // namespace

Status WeightSource::read_rows(const std::string& name, int64_t row_begin, int64_t rows, Tensor* out) const {
  Tensor whole;
  LLMQ_RETURN_IF_ERROR(read(name, &whole));
  std::vector<int64_t> shape = whole.shape();
  const int64_t all_rows = shape.empty() ? 1 : shape[0];
  if (row_begin < 0 || rows < 0 || row_begin > all_rows || rows > all_rows - row_begin)
    return invalid_argument(name + ": rows [" + std::to_string(row_begin) + ", " + std::to_string(row_begin + rows) +
                            ") outside [0, " + std::to_string(all_rows) + ")");
  if (!shape.empty()) shape[0] = rows;
  Tensor part(DType::kF32, shape);
  const int64_t row_elements = all_rows > 0 ? whole.numel() / all_rows : 0;
  std::copy(whole.data_as<float>() + row_begin * row_elements,
            whole.data_as<float>() + (row_begin + rows) * row_elements, part.data_as<float>());
  *out = std::move(part);
  return {};
}

namespace {

// A MemorySource over a model it owns: checkpoints whose family stores fused tensors (Phi-3,
// gpt-oss), read whole by the float loader and written unfused.
class OwnedMemorySource : public WeightSource {
 public:
  explicit OwnedMemorySource(std::unique_ptr<ModelWeights> m, std::string dir)
      : model_(std::move(m)), inner_(*model_), dir_(std::move(dir)) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::vector<std::string> tensor_names() const override { return inner_.tensor_names(); }
  Status shape(const std::string& name, std::vector<int64_t>* out) const override { return inner_.shape(name, out); }
  Status read(const std::string& name, Tensor* out) const override { return inner_.read(name, out); }
  std::string config_json() const override { return inner_.config_json(); }
  std::string directory() const override { return dir_; }
  std::string identity() const override { return ""; }  // never resumable: the read is the cost

 private:
  std::unique_ptr<ModelWeights> model_;
  MemorySource inner_;
  std::string dir_;
};

}  // namespace

std::unique_ptr<WeightSource> memory_weight_source(const ModelWeights& model) {
  return std::make_unique<MemorySource>(model);
}

Status checkpoint_weight_source(const std::string& dir, std::unique_ptr<WeightSource>* out) {
  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  LLMQ_RETURN_IF_ERROR(open_hf_checkpoint(dir, &ckpt, &config));
  const bool mxfp4 = config.experts_mxfp4;
  if (config_has_quantization(ckpt->config_json()) && !mxfp4)
    return invalid_argument("--model: " + dir + " is already quantized (config.json has quantization_config)");
  if (!family_layout(config).streams()) {
    auto model = std::make_unique<ModelWeights>();
    LLMQ_RETURN_IF_ERROR(load_hf_model(dir, model.get()));
    *out = std::make_unique<OwnedMemorySource>(std::move(model), dir);
    return {};
  }
  *out = std::make_unique<CheckpointSource>(std::move(ckpt), std::move(config));
  return {};
}

}  // namespace llmq
