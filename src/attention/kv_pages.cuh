// Device side of the paged KV cache (attention.hpp's KvPages): where position t of a sequence is.
// Internal; CUDA sources only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention.hpp"

namespace llmq::attention {

// The block-table row of one sequence: position t is cache row table[t >> shift] << shift |
// (t & mask). block_size is a power of two and cache rows stay below 2^31 (validate_kv_pages), so
// int arithmetic is exact; the split is a shift and a mask instead of a division.
struct PagedRows {
  const int32_t* table = nullptr;  // the sequence's row of the block table
  int shift = 0;                   // log2(block_size)
  // The table is read-only for a kernel's lifetime (__ldg: the read-only path, cached in L1 next to
  // the other CTAs of the sequence that look up the same entries).
  __device__ __forceinline__ int row(int pos) const {
    return (__ldg(table + (pos >> shift)) << shift) | (pos & ((1 << shift) - 1));
  }
};

__device__ __forceinline__ PagedRows paged_rows(const KvPages& pages, int table_row) {
  PagedRows r;
  r.table = pages.block_table + static_cast<int64_t>(table_row) * pages.table_stride;
  r.shift = __ffs(static_cast<int>(pages.block_size)) - 1;  // block_size <= 2^16: exact in int
  return r;
}

// KvPages::capacity() is host code; the same product on the device (<= 2^30, validate_kv_pages).
__device__ __forceinline__ int pages_capacity(const KvPages& pages) {
  return static_cast<int>(pages.table_stride * pages.block_size);
}

}  // namespace llmq::attention
