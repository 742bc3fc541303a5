// Safetensors files and Hugging Face checkpoint directories. Reading memory-maps the file and
// validates the header as strictly as the reference (Rust) implementation: known dtypes, byte
// counts that match the shapes, and tensors that tile the data section exactly, with no gap, no
// overlap and nothing past the end. Writing streams tensor by tensor into a temporary file that
// is renamed over the destination only once everything is on disk.
#include "llmq/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "llmq/atomic_io.hpp"
#include "llmq/format.hpp"
#include "model/checkpoint/input_file.hpp"

// Safetensors data is little-endian; elements are read and written by memcpy.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llmq's safetensors code assumes a little-endian host");

namespace llmq {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB, so a corrupt length never makes us
// parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100000000;
// The data section starts at an 8-byte aligned file offset (as the reference writer pads it), so
// mapped tensors of every dtype are aligned when the writer orders them by element size.
constexpr int64_t kDataAlignment = 8;
constexpr int64_t kLengthPrefixBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";
// A header is {name: {dtype, shape: [...], data_offsets: [...]}, __metadata__: {k: v}}: 3 deep.
constexpr int64_t kMaxHeaderDepth = 3;
// fill_rows blocks: large enough that write(2) and the fill loops run at full speed, small
// enough that the largest tensor of a 70B model (a 2 GB embedding) never sits in memory whole.
constexpr int64_t kRowBlockBytes = int64_t{64} << 20;

struct SafetensorsName {
  DType dtype;
  const char* name;
};
constexpr SafetensorsName kSafetensorsNames[] = {
    {DType::kF32, "F32"},       {DType::kF64, "F64"},       {DType::kF16, "F16"}, {DType::kBF16, "BF16"},
    {DType::kE4M3, "F8_E4M3"}, {DType::kE5M2, "F8_E5M2"}, {DType::kI8, "I8"},   {DType::kI32, "I32"},
    {DType::kU8, "U8"},
};

Status io_error(std::string message) { return {StatusCode::kIoError, std::move(message)}; }

std::string errno_text(int err) { return std::strerror(err); }

std::string fmt_hex(uint8_t b) {
  const char* digits = "0123456789abcdef";
  return {digits[b >> 4], digits[b & 15]};
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel and byte count of a shape, refusing negative extents and int64 overflow (a corrupt header
// must not turn into a small, wrong byte count).
Status shape_bytes(DType dtype, const std::vector<int64_t>& shape, int64_t* numel, int64_t* nbytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("negative extent in shape " + shape_text(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      return invalid_argument("shape " + shape_text(shape) + " overflows int64");
    n *= d;
  }
  // dtype_storage_bytes multiplies by the bit width (at most 64).
  if (n > std::numeric_limits<int64_t>::max() / 64)
    return invalid_argument("shape " + shape_text(shape) + " is too large");
  *numel = n;
  *nbytes = dtype_storage_bytes(dtype, n);
  return {};
}

// A JSON integer in [0, INT64_MAX].
bool json_to_index(const json& v, int64_t* out) {
  if (!v.is_number_unsigned()) return false;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

// A file shorter than the length prefix cannot be mapped (mmap refuses 0 bytes) or parsed.
Status check_prefix_fits(const std::string& path, int64_t size) {
  if (size >= kLengthPrefixBytes) return {};
  return invalid_argument(path + ": " + std::to_string(size) +
                          " bytes is too short for the 8-byte header length: not a safetensors file");
}

// SAX handler that only notes the first key seen twice in the top-level object (parse errors
// surface from the DOM parse that follows).
struct TopLevelKeys {
  int64_t depth = 0;
  std::set<std::string> seen;
  std::string duplicate;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth, true; }
  bool end_object() { return --depth, true; }
  bool start_array(std::size_t) { return ++depth, true; }
  bool end_array() { return --depth, true; }
  bool key(std::string& k) {
    if (depth == 1 && !seen.insert(k).second && duplicate.empty()) duplicate = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) { throw e; }
};

// Parse and validate the header of a file of `file_size` (>= 8) bytes mapped at `bytes`.
Status parse_header(const std::string& path, const uint8_t* bytes, int64_t file_size,
                    std::vector<SafetensorsTensorInfo>* tensors, std::map<std::string, std::string>* metadata,
                    int64_t* data_start) {
  uint64_t header_len = 0;
  for (int i = 0; i < kLengthPrefixBytes; ++i) header_len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  const uint64_t after_prefix = static_cast<uint64_t>(file_size - kLengthPrefixBytes);
  if (header_len > after_prefix)
    return invalid_argument(path + ": header length " + std::to_string(header_len) +
                            " runs past the end of the file (" + std::to_string(file_size) +
                            " bytes): truncated or not a safetensors file");
  if (header_len > kMaxHeaderBytes)
    return invalid_argument(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                            std::to_string(kMaxHeaderBytes) + "-byte limit");
  const char* text = reinterpret_cast<const char*>(bytes + kLengthPrefixBytes);
  const int64_t data_offset = kLengthPrefixBytes + static_cast<int64_t>(header_len);
  const int64_t data_size = file_size - data_offset;

  // As the reference implementation reads it (serde_json over the UTF-8 header, which skips JSON
  // whitespace around the value; its tests pad with "\r \t\n" after and before the object): one
  // JSON object with only space, tab, CR or LF around it. NUL padding, a second value or any
  // other byte inside the declared length is an error.
  auto json_space = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; };
  int64_t json_begin = 0, json_len = static_cast<int64_t>(header_len);
  while (json_begin < json_len && json_space(text[json_begin])) ++json_begin;
  while (json_len > json_begin && json_space(text[json_len - 1])) --json_len;
  if (json_len == json_begin || text[json_begin] != '{')
    return invalid_argument(path + ": header is not a JSON object (it must start with '{'): not a safetensors file");
  if (text[json_len - 1] != '}')
    return invalid_argument(path + ": header has bytes other than JSON whitespace after its object (last byte 0x" +
                            fmt_hex(static_cast<uint8_t>(text[json_len - 1])) + ")");
  text += json_begin;
  json_len -= json_begin;

  // nlohmann keeps only the last of duplicate keys; a duplicated tensor name must be an error, so
  // a first SAX pass collects the top-level keys. (Not a parser callback: nlohmann's callback
  // parser rescans the parent object at every end_object, quadratic in the tensor count; and
  // nlohmann::json, a std::map, not ordered_json, whose inserts search linearly.)
  const int64_t depth = json_nesting_depth(text, text + json_len);
  if (depth > kMaxHeaderDepth)
    return invalid_argument(path + ": header JSON is nested " + std::to_string(depth) +
                            " levels deep; a safetensors header has " + std::to_string(kMaxHeaderDepth));
  TopLevelKeys keys;
  json header;
  try {
    json::sax_parse(text, text + json_len, &keys);
    header = json::parse(text, text + json_len);
  } catch (const std::exception& e) {
    return invalid_argument(path + ": header is not valid JSON: " + e.what());
  }
  const std::string& duplicate_key = keys.duplicate;
  if (!duplicate_key.empty()) return invalid_argument(path + ": header lists '" + duplicate_key + "' twice");
  if (!header.is_object()) return invalid_argument(path + ": header is not a JSON object");

  std::vector<SafetensorsTensorInfo> infos;
  std::map<std::string, std::string> meta;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const json& value = item.value();
    if (name == kMetadataKey) {
      if (!value.is_object()) return invalid_argument(path + ": __metadata__ is not a JSON object");
      for (const auto& m : value.items()) {
        if (!m.value().is_string())
          return invalid_argument(path + ": __metadata__." + m.key() + ": values must be strings, got " +
                                  m.value().dump());
        meta[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "': ";
    if (name.empty()) return invalid_argument(path + ": a tensor has an empty name");
    if (!value.is_object()) return invalid_argument(where + "entry is not a JSON object");
    const auto dtype_it = value.find("dtype");
    const auto shape_it = value.find("shape");
    const auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string())
      return invalid_argument(where + "missing or non-string \"dtype\"");
    if (shape_it == value.end() || !shape_it->is_array())
      return invalid_argument(where + "missing or non-array \"shape\"");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2)
      return invalid_argument(where + "\"data_offsets\" must be an array [begin, end]");

    SafetensorsTensorInfo info;
    info.name = name;
    const Status dtype_status = parse_safetensors_dtype(dtype_it->get<std::string>(), &info.dtype);
    if (!dtype_status.ok()) return Status(dtype_status.code(), where + dtype_status.message());
    for (const auto& d : *shape_it) {
      int64_t extent = 0;
      if (!json_to_index(d, &extent))
        return invalid_argument(where + "shape " + shape_it->dump() + " has an entry that is not a non-negative integer");
      info.shape.push_back(extent);
    }
    int64_t begin = 0, end = 0;
    if (!json_to_index((*offsets_it)[0], &begin) || !json_to_index((*offsets_it)[1], &end) || begin > end)
      return invalid_argument(where + "bad data_offsets " + offsets_it->dump() + " (need integers 0 <= begin <= end)");
    int64_t numel = 0;
    const Status size_status = shape_bytes(info.dtype, info.shape, &numel, &info.nbytes);
    if (!size_status.ok()) return invalid_argument(where + size_status.message());
    if (end - begin != info.nbytes)
      return invalid_argument(where + "data_offsets " + offsets_it->dump() + " span " + std::to_string(end - begin) +
                              " bytes, but " + dtype_it->get<std::string>() + " " + shape_text(info.shape) + " needs " +
                              std::to_string(info.nbytes));
    if (end > data_size)
      return invalid_argument(where + "data_offsets " + offsets_it->dump() + " run past the data section (" +
                              std::to_string(data_size) + " bytes): file truncated?");
    info.offset = begin;
    infos.push_back(std::move(info));
  }

  // Every byte of the data section belongs to exactly one tensor (the reference implementation's
  // rule): sorted by offset, each tensor starts where the previous one ends, and the last ends at
  // the end of the file. Zero-byte tensors sit anywhere on that chain.
  std::stable_sort(infos.begin(), infos.end(), [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  int64_t covered = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const auto& info : infos) {
    const std::string prev_name = previous ? "'" + previous->name + "'" : "the start of the data section";
    if (info.offset < covered)
      return invalid_argument(path + ": tensor '" + info.name + "' (bytes " + std::to_string(info.offset) + ".." +
                              std::to_string(info.offset + info.nbytes) + ") overlaps " + prev_name +
                              " (ends at " + std::to_string(covered) + ")");
    if (info.offset > covered)
      return invalid_argument(path + ": gap of " + std::to_string(info.offset - covered) + " bytes between " +
                              prev_name + " and tensor '" + info.name + "': the tensors must cover every byte");
    covered = info.offset + info.nbytes;
    previous = &info;
  }
  if (covered != data_size)
    return invalid_argument(path + ": " + std::to_string(data_size - covered) +
                            " bytes after the last tensor" + (previous ? " '" + previous->name + "'" : std::string()) +
                            " belong to no tensor: the tensors must cover every byte");

  *tensors = std::move(infos);
  *metadata = std::move(meta);
  *data_start = data_offset;
  return {};
}

// Whether `path` is there as a regular file; something else under that name (a FIFO, a device,
// a directory, a symbolic-link loop) is an error naming it, never read.
Status find_input_file(const std::string& path, bool* exists) {
  std::string why;
  *exists = is_input_file(path, &why);
  if (!*exists && !why.empty()) return invalid_argument(why);
  return {};
}

// Elementwise conversion of n elements at src (any alignment: memcpy) to float32.
template <typename T, typename Convert>
void convert_elements(const uint8_t* src, int64_t n, float* dst, Convert convert) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    dst[i] = convert(v);
  }
}

}  // namespace

// ---- dtype names

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& n : kSafetensorsNames)
    if (n.dtype == dtype) return n.name;
  return nullptr;  // no safetensors spelling (IEEE-like E4M3, fnuz, INT4)
}

