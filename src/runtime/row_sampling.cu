// Per-row sampling on the device (row_sampling.hpp holds the definition): each logits row drawn
// with its own temperature, top-k, top-p, seed and draw, by a team of CTAs of 1024 threads: one CTA,
// or while the batch leaves SMs idle a thread-block cluster of 2-8 (sm_90) that splits the row into
// slices and exchanges its sums through distributed shared memory.
//
// How a sampled row is drawn, in passes over the row (each a coalesced float4 read of the slice):
//   A  the argmax (a 64-bit max of (order key, ~id)), which is also the maximum the weights are
//      taken against; with top-k, a histogram of the top 11 bits of every order key (counts).
//   K  top-k by radix selection on the order key: the bin where the count from the top reaches k
//      (pick_bin), then the next 11 and 10 bits of the keys inside that bin (passes that only read
//      the row and test a key prefix). A bin holding one token, or whose tokens are all kept, ends
//      it early; after all 32 bits, ties at the k-th key are split by id (first_reaching).
//   P  top-p the same way on weights: the level-0 histogram of the top-k set's integer weights
//      (whose total is the top-k weight, so the threshold ceil(top_p * total) is known after it),
//      then the finer levels inside the threshold's bin.
//   D  the draw: each warp sums the kept weights of a contiguous range; the range holding
//      floor(u * total) + 1 is then searched by the whole CTA in per-thread slices.
// Weights are integers (round(w * 2^31)) and every sum exact, so the token depends on nothing but
// the row and its parameters: not on the batch, the team size or the order of atomics.
// Cost per row: greedy 1 pass; temperature only 2; with top-k and/or top-p 3 full passes (A, P's
// level 0 and D compute exp2 only for tokens still in play) plus 1-4 key-prefix passes. Measured on
// an H200, vocabulary 151936, N(0, 2.5) logits with outliers: 1 row (a cluster of 8) 13 us greedy,
// 23 us temperature only, 45 us top-k 40 + top-p 0.9; 64 rows 20 / 41 / 85 us; 512 rows (one CTA
// each; near the memory bound of ~6 reads) 101 / 255 / 511 us; argmax_rows 10 / 22 / 103 us.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "cuda/pdl.cuh"
#include "runtime/row_sampling.hpp"

namespace llmq::runtime {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;                   // the widest level's digit: 11 bits
constexpr int kGroups = 32;                   // bins are picked a group (kBins / kGroups at most) at a time
constexpr int64_t kAllTies = INT64_MAX;          // Prefix::last_tie when every tie at its key is kept
// A row is split over a cluster of up to 8 CTAs (sm_90) while the batch leaves SMs idle and each
// CTA keeps at least kMinSlice tokens: one CTA streams a row at only ~30 GB/s, and an SM has too
// few lanes for the exp2 of a 152k row (H200, one row of 151936 with top-p 0.9: 124 us on one
// CTA, 38 us on 8).
constexpr int kMaxTeam = 8;
constexpr int64_t kMinSlice = 8192;

// The rank key (row_sampling_reference.cpp's order_key): larger logit, larger key; -0 is +0; NaN 0.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);  // -0 + 0 is +0
  const uint32_t key = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
  return v != v ? 0u : key;
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// A token's integer weight round(exp((l - max) / T) * 2^31) = round(2^(x + 31)) for
// x = (l - max) * log2(e) / T; the maximum itself weighs exactly 2^31. Below x = -32 it rounds to 0,
// and the exp is skipped: most of a peaked row. ex2.approx's relative error (2^-22) is far inside
// the reference tests' near-tie tolerance.
struct Weight {
  float max;
  float log2e_over_t;
  __device__ __forceinline__ uint32_t operator()(float v) const {
    if (v == max) return 1u << 31;
    const float x = (v - max) * log2e_over_t;
    if (!(x >= -32.0f)) return 0;  // NaN too (a NaN logit; -Inf at an infinite temperature)
    float scaled;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(scaled) : "f"(x + 31.0f));
    return __float2uint_rn(scaled);
  }
};

