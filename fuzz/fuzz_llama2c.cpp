// llama2.c checkpoints (legacy and v1 headers, shared or separate classifier), read from memory
// through the same stream loader a file goes through. Mutated files almost never have the exact
// size their header implies, so each input is also tried resized to that size (computed the way
// export.py writes files, format_writers.hpp) when that is at most 256 KiB: this reaches the code
// after the size check (allocation, reading, the config) with arbitrary headers. An accepted file
// yields weights of the shapes its config says.
#include <cstring>
#include <sstream>

#include "format_writers.hpp"
#include "fuzz_support.hpp"
#include "llmq/model.hpp"

namespace {

constexpr int64_t kMaxResized = 256 * 1024;

void load_and_check(const std::string& bytes) {
  using namespace llmq;
  const std::string source = "fuzz.bin";
  std::istringstream in(bytes);
  ModelWeights w;
  const Status st = load_llama2c(source, in, &w);
  fuzz::require_named_error(st, source);
  if (!st.ok()) return;
  const ModelConfig& c = w.config;
  fuzz::require(c.validate().ok(), "accepted a config validate() refuses");
  fuzz::require(w.token_embedding.numel() == c.vocab_size * c.dim, "embedding size");
  fuzz::require(static_cast<int64_t>(w.layers.size()) == c.n_layers, "layer count");
  fuzz::require(w.lm_head.weight.numel() == c.vocab_size * c.dim, "classifier size");
}

// The header of `bytes` read as export.py's fields; false when there are too few bytes.
bool read_shape(const std::string& bytes, llmq::fuzz::Llama2cShape* s) {
  uint32_t magic = 0;
  if (bytes.size() >= 4) std::memcpy(&magic, bytes.data(), sizeof magic);
  s->v1 = magic == 0x616b3432;  // "ak42"
  const size_t at = s->v1 ? 8 : 0;
  if (bytes.size() < (s->v1 ? 256 : 28)) return false;
  int32_t f[7];
  std::memcpy(f, bytes.data() + at, sizeof f);
  *s = {f[0], f[1], f[2], f[3], f[4], f[5], f[6], s->v1 ? bytes[36] != 0 : f[5] > 0, s->v1};
  if (!s->v1 && s->vocab_size < 0 && s->vocab_size != INT32_MIN) s->vocab_size = -s->vocab_size;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = llmq::fuzz::as_string(data, size);
  load_and_check(bytes);
  llmq::fuzz::Llama2cShape shape;
  if (!read_shape(bytes, &shape)) return 0;
  const int64_t floats = llmq::fuzz::llama2c_float_count(shape);
  const int64_t header = shape.v1 ? 256 : 28;
  if (floats < 0 || floats > (kMaxResized - header) / 4 || header + floats * 4 == static_cast<int64_t>(size)) return 0;
  std::string resized = bytes;
  resized.resize(static_cast<size_t>(header + floats * 4), '\0');
  load_and_check(resized);
  return 0;
}
