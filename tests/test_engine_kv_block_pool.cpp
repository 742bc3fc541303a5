// The serving engine's KV block pool (include/llmq/kv_block_pool.hpp): allocation and release with
// reference counts, the LRU order of reuse, and prefix caching that is exact: a random workload is
// checked against a shadow of what every block holds (the whole token prefix its KV was computed
// for), so a hit that handed out KV of other tokens (a stale chain after eviction) would fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "llmq/kv_block_pool.hpp"

namespace llmq::engine {
namespace {

KvBlockPool make_pool(int64_t blocks, int64_t block_size) {
  KvBlockPool p;
  const Status st = KvBlockPool::create(blocks, block_size, &p);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p;
}

TEST(KvBlockPool, RefusesBadSizes) {
  KvBlockPool p;
  EXPECT_EQ(KvBlockPool::create(1, 16, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::create(8, 0, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::create(int64_t{1} << 40, 16, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(KvBlockPool::create(8, 16, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(KvBlockPool, HandsOutEveryBlockButTheNullOneAndRefusesPastThem) {
  KvBlockPool p = make_pool(6, 16);
  EXPECT_EQ(p.usable_blocks(), 5);
  std::vector<BlockId> got;
  ASSERT_TRUE(p.allocate(5, &got).ok());
  std::vector<BlockId> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<BlockId>{1, 2, 3, 4, 5}));
  EXPECT_EQ(p.free_blocks(), 0);
  std::vector<BlockId> more;
  const Status full = p.allocate(1, &more);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("1 blocks asked, 0 free"), std::string::npos) << full.to_string();
  EXPECT_TRUE(more.empty());
  ASSERT_TRUE(p.release(got).ok());
  EXPECT_TRUE(p.all_free());
  // Releasing what is not held (again, the null block, out of range, listed twice) changes nothing.
  EXPECT_EQ(p.release({got[0]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.release({kNullBlock}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.release({99}).code(), StatusCode::kInvalidArgument);
  std::vector<BlockId> one;
  ASSERT_TRUE(p.allocate(1, &one).ok());
  EXPECT_EQ(p.release({one[0], one[0]}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.refs(one[0]), 1);
  ASSERT_TRUE(p.release(one).ok());
  EXPECT_TRUE(p.all_free());
}

TEST(KvBlockPool, ReusesTheEndOfAReleasedTableFirst) {
  KvBlockPool p = make_pool(5, 4);
  std::vector<BlockId> t;
  ASSERT_TRUE(p.allocate(4, &t).ok());
  ASSERT_TRUE(p.release({t[0], t[1], t[2]}).ok());
  std::vector<BlockId> again;
  ASSERT_TRUE(p.allocate(3, &again).ok());
  EXPECT_EQ(again, (std::vector<BlockId>{t[2], t[1], t[0]}));
}

std::vector<int32_t> tokens_of(std::initializer_list<int32_t> blocks, int64_t block_size, int32_t last) {
  std::vector<int32_t> out;
  for (const int32_t b : blocks)
    for (int64_t i = 0; i < block_size; ++i) out.push_back(b * 100 + static_cast<int32_t>(i));
  out.push_back(last);
  return out;
}

TEST(KvBlockPool, SharesPublishedPrefixesWholeBlocksOnlyAndLeavesTheLastToken) {
  const int64_t bs = 4;
  KvBlockPool p = make_pool(16, bs);
  const std::vector<int32_t> prompt = tokens_of({1, 2, 3}, bs, 7);  // 13 tokens
  std::vector<BlockId> a;
  ASSERT_TRUE(p.allocate(4, &a).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.publish(a[i], i == 0 ? kNullBlock : a[i - 1], &prompt[i * bs]).ok());
  EXPECT_EQ(p.cached_blocks(), 3);

  std::vector<BlockId> b;  // the same prompt while A still runs: shared, three references more
  EXPECT_EQ(p.match_prefix(prompt.data(), static_cast<int64_t>(prompt.size()), &b), 3 * bs);
  EXPECT_EQ(b, (std::vector<BlockId>{a[0], a[1], a[2]}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.refs(a[i]), 2);
  ASSERT_TRUE(p.release(b).ok());
  ASSERT_TRUE(p.release(a).ok());
  EXPECT_TRUE(p.all_free());
  EXPECT_EQ(p.cached_blocks(), 3);  // free, still findable

  std::vector<BlockId> c;  // after A finished: taken back off the free list
  EXPECT_EQ(p.match_prefix(prompt.data(), static_cast<int64_t>(prompt.size()), &c), 3 * bs);
  EXPECT_EQ(p.free_blocks(), p.usable_blocks() - 3);
  ASSERT_TRUE(p.release(c).ok());

  std::vector<BlockId> d;  // exactly three blocks long: the last block stays to compute
  EXPECT_EQ(p.match_prefix(prompt.data(), 3 * bs, &d), 2 * bs);
  ASSERT_TRUE(p.release(d).ok());
  const std::vector<int32_t> other = tokens_of({1, 9, 3}, bs, 7);  // differs in block 2
  std::vector<BlockId> e;
  EXPECT_EQ(p.match_prefix(other.data(), static_cast<int64_t>(other.size()), &e), bs);
  ASSERT_TRUE(p.release(e).ok());
  // A lookup from the middle of a prompt finds nothing: every chain starts at the null block.
  std::vector<BlockId> f;
  EXPECT_EQ(p.match_prefix(&prompt[bs], 2 * bs + 1, &f), 0);
  EXPECT_TRUE(p.all_free());
}

TEST(KvBlockPool, AChainWhoseParentWasReusedIsNeverMatched) {
  const int64_t bs = 2;
  KvBlockPool p = make_pool(3, bs);  // two usable blocks
  const std::vector<int32_t> first = tokens_of({1, 2}, bs, 5);
  std::vector<BlockId> a;
  ASSERT_TRUE(p.allocate(2, &a).ok());
  ASSERT_TRUE(p.publish(a[0], kNullBlock, &first[0]).ok());
  ASSERT_TRUE(p.publish(a[1], a[0], &first[bs]).ok());
  ASSERT_TRUE(p.release({a[0]}).ok());  // the head of the chain is reused first
  ASSERT_TRUE(p.release({a[1]}).ok());
  std::vector<BlockId> z;
  ASSERT_TRUE(p.allocate(1, &z).ok());
  ASSERT_EQ(z[0], a[0]);
  const std::vector<int32_t> second = tokens_of({3, 2}, bs, 5);  // other first block, same second
  ASSERT_TRUE(p.publish(z[0], kNullBlock, &second[0]).ok());
  std::vector<BlockId> m;
  // Block a[1] still holds the key (a[0], tokens of block 2), but a[0] now holds other tokens.
  EXPECT_EQ(p.match_prefix(second.data(), static_cast<int64_t>(second.size()), &m), bs);
  EXPECT_EQ(m, (std::vector<BlockId>{z[0]}));
  ASSERT_TRUE(p.release(m).ok());
  ASSERT_TRUE(p.release(z).ok());
  EXPECT_TRUE(p.all_free());
}

TEST(KvBlockPool, PublishRefusesWhatBreaksTheRules) {
  KvBlockPool p = make_pool(4, 2);
  const int32_t toks[2] = {1, 2};
  std::vector<BlockId> a;
  ASSERT_TRUE(p.allocate(1, &a).ok());
  EXPECT_EQ(p.publish(kNullBlock, kNullBlock, toks).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.publish(a[0], a[0], toks).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.publish(a[0], 7, toks).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.publish(a[0], kNullBlock, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.publish(3, kNullBlock, toks).code(), StatusCode::kInvalidArgument);  // free, not held
  ASSERT_TRUE(p.release(a).ok());
}

// Random sequences over a small vocabulary (so prefixes repeat) against a shadow of each block's
// contents: the whole prefix its KV stands for. Every hit must hand out blocks whose contents are
// exactly the prompt's prefix; references and the free count must agree with the sequences alive.
TEST(KvBlockPool, RandomWorkloadHitsAreExactAndNothingLeaks) {
  const int64_t bs = 3;
  KvBlockPool p = make_pool(12, bs);  // small: blocks are reused often
  std::mt19937 rng(5);
  std::map<BlockId, std::vector<int32_t>> content;  // block -> prefix its KV was computed for
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<BlockId> table;
  };
  std::vector<Seq> alive;
  int64_t hits = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op < 2 || alive.empty()) {  // a new sequence: prefix lookup, then blocks for the rest
      Seq s;
      const int64_t n = 1 + static_cast<int64_t>(rng() % 14);
      for (int64_t i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng() % 2));
      const int64_t covered = p.match_prefix(s.tokens.data(), n, &s.table);
      ASSERT_EQ(covered % bs, 0);
      ASSERT_LT(covered, n);
      for (size_t i = 0; i < s.table.size(); ++i) {
        const std::vector<int32_t> want(s.tokens.begin(), s.tokens.begin() + static_cast<int64_t>(i + 1) * bs);
        ASSERT_EQ(content[s.table[i]], want) << "a hit handed out the KV of other tokens (block " << s.table[i] << ")";
        ++hits;
      }
      const int64_t need = (n + bs - 1) / bs - static_cast<int64_t>(s.table.size());
      const size_t first_new = s.table.size();
      if (!p.allocate(need, &s.table).ok()) {  // full: give the hits back
        ASSERT_TRUE(p.release(s.table).ok());
        continue;
      }
      for (size_t i = first_new; i < s.table.size(); ++i) {
        const int64_t end = std::min<int64_t>(n, static_cast<int64_t>(i + 1) * bs);
        content[s.table[i]] = std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + end);
        if (end - static_cast<int64_t>(i) * bs == bs) {  // full: publish it
          ASSERT_TRUE(p.publish(s.table[i], i == 0 ? kNullBlock : s.table[i - 1], &s.tokens[i * bs]).ok());
        }
      }
      alive.push_back(std::move(s));
    } else {  // a sequence ends: its table at once, or block by block in any order (so that
              // parents are also reused before their children, the case a stale chain needs)
      const size_t k = rng() % alive.size();
      if (rng() % 2 == 0) {
        ASSERT_TRUE(p.release(alive[k].table).ok());
      } else {
        std::vector<BlockId> order = alive[k].table;
        std::shuffle(order.begin(), order.end(), rng);
        for (const BlockId b : order) ASSERT_TRUE(p.release({b}).ok());
      }
      alive.erase(alive.begin() + static_cast<int64_t>(k));
    }
    int64_t held = 0;
    std::map<BlockId, int32_t> refs;
    for (const Seq& s : alive)
      for (const BlockId b : s.table) ++refs[b];
    for (const auto& [b, r] : refs) {
      ASSERT_EQ(p.refs(b), r) << "block " << b;
      ++held;
    }
    ASSERT_EQ(p.free_blocks(), p.usable_blocks() - held);
  }
  EXPECT_GT(hits, 100) << "the workload should reuse prefixes";
  for (const Seq& s : alive) ASSERT_TRUE(p.release(s.table).ok());
  EXPECT_TRUE(p.all_free());
}

}  // namespace
}  // namespace llmq::engine