// A prefix of the order: keys above `key`, and the tokens at `key` with id <= last_tie.
struct Prefix {
  uint32_t key = 0;
  int64_t last_tie = kAllTies;
  __device__ __forceinline__ bool has(uint32_t k, int64_t i) const { return k > key || (k == key && i <= last_tie); }
};

struct BinPick {
  int bin;
  uint64_t above;   // metric of the bins above it (plus what the levels before had above)
  uint32_t count;
  uint64_t metric;
};

// The CTAs that share a row: `size` CTAs of a cluster (1 without clusters), this one `rank`, each
// reading its slice [begin, end) of the row (slices of a multiple of 4 tokens, in rank order).
struct Team {
  int size, rank;
  int64_t vocab, slice, begin, end;
  __device__ Team(int team_size, int64_t row_vocab) : size(team_size), rank(static_cast<int>(blockIdx.x) % team_size) {
    vocab = row_vocab;
    slice = ((vocab + size - 1) / size + 3) / 4 * 4;
    begin = slice_begin(rank);
    end = slice_end(rank);
  }
  __device__ int64_t slice_begin(int r) const { return static_cast<int64_t>(r) * slice < vocab ? static_cast<int64_t>(r) * slice : vocab; }
  __device__ int64_t slice_end(int r) const { return slice_begin(r) + slice < vocab ? slice_begin(r) + slice : vocab; }
};

struct Shared {
  uint32_t count[kBins];
  uint32_t mass_lo[kBins];  // a bin's weight is mass_hi * 2^32 + mass_lo: 32-bit shared atomics with
  uint32_t mass_hi[kBins];  // the carry counted where an add wraps, exact and order-free
  unsigned long long warp_u64[kWarps];              // this CTA's per-warp sums, read by the team
  unsigned long long team_u64[kMaxTeam * kWarps];   // the team's, gathered in id order
  unsigned long long group_metric[kBins / kGroups];  // one group of bins summed over the team
  uint32_t group_count[kBins / kGroups];
  unsigned long long exchange[2], goal, base;
  int group;
  BinPick pick;
  long long index;
};

// ---- The team's exchanges. A team of several CTAs is a cluster (sm_90) and reads its CTAs'
// shared memory directly; a team of one uses its own and a CTA barrier.

__device__ __forceinline__ void team_sync(const Team& team) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (team.size > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}
template <class T>
__device__ __forceinline__ T* at_rank(T* p, int rank, const Team& team) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (team.size > 1) return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  (void)rank;
  (void)team;
  return p;
}
// The sum over the team's CTAs of the value at p in each: all loads issued before any is used
// (one remote round trip, not one per rank).
template <class T>
__device__ __forceinline__ unsigned long long team_sum(T* p, const Team& team) {
  T v[kMaxTeam];
#pragma unroll
  for (int r = 0; r < kMaxTeam; ++r) v[r] = r < team.size ? *at_rank(p, r, team) : T(0);
  unsigned long long s = 0;
#pragma unroll
  for (int r = 0; r < kMaxTeam; ++r) s += v[r];
  return s;
}

// ---- Block- and warp-wide helpers (every thread of the CTA calls the block ones).

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}
__device__ __forceinline__ unsigned long long warp_inclusive_scan(unsigned long long v) {
  const int lane = threadIdx.x % 32;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xFFFFFFFFu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}
__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = other > v ? other : v;
  }
  return v;
}

// The maximum over the team's threads.
__device__ __noinline__ unsigned long long team_max(unsigned long long v, const Team& team, Shared& sh) {
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.warp_u64[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = warp_max(sh.warp_u64[threadIdx.x]);
    if (threadIdx.x == 0) sh.exchange[0] = v;
  }
  team_sync(team);
  if (threadIdx.x < 32) {
    v = static_cast<int>(threadIdx.x) < team.size ? *at_rank(&sh.exchange[0], threadIdx.x, team) : 0;
    v = warp_max(v);
    if (threadIdx.x == 0) sh.exchange[1] = v;
  }
  team_sync(team);  // every rank's exchange[0] read before any rank moves on; exchange[1] visible
  return sh.exchange[1];
}

