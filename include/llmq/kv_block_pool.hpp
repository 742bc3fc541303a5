// The serving engine's paged KV cache, host side: which blocks of the device cache are free, which
// sequences hold which blocks, and which full blocks hold a known prefix (prefix caching). The
// device memory itself belongs to the backend; this object only hands out block ids.
//
// Blocks hold `block_size` token positions of every layer's K and V. Block 0 is never handed out:
// block tables are padded with it (the kernels may read it, never use it).
//
// Prefix caching. A full block that a sequence has computed can be published under its key: the
// block before it in the sequence (its parent; the null block for the first) and its tokens. A later
// sequence whose prompt starts the same way finds the chain block by block and shares the blocks
// (reference counts) instead of computing them again. A key names its parent by id *and* the
// parent's generation (bumped every time a block is handed out afresh), so a chain whose parent
// block was evicted and reused for other tokens can never be matched: a hit is exact, never a hash
// collision. Lookups compare the tokens themselves.
//
// Free blocks form one LRU list. A released block goes to its tail (a sequence's blocks in reverse
// order, so the end of a chain is evicted before its start); allocation takes the head. A free
// block that is published stays findable until it is taken for another sequence: a hit takes it off
// the free list and counts a reference.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "llmq/status.hpp"

namespace llmq::engine {

using BlockId = int32_t;
inline constexpr BlockId kNullBlock = 0;

class KvBlockPool {
 public:
  KvBlockPool() = default;
  KvBlockPool(const KvBlockPool&) = delete;  // key_of_ points into index_
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  KvBlockPool(KvBlockPool&&) = default;
  KvBlockPool& operator=(KvBlockPool&&) = default;

  // `blocks` blocks (block 0 included, so blocks - 1 usable, at least 1) of `block_size` tokens.
  static Status create(int64_t blocks, int64_t block_size, KvBlockPool* out);

  int64_t block_size() const { return block_size_; }
  int64_t usable_blocks() const { return static_cast<int64_t>(ref_.size()) - 1; }
  int64_t free_blocks() const { return free_count_; }  // free blocks, published ones included
  int64_t cached_blocks() const { return static_cast<int64_t>(index_.size()); }
  int32_t refs(BlockId b) const { return ref_[static_cast<size_t>(b)]; }

  // `n` blocks, each with one reference, appended to `out`; kResourceExhausted (nothing taken) when
  // fewer than n are free.
  Status allocate(int64_t n, std::vector<BlockId>* out);

  // The longest chain of published blocks that starts `tokens` (whole blocks only, and never all
  // of `tokens`: the last token must still be computed to give logits). The blocks found get a
  // reference each and are appended to `out`; returns how many tokens they cover.
  int64_t match_prefix(const int32_t* tokens, int64_t n, std::vector<BlockId>* out);

  // Publishes block `b` (full, computed) as holding `tokens` (block_size of them) after `parent`
  // (the block before it in its sequence, or kNullBlock). A block already published, or one whose
  // key another block holds, is left as it is. Fails only on arguments that break the rules above.
  Status publish(BlockId b, BlockId parent, const int32_t* tokens);

  // Drops one reference of each block (a finished, cancelled or preempted sequence's table); blocks
  // left without references become free, the last of `blocks` first in line for reuse.
  Status release(const std::vector<BlockId>& blocks);

  // Every block free and no reference held (for the engine's leak checks).
  bool all_free() const { return free_count_ == usable_blocks(); }

 private:
  struct Key {
    BlockId parent = kNullBlock;
    uint64_t parent_generation = 0;
    std::vector<int32_t> tokens;
    bool operator==(const Key& o) const {
      return parent == o.parent && parent_generation == o.parent_generation && tokens == o.tokens;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  void unlink(BlockId b);
  void push_back(BlockId b);
  void forget(BlockId b);  // drops b's published key, if any

  int64_t block_size_ = 0;
  std::vector<int32_t> ref_;          // references per block (0: free)
  std::vector<uint64_t> generation_;  // bumped whenever a block is handed out afresh
  std::vector<BlockId> prev_, next_;  // the free list (kNullBlock ends it)
  BlockId head_ = kNullBlock, tail_ = kNullBlock;
  int64_t free_count_ = 0;
  std::unordered_map<Key, BlockId, KeyHash> index_;  // published blocks by key
  std::vector<const Key*> key_of_;                    // each block's key in index_, or null
};

}  // namespace llmq::engine
