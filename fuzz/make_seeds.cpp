// Writes the seed corpora of the fuzz targets: small files of every format llmq reads, made with
// llmq's own writers where it has them (write_safetensors, CalibrationStats::save) and with
// format_writers.hpp where it does not. Usage: llmq_fuzz_seeds <corpus root> (one folder per
// target). Seeds are deterministic, so regenerating them changes nothing unless a format does.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat_template_input.hpp"
#include "format_writers.hpp"
#include "llmq/calibration.hpp"
#include "llmq/model_io.hpp"
#include "llmq/safetensors.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"
#include "server/openai_request.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using llmq::Status;
using namespace llmq::fuzz;

class Corpus {
 public:
  explicit Corpus(fs::path root) : root_(std::move(root)) {}
  fs::path dir(const std::string& target) const {
    fs::create_directories(root_ / target);
    return root_ / target;
  }
  void put(const std::string& target, const std::string& name, const std::string& bytes) const {
    std::ofstream out(dir(target) / name, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out) throw std::runtime_error("cannot write " + (dir(target) / name).string());
  }

 private:
  fs::path root_;
};

void check(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.to_string());
}

// ---- safetensors: files written by write_safetensors, and an index over two shards

llmq::SafetensorsWriteEntry entry(const std::string& name, llmq::DType dtype, std::vector<int64_t> shape) {
  return {name, dtype, std::move(shape), [](uint8_t*) { return Status(); }};  // zeroed data
}