// The exclusive prefix sum of v over the CTA's threads in order; *total the sum of all.
__device__ unsigned long long block_exclusive_scan(unsigned long long v, Shared& sh, unsigned long long* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned long long inclusive = warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) sh.warp_u64[warp] = inclusive;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const unsigned long long s = sh.warp_u64[w];
    before += w < warp ? s : 0;
    all += s;
  }
  *total = all;
  return before + inclusive - v;
}

// fn(i, x[i]) for every i in [begin, end) that this thread takes (tid, tid + stride, ...): 16-byte
// loads, four in flight per thread, so one CTA keeps enough reads outstanding to stream its slice.
template <class Fn>
__device__ __forceinline__ void visit(const float* x, int64_t begin, int64_t end, int tid, int stride, Fn&& fn) {
  if (begin >= end) return;
  const int64_t misaligned = static_cast<int64_t>((reinterpret_cast<uintptr_t>(x + begin) >> 2) & 3);
  const int64_t head = misaligned == 0 ? 0 : (4 - misaligned < end - begin ? 4 - misaligned : end - begin);
  for (int64_t i = begin + tid; i < begin + head; i += stride) fn(i, x[i]);
  const int64_t body = begin + head;
  const int64_t n4 = (end - body) / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x + body);
  constexpr int kInFlight = 4;
  for (int64_t j = tid; j < n4; j += static_cast<int64_t>(kInFlight) * stride) {
    float4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t jj = j + static_cast<int64_t>(u) * stride;
      v[u] = jj < n4 ? __ldg(x4 + jj) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t jj = j + static_cast<int64_t>(u) * stride;
      if (jj >= n4) break;
      const int64_t i = body + 4 * jj;
      fn(i, v[u].x);
      fn(i + 1, v[u].y);
      fn(i + 2, v[u].z);
      fn(i + 3, v[u].w);
    }
  }
  for (int64_t i = body + 4 * n4 + tid; i < end; i += stride) fn(i, x[i]);
}

