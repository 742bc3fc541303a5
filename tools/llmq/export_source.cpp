// The weights `llmq quantize` and `llmq recipe` export from (export_source.hpp).
#include "export_source.hpp"

#include <cstdio>
#include <filesystem>

#include "llmq/tokenizer.hpp"

namespace llmq::cli {

Status export_weight_source(const std::string& model_path, const ModelWeights& model,
                            std::unique_ptr<WeightSource>* source, std::vector<ExportSideFile>* side_files) {
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) return checkpoint_weight_source(model_path, source);
  *source = memory_weight_source(model);
  // A llama2.c model keeps its tokenizer (tokenizer.bin / tok<N>.bin beside it), as the
  // tokenizer.json and tokenizer_config.json that llmq and transformers read.
  // A tokenizer of another vocabulary size beside it (llama2.c's 32k tokenizer.bin next to a
  // tok512 model) is not its tokenizer: the output gets none, and says so.
  if (const std::string tok_path = Tokenizer::find(model_path); !tok_path.empty()) {
    HfTokenizerFiles tok;
    LLMQ_RETURN_IF_ERROR(llama2c_tokenizer_to_hf(tok_path, &tok));
    if (tok.vocab_size != model.config.vocab_size)
      std::fprintf(stderr, "llmq: warning: %s has %lld tokens, the model %lld: not its tokenizer; the output has none\n",
                   tok_path.c_str(), static_cast<long long>(tok.vocab_size),
                   static_cast<long long>(model.config.vocab_size));
    else
      *side_files = {{"tokenizer.json", tok.tokenizer_json}, {"tokenizer_config.json", tok.tokenizer_config_json}};
  }
  return {};
}

}  // namespace llmq::cli
