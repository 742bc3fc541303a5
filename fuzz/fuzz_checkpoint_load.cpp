// The whole load path of a Hugging Face checkpoint, not only its parsers: config.json and one
// model.safetensors from the input are written into a directory and opened the way every command
// opens a model (open_hf_checkpoint: config semantics, header, the config-vs-tensor checks), then
// loaded into float32 weights (load_hf_model: dequantization of 8-bit weights included), and its
// static KV-cache scales read (read_kv_cache_scales).
// Input layout: 4 bytes little-endian n, then n bytes of config.json, then the safetensors file.
// Invariants: an error names the directory; a model that loads matches its own config (every
// layer, tensor shapes as the config says) and holds only finite weights.
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fuzz_support.hpp"
#include "llmq/export.hpp"
#include "llmq/safetensors.hpp"

namespace {

// One directory per fuzzing process, rewritten for every input, and removed at exit (libFuzzer
// ends with exit()). Kept in a plain array: an atexit handler may run after a static std::string
// is destroyed.
char g_dir[64] = "/tmp/llmq-fuzz-load-XXXXXX";

void remove_work_dir() {
  ::unlink((std::string(g_dir) + "/config.json").c_str());
  ::unlink((std::string(g_dir) + "/model.safetensors").c_str());
  ::rmdir(g_dir);
}

const std::string& work_dir() {
  static const std::string dir = [] {
    if (::mkdtemp(g_dir) == nullptr) llmq::fuzz::invariant_failed("mkdtemp failed");
    std::atexit(remove_work_dir);
    return std::string(g_dir);
  }();
  return dir;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) llmq::fuzz::invariant_failed("cannot write", path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  if (size < 4) return 0;
  const size_t n = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8 |
                   static_cast<size_t>(data[2]) << 16 | static_cast<size_t>(data[3]) << 24;
  if (n > size - 4) return 0;
  const std::string& dir = work_dir();
  write_file(dir + "/config.json", data + 4, n);
  write_file(dir + "/model.safetensors", data + 4 + n, size - 4 - n);

  std::unique_ptr<Checkpoint> ckpt;
  ModelConfig config;
  const Status opened = open_hf_checkpoint(dir, &ckpt, &config);
  fuzz::require_named_error(opened, dir);
  ModelWeights w;
  const Status loaded = load_hf_model(dir, &w);
  fuzz::require_named_error(loaded, dir);
  fuzz::require(opened.ok() || !loaded.ok(), "load_hf_model accepted what open_hf_checkpoint refuses");
  if (opened.ok()) {
    // Static KV-cache scales (quantization_config.kv_cache_scheme + each attention's k_scale /
    // v_scale): refused by name, or one finite positive scale per layer and KV head.
    bool declared = false;
    std::vector<float> k, v;
    const Status kv = read_kv_cache_scales(*ckpt, config, &declared, &k, &v);
    fuzz::require_named_error(kv, dir);
    const size_t n = static_cast<size_t>(config.n_layers * config.n_kv_heads);
    fuzz::require(!kv.ok() || !declared || (k.size() == n && v.size() == n), "KV scales of the wrong count");
    fuzz::require(!kv.ok() || declared || (k.empty() && v.empty()), "KV scales without a declaration");
    for (const std::vector<float>* s : {&k, &v})
      for (float x : *s) fuzz::require(!kv.ok() || (std::isfinite(x) && x > 0.0f), "a KV scale that is not finite positive");
  }
  if (!loaded.ok()) return 0;
  fuzz::require(w.config.validate().ok(), "loaded a model whose config validate() refuses");
  fuzz::require(static_cast<int64_t>(w.layers.size()) == w.config.n_layers, "layer count differs from the config");
  fuzz::require(w.token_embedding.shape() == std::vector<int64_t>{w.config.vocab_size, w.config.dim},
                "embedding shape differs from the config");
  fuzz::require(w.check_finite(dir).ok(), "loaded non-finite weights");
  return 0;
}