// The smallest id i whose running metric sum (ids 0..i, metric(i, x[i]) >= 0) reaches
// target_of(total metric); -1 when the target is 0 or above the total. Pass 1: each warp sums a
// contiguous 1/32 of its CTA's slice (coalesced), and the team's warp sums are gathered in id
// order; pass 2: the one warp range holding the target is split into 1024 per-thread slices (a
// few elements each), scanned, and the slice holding it walked; every CTA of the team does pass 2
// alike, so all of them return the same id.
template <class Metric, class TargetOf>
__device__ int64_t first_reaching(const float* x, const Team& team, Metric metric, TargetOf target_of, Shared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t chunk = ((team.slice + kWarps - 1) / kWarps + 3) / 4 * 4;
  auto range_begin = [&](int g) {  // g: rank * kWarps + warp
    const int64_t b = team.slice_begin(g / kWarps) + static_cast<int64_t>(g % kWarps) * chunk;
    return b < team.slice_end(g / kWarps) ? b : team.slice_end(g / kWarps);
  };
  auto range_end = [&](int g) {
    const int64_t e = range_begin(g) + chunk;
    return e < team.slice_end(g / kWarps) ? e : team.slice_end(g / kWarps);
  };
  const int mine_g = team.rank * kWarps + warp;
  unsigned long long s = 0;
  visit(x, range_begin(mine_g), range_end(mine_g), lane, 32, [&](int64_t i, float v) { s += metric(i, v); });
  s = warp_sum(s);
  __syncthreads();
  if (lane == 0) sh.warp_u64[warp] = s;
  if (tid == 0) sh.index = -1;
  team_sync(team);
  const int parts = team.size * kWarps;
  if (tid < parts) sh.team_u64[tid] = *at_rank(&sh.warp_u64[tid % kWarps], tid / kWarps, team);
  team_sync(team);  // every rank's warp sums read before any rank writes them again
  // Warp 0 finds the part holding the target: lane l holds parts [l * size, (l + 1) * size).
  if (warp == 0) {
    unsigned long long mine = 0;
    for (int j = 0; j < team.size; ++j) mine += sh.team_u64[lane * team.size + j];
    const unsigned long long inclusive = warp_inclusive_scan(mine);
    const unsigned long long total = __shfl_sync(0xFFFFFFFFu, inclusive, 31);
    const unsigned long long goal = target_of(total);
    unsigned long long before = inclusive - mine;
    const bool here = goal > 0 && before < goal && goal <= inclusive;
    if (__ballot_sync(0xFFFFFFFFu, here) == 0 && lane == 0) sh.group = -1;
    if (here) {
      int g = lane * team.size;
      while (before + sh.team_u64[g] < goal) before += sh.team_u64[g++];
      sh.group = g;
      sh.base = before;
      sh.goal = goal;
    }
  }
  __syncthreads();
  const int g = sh.group;
  if (g < 0) return -1;  // the same for every thread of the team
  const unsigned long long rest = sh.goal - sh.base;
  const int64_t b = range_begin(g), e = range_end(g);
  const int64_t slice = (e - b + kThreads - 1) / kThreads;
  const int64_t sb = b + tid * slice < e ? b + tid * slice : e;
  const int64_t se = sb + slice < e ? sb + slice : e;
  unsigned long long mine = 0;
  for (int64_t i = sb; i < se; ++i) mine += metric(i, x[i]);
  unsigned long long all;
  const unsigned long long excl = block_exclusive_scan(mine, sh, &all);
  if (mine > 0 && excl < rest && rest <= excl + mine) {
    unsigned long long run = excl;
    for (int64_t i = sb; i < se; ++i) {
      run += metric(i, x[i]);
      if (run >= rest) {
        sh.index = i;
        break;
      }
    }
  }
  __syncthreads();
  return sh.index;
}

// ---- Radix selection of a prefix of the order.

// Bits of the order key each level resolves: 31..21, 20..10, 9..0.
__device__ __forceinline__ int level_shift(int level) { return level == 0 ? 21 : (level == 1 ? 10 : 0); }
__device__ __forceinline__ int level_bins(int level) { return level == 2 ? 1024 : 2048; }

__device__ __forceinline__ unsigned long long bin_metric(const Shared& sh, bool by_weight, int b) {
  return by_weight ? (static_cast<unsigned long long>(sh.mass_hi[b]) << 32) | sh.mass_lo[b] : sh.count[b];
}

// The level's histogram of the keys whose resolved bits equal `prefix` (under `mask`): counts and,
// by_weight, integer weights of the tokens in `within` that weigh more than 0.
__device__ void histogram(const float* x, const Team& team, const Weight& weight, bool by_weight, const Prefix& within,
                          uint32_t mask, uint32_t prefix, int level, Shared& sh) {
  const int shift = level_shift(level);
  const uint32_t digits = static_cast<uint32_t>(level_bins(level) - 1);
  for (int b = threadIdx.x; b < kBins; b += kThreads) sh.count[b] = sh.mass_lo[b] = sh.mass_hi[b] = 0;
  __syncthreads();
  visit(x, team.begin, team.end, threadIdx.x, kThreads, [&](int64_t i, float v) {
    const uint32_t key = order_key(v);
    if ((key & mask) != prefix) return;
    const uint32_t d = (key >> shift) & digits;
    if (by_weight) {
      if (!within.has(key, i)) return;
      const uint32_t q = weight(v);
      if (q == 0) return;
      const uint32_t old = atomicAdd(&sh.mass_lo[d], q);
      if (old + q < old) atomicAdd(&sh.mass_hi[d], 1u);
    }
    atomicAdd(&sh.count[d], 1u);
  });
  __syncthreads();
}