Status parse_safetensors_dtype(const std::string& name, DType* out) {
  for (const auto& n : kSafetensorsNames) {
    if (name == n.name) {
      *out = n.dtype;
      return {};
    }
  }
  return unsupported("safetensors dtype \"" + name + "\" is not supported (F32, F64, F16, BF16, F8_E4M3, F8_E5M2, I8, I32)");
}

// ---- parsing from memory

Status parse_safetensors_header(const std::string& source, const uint8_t* bytes, int64_t size,
                                SafetensorsHeader* out) {
  if (bytes == nullptr && size > 0) return invalid_argument(source + ": no bytes given");
  LLMQ_RETURN_IF_ERROR(check_prefix_fits(source, size));
  SafetensorsHeader h;
  LLMQ_RETURN_IF_ERROR(parse_header(source, bytes, size, &h.tensors, &h.metadata, &h.data_start));
  *out = std::move(h);
  return {};
}

Status parse_safetensors_index(const std::string& source, const std::string& json_text,
                               std::map<std::string, std::string>* weight_map) {
  nlohmann::json index;
  LLMQ_RETURN_IF_ERROR(parse_json_text(source, json_text, &index));
  const auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (wm == index.end() || !wm->is_object()) return invalid_argument(source + ": no \"weight_map\" object");
  std::map<std::string, std::string> map;
  for (const auto& item : wm->items()) {
    if (!item.value().is_string())
      return invalid_argument(source + ": weight_map['" + item.key() + "'] is not a file name");
    const std::string shard = item.value().get<std::string>();
    // Shards live next to the index; a path would let a checkpoint read files elsewhere.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
      return invalid_argument(source + ": weight_map['" + item.key() + "']: shard '" + shard +
                              "' is not a plain file name");
    map[item.key()] = shard;
  }
  *weight_map = std::move(map);
  return {};
}