void safetensors_seeds(const Corpus& c) {
  using llmq::DType;
  const fs::path d = c.dir("fuzz_safetensors_header");
  check(llmq::write_safetensors((d / "tiny-llama.safetensors").string(),
                                {entry("model.embed_tokens.weight", DType::kBF16, {12, 8}),
                                 entry("model.layers.0.self_attn.q_proj.weight", DType::kE4M3, {8, 8}),
                                 entry("model.layers.0.self_attn.q_proj.weight_scale", DType::kF32, {}),
                                 entry("model.layers.0.input_layernorm.weight", DType::kF16, {8}),
                                 entry("model.norm.weight", DType::kF32, {8})}));
  check(llmq::write_safetensors((d / "every-dtype.safetensors").string(),
                                {entry("f64", DType::kF64, {2}), entry("f32", DType::kF32, {1, 3}),
                                 entry("i32", DType::kI32, {3}), entry("bf16", DType::kBF16, {2, 1, 2}),
                                 entry("f16", DType::kF16, {1}), entry("e5m2", DType::kE5M2, {5}),
                                 entry("i8", DType::kI8, {3, 1}), entry("empty", DType::kF32, {0, 4})},
                                {{"format", "pt"}, {"producer", "llmq"}}));
  check(llmq::write_safetensors((d / "no-tensors.safetensors").string(), {}, {}));

  const json index = {{"metadata", {{"total_size", 4096}}},
                      {"weight_map",
                       {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                        {"model.layers.0.mlp.down_proj.weight", "model-00001-of-00002.safetensors"},
                        {"model.norm.weight", "model-00002-of-00002.safetensors"},
                        {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
  c.put("fuzz_safetensors_index", "two-shards.json", index.dump(2));
}

// ---- config.json of the model families parse_hf_config accepts

void config_seeds(const Corpus& c) {
  const json llama31 = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 4096},
                        {"intermediate_size", 14336}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                        {"num_key_value_heads", 8}, {"vocab_size", 128256}, {"max_position_embeddings", 131072},
                        {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0}, {"tie_word_embeddings", false},
                        {"rope_scaling", {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                          {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}}},
                        {"bos_token_id", 128000}, {"eos_token_id", {128001, 128008, 128009}},
                        {"hidden_act", "silu"}, {"attention_bias", false}, {"mlp_bias", false}, {"head_dim", 128}};
  c.put("fuzz_hf_config", "llama31.json", llama31.dump(2));
  const json mistral = {{"model_type", "mistral"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                        {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                        {"vocab_size", 32000}, {"max_position_embeddings", 32768}, {"sliding_window", 4096},
                        {"rope_theta", 10000.0}, {"head_dim", nullptr}, {"rope_scaling", nullptr}};
  c.put("fuzz_hf_config", "mistral.json", mistral.dump(2));
  const json qwen2 = {{"model_type", "qwen2"}, {"hidden_size", 896}, {"intermediate_size", 4864},
                      {"num_hidden_layers", 24}, {"num_attention_heads", 14}, {"num_key_value_heads", 2},
                      {"vocab_size", 151936}, {"use_sliding_window", false}, {"sliding_window", 32768},
                      {"tie_word_embeddings", true}, {"rope_theta", 1000000.0}, {"eos_token_id", 151645}};
  c.put("fuzz_hf_config", "qwen2.json", qwen2.dump(2));
  const json mixtral = {{"model_type", "mixtral"}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                        {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                        {"vocab_size", 32000}, {"num_local_experts", 8}, {"num_experts_per_tok", 2},
                        {"router_aux_loss_coef", 0.02}};
  c.put("fuzz_hf_config", "mixtral.json", mixtral.dump(2));
  const json fp8 = {{"model_type", "llama"}, {"hidden_size", 256}, {"intermediate_size", 768},
                    {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"vocab_size", 512},
                    {"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                             {"weight_block_size", {128, 128}}}}};
  c.put("fuzz_hf_config", "block-fp8.json", fp8.dump(2));
  // The families of issue 24, as their published configs spell them.
  const json qwen3 = {{"model_type", "qwen3"}, {"hidden_size", 4096}, {"intermediate_size", 12288},
                      {"num_hidden_layers", 36}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                      {"head_dim", 128}, {"vocab_size", 151936}, {"max_window_layers", 36}, {"use_sliding_window", false},
                      {"sliding_window", nullptr}, {"rope_theta", 1000000.0}, {"rope_scaling", nullptr},
                      {"attention_bias", false}, {"tie_word_embeddings", false}, {"bos_token_id", 151643},
                      {"eos_token_id", 151645}};
  c.put("fuzz_hf_config", "qwen3.json", qwen3.dump(2));
  const json qwen3_moe = {{"model_type", "qwen3_moe"}, {"hidden_size", 2048}, {"intermediate_size", 6144},
                          {"moe_intermediate_size", 768}, {"num_hidden_layers", 48}, {"num_attention_heads", 32},
                          {"num_key_value_heads", 4}, {"head_dim", 128}, {"vocab_size", 151936}, {"num_experts", 128},
                          {"num_experts_per_tok", 8}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
                          {"mlp_only_layers", json::array()}, {"max_window_layers", 48}, {"use_sliding_window", false},
                          {"sliding_window", nullptr}, {"rope_theta", 1000000.0}, {"output_router_logits", false},
                          {"router_aux_loss_coef", 0.001}};
  c.put("fuzz_hf_config", "qwen3-moe.json", qwen3_moe.dump(2));
  const json phi3 = {{"model_type", "phi3"}, {"hidden_size", 3072}, {"intermediate_size", 8192},
                     {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
                     {"vocab_size", 32064}, {"max_position_embeddings", 4096}, {"original_max_position_embeddings", 4096},
                     {"sliding_window", 2047}, {"rope_scaling", nullptr}, {"rope_theta", 10000.0}, {"embd_pdrop", 0.0},
                     {"resid_pdrop", 0.0}, {"bos_token_id", 1}, {"eos_token_id", 32000}, {"pad_token_id", 32000},
                     {"auto_map", {{"AutoConfig", "configuration_phi3.Phi3Config"}}}};
  c.put("fuzz_hf_config", "phi3.json", phi3.dump(2));
  json layer_types = json::array();
  for (int i = 0; i < 24; ++i) layer_types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  const json gpt_oss = {{"model_type", "gpt_oss"}, {"hidden_size", 2880}, {"intermediate_size", 2880},
                        {"num_hidden_layers", 24}, {"num_attention_heads", 64}, {"num_key_value_heads", 8},
                        {"head_dim", 64}, {"vocab_size", 201088}, {"num_local_experts", 32}, {"num_experts_per_tok", 4},
                        {"experts_per_token", 4}, {"sliding_window", 128}, {"layer_types", layer_types},
                        {"rope_theta", 150000.0}, {"swiglu_limit", 7.0}, {"initial_context_length", 4096},
                        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                                          {"truncate", false}, {"original_max_position_embeddings", 4096}}},
                        {"attention_bias", true}, {"eos_token_id", 200002}, {"pad_token_id", 199999},
                        {"quantization_config", {{"quant_method", "mxfp4"},
                                                 {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head"}}}}};
  c.put("fuzz_hf_config", "gpt-oss.json", gpt_oss.dump(2));
}

// ---- llama2.c checkpoints and tokenizer.bin

void llama2c_seeds(const Corpus& c) {
  for (const bool v1 : {false, true})
    for (const bool shared : {true, false}) {
      Llama2cShape s;
      s.v1 = v1;
      s.shared_classifier = shared;
      c.put("fuzz_llama2c", std::string(v1 ? "v1" : "legacy") + (shared ? "-shared" : "-unshared") + ".bin",
            llama2c_checkpoint(s));
    }
  c.put("fuzz_tokenizer_llama2c", "story.bin", story_tokenizer_file());
  c.put("fuzz_tokenizer_llama2c", "letters.bin", llama2c_tokenizer_file({{"<unk>", 0}, {"a", -1}, {"b", -1}}));
}

// ---- sentencepiece tokenizer.model (BPE, byte fallback, user-defined and control pieces)

void sentencepiece_seeds(const Corpus& c) {
  constexpr int64_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;
  std::vector<std::pair<std::string, int64_t>> pieces = {{"<unk>", kUnknown}, {"<s>", kControl}, {"</s>", kControl}};
  for (int b = 0; b < 256; ++b) pieces.push_back({byte_piece(b), kByte});
  for (const char* p : {"\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a", "ba", "c"}) pieces.push_back({p, kNormal});
  pieces.push_back({"<sep>", kUserDefined});
  std::string model;
  float score = 0.0f;
  for (const auto& [text, type] : pieces) {
    std::string piece = pb_bytes(1, text) + pb_float(2, score -= 0.25f);
    if (type != kNormal) piece += pb_varint(3, type);
    model += pb_bytes(1, piece);
  }
  const std::string trainer = pb_varint(3, 2) + pb_bytes(2, "seed") + pb_varint(40, 0) + pb_varint(41, 1) +
                              pb_varint(42, 2) + pb_varint(43, -1);
  const std::string normalizer = pb_bytes(1, "identity") + pb_varint(3, 1) + pb_varint(4, 1) + pb_varint(5, 1);
  c.put("fuzz_tokenizer_sentencepiece", "bpe.model", model + pb_bytes(2, trainer) + pb_bytes(3, normalizer));
  c.put("fuzz_tokenizer_sentencepiece", "no-trainer.model", model);
}

// ---- tokenizer.json: byte-level (GPT-2, Llama 3 split) and sentencepiece-style (Llama 2)

json byte_level_vocab() {
  json vocab = json::object();
  const auto& chars = llmq::tokenizer_detail::byte_to_unicode();
  for (int b = 0; b < 256; ++b) vocab[chars[static_cast<size_t>(b)]] = b;
  const std::string g = chars[' '];  // the byte-level spelling of a space
  int id = 256;
  for (const std::string& p : {g + "t", std::string("he"), g + "the", std::string("in"), g + "in"}) vocab[p] = id++;
  return vocab;
}

void tokenizer_json_seeds(const Corpus& c) {
  const std::string g = llmq::tokenizer_detail::byte_to_unicode()[' '];
  const json added = json::array({{{"id", 261}, {"content", "<|endoftext|>"}, {"special", true}},
                                  {{"id", 262}, {"content", "<|begin_of_text|>"}, {"special", true}}});
  const json bpe = {{"type", "BPE"}, {"vocab", byte_level_vocab()},
                    {"merges", {g + " t", "h e", json::array({g + "t", "he"}), "i n", g + " in"}},
                    {"ignore_merges", false}, {"byte_fallback", false}};
  const json gpt2 = {{"version", "1.0"}, {"added_tokens", added}, {"normalizer", nullptr},
                     {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                     {"decoder", {{"type", "ByteLevel"}}}, {"model", bpe}};
  c.put("fuzz_tokenizer_json", "gpt2.json", gpt2.dump(1));
  const char* llama3_split =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json llama3_model = bpe;
  llama3_model["ignore_merges"] = true;
  const json llama3 = {
      {"added_tokens", added},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", llama3_split}}}, {"behavior", "Isolated"}},
                           {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"<|begin_of_text|>", {{"ids", {262}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", llama3_model}};
  c.put("fuzz_tokenizer_json", "llama3.json", llama3.dump(1));
  // gpt-oss / GPT-4o: the o200k Split pattern, then ByteLevel without its regex.
  json o200k = llama3;
  o200k.erase("post_processor");
  for (const llmq::tokenizer_detail::SplitPattern& p : llmq::tokenizer_detail::split_patterns())
    if (p.kind == llmq::tokenizer_detail::SplitKind::kO200k)
      o200k["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = p.regex;
  c.put("fuzz_tokenizer_json", "o200k.json", o200k.dump(1));

  const std::string m = "\xE2\x96\x81";  // "▁"
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[byte_piece(b)] = 3 + b;
  int id = 259;
  for (const std::string& p : {m, std::string("a"), std::string("b"), m + "a", std::string("ab"), m + "ab"})
    vocab[p] = id++;
  const json llama2 = {
      {"added_tokens", {{{"id", 0}, {"content", "<unk>"}}, {{"id", 1}, {"content", "<s>"}}}},
      {"normalizer", {{"type", "Sequence"},
                      {"normalizers", {{{"type", "Prepend"}, {"prepend", m}},
                                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}}}}},
      {"pre_tokenizer", nullptr},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {m + " a", "a b", m + "a b"}}, {"unk_token", "<unk>"},
                 {"byte_fallback", true}, {"fuse_unk", true}}}};
  c.put("fuzz_tokenizer_json", "llama2.json", llama2.dump(1));
  json metaspace = llama2;
  metaspace["normalizer"] = nullptr;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", true}};
  c.put("fuzz_tokenizer_json", "metaspace.json", metaspace.dump(1));
}

// ---- calibration statistics (CalibrationStats::save) and token data

void calibration_seeds(const Corpus& c) {
  llmq::CalibrationStats stats;
  stats.model = "default";
  stats.data = "seeded";
  stats.tokens = 64;
  for (const char* name : {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "lm_head"}) {
    llmq::LinearStats& l = stats.linears[name];
    l.in_features = 4;
    l.rows_seen = 64;
    l.input_channel_absmax = {0.5f, 12.0f, 0.25f, 3.0f};
    l.weight_channel_absmax = {0.125f, 0.0625f, 1.5f, 0.75f};
    l.input_absmax = 12.0;
    l.weight_absmax = 1.5;
  }
  const fs::path path = c.dir("fuzz_calibration") / "stats.json";
  check(stats.save(path.string()));
  stats.linears.clear();
  check(stats.save((c.dir("fuzz_calibration") / "empty.json").string()));
}

void text_seeds(const Corpus& c) {
  c.put("fuzz_token_file", "ids.txt", "1 5 9 12\n1 270 2\n\n  7\t8 \n");
  c.put("fuzz_token_file", "text.txt", "Once upon a time\r\nthe end 12\n");
  c.put("fuzz_token_file", "bad-big-ids.txt", "2147483647 4294967296 -1 0x10 +3\n");
  c.put("fuzz_pretokenizer", "english.txt", "It's 2026; we'll see: 12345 cats, don't they?\n\n  Tabs\tand  spaces ");
  c.put("fuzz_pretokenizer", "unicode.txt",
        "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xD0\x9F\xD1\x80\xD0\xB8 \xF0\x9F\x98\x80!\r\n\xE2\x96\x81x \xFF\xC3(");
}

// ---- chat templates: the vendor templates of tests/data with each conversation there, and one
// small template per construct of the subset

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void vendor_template_seeds(const Corpus& c) {
  const fs::path data = LLMQ_CHAT_TEMPLATE_DATA;
  const json tokens = json::parse(read_text(data / "tokens.json"));
  std::vector<fs::path> conversations;
  for (const auto& f : fs::directory_iterator(data / "conversations")) conversations.push_back(f.path());
  std::sort(conversations.begin(), conversations.end());
  for (const auto& [file, special] : tokens.items()) {
    const std::string source = read_text(data / file);
    const std::string stem = fs::path(file).stem().string();
    for (size_t k = 0; k < conversations.size(); ++k) {
      // Every other seed without the generation prompt, one in three with sorted keys.
      json options = {{"bos_token", special["bos"]}, {"eos_token", special["eos"]}, {"add_generation_prompt", k % 2 == 0}};
      if (k % 3 == 1) options["parsed"] = true;
      if (k == 0) options["extra_context"] = {{"enable_thinking", false}, {"reasoning_effort", "low"}};
      const std::string input = chat_template_input(source, read_text(conversations[k]), options);
      // Gemma's template refuses a system turn by raise_exception: kept, as a seed meant to fail.
      std::string out;
      const bool refused = !render_chat_template_input(read_chat_template_input(input), &out).ok();
      c.put("fuzz_chat_template", (refused ? "bad-" : "") + stem + "-" + conversations[k].stem().string(), input);
    }
  }
}

void construct_template_seeds(const Corpus& c) {
  const std::string two = R"([{"role": "system", "content": "S"}, {"role": "user", "content": "caf\u00e9 \"q\"\n"}])";
  const std::vector<std::pair<std::string, std::string>> templates = {
      {"whitespace", "a\n  {# c #}\n  b\n  {% if 1 %}\nX\n  {% endif %}\n{{- 1 -}}  {%+ if true %}k{% endif %}\r\n"},
      {"for", "{% for k, v in {'a': 1, 'b': 2}.items() if v > 0 %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
              "{{ loop.first }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ k }}={{ v }}{% if loop.last %}"
              "{% break %}{% endif %}{% continue %}{% else %}none{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}"},
      {"namespace", "{% set ns = namespace(x=0, s='') %}{% for m in messages %}{% set ns.x = ns.x + 1 %}{% set ns.s %}"
                    "{{ ns.s }}{{ m.role[:1] }}{% endset %}{% set local = 1 %}{% endfor %}{{ ns.x }} {{ ns.s }} {{ local }}"
                    "{% set blk %}B{% endset %}{{ blk }}"},
      {"macro", "{% macro f(a, b='x', n=0) %}{{ a }}{{ b }}{% if n < 3 %}{{ f(a, n=n + 1) }}{% endif %}{% endmacro %}"
                "{{ f('q') }}{{ f(1, b=2) }}{{ f }}{% macro g() %}{% endmacro %}{{ g() }}"},
      {"expressions", "{{ 1 + 2 * 3 - 4 // 3 % 2 ** 2 }} {{ 7 / 2 }} {{ -3 // 2 }} {{ -7 % 3 }} {{ 2.5 // 1 }} {{ 'a' ~ 1 ~ none }}"
                      " {{ [1, 2] + [3] }} {{ 'ab' * 3 }} {{ [0] * 2 }} {{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1 < 2 <= 2 != 3 }}"
                      " {{ 'a' in 'abc' and not 'z' in ['a'] or false }} {{ 'k' in {'k': 1} }} {{ 'b' not in 'abc' }}"
                      " {{ 1 if false else 2 }} {{ 1 if false }} {{ 1.5e3 }} {{ 1_000 }} {{ 'x' 'y' }} {{ -(+1) }}"
                      " {{ {'a': [1, {'b': none}]} }} {{ 0.1 + 0.2 }} {{ 1e300 * 1e300 }} {{ True }} {{ None }}"},
      {"tests", "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ 1 is integer }}"
                " {{ 1.0 is float }} {{ true is boolean }} {{ 'a' is string }} {{ [1] is iterable }} {{ [1] is sequence }}"
                " {{ {} is mapping }} {{ 3 is odd }} {{ 2 is even }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is equalto(1) }}"
                " {{ 'A' is upper }} {{ 'a' is lower }} {{ range is callable }} {{ 1 is in [2] }} {{ true is sameas true }}"
                " {{ true is true }} {{ false is false }} {{ messages is not none }}"},
      {"filters", "{{ ' a '|trim }}{{ 'xax'|trim('x') }}{{ messages|length }}{{ messages|count }}"
                  "{{ messages|map(attribute='role')|join(',') }}{{ ['a', 'b']|map('upper')|list }}"
                  "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}{{ messages|rejectattr('role', 'eq', 'user')|first }}"
                  "{{ [3, 1, 3]|unique|list }}{{ 'x'|upper|lower|capitalize|title }}{{ 'a-b'|replace('-', '+') }}"
                  "{{ nothing|default('d') }}{{ ''|d('e', true) }}{{ '3.5'|float }}{{ '7'|int }}{{ 'z'|int(4) }}{{ -2|abs }}"
                  "{{ {'b': 1, 'a': 2}|dictsort }}{{ {'a': 1}|items|list }}{{ 'l1\nl2\n\nl3'|indent(2, true) }}"
                  "{{ messages|tojson }}{{ messages[0]|tojson(indent=2) }}{{ 5|string }}{{ [1, 2]|last }}"
                  "{{ [0, 1]|select|list }}{{ [0, 1]|reject|list }}{{ 'ab'|list }}{{ 'x'|safe }}{{ messages|join }}"},
      {"methods", "{{ ' ab '.strip() }}{{ 'xab'.lstrip('x') }}{{ 'abx'.rstrip('x') }}{{ 'a b  c'.split() }}"
                  "{{ 'a,b,c'.split(',', 1) }}{{ ' a b '.split(none, 1) }}{{ 'ab'.startswith('a') }}{{ 'ab'.endswith(('b', 'c')) }}"
                  "{{ 'aXa'.replace('a', 'b', 1) }}{{ 'ab'.replace('', '-') }}{{ 'abc'.find('c') }}{{ 'aaa'.count('a') }}"
                  "{{ 'x'.upper() }}{{ 'X'.lower() }}{{ 'ab cd'.title() }}{{ 'ab'.capitalize() }}{{ {'a': 1}.get('a') }}"
                  "{{ {'a': 1}.get('b', 2) }}{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}{{ {'a': 1}.items() }}"},
      {"subscripts", "{{ 'h\xc3\xa9llo'[1:4] }}{{ 'abc'[::-1] }}{{ 'abc'[-1] }}{{ [1, 2, 3][-1] }}{{ [1, 2, 3][1:] }}"
                     "{{ [1, 2, 3][::2] }}{{ messages[0]['role'] }}{{ messages[0].content }}{{ messages.0.role }}"
                     "{{ (1, 2)[0] }}{{ messages[-1]['content'][:2] }}{{ {'a': 1}['a'] }}{{ messages[9] is undefined }}"},
      {"globals", "{{ strftime_now('%Y-%m-%d %b %B %a %A %j %-d %e %y %H:%M:%S %I %p %w %u %F %%') }}{{ range(3)|list }}"
                  "{{ range(5, 0, -2)|list }}{{ range(1, 3)|list }}{% if false %}{{ raise_exception('no') }}{% endif %}"
                  "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools is none }}{{ documents is none }}"},
      {"strings", "{% generation %}{{ 'a\\n\\t\\r\\x41\\u00e9\\U0001F600\\101\\q\\\\' }}{% endgeneration %}{# note #}"
                  "{{ \"d'q\" }}{{ 'raw \xff\xfe bytes'[1:] }}{{ ['\\'', \"\\\"\", '\x01'] }}{{ ['\\'']|tojson }}"},
  };
  for (const auto& [name, source] : templates)
    c.put("fuzz_chat_template", "construct-" + name, chat_template_input(source, two, {{"bos_token", "<s>"}, {"eos_token", "</s>"}}));
  c.put("fuzz_chat_template", "template-only",
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}");
  c.put("fuzz_chat_template", "object-with-tools",
        chat_template_input("{{ tools|tojson }}{% for m in messages %}{{ m.role }}{% endfor %}{{ custom }}{{ reasoning }}",
                            R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function":)"
                            R"( {"name": "f", "parameters": {"type": "object"}}}], "custom": 1})",
                            {{"extra_context", {{"reasoning", "high"}}}, {"parsed", true}, {"add_generation_prompt", false}}));
  c.put("fuzz_chat_template", "bad-loop-limit",
        chat_template_input("{% for i in range(100) %}{{ i }}{% endfor %}", "[]",
                            {{"max_loop_iterations", 10}, {"max_output_bytes", 4096}, {"max_nesting", 16}}));
  c.put("fuzz_chat_template", "bad-raise", chat_template_input("{{ raise_exception('refused') }}", "[]"));
  c.put("fuzz_chat_template", "bad-date", chat_template_input("{{ strftime_now('%d') }}", "[]", {{"date", "2023-02-29"}}));
}

// ---- OpenAI request bodies: chat-* for /v1/chat/completions, the others for /v1/completions

void openai_request_seeds(const Corpus& c) {
  const std::string t = "fuzz_openai_request";
  c.put(t, "completions-text.json", R"({"model": "m", "prompt": "Hello"})");
  c.put(t, "completions-ids.json", R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 5})");
  c.put(t, "completions-one-text.json", R"({"model": "m", "prompt": ["Hello"], "stop": "\n"})");
  c.put(t, "completions-one-ids.json", R"({"model": "m", "prompt": [[1, 2]], "temperature": 0})");
  const json every = {{"model", "m"}, {"prompt", "x"}, {"max_tokens", 8}, {"temperature", 0.7}, {"top_p", 0.9},
                      {"top_k", 40}, {"seed", 42}, {"stop", {"\n", "END"}}, {"stop_token_ids", {2}},
                      {"ignore_eos", false}, {"stream", true}, {"stream_options", {{"include_usage", true}}},
                      {"echo", true}, {"logprobs", 2}, {"best_of", 1}, {"suffix", ""}, {"n", 1},
                      {"logit_bias", json::object()}, {"presence_penalty", 0}, {"frequency_penalty", 0.0},
                      {"repetition_penalty", 1}, {"user", "u"}, {"metadata", {{"k", "v"}}}};
  c.put(t, "completions-every-field.json", every.dump());
  c.put(t, "chat-one.json", R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})");
  const json chat = {
      {"model", "m"},
      {"messages", {{{"role", "system"}, {"content", "S"}},
                    {{"role", "developer"}, {"content", "D"}},
                    {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
                    {{"role", "assistant"}, {"content", nullptr}},
                    {{"role", "tool"}, {"content", "result"}, {"tool_calls", nullptr}}}},
      {"max_completion_tokens", 100}, {"temperature", 2}, {"top_p", 1}, {"top_k", -1}, {"seed", -1},
      {"stop", "x"}, {"logprobs", true}, {"top_logprobs", 2}, {"add_generation_prompt", false},
      {"tools", json::array()}, {"tool_choice", "none"}, {"functions", json::array()},
      {"response_format", {{"type", "text"}}}, {"stream", false}, {"max_tokens", nullptr}};
  c.put(t, "chat-every-field.json", chat.dump());
  c.put(t, "bad-deep.json", std::string(100, '[') + std::string(100, ']'));
  c.put(t, "bad-invalid-utf8.json", "{\"model\": \"m\xff\", \"prompt\": \"x\"}");
  c.put(t, "bad-huge-number.json", R"({"model": "m", "prompt": "x", "max_tokens": 1e400, "seed": 18446744073709551616})");
  c.put(t, "bad-types.json", R"({"model": 1, "prompt": {"a": []}, "messages": "x", "stop": [1], "top_p": "0.5"})");
}

// Every seed but those named bad-* must be accepted: a seed its parser refuses would only
// exercise error paths, and would mean the generator (or the parser) has drifted from the format.
Status parse_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  namespace td = llmq::tokenizer_detail;
  std::unique_ptr<llmq::Tokenizer> tok;
  if (target == "fuzz_safetensors_header") {
    llmq::SafetensorsHeader h;
    return llmq::parse_safetensors_header(name, reinterpret_cast<const uint8_t*>(bytes.data()),
                                          static_cast<int64_t>(bytes.size()), &h);
  }
  if (target == "fuzz_safetensors_index") {
    std::map<std::string, std::string> map;
    return llmq::parse_safetensors_index(name, bytes, &map);
  }
  if (target == "fuzz_hf_config") {
    llmq::ModelConfig config;
    return llmq::parse_hf_config(bytes, &config);
  }
  if (target == "fuzz_llama2c") {
    std::istringstream in(bytes);
    llmq::ModelWeights w;
    return llmq::load_llama2c(name, in, &w);
  }
  if (target == "fuzz_tokenizer_json") return td::parse_tokenizer_json(name, bytes, &tok);
  if (target == "fuzz_tokenizer_sentencepiece") return td::parse_sentencepiece_model(name, bytes, &tok);
  if (target == "fuzz_tokenizer_llama2c") return td::parse_llama2c_tokenizer(name, bytes, &tok);
  if (target == "fuzz_calibration") {
    llmq::CalibrationStats stats;
    return llmq::CalibrationStats::parse(name, bytes, &stats);
  }
  if (target == "fuzz_token_file") {
    std::vector<std::vector<int32_t>> seqs;
    LLMQ_RETURN_IF_ERROR(td::parse_llama2c_tokenizer("story.bin", story_tokenizer_file(), &tok));
    return llmq::parse_token_sequences(name, bytes, tok->vocab_size(), &seqs, tok.get());
  }
  if (target == "fuzz_chat_template") {
    std::string out;
    return llmq::fuzz::render_chat_template_input(llmq::fuzz::read_chat_template_input(bytes), &out);
  }
  if (target == "fuzz_openai_request") {
    llmq::server::GenerateRequest r;
    llmq::server::ApiError e;
    if (llmq::server::parse_generate_request(bytes, name.rfind("chat-", 0) == 0, {}, &r, &e)) return {};
    return llmq::invalid_argument(name + ": " + e.message);
  }
  return {};  // fuzz_pretokenizer: any text is valid
}

void verify_seeds(const fs::path& root) {
  for (const auto& target : fs::directory_iterator(root))
    for (const auto& file : fs::directory_iterator(target.path())) {
      const std::string name = file.path().filename().string();
      if (name.rfind("bad-", 0) == 0) continue;
      std::ifstream in(file.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const Status st = parse_seed(target.path().filename().string(), name, bytes);
      if (!st.ok()) throw std::runtime_error("seed " + file.path().string() + " is refused: " + st.to_string());
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus root>\n", argv[0]);
    return 2;
  }
  try {
    const Corpus corpus{fs::path(argv[1])};
    safetensors_seeds(corpus);
    config_seeds(corpus);
    llama2c_seeds(corpus);
    sentencepiece_seeds(corpus);
    tokenizer_json_seeds(corpus);
    calibration_seeds(corpus);
    text_seeds(corpus);
    vendor_template_seeds(corpus);
    construct_template_seeds(corpus);
    openai_request_seeds(corpus);
    verify_seeds(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llmq_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