// The bin, scanning from the highest key down, where above + the running metric over the team's
// histograms reaches the target; from_total sets the target from the level's total first
// (ceil(top_p * total), >= 1). No CTA merges whole histograms: the team sums 32 groups of bins
// (each CTA's group sums), and then the bins of the one group that holds the target.
__device__ __noinline__ BinPick pick_bin(const Team& team, bool by_weight, int level, bool from_total, float top_p,
                            unsigned long long* target, unsigned long long above, Shared& sh) {
  const int bins = level_bins(level), per_group = bins / kGroups;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Positions count from the top (position j is bin bins - 1 - j); group g is positions
  // [g * per_group, (g + 1) * per_group). This CTA's sum of group `warp`:
  unsigned long long m = 0;
  for (int j = lane; j < per_group; j += 32) m += bin_metric(sh, by_weight, bins - 1 - (warp * per_group + j));
  m = warp_sum(m);
  if (lane == 0) sh.warp_u64[warp] = m;
  team_sync(team);
  if (warp == 0) {  // the team's group sums; the group where the target is reached
    const unsigned long long g = team_sum(&sh.warp_u64[lane], team);
    const unsigned long long inclusive = warp_inclusive_scan(g);
    unsigned long long goal = *target;
    if (from_total) {
      const double t = ceil(static_cast<double>(top_p) * static_cast<double>(__shfl_sync(0xFFFFFFFFu, inclusive, 31)));
      goal = t < 1.0 ? 1ull : static_cast<unsigned long long>(t);
    }
    const unsigned long long before = above + inclusive - g;
    const bool here = before < goal && goal <= before + g;
    if (lane == 0) sh.goal = goal;
    if (__ballot_sync(0xFFFFFFFFu, here) == 0 && lane == 0) sh.group = -1;  // unreachable: goal <= total
    if (here) {
      sh.group = lane;
      sh.base = before;
    }
  }
  __syncthreads();
  const int group = sh.group;
  *target = sh.goal;
  if (group >= 0) {
    if (tid < per_group) {  // the group's bins over the team
      const int b = bins - 1 - (group * per_group + tid);
      const unsigned long long count = team_sum(&sh.count[b], team);
      sh.group_count[tid] = static_cast<uint32_t>(count);
      sh.group_metric[tid] = by_weight ? (team_sum(&sh.mass_hi[b], team) << 32) + team_sum(&sh.mass_lo[b], team) : count;
    }
    __syncthreads();
    if (warp == 0) {  // the bin: two positions a lane
      const int j0 = 2 * lane, j1 = j0 + 1;
      const unsigned long long m0 = j0 < per_group ? sh.group_metric[j0] : 0;
      const unsigned long long m1 = j1 < per_group ? sh.group_metric[j1] : 0;
      const unsigned long long inclusive = warp_inclusive_scan(m0 + m1);
      const unsigned long long before = sh.base + inclusive - (m0 + m1);
      const unsigned long long goal = sh.goal;
      if (before < goal && goal <= before + m0 + m1) {
        const bool first = before + m0 >= goal;
        const int j = first ? j0 : j1;
        sh.pick = BinPick{bins - 1 - (group * per_group + j), first ? before : before + m0, sh.group_count[j],
                          sh.group_metric[j]};
      }
    }
  } else if (tid == 0) {
    sh.pick.bin = -1;
  }
  team_sync(team);  // every rank done reading this CTA's bins and sums; the pick visible
  return sh.pick;
}

