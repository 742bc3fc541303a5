// Inputs for the hostile-input suite (hostile_support.hpp): the base inputs llmq makes once per
// process, file and JSON helpers, special files, safetensors editing, and the command lines.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "hostile_support.hpp"

namespace llmq::hostile {
namespace {

namespace fs = std::filesystem;

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

// ---- the base inputs
struct BaseInputs {
  llmq::testing::TempDir dir{"llmq_hostile_base"};
  std::map<Base, std::string> made;
};
BaseInputs& bases() {
  static BaseInputs b;
  return b;
}

void make_with_cli(const std::vector<std::string>& args) {
  const std::string logs = bases().dir.file("logs");
  fs::create_directories(logs);
  const RunResult r = run_cli(args, bases().dir.path(), logs, 120.0);
  if (!r.exited || r.code != 0)
    ADD_FAILURE() << "HOSTILE base input could not be made\n" << r.repro() << "\n" << tail(r.err, 2000);
}

// A little-endian float32 array.
void put_floats(std::string* out, const std::vector<float>& v) {
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A legacy llama2.c checkpoint (7 int32, then the float32 arrays in run.c's order; a positive
// vocab_size means the classifier shares the embedding). Seeded weights with outlier columns.
void write_llama2c(const std::string& path) {
  const int32_t dim = 64, hidden = 192, layers = 2, heads = 4, kv_heads = 2, vocab = 128, seq = 64;
  const int32_t head = dim / heads, kv_dim = head * kv_heads;
  std::string bytes;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq})
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
  uint64_t seed = 9100;
  auto matrix = [&](int64_t rows, int64_t cols, float scale) {
    std::vector<float> m = llmq::testing::outlier_matrix(rows, cols, seed++, 6.0f);
    for (float& x : m) x *= scale;
    return m;
  };
  auto norm = [&](int64_t n) {
    std::vector<float> g = llmq::testing::normal_vector(n, seed++, 0.1f);
    for (float& x : g) x = 1.0f + x;
    return g;
  };
  put_floats(&bytes, matrix(vocab, dim, 0.5f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, norm(dim));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(dim, dim, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(kv_dim, dim, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(kv_dim, dim, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(dim, dim, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, norm(dim));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(hidden, dim, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(dim, hidden, 0.05f));
  for (int l = 0; l < layers; ++l) put_floats(&bytes, matrix(hidden, dim, 0.05f));
  put_floats(&bytes, norm(dim));
  std::vector<float> re, im;  // freq_cis (run.c skips them; written as export.py does)
  for (int p = 0; p < seq; ++p)
    for (int i = 0; i < head / 2; ++i) {
      const double f = std::pow(10000.0, -2.0 * i / head) * p;
      re.push_back(static_cast<float>(std::cos(f)));
      im.push_back(static_cast<float>(std::sin(f)));
    }
  put_floats(&bytes, re);
  put_floats(&bytes, im);
  write_bytes(path, bytes);
}

// GPT-2's byte -> printable character map, as UTF-8.
std::string byte_char(int b) {
  std::vector<int> bs;
  for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
  for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
  for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
  int cp = -1;
  if (std::find(bs.begin(), bs.end(), b) != bs.end()) {
    cp = b;
  } else {
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      if (std::find(bs.begin(), bs.end(), x) != bs.end()) continue;
      if (x == b) cp = 256 + n;
      ++n;
    }
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE tokenizer with exactly the tiny model's 512 ids: the 256 bytes, 254 letter
// pairs with their merges, and <s> / </s> as 510 / 511.
void write_tokenizer(const std::string& dir) {
  fs::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json merges = json::array();
  const std::string letters = "abcdefghijklmnop";
  for (int k = 0; k < 254; ++k) {
    const std::string a(1, letters[k / 16]), b(1, letters[k % 16]);
    vocab[a + b] = 256 + k;
    merges.push_back(a + " " + b);
  }
  const json added = json::array({{{"id", 510}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 511}, {"content", "</s>"}, {"special", true}}});
  const json tok = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "ByteLevel"}}},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}}};
  write_json_file(dir + "/tokenizer.json", tok);
  write_json_file(dir + "/tokenizer_config.json", {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
}

void write_token_data(const std::string& path) {
  std::mt19937_64 rng(4242);
  std::uniform_int_distribution<int> id(3, 511);
  std::string text;
  for (int len : {12, 9, 15}) {
    for (int i = 0; i < len; ++i) text += (i ? " " : "") + std::to_string(id(rng));
    text += "\n";
  }
  write_bytes(path, text);
}

}  // namespace

const std::string& base_path(Base b) {
  BaseInputs& in = bases();
  auto it = in.made.find(b);
  if (it != in.made.end()) return it->second;
  const std::string& root = in.dir.path();
  std::string path;
  switch (b) {
    case Base::kHf:
      path = root + "/hf";
      make_with_cli({"make-checkpoint", "--shape", "tiny", "--layers", "2", "--seed", "7", "-o", path});
      break;
    case Base::kSharded:
      path = root + "/sharded";
      make_with_cli({"make-checkpoint", "--shape", "tiny", "--layers", "2", "--seed", "7", "--shard-mb", "1", "-o", path});
      break;
    case Base::kQuantized:
      path = root + "/quantized";
      make_with_cli({"quantize", "--model", base_path(Base::kHf), "--scheme", "fp8-dynamic", "-o", path});
      break;
    case Base::kMoe:
      path = root + "/moe";
      make_with_cli({"make-checkpoint", "--shape", "tiny-moe", "--layers", "1", "--seed", "8", "-o", path});
      break;
    case Base::kLlama2c:
      path = root + "/model.bin";
      write_llama2c(path);
      break;
    case Base::kStats:
      path = root + "/stats.json";
      make_with_cli({"calibrate", "--model", base_path(Base::kHf), "--samples", "2", "--length", "16", "-o", path});
      break;
    case Base::kData:
      path = root + "/data.txt";
      write_token_data(path);
      break;
    case Base::kTokenizer:
      path = root + "/tokenizer";
      write_tokenizer(path);
      break;
  }
  return in.made.emplace(b, path).first->second;
}

// ---- files

std::string read_bytes(const std::string& path) {
  std::vector<uint8_t> bytes;
  (void)llmq::testing::read_file(path, &bytes);  // in blocks (fast at -O0 under the sanitizers)
  return std::string(bytes.begin(), bytes.end());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  fs::remove(path, ec);  // a link or special file there is replaced, not written through
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) ADD_FAILURE() << "HOSTILE setup: cannot write " << path;
}

