// Tokenizer: text <-> token ids for the models llmq loads, so calibration and evaluation data can
// be text and `llmq run` can print text. Three on-disk forms, all BPE:
//  - Hugging Face tokenizer.json, model.type "BPE": byte-level BPE (GPT-2, Llama 3, Qwen2) or
//    sentencepiece-style BPE with "▁" and <0xNN> byte fallback (Llama 2, Mistral);
//  - sentencepiece tokenizer.model (BPE models; pieces merged by score);
//  - llama2.c tokenizer.bin (pieces with scores, merged exactly as run.c's encode does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmq/status.hpp"

namespace llmq {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `model_dir_or_file`: a Hugging Face directory (tokenizer.json, else tokenizer.model), a
  // tokenizer file itself (*.json, *.model, tokenizer.bin / tok<N>.bin), or a llama2.c checkpoint
  // (tokenizer.bin beside it, else the one tok<N>.bin there, as llama2.c ships tok512.bin).
  // Errors name the file at fault, or every file looked for when there is none.
  static Status load(const std::string& model_dir_or_file, std::unique_ptr<Tokenizer>* out);
  // The tokenizer file load() would read, or "" when there is none (a model without tokenizer is
  // not an error for callers that can fall back to token ids).
  static std::string find(const std::string& model_dir_or_file);

  // Special tokens (added_tokens, sentencepiece user-defined pieces) are matched literally first.
  // BOS is prepended when add_bos and the tokenizer has one (bos() >= 0).
  virtual Status encode(const std::string& text, bool add_bos, std::vector<int32_t>* out) const = 0;
  // The bytes `token` stands for when it follows `prev` (-1: start of text). As run.c does, the
  // space a sentencepiece-style tokenizer prepends is dropped from the first piece after BOS or at
  // the start. BOS, EOS and control tokens give "". A piece may be part of a UTF-8 character.
  virtual Status decode_token(int32_t prev, int32_t token, std::string* piece) const = 0;
  // The text of a whole sequence; an id outside the vocabulary gives U+FFFD.
  std::string decode(const std::vector<int32_t>& tokens) const;

  int64_t vocab_size() const { return vocab_size_; }
  int32_t bos() const { return bos_; }  // -1 when the tokenizer has none (Qwen2)
  int32_t eos() const { return eos_; }
  // Every token that ends a generation: EOS first, then the other ids a Hugging Face model's
  // config.json and generation_config.json name as eos_token_id (instruct models end a turn with
  // one of several). Empty when the tokenizer has no EOS and the files name none.
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  // "tokenizer.json byte-level BPE, 128256 tokens (/models/llama3/tokenizer.json)"
  const std::string& description() const { return description_; }

 protected:
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  std::vector<int32_t> end_ids_;
  std::string description_;
};

struct ModelConfig;
// The tokens that end a generation of this model, decided here for `llmq run`, `serve` and `chat`:
// config.json's EOS (when it names one), then the tokenizer's end ids (EOS and the other ids
// config.json and generation_config.json name), without repeats. A model served without a
// tokenizer (token-id prompts) still stops at its EOS. BOS is not among them: `llmq run` also stops
// on it, as run.c does.
std::vector<int32_t> generation_end_ids(const ModelConfig& config, const Tokenizer* tokenizer);

// A llama2.c tokenizer as the Hugging Face files that stand for it beside a converted model, so
// llmq and transformers both read the model's text. tokenizer.json is sentencepiece-style BPE as
// transformers writes Llama 2's: "▁" prepended and for spaces, <0xNN> byte fallback, and merges
// derived from the scores as transformers' sentencepiece converter derives them.
struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t bos = -1;  // the ids config.json must carry (llama2.c's fixed 1 and 2)
  int32_t eos = -1;
  int64_t vocab_size = 0;  // tokens in the vocabulary (a model of another size is not its own)
};
// `path`: tokenizer.bin / tok<N>.bin. The files encode every text to the ids run.c gives, but for
// U+2581 ("▁") in the text, which tokenizer.json cannot tell from a space (nor can sentencepiece,
// which made the vocabulary). A vocabulary they could not reproduce is refused with an error that
// names the file and the piece: a piece that is not UTF-8 or holds "▁", two equal pieces, two
// pieces merges make with the same score (run.c takes the leftmost; a merge list has one order), a
// missing byte token <0xNN> (transformers would put the <unk> standing in for it out of order).
Status llama2c_tokenizer_to_hf(const std::string& path, HfTokenizerFiles* out);

}  // namespace llmq