// ---- SafetensorsFile

Status SafetensorsFile::open(const std::string& path, std::unique_ptr<SafetensorsFile>* out) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  int fd = -1;
  int64_t size = 0;
  LLMQ_RETURN_IF_ERROR(open_input_file(path, &fd, &size));  // regular files only; a FIFO never blocks us
  if (Status short_status = check_prefix_fits(path, size); !short_status.ok()) {
    ::close(fd);
    return short_status;
  }
  // Read-only private mapping: pages are read on first touch, so a checkpoint larger than RAM is
  // processed tensor by tensor. (A file truncated by someone else while mapped raises SIGBUS on
  // access; no portable API avoids that.)
  void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (map == MAP_FAILED) return io_error(path + ": mmap failed: " + errno_text(map_err));
  file->map_ = map;  // unmapped by the destructor on every path from here
  file->map_size_ = size;

  const auto* bytes = static_cast<const uint8_t*>(map);
  int64_t data_start = 0;
  LLMQ_RETURN_IF_ERROR(parse_header(path, bytes, size, &file->tensors_, &file->metadata_, &data_start));
  file->data_ = bytes + data_start;
  for (size_t i = 0; i < file->tensors_.size(); ++i)
    file->index_[file->tensors_[i].name] = static_cast<int64_t>(i);
  *out = std::move(file);
  return {};
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_size_));
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[static_cast<size_t>(it->second)];
}

