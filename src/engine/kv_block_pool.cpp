// KvBlockPool (kv_block_pool.hpp).
#include "llmq/kv_block_pool.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace llmq::engine {

size_t KvBlockPool::KeyHash::operator()(const Key& k) const {
  // A multiply-xorshift per word over the parent, its generation and the tokens: a bucket choice
  // only (lookups compare whole keys), so speed before strength; a word at a time (the byte-wise
  // FNV-1a before it took 80 multiplies a 16-token key).
  uint64_t h = 0x9E3779B97F4A7C15ull;
  const auto mix = [&h](uint64_t v) {
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  };
  mix(static_cast<uint64_t>(static_cast<uint32_t>(k.parent)));
  mix(k.parent_generation);
  for (const int32_t t : k.tokens) mix(static_cast<uint32_t>(t));
  return static_cast<size_t>(h);
}

Status KvBlockPool::create(int64_t blocks, int64_t block_size, KvBlockPool* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (blocks < 2 || blocks > (int64_t{1} << 30))
    return invalid_argument("blocks: must be in [2, 2^30] (block 0 is the null block), got " + std::to_string(blocks));
  if (block_size < 1 || block_size > 4096)
    return invalid_argument("block_size: must be in [1, 4096] tokens, got " + std::to_string(block_size));
  KvBlockPool p;
  p.block_size_ = block_size;
  const size_t n = static_cast<size_t>(blocks);
  p.ref_.assign(n, 0);
  p.generation_.assign(n, 0);
  p.prev_.assign(n, kNullBlock);
  p.next_.assign(n, kNullBlock);
  p.key_of_.assign(n, nullptr);
  p.ref_[kNullBlock] = 1;  // never free, never handed out
  for (BlockId b = 1; b < static_cast<BlockId>(blocks); ++b) p.push_back(b);
  p.index_.reserve(n);  // at most one key a block: the index never rehashes while serving
  *out = std::move(p);
  return {};
}

void KvBlockPool::unlink(BlockId b) {
  const BlockId p = prev_[static_cast<size_t>(b)], n = next_[static_cast<size_t>(b)];
  if (p != kNullBlock) next_[static_cast<size_t>(p)] = n; else head_ = n;
  if (n != kNullBlock) prev_[static_cast<size_t>(n)] = p; else tail_ = p;
  prev_[static_cast<size_t>(b)] = next_[static_cast<size_t>(b)] = kNullBlock;
  --free_count_;
}

void KvBlockPool::push_back(BlockId b) {
  prev_[static_cast<size_t>(b)] = tail_;
  next_[static_cast<size_t>(b)] = kNullBlock;
  if (tail_ != kNullBlock) next_[static_cast<size_t>(tail_)] = b; else head_ = b;
  tail_ = b;
  ++free_count_;
}

void KvBlockPool::forget(BlockId b) {
  const Key* k = key_of_[static_cast<size_t>(b)];
  if (k == nullptr) return;
  key_of_[static_cast<size_t>(b)] = nullptr;
  index_.erase(*k);
}

Status KvBlockPool::allocate(int64_t n, std::vector<BlockId>* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (n < 0) return invalid_argument("n: must be >= 0, got " + std::to_string(n));
  if (n > free_count_)
    return {StatusCode::kResourceExhausted, "KV cache: " + std::to_string(n) + " blocks asked, " +
                                                std::to_string(free_count_) + " free"};
  for (int64_t i = 0; i < n; ++i) {
    const BlockId b = head_;
    unlink(b);
    forget(b);  // its old contents are about to be overwritten: no longer findable
    ++generation_[static_cast<size_t>(b)];
    ref_[static_cast<size_t>(b)] = 1;
    out->push_back(b);
  }
  return {};
}

int64_t KvBlockPool::match_prefix(const int32_t* tokens, int64_t n, std::vector<BlockId>* out) {
  if (tokens == nullptr || out == nullptr || n <= 0 || index_.empty()) return 0;
  Key key;
  key.tokens.resize(static_cast<size_t>(block_size_));
  int64_t covered = 0;
  BlockId parent = kNullBlock;
  // Whole blocks, leaving at least one token to compute.
  while (covered + block_size_ <= n - 1) {
    key.parent = parent;
    key.parent_generation = generation_[static_cast<size_t>(parent)];
    key.tokens.assign(tokens + covered, tokens + covered + block_size_);
    const auto it = index_.find(key);
    if (it == index_.end()) break;
    const BlockId b = it->second;
    if (ref_[static_cast<size_t>(b)]++ == 0) unlink(b);  // a free published block is taken back
    out->push_back(b);
    parent = b;
    covered += block_size_;
  }
  return covered;
}

Status KvBlockPool::publish(BlockId b, BlockId parent, const int32_t* tokens) {
  const BlockId blocks = static_cast<BlockId>(ref_.size());
  if (b <= kNullBlock || b >= blocks) return invalid_argument("block: " + std::to_string(b) + " is not a usable block");
  if (parent < kNullBlock || parent >= blocks || parent == b)
    return invalid_argument("parent: " + std::to_string(parent) + " is not a block before " + std::to_string(b));
  if (tokens == nullptr) return invalid_argument("tokens: null");
  if (ref_[static_cast<size_t>(b)] == 0) return invalid_argument("block " + std::to_string(b) + ": not held");
  if (key_of_[static_cast<size_t>(b)] != nullptr) return {};  // published already
  Key key;
  key.parent = parent;
  key.parent_generation = generation_[static_cast<size_t>(parent)];
  key.tokens.assign(tokens, tokens + block_size_);
  const auto [it, inserted] = index_.emplace(std::move(key), b);
  if (inserted) key_of_[static_cast<size_t>(b)] = &it->first;  // else another block holds the key
  return {};
}

Status KvBlockPool::release(const std::vector<BlockId>& blocks) {
  // Checked whole before anything changes: every block held at least as often as it is listed
  // (counted over a sorted copy: one allocation, not a node per block).
  const BlockId count = static_cast<BlockId>(ref_.size());
  std::vector<BlockId> sorted(blocks);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    const BlockId b = sorted[i];
    size_t j = i;
    while (j < sorted.size() && sorted[j] == b) ++j;
    if (b <= kNullBlock || b >= count || static_cast<int64_t>(j - i) > ref_[static_cast<size_t>(b)])
      return invalid_argument("release: block " + std::to_string(b) + " is not held");
    i = j;
  }
  // Last block first in line: a chain's tail is evicted before its head (which more prompts share).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (--ref_[static_cast<size_t>(*it)] == 0) push_back(*it);
  return {};
}

}  // namespace llmq::engine