json read_json_file(const std::string& path) { return json::parse(read_bytes(path)); }

void write_json_file(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

void edit_config(const std::string& model_dir, const std::function<void(json&)>& edit) {
  json j = read_json_file(model_dir + "/config.json");
  edit(j);
  write_json_file(model_dir + "/config.json", j);
}

std::string nested_json(int64_t depth, char open) {
  const char close = open == '[' ? ']' : '}';
  if (open == '[') return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']');
  // Objects: {"a":{"a":...{}...}}
  std::string s;
  s.reserve(static_cast<size_t>(depth) * 7);
  for (int64_t i = 0; i + 1 < depth; ++i) s += "{\"a\":";
  s += "{}";
  s += std::string(static_cast<size_t>(depth - 1), close);
  return s;
}

void make_special(const std::string& path, Special kind) {
  std::error_code ec;
  fs::remove_all(path, ec);
  fs::create_directories(fs::path(path).parent_path(), ec);
  bool ok = true;
  switch (kind) {
    case Special::kFifo: ok = ::mkfifo(path.c_str(), 0644) == 0; break;
    case Special::kDevZero: ok = ::symlink("/dev/zero", path.c_str()) == 0; break;
    case Special::kDirectory: ok = fs::create_directory(path, ec); break;
    case Special::kSymlinkLoop: {
      const std::string other = path + ".loop";
      ok = ::symlink(fs::path(other).filename().c_str(), path.c_str()) == 0 &&
           ::symlink(fs::path(path).filename().c_str(), other.c_str()) == 0;
      break;
    }
  }
  if (!ok) ADD_FAILURE() << "HOSTILE setup: cannot make " << special_name(kind) << " at " << path;
}

const char* special_name(Special kind) {
  switch (kind) {
    case Special::kFifo: return "Fifo";
    case Special::kDevZero: return "DevZero";
    case Special::kDirectory: return "Directory";
    case Special::kSymlinkLoop: return "SymlinkLoop";
  }
  return "?";
}

const char* special_words(Special kind) {
  switch (kind) {
    case Special::kFifo: return "FIFO|named pipe";
    case Special::kDevZero: return "device";
    case Special::kDirectory: return "directory";
    case Special::kSymlinkLoop: return "symbolic link|symlink|loop|too many levels";
  }
  return "";
}

// ---- safetensors

StTensor* StFile::find(const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  ADD_FAILURE() << "HOSTILE setup: no tensor " << name;
  return nullptr;
}