// The view points into the mapping. Its element alignment follows the file's layout: files whose
// writer put wider dtypes first (the reference writer, and write_safetensors when called that
// way) are aligned; others may not be, and Checkpoint::read_f32 copies element by element safely.
Status SafetensorsFile::view(const std::string& name, TensorView* out) const {
  const SafetensorsTensorInfo* info = find(name);
  if (info == nullptr) return invalid_argument(path_ + ": no tensor named '" + name + "'");
  TensorView v;
  v.data = const_cast<uint8_t*>(data_ + info->offset);
  v.dtype = info->dtype;
  v.shape = info->shape;
  v.device = Device::kCpu;
  *out = std::move(v);
  return {};
}

// ---- Checkpoint

Status Checkpoint::open(const std::string& dir, std::unique_ptr<Checkpoint>* out) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  const std::string config_path = dir + "/config.json";
  bool exists = false;
  LLMQ_RETURN_IF_ERROR(find_input_file(config_path, &exists));
  if (!exists) return io_error(config_path + ": missing (a Hugging Face checkpoint directory needs config.json)");
  LLMQ_RETURN_IF_ERROR(read_input_file("config.json", config_path, kMaxConfigJsonBytes, &ckpt->config_json_));

  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;  // tensor -> shard file
  LLMQ_RETURN_IF_ERROR(find_input_file(index_path, &exists));
  if (exists) {
    std::string text;
    LLMQ_RETURN_IF_ERROR(read_input_file("safetensors index", index_path, kMaxSideFileBytes, &text));
    LLMQ_RETURN_IF_ERROR(parse_safetensors_index(index_path, text, &weight_map));
    std::set<std::string> shard_set;
    for (const auto& item : weight_map) shard_set.insert(item.second);
    shards.assign(shard_set.begin(), shard_set.end());  // model-00001-of-0000N sorts in order
  } else {
    const std::string single = dir + "/model.safetensors";
    LLMQ_RETURN_IF_ERROR(find_input_file(single, &exists));
    if (!exists) return io_error(dir + ": neither model.safetensors nor model.safetensors.index.json exists");
    shards.push_back("model.safetensors");
  }

  std::map<std::string, std::string> shard_of;  // tensor -> shard that holds it
  for (const std::string& shard : shards) {
    const std::string shard_path = dir + "/" + shard;
    LLMQ_RETURN_IF_ERROR(find_input_file(shard_path, &exists));
    if (!exists)
      return io_error(index_path + ": shard '" + shard + "' is listed but " + shard_path + " does not exist");
    std::unique_ptr<SafetensorsFile> file;
    LLMQ_RETURN_IF_ERROR(SafetensorsFile::open(shard_path, &file));
    for (const auto& info : file->tensors()) {
      const auto [it, inserted] = shard_of.emplace(info.name, shard);
      if (!inserted)
        return invalid_argument(dir + ": tensor '" + info.name + "' appears in two shards: '" + it->second +
                                "' and '" + shard + "'");
      ckpt->owner_[info.name] = file.get();
    }
    ckpt->files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : weight_map) {
    const auto it = shard_of.find(name);
    if (it == shard_of.end() || it->second != shard)
      return invalid_argument(index_path + ": tensor '" + name + "' is listed in shard '" + shard +
                              "' but is not there");
  }
  *out = std::move(ckpt);
  return {};
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& file : files_)
    for (const auto& info : file->tensors()) names.push_back(info.name);
  return names;
}

