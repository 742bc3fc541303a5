// A whole .safetensors file from bytes: length prefix, JSON header, dtypes, shapes, data_offsets
// and the rule that the tensors tile the data section. What an accepted header promises is
// checked: every tensor lies inside the file and its byte count matches dtype x shape.
#include "fuzz_support.hpp"
#include "llmq/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const std::string source = "fuzz.safetensors";
  SafetensorsHeader header;
  const Status st = parse_safetensors_header(source, data, static_cast<int64_t>(size), &header);
  fuzz::require_named_error(st, source);
  if (!st.ok()) return 0;
  const int64_t data_bytes = static_cast<int64_t>(size) - header.data_start;
  fuzz::require(header.data_start >= 8 && data_bytes >= 0, "data section outside the file");
  for (const SafetensorsTensorInfo& t : header.tensors) {
    fuzz::require(t.offset >= 0 && t.nbytes >= 0 && t.offset <= data_bytes - t.nbytes, "tensor past the end", t.name);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;  // cannot overflow: the parser bounded it
    fuzz::require(dtype_storage_bytes(t.dtype, numel) == t.nbytes, "byte count does not match the shape", t.name);
    fuzz::require(safetensors_dtype_name(t.dtype) != nullptr, "dtype without a safetensors name", t.name);
  }
  return 0;
}
