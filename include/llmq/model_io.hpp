// Finding models and token data by path, as the CLI takes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/model.hpp"
#include "llmq/status.hpp"

namespace llmq {

// "default": the seeded default model; "default-moe": its Mixtral-style sibling; a directory: a
// Hugging Face checkpoint; a regular file: a llama2.c checkpoint. An empty path is an error (it
// names nothing; it does not mean the default model). `description` says which ("llama2.c
// stories260K.bin", ...).
Status load_model(const std::string& path, ModelWeights* out, std::string* description = nullptr);
// Whether `path` names one of the built-in models load_model generates ("default", "default-moe").
inline bool is_builtin_model(const std::string& path) { return path == "default" || path == "default-moe"; }

class Tokenizer;

// Token data: a text file of token ids separated by white space; each non-empty line is one
// sequence (evaluated from an empty KV cache). A file that is not all token ids is read as text
// with `tokenizer` (read_text_sequences) when one is given, and is otherwise an error that says
// which tokenizer files enable text. Ids are checked against vocab_size (when > 0).
Status read_token_sequences(const std::string& path, int64_t vocab_size, std::vector<std::vector<int32_t>>* out,
                            const Tokenizer* tokenizer = nullptr);

// Token ids given as text on a command line ("1 15 243"): words of decimal digits separated by
// white space, each in [0, vocab_size). A sign, a fraction, a number beyond the vocabulary (never
// wrapped into another id: 4294967297 is not 1) or anything else is an error naming `what` (the
// option) and the word.
Status parse_token_ids(const std::string& what, const std::string& text, int64_t vocab_size, std::vector<int32_t>* out);

// Text data: each line with any non-space character is one sequence, encoded with BOS (a trailing
// "\r" of CRLF files is dropped).
Status read_text_sequences(const std::string& path, const Tokenizer& tok, std::vector<std::vector<int32_t>>* out);

// The same two readers over a file's text already in memory; `source` names it in errors.
Status parse_token_sequences(const std::string& source, const std::string& text, int64_t vocab_size,
                             std::vector<std::vector<int32_t>>* out, const Tokenizer* tokenizer = nullptr);
Status parse_text_sequences(const std::string& source, const std::string& text, const Tokenizer& tok,
                            std::vector<std::vector<int32_t>>* out);

// Deterministic token data from a model's own samples: `count` sequences of `length` tokens after
// ModelConfig::text_start_token (BOS, else EOS; refused when neither) at temperature 1 / top-p 0.9 with seeds seed, seed+1, ... (llama2.c sampling).
Status sample_token_sequences(const ModelWeights& model, int64_t count, int64_t length, uint64_t seed,
                              std::vector<std::vector<int32_t>>* out);

}  // namespace llmq