void StFile::erase(const std::string& name) {
  const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const StTensor& t) { return t.name == name; });
  if (it == tensors.end()) ADD_FAILURE() << "HOSTILE setup: no tensor " << name;
  else tensors.erase(it);
}

StFile read_safetensors(const std::string& path) {
  const std::string bytes = read_bytes(path);
  StFile f;
  if (bytes.size() < 8) {
    ADD_FAILURE() << "HOSTILE setup: " << path << " is not a safetensors file";
    return f;
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, n));
  const size_t data_start = 8 + n;
  std::vector<std::pair<int64_t, StTensor>> items;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      f.metadata = v;
      continue;
    }
    StTensor t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    t.shape = v["shape"].get<std::vector<int64_t>>();
    const int64_t b = v["data_offsets"][0].get<int64_t>(), e = v["data_offsets"][1].get<int64_t>();
    t.data = bytes.substr(data_start + static_cast<size_t>(b), static_cast<size_t>(e - b));
    items.emplace_back(b, std::move(t));
  }
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& it : items) f.tensors.push_back(std::move(it.second));
  return f;
}

std::string safetensors_header(const StFile& f) {
  // Written by hand, not through a JSON library: a case may need a name the library would refuse
  // to print (invalid UTF-8), and 200,000 entries print fast this way.
  std::string h = "{";
  if (!f.metadata.is_null()) h += "\"__metadata__\":" + f.metadata.dump();
  int64_t offset = 0;
  for (const auto& t : f.tensors) {
    if (h.size() > 1) h += ",";
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    const int64_t end = offset + static_cast<int64_t>(t.data.size());
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  return h + "}";
}

std::string concat_data(const StFile& f) {
  std::string d;
  for (const auto& t : f.tensors) d += t.data;
  return d;
}

void write_safetensors_raw(const std::string& path, const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header;
  bytes += data;
  write_bytes(path, bytes);
}

void write_safetensors(const std::string& path, const StFile& f) {
  std::string header = safetensors_header(f);
  header.append((8 - header.size() % 8) % 8, ' ');
  write_safetensors_raw(path, header, concat_data(f));
}

uint16_t bf16_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

std::string random_bf16(int64_t n, uint64_t seed, float sigma) {
  std::vector<float> v = llmq::testing::normal_vector(n, seed, sigma);
  for (size_t i = 0; i < v.size(); i += 97) v[i] *= 20.0f;  // outliers
  std::string out(static_cast<size_t>(n) * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = bf16_bits(v[i]);
    std::memcpy(&out[2 * i], &b, 2);
  }
  return out;
}

void set_bf16(StTensor* t, int64_t index, uint16_t bits) {
  if (t == nullptr || t->dtype != "BF16" || static_cast<size_t>(2 * index + 2) > t->data.size()) {
    ADD_FAILURE() << "HOSTILE setup: set_bf16 out of range";
    return;
  }
  std::memcpy(&t->data[static_cast<size_t>(2 * index)], &bits, 2);
}

std::string layer_tensor(int layer, const std::string& module) {
  return "model.layers." + std::to_string(layer) + "." + module + ".weight";
}

const char* cmd_name(Cmd c) {
  switch (c) {
    case Cmd::kRun: return "run";
    case Cmd::kEval: return "eval";
    case Cmd::kCalibrate: return "calibrate";
    case Cmd::kLogits: return "logits";
    case Cmd::kQuantize: return "quantize";
  }
  return "?";
}

std::vector<std::string> model_args(Cmd c, const std::string& model) {
  switch (c) {
    case Cmd::kRun: return {"run", "--model", model, "--prompt-ids", "5 9 17", "-n", "8", "-t", "0", "--ids"};
    case Cmd::kEval: return {"eval", "--model", model, "--samples", "1", "--length", "8"};
    case Cmd::kCalibrate:
      return {"calibrate", "--model", model, "--samples", "1", "--length", "8", "-o", "calib-out.json"};
    case Cmd::kLogits: return {"logits", "--model", model, "--ids", "1 5 9 17", "-o", "logits-out.bin"};
    case Cmd::kQuantize: return {"quantize", "--model", model, "--scheme", "fp8-dynamic", "-o", "quant-out"};
  }
  return {};
}

const std::vector<Cmd>& all_cmds() {
  static const std::vector<Cmd> all = {Cmd::kRun, Cmd::kEval, Cmd::kCalibrate, Cmd::kLogits, Cmd::kQuantize};
  return all;
}

std::string safe_name(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

}  // namespace llmq::hostile
