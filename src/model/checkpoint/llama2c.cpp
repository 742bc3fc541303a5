// load_llama2c: llama2.c checkpoints. Two float32 layouts are read:
//  - legacy ("v0"): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
//    a negative vocab_size flags an unshared classifier), then token_embedding, rms_att, wq, wk,
//    wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real, freq_cis_imag (skipped), [wcls];
//  - v1: magic "ak42", version 1, the same 7 int32, a uint8 shared-classifier flag, zero padding
//    to 256 bytes, then the norms first (export.py's version1_export order), see kV1Order.
// Linear weights are row-major [out, in] in both, exactly nn.Linear's layout. The file size must
// match the header exactly, so a truncated or padded file is caught before anything is trusted.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq {
namespace {

constexpr uint32_t kV1Magic = 0x616b3432;  // "ak42" read as a little-endian uint32
constexpr int64_t kV1HeaderBytes = 256;
constexpr int64_t kLegacyHeaderBytes = 7 * 4;

struct Header {
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
};

// Where a float32 array of the file goes. kSkip: read past it (the legacy freq_cis tables, which
// the transformer recomputes).
enum class Slot { kEmbedding, kAttnNorm, kFfnNorm, kFinalNorm, kWq, kWk, kWv, kWo, kW1, kW2, kW3, kWcls, kSkip };

// One array of the file, or one per layer (n_layers arrays in a row): the list stays a dozen
// entries long whatever n_layers a corrupt header claims.
struct Segment {
  Slot slot;
  bool per_layer;
  int64_t count;  // floats in one array
};

Status file_error(const std::string& path, const std::string& what) {
  return {StatusCode::kIoError, path + ": " + what};
}
Status bad_file(const std::string& path, const std::string& what) {
  return invalid_argument(path + ": not a valid llama2.c checkpoint: " + what);
}

// a * b, false on int64 overflow (a corrupted header can claim any int32 sizes).
bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

// The arrays of the file in order. Sizes are products of header fields checked for overflow.
Status layout(const Header& h, bool v1, const std::string& path, std::vector<Segment>* out) {
  const int64_t head_size = h.dim / h.n_heads;
  const int64_t kv_dim = head_size * h.n_kv_heads;
  int64_t dd = 0, kvd = 0, hd = 0, vd = 0, freq = 0;
  if (!checked_mul(h.dim, h.dim, &dd) || !checked_mul(kv_dim, h.dim, &kvd) ||
      !checked_mul(h.hidden_dim, h.dim, &hd) || !checked_mul(h.vocab_size, h.dim, &vd) ||
      !checked_mul(h.seq_len, head_size / 2, &freq))
    return bad_file(path, "header sizes overflow");
  std::vector<Segment> s;
  auto per_layer = [&](Slot slot, int64_t count) { s.push_back({slot, true, count}); };
  if (v1) {
    // export.py version1_export: norms, then the embedding, then the matrices.
    per_layer(Slot::kAttnNorm, h.dim);
    per_layer(Slot::kFfnNorm, h.dim);
    s.push_back({Slot::kFinalNorm, false, h.dim});
    s.push_back({Slot::kEmbedding, false, vd});
    per_layer(Slot::kWq, dd);
    per_layer(Slot::kWk, kvd);
    per_layer(Slot::kWv, kvd);
    per_layer(Slot::kWo, dd);
    per_layer(Slot::kW1, hd);
    per_layer(Slot::kW2, hd);
    per_layer(Slot::kW3, hd);
  } else {
    s.push_back({Slot::kEmbedding, false, vd});
    per_layer(Slot::kAttnNorm, h.dim);
    per_layer(Slot::kWq, dd);
    per_layer(Slot::kWk, kvd);
    per_layer(Slot::kWv, kvd);
    per_layer(Slot::kWo, dd);
    per_layer(Slot::kFfnNorm, h.dim);
    per_layer(Slot::kW1, hd);
    per_layer(Slot::kW2, hd);
    per_layer(Slot::kW3, hd);
    s.push_back({Slot::kFinalNorm, false, h.dim});
    s.push_back({Slot::kSkip, false, freq});  // freq_cis_real
    s.push_back({Slot::kSkip, false, freq});  // freq_cis_imag
  }
  if (!h.shared_classifier) s.push_back({Slot::kWcls, false, vd});
  *out = std::move(s);
  return {};
}

Status check_header(const Header& h, const std::string& path) {
  auto positive = [&](int64_t v, const char* name) -> Status {
    if (v <= 0) return bad_file(path, std::string(name) + " = " + std::to_string(v) + " in the header");
    return {};
  };
  LLMQ_RETURN_IF_ERROR(positive(h.dim, "dim"));
  LLMQ_RETURN_IF_ERROR(positive(h.hidden_dim, "hidden_dim"));
  LLMQ_RETURN_IF_ERROR(positive(h.n_layers, "n_layers"));
  LLMQ_RETURN_IF_ERROR(positive(h.n_heads, "n_heads"));
  LLMQ_RETURN_IF_ERROR(positive(h.n_kv_heads, "n_kv_heads"));
  LLMQ_RETURN_IF_ERROR(positive(h.vocab_size, "vocab_size"));
  LLMQ_RETURN_IF_ERROR(positive(h.seq_len, "seq_len"));
  if (h.dim % h.n_heads != 0)
    return bad_file(path, "n_heads " + std::to_string(h.n_heads) + " does not divide dim " + std::to_string(h.dim));
  if (h.n_heads % h.n_kv_heads != 0)
    return bad_file(path, "n_kv_heads " + std::to_string(h.n_kv_heads) + " does not divide n_heads " +
                              std::to_string(h.n_heads));
  if ((h.dim / h.n_heads) % 2 != 0) return bad_file(path, "head size dim/n_heads is odd");
  return {};
}

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);  // llama2.c files are little-endian, as is every host llmq targets
  return v;
}

