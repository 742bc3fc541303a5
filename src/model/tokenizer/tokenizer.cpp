// Tokenizer::load: which tokenizer file a model path has, and which loader reads it.
#include "llmq/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "llmq/model.hpp"
#include "llmq/model_io.hpp"
#include "model/checkpoint/input_file.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama2.c's own vocabularies: tokenizer.bin (Llama 2's 32000) and tok<N>.bin (tok512.bin, the
// one stories260K uses).
bool is_llama2c_tokenizer_name(const std::string& name) {
  if (name == "tokenizer.bin") return true;
  if (name.size() <= 7 || name.compare(0, 3, "tok") != 0 || !ends_with(name, ".bin")) return false;
  const std::string digits = name.substr(3, name.size() - 7);
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_tokenizer_file_name(const std::string& name) {
  return ends_with(name, ".json") || ends_with(name, ".model") || is_llama2c_tokenizer_name(name);
}

// Present under that name as anything (input_file.hpp's path_present): a FIFO or a directory
// named tokenizer.json is found here and then refused by name when read, not skipped.
bool is_file(const fs::path& p) { return path_present(p.string()); }

// The files looked for, in order, for a model path (what find() tries and load()'s error lists).
std::vector<fs::path> candidates(const std::string& model_dir_or_file) {
  std::error_code ec;
  const fs::path path(model_dir_or_file);
  if (fs::is_directory(path, ec)) return {path / "tokenizer.json", path / "tokenizer.model", path / "tokenizer.bin"};
  if (is_tokenizer_file_name(path.filename().string())) return {path};
  // A llama2.c checkpoint: tokenizer.bin beside it, else the one tok<N>.bin there.
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::vector<fs::path> out{dir / "tokenizer.bin"};
  std::vector<fs::path> numbered;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != "tokenizer.bin" && is_llama2c_tokenizer_name(it->path().filename().string()))
      numbered.push_back(it->path());
  if (numbered.size() == 1) out.push_back(numbered[0]);
  return out;
}

}  // namespace

std::string Tokenizer::find(const std::string& model_dir_or_file) {
  if (model_dir_or_file.empty() || is_builtin_model(model_dir_or_file)) return "";
  for (const fs::path& p : candidates(model_dir_or_file))
    if (is_file(p)) return p.string();
  return "";
}

Status Tokenizer::load(const std::string& model_dir_or_file, std::unique_ptr<Tokenizer>* out) {
  if (model_dir_or_file.empty() || model_dir_or_file == "default")
    return invalid_argument("the default (generated) model has no tokenizer");
  std::error_code ec;
  if (!fs::exists(model_dir_or_file, ec)) return {StatusCode::kIoError, model_dir_or_file + " does not exist"};
  const std::string file = find(model_dir_or_file);
  if (file.empty()) {
    std::string looked;
    for (const fs::path& p : candidates(model_dir_or_file)) looked += (looked.empty() ? "" : ", ") + p.string();
    return {StatusCode::kIoError, "no tokenizer for " + model_dir_or_file + ": looked for " + looked};
  }
  const std::string name = fs::path(file).filename().string();
  if (ends_with(name, ".json")) return tokenizer_detail::load_tokenizer_json(file, out);
  if (ends_with(name, ".model")) return tokenizer_detail::load_sentencepiece_model(file, out);
  return tokenizer_detail::load_llama2c_tokenizer(file, out);
}

std::vector<int32_t> generation_end_ids(const ModelConfig& config, const Tokenizer* tokenizer) {
  std::vector<int32_t> ids;
  if (config.eos_token >= 0) ids.push_back(config.eos_token);
  if (tokenizer != nullptr)
    for (int32_t id : tokenizer->end_ids())
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text, piece;
  int32_t prev = -1;
  for (int32_t t : tokens) {
    if (decode_token(prev, t, &piece).ok())
      text += piece;
    else
      text += "\xEF\xBF\xBD";  // U+FFFD: visible, where dropping the id would hide it
    prev = t;
  }
  return text;
}

namespace tokenizer_detail {

// Tokenizer files are side files: regular files only, bounded (input_file.hpp).
Status read_whole_file(const std::string& path, std::string* out) {
  return read_input_file("tokenizer", path, kMaxSideFileBytes, out);
}

}  // namespace tokenizer_detail
}  // namespace llmq
