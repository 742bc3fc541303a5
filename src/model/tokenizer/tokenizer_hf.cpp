// Hugging Face tokenizer.json (model.type "BPE") -> BpeSpec. Two families are told apart by their
// pipeline: a ByteLevel pre-tokenizer or decoder means byte-level BPE (GPT-2, Llama 3, Qwen2); a
// "▁" normalizer or Metaspace pre-tokenizer means sentencepiece-style BPE (Llama 2, Mistral).
// Only the pipeline pieces these models use are accepted; anything else is an Unsupported error
// that names the component, rather than a tokenization that silently differs.
// BOS / EOS come from tokenizer_config.json beside the file, else config.json's ids, else the
// post-processor's template, else the conventional names.
#include <algorithm>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer_bpe.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq::tokenizer_detail {
namespace {

using json = nlohmann::json;

constexpr const char* kMetaspaceMarker = "\xE2\x96\x81";  // "▁" U+2581
// How many unused ids beyond the listed tokens a vocabulary may have (besides as many unused ids
// as listed ones): room for reserved ranges without sizing the table by an arbitrary id.
constexpr int64_t kMaxIdSlack = 1024;

}  // namespace

// The split patterns of the models llmq knows: GPT-2, Llama 3, Qwen2 (Llama 3's with single
// digits), and tiktoken's o200k_base (GPT-4o, gpt-oss).
const std::vector<SplitPattern>& split_patterns() {
  static const std::vector<SplitPattern> patterns = {
      {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", SplitKind::kGpt2, 0},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       SplitKind::kLlama3, 3},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       SplitKind::kLlama3, 1},
      {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       SplitKind::kO200k, 3},
  };
  return patterns;
}

namespace {

// The parse state: the spec being filled and the file name for messages.
struct Parser {
  std::string path;
  BpeSpec spec;
  bool byte_level_seen = false;
  bool metaspace_seen = false;
  int32_t template_bos = -1;  // the post-processor's leading special token

  Status bad(const std::string& what) const { return invalid_argument(path + ": " + what); }
  Status unsupported_part(const std::string& what) const {
    return unsupported(path + ": " + what + " is not supported (llmq reads the byte-level BPE of GPT-2 / Llama 3 / "
                                            "Qwen2 / GPT-4o / gpt-oss and the sentencepiece-style BPE of Llama 2)");
  }
};

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

bool bool_field(const json& obj, const char* key, bool fallback) {
  const json* v = field(obj, key);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}

std::string string_field(const json& obj, const char* key) {
  const json* v = field(obj, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

std::string type_of(const json& obj) { return string_field(obj, "type"); }

Status parse_normalizer(Parser* p, const json& n) {
  const std::string type = type_of(n);
  if (type == "Sequence") {
    const json* list = field(n, "normalizers");
    if (!list || !list->is_array()) return p->bad("normalizer.normalizers: expected an array");
    for (const json& item : *list) LLMQ_RETURN_IF_ERROR(parse_normalizer(p, item));
    return {};
  }
  if (type == "Prepend") {
    NormalizeOp op;
    op.kind = NormalizeOp::Kind::kPrepend;
    op.to = string_field(n, "prepend");
    p->spec.normalize.push_back(op);
    return {};
  }
  if (type == "Replace") {
    const json* pattern = field(n, "pattern");
    const json* literal = pattern ? field(*pattern, "String") : nullptr;
    if (!literal || !literal->is_string()) return p->unsupported_part("a Replace normalizer with a regex pattern");
    NormalizeOp op;
    op.kind = NormalizeOp::Kind::kReplace;
    op.from = literal->get<std::string>();
    op.to = string_field(n, "content");
    p->spec.normalize.push_back(op);
    return {};
  }
  // Qwen2 / Qwen3 declare NFC: canonical composition (ICU), so "e" + U+0301 encodes as "é" does.
  if (type == "NFC") {
    NormalizeOp op;
    op.kind = NormalizeOp::Kind::kNfc;
    p->spec.normalize.push_back(op);
    return {};
  }
  return p->unsupported_part("normalizer '" + type + "'");
}

Status parse_pre_tokenizer(Parser* p, const json& t) {
  const std::string type = type_of(t);
  if (type == "Sequence") {
    const json* list = field(t, "pretokenizers");
    if (!list || !list->is_array()) return p->bad("pre_tokenizer.pretokenizers: expected an array");
    for (const json& item : *list) LLMQ_RETURN_IF_ERROR(parse_pre_tokenizer(p, item));
    return {};
  }
  if (type == "ByteLevel") {
    p->byte_level_seen = true;
    if (bool_field(t, "add_prefix_space", false)) {
      NormalizeOp op;
      op.kind = NormalizeOp::Kind::kPrepend;
      op.to = " ";
      op.skip_if_present = true;
      p->spec.normalize.push_back(op);
    }
    if (bool_field(t, "use_regex", true)) p->spec.splitters.push_back({SplitKind::kGpt2, 0, ""});
    return {};
  }
  if (type == "Split") {
    const json* pattern = field(t, "pattern");
    const json* regex = pattern ? field(*pattern, "Regex") : nullptr;
    if (!regex || !regex->is_string()) return p->unsupported_part("a Split pre-tokenizer without a Regex pattern");
    if (string_field(t, "behavior") != "Isolated" || bool_field(t, "invert", false))
      return p->unsupported_part("a Split pre-tokenizer with behavior '" + string_field(t, "behavior") + "'" +
                                 (bool_field(t, "invert", false) ? " and invert" : ""));
    const std::string text = regex->get<std::string>();
    for (const SplitPattern& k : split_patterns())
      if (text == k.regex) {
        p->spec.splitters.push_back({k.kind, k.max_digits, ""});
        return {};
      }
    return p->unsupported_part("the Split pattern " + json(text).dump());
  }
  if (type == "Metaspace") {
    // "▁" for spaces, a "▁" before the text (unless already there), and a word per "▁".
    p->metaspace_seen = true;
    const std::string marker = t.contains("replacement") ? string_field(t, "replacement") : kMetaspaceMarker;
    NormalizeOp replace;
    replace.kind = NormalizeOp::Kind::kReplace;
    replace.from = " ";
    replace.to = marker;
    p->spec.normalize.push_back(replace);
    std::string scheme = string_field(t, "prepend_scheme");
    if (scheme.empty()) scheme = bool_field(t, "add_prefix_space", true) ? "always" : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never")
      return p->unsupported_part("Metaspace prepend_scheme '" + scheme + "'");
    if (scheme != "never") {
      NormalizeOp prepend;
      prepend.kind = NormalizeOp::Kind::kPrepend;
      prepend.to = marker;
      prepend.first_only = scheme == "first";
      prepend.skip_if_present = true;
      p->spec.normalize.push_back(prepend);
    }
    if (bool_field(t, "split", true)) p->spec.splitters.push_back({SplitKind::kMetaspace, 0, marker});
    p->spec.space_symbol = marker;
    return {};
  }
  return p->unsupported_part("pre_tokenizer '" + type + "'");
}

// The first SpecialToken of a TemplateProcessing "single" template: Llama 3's BOS.
void parse_post_processor(Parser* p, const json& pp) {
  const std::string type = type_of(pp);
  if (type == "Sequence") {
    if (const json* list = field(pp, "processors"); list && list->is_array())
      for (const json& item : *list) parse_post_processor(p, item);
    return;
  }
  if (type != "TemplateProcessing") return;
  const json* single = field(pp, "single");
  if (!single || !single->is_array() || single->empty()) return;
  const json* special = field((*single)[0], "SpecialToken");
  if (!special) return;
  const std::string name = string_field(*special, "id");
  const json* specials = field(pp, "special_tokens");
  const json* entry = specials ? field(*specials, name.c_str()) : nullptr;
  const json* ids = entry ? field(*entry, "ids") : nullptr;
  if (ids && ids->is_array() && ids->size() == 1 && (*ids)[0].is_number_integer())
    p->template_bos = (*ids)[0].get<int32_t>();
}

Status parse_merges(Parser* p, const json& merges, const std::unordered_map<std::string, int32_t>& vocab) {
  if (!merges.is_array()) return p->bad("model.merges: expected an array");
  p->spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      // "a b": pieces never hold a plain space (byte-level maps it to "Ġ", sentencepiece to "▁").
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        return p->bad("model.merges[" + std::to_string(i) + "]: expected two pieces separated by a space, got " +
                      m.dump());
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return p->bad("model.merges[" + std::to_string(i) + "]: expected \"a b\" or [\"a\", \"b\"], got " + m.dump());
    }
    const auto l = vocab.find(left);
    const auto r = vocab.find(right);
    if (l == vocab.end() || r == vocab.end())
      return p->bad("model.merges[" + std::to_string(i) + "]: '" + (l == vocab.end() ? left : right) +
                    "' is not in model.vocab");
    p->spec.merges.emplace_back(l->second, r->second);
  }
  return {};
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}; null = none.
Status config_token(const std::string& config_path, const json& cfg, const char* key,
                    const std::unordered_map<std::string, int32_t>& ids, bool* present, int32_t* id) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  *present = true;
  if (it->is_null()) {
    *id = -1;
    return {};
  }
  std::string content;
  if (it->is_string()) content = it->get<std::string>();
  if (it->is_object()) content = string_field(*it, "content");
  const auto found = ids.find(content);
  if (found == ids.end())
    return invalid_argument(config_path + ": " + key + " " + it->dump() + " is not a token of the tokenizer");
  *id = found->second;
  return {};
}

Status parse_json_object(const std::string& path, const std::string& text, json* out) {
  LLMQ_RETURN_IF_ERROR(parse_json_text(path, text, out));
  if (!out->is_object()) return invalid_argument(path + ": expected a JSON object");
  return {};
}

Status read_json(const std::string& path, json* out) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_whole_file(path, &text));
  return parse_json_object(path, text, out);
}