Linear make_linear(int64_t layer, LinearRole role, int64_t out, int64_t in) {
  Linear l;
  l.id.layer = layer;
  l.id.role = role;
  l.weight = Tensor(DType::kF32, {out, in});
  return l;
}

// Where array `s` of layer `l` (ignored for whole-model arrays) goes; nullptr to skip it.
float* slot_data(ModelWeights* w, Tensor* wcls, const Segment& s, int64_t l) {
  auto layer = [&]() -> LayerWeights& { return w->layers[static_cast<size_t>(l)]; };
  switch (s.slot) {
    case Slot::kEmbedding: return w->token_embedding.data_as<float>();
    case Slot::kAttnNorm: return layer().attn_norm.data_as<float>();
    case Slot::kFfnNorm: return layer().ffn_norm.data_as<float>();
    case Slot::kFinalNorm: return w->final_norm.data_as<float>();
    case Slot::kWq: return layer().q.weight.data_as<float>();
    case Slot::kWk: return layer().k.weight.data_as<float>();
    case Slot::kWv: return layer().v.weight.data_as<float>();
    case Slot::kWo: return layer().o.weight.data_as<float>();
    case Slot::kW1: return layer().mlp.gate.weight.data_as<float>();
    case Slot::kW2: return layer().mlp.down.weight.data_as<float>();
    case Slot::kW3: return layer().mlp.up.weight.data_as<float>();
    case Slot::kWcls: return wcls->data_as<float>();
    case Slot::kSkip: return nullptr;
  }
  return nullptr;
}

}  // namespace

Status load_llama2c(const std::string& path, ModelWeights* out) {
  if (out == nullptr) return invalid_argument("load_llama2c: out is null");
  // Regular files only: a FIFO or a device would be read until it ends (input_file.hpp).
  int fd = -1;
  int64_t size = 0;
  LLMQ_RETURN_IF_ERROR(open_input_file(path, &fd, &size));
  ::close(fd);
  std::ifstream in(path, std::ios::binary);
  if (!in) return file_error(path, "cannot open for reading");
  return load_llama2c(path, in, out);
}