std::vector<std::string> Checkpoint::file_paths() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file->path());
  return paths;
}

const SafetensorsTensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : it->second->find(name);
}

Status Checkpoint::view(const std::string& name, TensorView* out) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) return invalid_argument(dir_ + ": no tensor named '" + name + "'");
  return it->second->view(name, out);
}

namespace {

// Convert n elements of `dtype` at src to float32 at dst. One loop per dtype (not a switch per
// element): checkpoints hold billions of elements.
bool convert_to_f32(DType dtype, const uint8_t* src, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32: convert_elements<float>(src, n, dst, [](float x) { return x; }); return true;
    case DType::kF64: convert_elements<double>(src, n, dst, [](double x) { return static_cast<float>(x); }); return true;
    case DType::kF16: convert_elements<uint16_t>(src, n, dst, fp16_bits_to_float); return true;
    case DType::kBF16: convert_elements<uint16_t>(src, n, dst, bf16_bits_to_float); return true;
    case DType::kE4M3:
      convert_elements<uint8_t>(src, n, dst, [](uint8_t c) { return fp8_to_float(c, DType::kE4M3); });
      return true;
    case DType::kE5M2:
      convert_elements<uint8_t>(src, n, dst, [](uint8_t c) { return fp8_to_float(c, DType::kE5M2); });
      return true;
    case DType::kI8: convert_elements<int8_t>(src, n, dst, [](int8_t x) { return static_cast<float>(x); }); return true;
    // Integers above 2^24 round to the nearest float32.
    case DType::kI32: convert_elements<int32_t>(src, n, dst, [](int32_t x) { return static_cast<float>(x); }); return true;
    case DType::kU8: convert_elements<uint8_t>(src, n, dst, [](uint8_t x) { return static_cast<float>(x); }); return true;
    default: return false;
  }
}

}  // namespace

void SafetensorsFile::release_pages(int64_t begin, int64_t end) const {
  const int64_t page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t file_begin = (data_ - static_cast<const uint8_t*>(map_)) + begin;
  const int64_t first = file_begin / page * page;
  const int64_t last = std::min(map_size_, file_begin + (end - begin));
  if (last <= first) return;
  // Advice only: a failure leaves the pages resident, which costs memory, not correctness.
  (void)::madvise(static_cast<uint8_t*>(map_) + first, static_cast<size_t>(last - first), MADV_DONTNEED);
}

Status Checkpoint::read_f32(const std::string& name, Tensor* out) const {
  const SafetensorsTensorInfo* info = find(name);
  const int64_t rows = info != nullptr && !info->shape.empty() ? info->shape[0] : 1;
  return read_f32_rows(name, 0, rows, out);
}

