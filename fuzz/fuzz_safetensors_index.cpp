// model.safetensors.index.json: the weight_map a sharded checkpoint is opened by. An accepted map
// must name only plain shard files beside the index (never a path out of the model directory).
#include "fuzz_support.hpp"
#include "llmq/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string source = "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  const Status st = parse_safetensors_index(source, fuzz::as_string(data, size), &weight_map);
  fuzz::require_named_error(st, source);
  if (!st.ok()) return 0;
  for (const auto& [tensor, shard] : weight_map)
    fuzz::require(!shard.empty() && shard != "." && shard != ".." && shard.find('/') == std::string::npos,
                  "shard is not a plain file name", shard);
  return 0;
}
