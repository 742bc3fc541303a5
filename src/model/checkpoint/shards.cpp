// Sharding of a checkpoint being written (Hugging Face's layout and file names).
#include <cstdio>

#include "llmq/safetensors.hpp"

namespace llmq {

int64_t safetensors_entry_bytes(const SafetensorsWriteEntry& entry) {
  int64_t numel = 1;
  for (int64_t d : entry.shape) numel *= d;
  return dtype_storage_bytes(entry.dtype, numel);
}

std::vector<std::vector<SafetensorsWriteEntry>> split_into_shards(std::vector<SafetensorsWriteEntry> entries,
                                                                  int64_t max_shard_bytes) {
  std::vector<std::vector<SafetensorsWriteEntry>> shards(1);
  int64_t shard_bytes = 0;
  for (auto& e : entries) {
    const int64_t b = safetensors_entry_bytes(e);
    if (shard_bytes > 0 && shard_bytes + b > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(std::move(e));
    shard_bytes += b;
  }
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char file[64];
  std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return file;
}

}  // namespace llmq