Status Checkpoint::read_f32_rows(const std::string& name, int64_t row_begin, int64_t rows, Tensor* out) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) return invalid_argument(dir_ + ": no tensor named '" + name + "'");
  const SafetensorsFile& file = *it->second;
  const SafetensorsTensorInfo& info = *file.find(name);
  std::vector<int64_t> shape = info.shape;
  const int64_t all_rows = shape.empty() ? 1 : shape[0];
  if (row_begin < 0 || rows < 0 || row_begin > all_rows || rows > all_rows - row_begin)
    return invalid_argument(dir_ + ": tensor '" + name + "': rows [" + std::to_string(row_begin) + ", " +
                            std::to_string(row_begin + rows) + ") outside [0, " + std::to_string(all_rows) + ")");
  if (!shape.empty()) shape[0] = rows;
  Tensor t(DType::kF32, shape);
  int64_t row_elements = 1;  // product of the dimensions after 0 (the shape passed the header checks)
  for (size_t d = 1; d < info.shape.size(); ++d) row_elements *= info.shape[d];
  const int64_t element_bytes = dtype_storage_bytes(info.dtype, 1);
  const int64_t begin = info.offset + row_begin * row_elements * element_bytes;
  const int64_t end = begin + t.numel() * element_bytes;
  TensorView v;
  LLMQ_RETURN_IF_ERROR(file.view(name, &v));
  const auto* src = static_cast<const uint8_t*>(v.data) + (begin - info.offset);
  if (!convert_to_f32(info.dtype, src, t.numel(), t.data_as<float>()))
    return unsupported(dir_ + ": tensor '" + name + "': cannot read " + dtype_name(info.dtype) + " as float32");
  file.release_pages(begin, end);
  *out = std::move(t);
  return {};
}

// ---- writing