// The shortest prefix of the order whose metric reaches the target: by count (top-k: target
// top_k; level 0's histogram already made by pass A) or by weight within `within` (top-p: target
// ceil(top_p * the weight of `within`)).
__device__ Prefix select_prefix(const float* x, const Team& team, const Weight& weight, bool by_weight, const Prefix& within,
                                float top_p, unsigned long long target, Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  BinPick p{};
  for (int level = 0; level < 3; ++level) {
    if (by_weight || level > 0) histogram(x, team, weight, by_weight, within, mask, prefix, level, sh);
    p = pick_bin(team, by_weight, level, by_weight && level == 0, top_p, &target, above, sh);
    if (p.bin < 0) return within;  // unreachable: the target never exceeds the total
    const int shift = level_shift(level);
    above = p.above;
    prefix |= static_cast<uint32_t>(p.bin) << shift;
    // One token in the bin, or all of its tokens needed: every key from the bin's lowest up is kept.
    if (p.count == 1 || above + p.metric == target) return Prefix{prefix, kAllTies};
    mask |= static_cast<uint32_t>(level_bins(level) - 1) << shift;
  }
  // All 32 bits resolved: p.count tokens share the key `prefix`; keep the first n of them by id.
  const unsigned long long rest = target - above;
  unsigned long long n = rest;
  if (by_weight) {
    const unsigned long long q = weight(key_value(prefix));  // > 0: the bin held only tokens that weigh
    if (q > 0) n = (rest + q - 1) / q;
  }
  const int64_t last = first_reaching(
      x, team,
      [&](int64_t i, float v) -> unsigned long long {
        const uint32_t key = order_key(v);
        return key == prefix && within.has(key, i) ? 1ull : 0ull;
      },
      [&](unsigned long long) { return n; }, sh);
  return Prefix{prefix, last < 0 ? kAllTies : last};
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_rows_each_kernel(const float* logits, int64_t vocab, const RowSamplingParams* params, int32_t* tokens,
                            int team_size, int32_t* unusable, const int32_t* valid_rows) {
  __shared__ Shared sh;
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const Team team(team_size, vocab);
  const int64_t row = blockIdx.x / team_size;
  const float* x = logits + row * vocab;
  const RowSamplingParams p = params[row];
  const bool greedy = !(p.temperature > 0.0f) || p.top_k == 1;
  const bool use_top_k = !greedy && p.top_k > 1 && p.top_k < vocab;
  const bool use_top_p = !greedy && p.top_p < 1.0f;

  // A: the argmax (ties to the lowest id: the id's complement in the low word), and top-k's
  // level-0 histogram.
  if (use_top_k)
    for (int b = threadIdx.x; b < kBins; b += kThreads) sh.count[b] = 0;
  __syncthreads();
  unsigned long long best = 0;
  // The unusable-row test in the same read (flag_unusable_rows' definition): any NaN/Inf, and
  // whether any value differs from the row's first.
  const float first = x[0];
  unsigned long long nonfinite = 0, differs = 0;
  visit(x, team.begin, team.end, threadIdx.x, kThreads, [&](int64_t i, float v) {
    const uint32_t key = order_key(v);
    const unsigned long long packed = (static_cast<unsigned long long>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
    best = packed > best ? packed : best;
    if (use_top_k) atomicAdd(&sh.count[key >> 21], 1u);
    nonfinite |= isfinite(v) ? 0ull : 1ull;
    differs |= v != first ? 1ull : 0ull;
  });
  best = team_max(best, team, sh);
  if (unusable != nullptr) {  // every thread of the team takes part in both reductions
    nonfinite = team_max(nonfinite, team, sh);
    differs = team_max(differs, team, sh);
    const bool counted = valid_rows == nullptr || row < *valid_rows;
    if (counted && team.rank == 0 && threadIdx.x == 0 && (nonfinite != 0 || (differs == 0 && vocab > 1))) *unusable = 1;
  }
  const int32_t argmax = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(best & 0xFFFFFFFFull));
  const uint32_t max_key = static_cast<uint32_t>(best >> 32);
  if (greedy || max_key == 0) {  // greedy, or a row of NaN only (its argmax is id 0)
    if (team.rank == 0 && threadIdx.x == 0) tokens[row] = argmax;
    return;
  }
  const Weight weight{key_value(max_key), 1.4426950408889634f / p.temperature};

  Prefix k_set, p_set;
  if (use_top_k) k_set = select_prefix(x, team, weight, false, Prefix{}, -1.0f, static_cast<unsigned long long>(p.top_k), sh);
  if (use_top_p) p_set = select_prefix(x, team, weight, true, k_set, p.top_p, 0, sh);

  // D: the first kept token, in id order, whose running weight exceeds u * the kept weight:
  // floor(u24 * total / 2^24) + 1 in exact integers.
  const unsigned long long u24 = sampling_uniform24(p.seed, p.draw);
  const int64_t token = first_reaching(
      x, team,
      [&](int64_t i, float v) -> unsigned long long {
        const uint32_t key = order_key(v);
        return k_set.has(key, i) && p_set.has(key, i) ? weight(v) : 0ull;
      },
      [&](unsigned long long total) { return (total >> 24) * u24 + (((total & 0xFFFFFFull) * u24) >> 24) + 1; }, sh);
  if (team.rank == 0 && threadIdx.x == 0) tokens[row] = token < 0 ? argmax : static_cast<int32_t>(token);
}

// The kernel's PTX version on `device` (80 where the compute_80 PTX was JIT-compiled: no
// clusters), asked of the runtime once per device.
Status kernel_ptx_version(int device, int* out) {
  static std::mutex mu;
  static std::map<int, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it == cache.end()) {
    cudaFuncAttributes attr{};
    LLMQ_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attr, sample_rows_each_kernel));
    it = cache.emplace(device, attr.ptxVersion).first;
  }
  *out = it->second;
  return {};
}

}  // namespace