Status load_llama2c(const std::string& path, std::istream& in, ModelWeights* out) {
  if (out == nullptr) return invalid_argument("load_llama2c: out is null");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) return file_error(path, "cannot determine the file size");
  const int64_t file_size = static_cast<int64_t>(end);
  in.seekg(0, std::ios::beg);

  uint8_t raw[kV1HeaderBytes] = {};
  const int64_t head_read = std::min<int64_t>(file_size, kV1HeaderBytes);
  if (!in.read(reinterpret_cast<char*>(raw), static_cast<std::streamsize>(head_read)))
    return file_error(path, "read of the header failed");
  if (file_size < kLegacyHeaderBytes)
    return bad_file(path, "file has " + std::to_string(file_size) + " bytes, shorter than a header");

  Header h;
  bool v1 = false;
  int64_t header_bytes = kLegacyHeaderBytes;
  uint32_t magic;
  std::memcpy(&magic, raw, sizeof magic);
  if (magic == kV1Magic) {
    if (file_size < kV1HeaderBytes)
      return bad_file(path, "file has " + std::to_string(file_size) + " bytes, shorter than the 256-byte v1 header");
    const int32_t version = read_i32(raw + 4);
    if (version == 2)
      return unsupported(path + ": llama2.c version 2 (Q8_0) checkpoints are not supported; export version 1 (float32)");
    if (version != 1) return bad_file(path, "unknown version " + std::to_string(version));
    v1 = true;
    header_bytes = kV1HeaderBytes;
  }
  const uint8_t* p = raw + (v1 ? 8 : 0);
  h.dim = read_i32(p);
  h.hidden_dim = read_i32(p + 4);
  h.n_layers = read_i32(p + 8);
  h.n_heads = read_i32(p + 12);
  h.n_kv_heads = read_i32(p + 16);
  h.vocab_size = read_i32(p + 20);
  h.seq_len = read_i32(p + 24);
  if (v1) {
    h.shared_classifier = raw[36] != 0;
  } else {
    h.shared_classifier = h.vocab_size > 0;
    if (h.vocab_size < 0) h.vocab_size = -h.vocab_size;
  }
  LLMQ_RETURN_IF_ERROR(check_header(h, path));

  std::vector<Segment> segments;
  LLMQ_RETURN_IF_ERROR(layout(h, v1, path, &segments));
  // Sizes first, with overflow checks, so a corrupt header is refused before anything is allocated.
  int64_t floats = 0;
  for (const Segment& s : segments) {
    int64_t n = s.count;
    if ((s.per_layer && !checked_mul(s.count, h.n_layers, &n)) ||
        n > std::numeric_limits<int64_t>::max() / 8 - floats)
      return bad_file(path, "header sizes overflow");
    floats += n;
  }
  const int64_t expected = header_bytes + floats * 4;
  if (file_size != expected)
    return bad_file(path, "the header (dim " + std::to_string(h.dim) + ", hidden_dim " + std::to_string(h.hidden_dim) +
                              ", n_layers " + std::to_string(h.n_layers) + ", vocab " + std::to_string(h.vocab_size) +
                              (h.shared_classifier ? ", shared classifier" : ", unshared classifier") +
                              ") implies " + std::to_string(expected) + " bytes, the file has " +
                              std::to_string(file_size) + (file_size < expected ? " (truncated?)" : ""));

  // The header is consistent with the file: allocate and read.
  ModelWeights w;
  ModelConfig& c = w.config;
  c.model_type = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.vocab_size = h.vocab_size;
  c.max_seq_len = h.seq_len;
  c.norm_eps = 1e-5;  // run.c's rmsnorm constant
  c.rope_theta = 10000.0;
  c.rope_style = RopeStyle::kInterleaved;
  c.tie_embeddings = h.shared_classifier;
  c.bos_token = 1;  // run.c stops generating when it samples BOS
  c.eos_token = 2;
  if (Status st = c.validate(); !st.ok()) return Status(st.code(), path + ": " + st.message());

  const int64_t kv_dim = c.head_dim * c.n_kv_heads;
  w.token_embedding = Tensor(DType::kF32, {c.vocab_size, c.dim});
  w.final_norm = Tensor(DType::kF32, {c.dim});
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.attn_norm = Tensor(DType::kF32, {c.dim});
    L.ffn_norm = Tensor(DType::kF32, {c.dim});
    L.q = make_linear(l, LinearRole::kQ, c.dim, c.dim);
    L.k = make_linear(l, LinearRole::kK, kv_dim, c.dim);
    L.v = make_linear(l, LinearRole::kV, kv_dim, c.dim);
    L.o = make_linear(l, LinearRole::kO, c.dim, c.dim);
    L.mlp.gate = make_linear(l, LinearRole::kGate, c.hidden_dim, c.dim);
    L.mlp.down = make_linear(l, LinearRole::kDown, c.dim, c.hidden_dim);
    L.mlp.up = make_linear(l, LinearRole::kUp, c.hidden_dim, c.dim);
  }
  w.lm_head = make_linear(-1, LinearRole::kLmHead, c.vocab_size, c.dim);

  in.seekg(static_cast<std::streamoff>(header_bytes), std::ios::beg);
  for (const Segment& s : segments) {
    for (int64_t l = 0; l < (s.per_layer ? c.n_layers : 1); ++l) {
      float* dst = slot_data(&w, &w.lm_head.weight, s, l);
      const int64_t bytes = s.count * 4;
      if (dst == nullptr) {
        in.seekg(static_cast<std::streamoff>(bytes), std::ios::cur);
      } else {
        in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(bytes));
      }
      if (!in) return file_error(path, "read failed");
    }
  }
  // Tied: lm_head is a copy of the embedding, so quantizing lm_head never touches the embedding.
  if (h.shared_classifier) w.lm_head.weight = w.token_embedding;
  LLMQ_RETURN_IF_ERROR(w.check_finite(path));
  *out = std::move(w);
  return {};
}

}  // namespace llmq