// Every token that ends a generation: EOS, and each id config.json and generation_config.json
// give as eos_token_id (one id or a list). Instruct models name several there and EOS is only
// one of them (Llama 3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>; gpt-oss: <|return|>,
// <|endoftext|>, <|call|>): a server that stopped at EOS alone would talk past the end of its turn.
// An entry that is not a token id of this vocabulary is an error naming the file.
Status resolve_end_ids(Parser* p) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(p->path).parent_path();
  const auto vocab = static_cast<int64_t>(p->spec.pieces.size());
  std::vector<int32_t>& end = p->spec.end_ids;
  end.clear();
  if (p->spec.eos >= 0) end.push_back(p->spec.eos);
  for (const char* name : {"config.json", "generation_config.json"}) {
    const fs::path path = dir / name;
    if (!path_present(path.string())) continue;
    json cfg;
    LLMQ_RETURN_IF_ERROR(read_json(path.string(), &cfg));
    const json* v = field(cfg, "eos_token_id");
    if (v == nullptr) continue;
    const bool list = v->is_array();
    const size_t count = list ? v->size() : 1;
    for (size_t i = 0; i < count; ++i) {
      const json& item = list ? (*v)[i] : *v;
      const std::string where = path.string() + ": eos_token_id" + (list ? "[" + std::to_string(i) + "]" : std::string());
      if (!item.is_number_integer()) return invalid_argument(where + ": expected a token id, got " + item.dump(-1).substr(0, 64));
      const bool fits = !(item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
      const int64_t id = fits ? item.get<int64_t>() : -1;
      if (id < 0 || id >= vocab)
        return invalid_argument(where + ": " + item.dump() + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
      if (std::find(end.begin(), end.end(), static_cast<int32_t>(id)) == end.end()) end.push_back(static_cast<int32_t>(id));
    }
  }
  return {};
}

// BOS and EOS: tokenizer_config.json, config.json, the post-processor, then common names.
Status resolve_special_ids(Parser* p, const std::unordered_map<std::string, int32_t>& ids) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(p->path).parent_path();
  bool have_bos = false, have_eos = false;
  int32_t bos = -1, eos = -1;
  // Present under the name as anything (a FIFO, a directory, a link loop): read, and so refused by
  // name (read_input_file), rather than skipped as if absent.
  auto present = [](const fs::path& path) { return path_present(path.string()); };
  if (const fs::path cfg_path = dir / "tokenizer_config.json"; present(cfg_path)) {
    json cfg;
    LLMQ_RETURN_IF_ERROR(read_json(cfg_path.string(), &cfg));
    LLMQ_RETURN_IF_ERROR(config_token(cfg_path.string(), cfg, "bos_token", ids, &have_bos, &bos));
    LLMQ_RETURN_IF_ERROR(config_token(cfg_path.string(), cfg, "eos_token", ids, &have_eos, &eos));
  }
  if ((!have_bos || !have_eos) && present(dir / "config.json")) {
    json cfg;
    LLMQ_RETURN_IF_ERROR(read_json((dir / "config.json").string(), &cfg));
    auto read_id = [&](const char* key, bool* have, int32_t* id) {
      const json* v = field(cfg, key);
      if (v && v->is_array() && !v->empty()) v = &(*v)[0];  // eos_token_id: [128001, 128009]
      // An id outside int32 is no token (never wrapped into one); the vocabulary check below refuses it.
      if (*have || !v || !v->is_number_integer()) return;
      *have = true;
      const int64_t wide = v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? -1 : v->get<int64_t>();
      *id = wide >= 0 && wide <= INT32_MAX ? static_cast<int32_t>(wide) : -1;
    };
    read_id("bos_token_id", &have_bos, &bos);
    read_id("eos_token_id", &have_eos, &eos);
  }
  if (!have_bos && p->template_bos >= 0) {
    have_bos = true;
    bos = p->template_bos;
  }
  auto by_name = [&](std::initializer_list<const char*> names, bool* have, int32_t* id) {
    for (const char* name : names)
      if (!*have)
        if (const auto it = ids.find(name); it != ids.end()) {
          *have = true;
          *id = it->second;
        }
  };
  by_name({"<s>", "<|begin_of_text|>"}, &have_bos, &bos);
  by_name({"</s>", "<|end_of_text|>", "<|endoftext|>"}, &have_eos, &eos);
  p->spec.bos = bos;
  p->spec.eos = eos;
  return resolve_end_ids(p);
}

}  // namespace