int64_t sample_rows_each_workspace_bytes(int64_t, int64_t) { return 0; }

Status sample_rows_each(const float* logits, int64_t rows, int64_t vocab, const RowSamplingParams* params,
                        int32_t* tokens, void* workspace, int64_t workspace_bytes, CudaStream stream, int32_t* unusable,
                        const int32_t* valid_rows) {
  (void)workspace;
  if (rows < 0 || rows > INT32_MAX) return invalid_argument("sample_rows_each: rows " + std::to_string(rows) + " outside [0, 2^31)");
  if (vocab < 1 || vocab > INT32_MAX)
    return invalid_argument("sample_rows_each: vocab " + std::to_string(vocab) + " outside [1, 2^31)");
  if (workspace_bytes < sample_rows_each_workspace_bytes(rows, vocab))
    return invalid_argument("sample_rows_each: workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                            std::to_string(sample_rows_each_workspace_bytes(rows, vocab)));
  if (rows == 0) return {};
  if (logits == nullptr || params == nullptr || tokens == nullptr)
    return invalid_argument("sample_rows_each: null logits, params or tokens");
  // The team size depends on rows, vocab and the device only (never on data): graph capture sees one
  // launch shape per batch size. The token does not depend on it (exact integer sums).
  cuda::DeviceFacts dev;
  LLMQ_RETURN_IF_ERROR(cuda::current_device_facts(&dev));
  int ptx_version = 0;
  LLMQ_RETURN_IF_ERROR(kernel_ptx_version(dev.ordinal, &ptx_version));
  const bool clusters = dev.major >= 9 && ptx_version >= 90;
  int team = 1;
  while (clusters && team < kMaxTeam && rows * 2 * team <= dev.sms && vocab >= 2 * team * kMinSlice) team *= 2;
  cudaLaunchAttribute attr[2];
  attr[0] = detail::pdl_attribute();  // the kernel waits before it reads the logits or params
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(team);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * team));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = team > 1 ? 2 : 1;  // no cluster attribute: runs on pre-sm_90 GPUs too
  LLMQ_CUDA_RETURN_IF_ERROR(
      cudaLaunchKernelEx(&cfg, sample_rows_each_kernel, logits, vocab, params, tokens, team, unusable, valid_rows));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("sample_rows_each_kernel");
  return {};
}

}  // namespace llmq::runtime
