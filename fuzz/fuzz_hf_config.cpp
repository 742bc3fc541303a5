// config.json of Hugging Face checkpoints (llama, mistral, qwen2, mixtral) and its
// quantization_config.weight_block_size. An accepted config must be one the loader can use
// without int64 overflow: every weight it will allocate (embedding, q/k/v/o, MLP or experts,
// router) has a byte count that fits, as does the block-scale grid of an FP8 checkpoint.
#include "fuzz_support.hpp"
#include "llmq/safetensors.hpp"

namespace {

bool fits_product(std::initializer_list<int64_t> factors) {
  int64_t p = 4;  // float32 bytes
  for (int64_t f : factors)
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string text = fuzz::as_string(data, size);
  ModelConfig config;
  const Status st = parse_hf_config(text, &config);
  fuzz::require_named_error(st, "config.json");
  int64_t block_rows = 0, block_cols = 0;
  const Status block = parse_hf_weight_block_size(text, &block_rows, &block_cols);
  fuzz::require_named_error(block, "config.json");
  if (block.ok()) fuzz::require(block_rows > 0 && block_cols > 0, "block size not positive");
  if (!st.ok()) return 0;
  fuzz::require(config.validate().ok(), "parse_hf_config accepted a config validate() refuses");
  const ModelConfig& c = config;
  const int64_t experts = c.is_moe() ? c.n_experts : 1;
  fuzz::require(fits_product({c.vocab_size, c.dim}) && fits_product({c.n_heads, c.head_dim, c.dim}) &&
                    fits_product({c.n_kv_heads, c.head_dim, c.dim}) && fits_product({experts, c.hidden_dim, c.dim}) &&
                    fits_product({c.n_layers, c.dim}) && fits_product({c.max_seq_len, c.head_dim}),
                "accepted config whose weight sizes overflow int64", text.substr(0, 200));
  return 0;
}
