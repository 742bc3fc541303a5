// validate_kv_pages (attention.hpp): the host-checkable half of the paged KV cache's contract, shared
// by the attention entry points, the K/V writer (rope_kv) and the 8-bit prefill path. The bounds
// keep every index the kernels form in int: cache rows below 2^31, positions below 2^30.
#include <string>

#include "attention/attention.hpp"

namespace llmq::attention {

Status validate_kv_pages(const KvPages& pages, const char* f) {
  const std::string p = std::string(f) + "pages.";
  if (pages.block_table == nullptr) return invalid_argument(p + "block_table is null");
  if (pages.table_stride < 1 || pages.table_stride > (int64_t{1} << 30))
    return invalid_argument(p + "table_stride " + std::to_string(pages.table_stride) + " not in [1, 2^30]");
  // A power of two so that the kernels split a position into block and offset by shift and mask.
  const int64_t bs = pages.block_size;
  if (bs < 1 || bs > (int64_t{1} << 16) || (bs & (bs - 1)) != 0)
    return invalid_argument(p + "block_size " + std::to_string(bs) + " is not a power of two in [1, 2^16]");
  if (pages.num_blocks < 1 || pages.num_blocks > (int64_t{1} << 31))
    return invalid_argument(p + "num_blocks " + std::to_string(pages.num_blocks) + " not in [1, 2^31]");
  if (pages.num_blocks * bs >= (int64_t{1} << 31))
    return invalid_argument(p + "num_blocks " + std::to_string(pages.num_blocks) + " x block_size " + std::to_string(bs) +
                            " cache rows: not below 2^31");
  if (pages.capacity() > (int64_t{1} << 30))
    return invalid_argument(p + "capacity (table_stride " + std::to_string(pages.table_stride) + " x block_size " +
                            std::to_string(bs) + ") over 2^30");
  return {};
}

}  // namespace llmq::attention
