// WeightSources: an in-memory model under Hugging Face names, and a memory-mapped HF checkpoint.
#include <sys/stat.h>

#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/synthetic_checkpoint.hpp"

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
    add("model.embed_tokens.weight", &m.token_embedding);
    for (int64_t i = 0; i < c.n_layers; ++i) {
      const LayerWeights& l = m.layers[static_cast<size_t>(i)];
      const std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", &l.attn_norm);
      for (const Linear* lin : {&l.q, &l.k, &l.v, &l.o}) {
        const std::string name = lin->id.hf_name(c) + ".weight";
        if (permute && (lin == &l.q || lin == &l.k)) {
          owned_.push_back(std::make_unique<Tensor>(
              interleaved_to_half(lin->weight, lin == &l.q ? c.n_heads : c.n_kv_heads, c.head_dim)));
          add(name, owned_.back().get());
        } else {
          add(name, &lin->weight);
        }
        if (lin->bias.numel() > 0) add(lin->id.hf_name(c) + ".bias", &lin->bias);
      }
      add(p + "post_attention_layernorm.weight", &l.ffn_norm);
      if (c.is_moe()) {
        add(l.router.id.hf_name(c) + ".weight", &l.router.weight);
        for (const Expert& e : l.experts)
          for (const Linear* lin : {&e.gate, &e.up, &e.down}) add(lin->id.hf_name(c) + ".weight", &lin->weight);
      } else {
        for (const Linear* lin : {&l.mlp.gate, &l.mlp.up, &l.mlp.down}) add(lin->id.hf_name(c) + ".weight", &lin->weight);
      }
    }
    add("model.norm.weight", &m.final_norm);
    if (!c.tie_embeddings) add("lm_head.weight", &m.lm_head.weight);
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

// The streaming quantizer never builds the model, so it checks here what load_hf_model checks as
// it loads: every tensor config.json implies is present, of that shape, in a float dtype; no
// layer beyond num_hidden_layers; and an lm_head unless the embeddings are tied.
Status check_against_config(const Checkpoint& ckpt, const ModelConfig& config) {
  const std::string where = "--model: " + ckpt.dir() + ": ";
  std::set<std::string> expected;
  for (const HfTensorSpec& spec : hf_tensor_specs(config)) {
    expected.insert(spec.name);
    const SafetensorsTensorInfo* info = ckpt.find(spec.name);
    if (info == nullptr) {
      if (spec.name == "lm_head.weight")
        return invalid_argument(where + "no lm_head.weight, and config.json's tie_word_embeddings is false: a loader "
                                "would start lm_head from random weights");
      return invalid_argument(where + "tensor '" + spec.name + "' is missing (config.json: " + config.model_type + ", " +
                              std::to_string(config.n_layers) + " layers)");
    }
    if (info->shape != spec.shape)
      return invalid_argument(where + "tensor '" + spec.name + "' has shape " + shape_string(info->shape) +
                              ", config.json implies " + shape_string(spec.shape));
    if (!is_high_precision(info->dtype))
      return invalid_argument(where + "tensor '" + spec.name + "' is " + dtype_name(info->dtype) +
                              "; weights must be F32, F64, F16 or BF16");
  }
  const std::string layers = "model.layers.";
  for (const std::string& name : ckpt.tensor_names()) {
    if (expected.count(name) != 0 || name.rfind(layers, 0) != 0) continue;
    const int64_t layer = std::atoll(name.c_str() + layers.size());
    if (layer >= config.n_layers)
      return invalid_argument(where + "tensor '" + name + "' belongs to layer " + std::to_string(layer) +
                              ", but config.json's num_hidden_layers is " + std::to_string(config.n_layers));
  }
  return {};
}

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

std::unique_ptr<WeightSource> memory_weight_source(const ModelWeights& model) {
  return std::make_unique<MemorySource>(model);
}

Status checkpoint_weight_source(const std::string& dir, std::unique_ptr<WeightSource>* out) {
  std::unique_ptr<Checkpoint> ckpt;
  LLMQ_RETURN_IF_ERROR(Checkpoint::open(dir, &ckpt));
  ModelConfig config;
  LLMQ_RETURN_IF_ERROR(parse_hf_config(ckpt->config_json(), &config));
  try {
    if (nlohmann::json::parse(ckpt->config_json()).contains("quantization_config"))
      return invalid_argument("--model: " + dir + " is already quantized (config.json has quantization_config)");
  } catch (const std::exception& e) {
    return invalid_argument("--model: " + dir + "/config.json: " + e.what());
  }
  for (const std::string& name : ckpt->tensor_names()) {
    const SafetensorsTensorInfo* info = ckpt->find(name);
    if (info != nullptr && (is_fp8(info->dtype) || info->dtype == DType::kI8))
      return invalid_argument("--model: " + dir + " holds 8-bit tensor " + name + "; quantize from the original weights");
  }
  LLMQ_RETURN_IF_ERROR(check_against_config(*ckpt, config));
  *out = std::make_unique<CheckpointSource>(std::move(ckpt), std::move(config));
  return {};
}

std::string hf_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.is_moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.is_moe() ? "mixtral" : "llama";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.enabled)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = c.attention_bias;
  j["bos_token_id"] = c.bos_token;
  j["eos_token_id"] = c.eos_token;
  j["torch_dtype"] = "bfloat16";
  if (c.is_moe()) {
    j["num_local_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_per_token;
  }
  return j.dump(2);
}

}  // namespace llmq