Status load_tokenizer_json(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  std::string text;
  LLMQ_RETURN_IF_ERROR(read_whole_file(path, &text));
  return parse_tokenizer_json(path, text, out);
}

Status parse_tokenizer_json(const std::string& path, const std::string& text, std::unique_ptr<Tokenizer>* out) {
  json j;
  LLMQ_RETURN_IF_ERROR(parse_json_object(path, text, &j));
  Parser p;
  p.path = path;
  p.spec.source = path;
  const json* model = field(j, "model");
  if (!model || !model->is_object()) return p.bad("no \"model\" object");
  const std::string model_type = type_of(*model);
  // Older files leave out model.type; their BPE models still carry merges.
  if (model_type != "BPE" && !(model_type.empty() && model->contains("merges")))
    return unsupported(path + ": model.type '" + model_type + "' is not supported (llmq reads BPE tokenizers)");
  if (!string_field(*model, "continuing_subword_prefix").empty() || !string_field(*model, "end_of_word_suffix").empty())
    return p.unsupported_part("a BPE model with continuing_subword_prefix / end_of_word_suffix");
  if (const json* dropout = field(*model, "dropout"); dropout && dropout->is_number() && dropout->get<double>() > 0.0)
    return p.unsupported_part("BPE dropout");

  const json* vocab = field(*model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty()) return p.bad("model.vocab: expected a non-empty object");
  std::unordered_map<std::string, int32_t> vocab_ids;  // model vocabulary only: what merges name
  std::unordered_map<std::string, int32_t> all_ids;    // plus added tokens: what configs name
  int64_t max_id = -1;
  for (const auto& [piece, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > INT32_MAX)
      return p.bad("model.vocab['" + piece + "']: expected a non-negative int32 id, got " + id_json.dump());
    const auto id = id_json.get<int32_t>();
    vocab_ids.emplace(piece, id);
    all_ids.emplace(piece, id);
    max_id = std::max<int64_t>(max_id, id);
  }
  if (const json* added = field(j, "added_tokens")) {
    if (!added->is_array()) return p.bad("added_tokens: expected an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const json* id = field(t, "id");
      const json* content = field(t, "content");
      if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX || !content ||
          !content->is_string())
        return p.bad("added_tokens[" + std::to_string(i) + "]: expected an int32 \"id\" and a string \"content\"");
      p.spec.specials.push_back({content->get<std::string>(), id->get<int32_t>()});
      all_ids[content->get<std::string>()] = id->get<int32_t>();
      max_id = std::max<int64_t>(max_id, id->get<int64_t>());
    }
  }
  // Ids need not be dense; a gap is a piece that never matches and decodes to "". But the table is
  // sized by the largest id, so an id far beyond the tokens listed (a 3 KB file claiming id
  // 120000008 asked for 4 GB) is refused: real vocabularies have few gaps, if any.
  const int64_t listed = static_cast<int64_t>(vocab->size()) + static_cast<int64_t>(p.spec.specials.size());
  if (max_id >= 2 * listed + kMaxIdSlack)
    return p.bad("token id " + std::to_string(max_id) + " is far beyond the " + std::to_string(listed) +
                 " tokens of model.vocab and added_tokens (ids may leave gaps, but fewer than " +
                 std::to_string(listed + kMaxIdSlack) + ")");
  p.spec.pieces.assign(static_cast<size_t>(max_id + 1), std::string());
  p.spec.mergeable.assign(p.spec.pieces.size(), false);
  for (const auto& [piece, id] : vocab_ids) {
    p.spec.pieces[static_cast<size_t>(id)] = piece;
    p.spec.mergeable[static_cast<size_t>(id)] = true;
  }
  for (const SpecialToken& t : p.spec.specials) p.spec.pieces[static_cast<size_t>(t.id)] = t.content;

  if (const json* merges = field(*model, "merges")) LLMQ_RETURN_IF_ERROR(parse_merges(&p, *merges, vocab_ids));
  p.spec.merge_mode = BpeSpec::MergeMode::kRank;
  p.spec.byte_fallback = bool_field(*model, "byte_fallback", false);
  p.spec.ignore_merges = bool_field(*model, "ignore_merges", false);
  p.spec.fuse_unk = bool_field(*model, "fuse_unk", false);
  if (const std::string unk = string_field(*model, "unk_token"); !unk.empty()) {
    const auto it = vocab_ids.find(unk);
    if (it == vocab_ids.end()) return p.bad("model.unk_token '" + unk + "' is not in model.vocab");
    p.spec.unk = it->second;
  }

  if (const json* n = field(j, "normalizer")) LLMQ_RETURN_IF_ERROR(parse_normalizer(&p, *n));
  if (const json* t = field(j, "pre_tokenizer")) LLMQ_RETURN_IF_ERROR(parse_pre_tokenizer(&p, *t));
  if (const json* d = field(j, "decoder"); d && type_of(*d) == "ByteLevel") p.byte_level_seen = true;
  if (const json* pp = field(j, "post_processor")) parse_post_processor(&p, *pp);

  bool prepends_marker = false;
  for (const NormalizeOp& op : p.spec.normalize) {
    if (op.kind == NormalizeOp::Kind::kReplace && op.to == kMetaspaceMarker) p.spec.space_symbol = kMetaspaceMarker;
    if (op.kind == NormalizeOp::Kind::kPrepend && op.to == kMetaspaceMarker) prepends_marker = true;
  }
  p.spec.byte_level = p.byte_level_seen;
  if (p.spec.byte_level && (p.metaspace_seen || !p.spec.space_symbol.empty()))
    return p.unsupported_part("a pipeline mixing ByteLevel and \"▁\" (Metaspace) steps");
  if (!p.spec.byte_level && p.spec.space_symbol.empty() && !p.spec.byte_fallback)
    return p.unsupported_part("a BPE model with neither a ByteLevel nor a \"▁\" (sentencepiece-style) pipeline");
  // Llama 2's decoder strips the one space the "▁" prefix became; run.c does the same after BOS.
  p.spec.strip_leading_space = !p.spec.byte_level && prepends_marker;

  LLMQ_RETURN_IF_ERROR(resolve_special_ids(&p, all_ids));
  p.spec.description = std::string("tokenizer.json ") +
                       (p.spec.byte_level ? "byte-level BPE" : "sentencepiece-style BPE") + ", " +
                       std::to_string(p.spec.pieces.size()) + " tokens (" + path + ")";
  return BpeTokenizer::create(std::move(p.spec), out);
}

}  // namespace llmq::tokenizer_detail