Status write_safetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata, SafetensorsWritten* written) {
  // Everything that can be checked is checked before a file is created. The header text is
  // built entry by entry in the caller's order (an ordered_json object would search its keys
  // linearly on every insert: quadratic in the tensor count); the bytes are what dumping the
  // ordered object gives.
  std::string header_text = "{";
  try {
    if (!metadata.empty()) {
      ordered_json meta = ordered_json::object();
      for (const auto& [key, value] : metadata) meta[key] = value;
      header_text += ordered_json(kMetadataKey).dump() + ":" + meta.dump();  // first, as the reference writer puts it
    }
  } catch (const std::exception& e) {  // e.g. a value that is not valid UTF-8
    return invalid_argument(path + ": cannot encode the metadata: " + e.what());
  }
  std::set<std::string> names;
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (const auto& e : entries) {
    const std::string where = path + ": tensor '" + e.name + "': ";
    if (e.name.empty()) return invalid_argument(path + ": a tensor has an empty name");
    if (e.name == kMetadataKey) return invalid_argument(where + "the name is reserved for metadata");
    if (!names.insert(e.name).second) return invalid_argument(where + "listed twice");
    const char* dtype = safetensors_dtype_name(e.dtype);
    if (dtype == nullptr)
      return unsupported(where + "dtype " + std::string(dtype_name(e.dtype)) + " has no safetensors name");
    int64_t numel = 0, nbytes = 0;
    const Status size_status = shape_bytes(e.dtype, e.shape, &numel, &nbytes);
    if (!size_status.ok()) return invalid_argument(where + size_status.message());
    if (!e.fill && !e.fill_rows && nbytes > 0) return invalid_argument(where + "no fill callback");
    if (e.fill_rows && e.shape.empty()) return invalid_argument(where + "fill_rows needs a dimension 0");
    ordered_json entry = ordered_json::object();
    entry["dtype"] = dtype;
    entry["shape"] = e.shape;
    entry["data_offsets"] = {offset, offset + nbytes};
    try {
      if (header_text.size() > 1) header_text += ",";
      header_text += ordered_json(e.name).dump() + ":" + entry.dump();
    } catch (const std::exception& ex) {  // e.g. a name that is not valid UTF-8
      return invalid_argument(path + ": cannot encode the header: " + ex.what());
    }
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  header_text += "}";
  // Pad with spaces (valid trailing JSON whitespace) so the data section is 8-byte aligned.
  header_text.append(static_cast<size_t>((kDataAlignment - static_cast<int64_t>(header_text.size()) % kDataAlignment) %
                                         kDataAlignment),
                     ' ');

  const std::string tmp = path + ".tmp-" + std::to_string(static_cast<long long>(::getpid()));
  // A new file (O_EXCL), never one planted under the name nor a link followed (O_NOFOLLOW).
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(tmp + ": cannot create: " + errno_text(errno));
  // Any failure from here removes the temporary file; the destination is only touched by rename.
  auto fail = [&](Status s) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };

  uint8_t prefix[kLengthPrefixBytes];
  const auto header_len = static_cast<uint64_t>(header_text.size());
  for (int i = 0; i < kLengthPrefixBytes; ++i) prefix[i] = static_cast<uint8_t>(header_len >> (8 * i));
  // The checksum sees exactly the bytes written, so --resume can verify the file later.
  Checksum sum;
  auto emit = [&](const uint8_t* data, int64_t n) {
    sum.update(data, n);
    return write_fully(fd, data, n, tmp);
  };
  Status st = emit(prefix, kLengthPrefixBytes);
  if (st.ok()) st = emit(reinterpret_cast<const uint8_t*>(header_text.data()), static_cast<int64_t>(header_text.size()));
  if (!st.ok()) return fail(st);

  std::vector<uint8_t> buffer;  // one tensor (or row block) at a time, reused
  // Run a fill callback into a zeroed buffer of n bytes (at least one byte so it always gets a
  // valid pointer; zeroed so nothing of the previous tensor leaks into a tensor whose fill writes
  // less than it should), with exceptions turned into a Status.
  auto run_fill = [&buffer](int64_t n, const std::function<Status(uint8_t*)>& fill) -> Status {
    try {
      buffer.assign(static_cast<size_t>(std::max<int64_t>(n, 1)), 0);
      return fill ? fill(buffer.data()) : Status();
    } catch (const std::exception& ex) {
      return Status(StatusCode::kInternal, std::string("fill threw: ") + ex.what());
    } catch (...) {
      return Status(StatusCode::kInternal, "fill threw a non-standard exception");
    }
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const int64_t nbytes = sizes[i];
    // A tensor of no bytes is one (empty) fill, whatever its first dimension says: [2^40, 0]
    // must not loop 2^40 / block times.
    const int64_t rows = e.fill_rows && nbytes > 0 ? e.shape[0] : 1;
    const int64_t row_bytes = rows > 0 ? nbytes / rows : 0;
    const int64_t block = e.fill_rows ? std::max<int64_t>(1, kRowBlockBytes / std::max<int64_t>(row_bytes, 1)) : 1;
    for (int64_t r = 0; r < rows; r += block) {
      const int64_t n = std::min(block, rows - r);
      const int64_t bytes = e.fill_rows && nbytes > 0 ? n * row_bytes : nbytes;
      const Status fill_status =
          e.fill_rows && nbytes > 0 ? run_fill(bytes, [&](uint8_t* dst) { return e.fill_rows(r, n, dst); }) : run_fill(bytes, e.fill);
      if (!fill_status.ok()) {
        // A fill that names its tensor failed on its input (a NaN weight, an unreadable source):
        // its message stands alone, since the file being written is not at fault.
        if (fill_status.message().find("'" + e.name + "'") != std::string::npos) return fail(fill_status);
        return fail(Status(fill_status.code(), path + ": tensor '" + e.name + "': " + fill_status.message()));
      }
      st = emit(buffer.data(), bytes);
      if (!st.ok()) return fail(st);
    }
  }
  if (::fsync(fd) != 0) return fail(io_error(tmp + ": fsync failed: " + errno_text(errno)));
  const int close_result = ::close(fd);
  fd = -1;
  if (close_result != 0) return fail(io_error(tmp + ": close failed: " + errno_text(errno)));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(io_error(path + ": cannot rename " + tmp + " into place: " + errno_text(errno)));
  if (written != nullptr) {
    written->bytes = kLengthPrefixBytes + static_cast<int64_t>(header_text.size()) + offset;
    written->checksum = sum.digest();
  }
  // Make the rename itself durable.
  return fsync_directory(parent_directory(path));
}

}  // namespace llmq
