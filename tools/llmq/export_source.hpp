// The weights `llmq quantize` and `llmq recipe` export from, and the files that go with them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "llmq/export.hpp"
#include "llmq/model.hpp"
#include "llmq/status.hpp"

namespace llmq::cli {

// A Hugging Face directory is streamed from its memory map (its tokenizer files are copied by the
// export itself). Anything else is `model`, already loaded from `model_path` (the source refers to
// it: keep it alive); a llama2.c model keeps its tokenizer, converted into tokenizer.json and
// tokenizer_config.json side files, unless the tokenizer beside it has another vocabulary size
// (then the output has none, and a warning says so).
Status export_weight_source(const std::string& model_path, const ModelWeights& model,
                            std::unique_ptr<WeightSource>* source, std::vector<ExportSideFile>* side_files);

}  // namespace llmq::cli
