// Safetensors files and Hugging Face checkpoints: memory-mapped reading (a checkpoint larger than
// RAM is processed tensor by tensor; the OS pages in what is touched), and writing to a temporary
// file that is renamed into place.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llmq/dtype.hpp"
#include "llmq/model.hpp"
#include "llmq/status.hpp"
#include "llmq/tensor.hpp"

namespace llmq {

// Safetensors dtype strings: "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I8", "I32", "F64".
const char* safetensors_dtype_name(DType dtype);
Status parse_safetensors_dtype(const std::string& name, DType* out);

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // from the start of the data section
  int64_t nbytes = 0;
};

// The parsed header of a safetensors file: its tensors (sorted by offset), metadata, and where the
// data section starts.
struct SafetensorsHeader {
  std::vector<SafetensorsTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // file offset of the data section
};

// Validate a whole safetensors file held in memory (`bytes`, `size` bytes): the length prefix, the
// JSON header, and tensors that tile the data section exactly. `source` names the file in errors.
// SafetensorsFile::open runs this on its mapping; taking bytes lets the fuzz target drive it.
Status parse_safetensors_header(const std::string& source, const uint8_t* bytes, int64_t size,
                                SafetensorsHeader* out);

// The "weight_map" of a model.safetensors.index.json (tensor name -> shard file name); shard names
// must be plain file names. `source` names the index file in errors.
Status parse_safetensors_index(const std::string& source, const std::string& json_text,
                               std::map<std::string, std::string>* weight_map);

// One .safetensors file, memory-mapped read-only.
class SafetensorsFile {
 public:
  static Status open(const std::string& path, std::unique_ptr<SafetensorsFile>* out);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensorInfo* find(const std::string& name) const;
  // A view of the mapped bytes (read-only; do not write through it).
  Status view(const std::string& name, TensorView* out) const;
  // Drop this process's mapped pages of bytes [begin, end) of the data section (madvise
  // MADV_DONTNEED: the mapping stays valid, a later read pages them in again).
  void release_pages(int64_t begin, int64_t end) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  int64_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, int64_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory: config.json and model.safetensors or the shards listed in
// model.safetensors.index.json. Tensor names resolve across shards.
class Checkpoint {
 public:
  static Status open(const std::string& dir, std::unique_ptr<Checkpoint>* out);
  const std::string& dir() const { return dir_; }
  const std::string& config_json() const { return config_json_; }  // raw text of config.json
  std::vector<std::string> tensor_names() const;  // in file order, shard by shard
  std::vector<std::string> file_paths() const;    // the safetensors files, shard by shard
  const SafetensorsTensorInfo* find(const std::string& name) const;
  Status view(const std::string& name, TensorView* out) const;
  // Read a tensor as float32, whatever its stored dtype (F8/I8 are returned raw: no scale applied).
  // The mapped pages it read are released afterwards, so streaming a checkpoint larger than RAM
  // through read_f32 keeps the resident set at one tensor, not the file (the page cache still
  // holds them while memory allows).
  Status read_f32(const std::string& name, Tensor* out) const;
  // Rows [row_begin, row_begin + rows) of dimension 0 as float32 [rows, ...] (pages released too).
  Status read_f32_rows(const std::string& name, int64_t row_begin, int64_t rows, Tensor* out) const;

 private:
  std::string dir_;
  std::string config_json_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> owner_;
};

// Writing: the header (names, dtypes, shapes) must be known first; each tensor's bytes are then
// produced by a callback, in order, so a large checkpoint streams through memory one tensor at a
// time. The file is written as `path` + ".tmp-<pid>", fsynced and renamed on success, and the
// directory fsynced.
struct SafetensorsWriteEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Fills exactly dtype_storage_bytes(dtype, numel) bytes at dst.
  std::function<Status(uint8_t* dst)> fill;
  // Instead of fill, for large tensors: fills rows [row_begin, row_begin + rows) of dimension 0,
  // so the writer holds one block of rows (about 64 MiB) at a time instead of the whole tensor.
  std::function<Status(int64_t row_begin, int64_t rows, uint8_t* dst)> fill_rows;
};
struct SafetensorsWritten {
  int64_t bytes = 0;      // the whole file
  uint64_t checksum = 0;  // llmq::Checksum of the whole file (atomic_io.hpp)
};
Status write_safetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& entries,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}},
                         SafetensorsWritten* written = nullptr);

// Bytes of one entry's tensor data.
int64_t safetensors_entry_bytes(const SafetensorsWriteEntry& entry);
// Consecutive groups of entries of at most max_shard_bytes each (a larger tensor gets a shard of
// its own), as Hugging Face shards a checkpoint.
std::vector<std::vector<SafetensorsWriteEntry>> split_into_shards(std::vector<SafetensorsWriteEntry> entries,
                                                                  int64_t max_shard_bytes);
// "model.safetensors" for one shard, else "model-00001-of-00003.safetensors".
std::string shard_file_name(size_t index, size_t count);

// Parse config.json text into a ModelConfig (llama, mistral, qwen2, mixtral by model_type).
Status parse_hf_config(const std::string& json_text, ModelConfig* out);
// quantization_config.weight_block_size ([rows, cols]) of a block-FP8 config.json, else 128 x 128.
Status parse_hf_weight_block_size(const std::string& json_text, int64_t* rows, int64_t* cols);
// The one checked way a Hugging Face checkpoint is opened as a model (every loader uses it):
// Checkpoint::open, config.json parsed (errors name the directory), and check_hf_checkpoint.
Status open_hf_checkpoint(const std::string& dir, std::unique_ptr<Checkpoint>* ckpt, ModelConfig* config);
// Every tensor `config` implies is present with its shape and a dtype the model can read (8-bit
// linear weights only under a quantization_config); lm_head present exactly when untied; and no
// tensor the model would not read (another layer, expert or stray name; a scale beside a float
// weight). Errors name the directory and the tensor. Stops at the first missing tensor, so a
// config that claims absurd counts costs no more than the checkpoint's own tensor count.
Status check_hf_checkpoint(const Checkpoint& ckpt, const ModelConfig& config);
// Whether config.json text carries a quantization_config object.
bool config_has_quantization(const std::string& config_json);
// Load a Hugging Face directory into float32 weights. Quantized checkpoints llmq writes (FP8 /
// INT8 with weight_scale or weight_scale_inv) are dequantized on load.
Status load_hf_model(const std::string& dir, ModelWeights* out);

}  // namespace llmq
