// The quantize kernels: per element v = x * (1 / s) with __fmul_rn (after the optional
// SmoothQuant division x / d), then the encoders of quantize_numerics.cuh. Memory-bound, so every
// fast path moves 16-element packs (16-byte loads, one 16-byte store of codes), keeps 128 bytes of
// loads per thread in flight before the first use, and runs a persistent grid of SM count x
// residency CTAs. Index math is 64-bit where it addresses memory; pack and tile counts are 32-bit
// (the host checks they fit).
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/quantize_kernels.cuh"

namespace llmq::quant_kernels {
namespace {

constexpr int kThreads = 256;  // every family except CTA-team tiles

// Minimum resident CTAs the tiles kernels are compiled for. Up to 256 threads with the cheap
// encoders (hardware FP8 cvt, INT8 RNE): 3, i.e. at most 80 registers, so 24 warps per SM keep
// their packs in flight (2 CTAs of 256 threads at the 86+ registers the compiler picks unbounded
// left the 128 x 128 case well short of the copy rate). The integer-path and stochastic encoders
// need more registers (Philox) and are compute-bound: 2.
constexpr int tiles_min_blocks(Encoder e, int max_threads) {
  if (max_threads > 256) return 1;
  return e == Encoder::kE4M3Hw || e == Encoder::kE5M2Hw || e == Encoder::kInt8 ? 3 : 2;
}

// ---------------------------------------------------------------------------------------------
// Tiles: dynamic scales, x read once. A team (kCtaTeam: the whole CTA; otherwise `team_lanes`
// consecutive lanes, several teams per warp) owns one scale block at a time: it loads the block's
// packs into registers (pack i of the block goes to lane i % lanes, slot i / lanes, so each slot's
// loads are contiguous across the team), reduces the absmax across the team, computes the scale
// exactly as the CPU does, and quantizes from the registers.
//
// kMaxThreads is the launch bound: 256 for sub-warp teams and for CTA teams of up to 256 threads
// (both built for 3 resident CTAs, see tiles_min_blocks); CTA teams of up to 512 threads get up to
// 128 registers, and only blocks that need more threads (rows beyond 32768 BF16 or 16384 F32
// elements; half that for the stochastic encoders, which keep half the packs per thread) run the
// 1024-thread instance, whose 64-register cap costs spills.
template <InType T, Encoder E, bool kCtaTeam, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads, tiles_min_blocks(E, kMaxThreads)) quantize_tiles_kernel(const TileArgs a) {
  using Tr = InTraits<T>;
  constexpr int kSlots = slots_for(T, E);
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  __shared__ float warp_maxima[2][32];
  const CommonArgs& c = a.c;
  const int lanes = kCtaTeam ? static_cast<int>(blockDim.x) : a.team_lanes;
  const int lane = kCtaTeam ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) & (lanes - 1);
  const uint32_t teams_per_cta = kCtaTeam ? 1u : blockDim.x / static_cast<uint32_t>(lanes);
  const uint32_t team = kCtaTeam ? 0u : threadIdx.x / static_cast<uint32_t>(lanes);
  uint32_t clips = 0;
  const bool count = c.clip_count != nullptr;
  int parity = 0;
  // The loop bound depends only on the CTA, so whole warps (and the CTA) iterate together, as the
  // shuffles and barriers below need; a team past the last tile idles with no packs.
  for (uint64_t first = static_cast<uint64_t>(blockIdx.x) * teams_per_cta; first < a.num_tiles;
       first += static_cast<uint64_t>(gridDim.x) * teams_per_cta) {
    const bool active = first + team < a.num_tiles;
    const uint32_t tile = active ? static_cast<uint32_t>(first + team) : 0u;
    const uint32_t tile_row = a.scale_cols_div.div(tile);
    const uint32_t tile_col = tile - tile_row * static_cast<uint32_t>(c.scale_cols);
    const int64_t r0 = static_cast<int64_t>(tile_row) * c.block_rows;
    const int64_t c0 = static_cast<int64_t>(tile_col) * c.block_cols;
    // Edge blocks are partial; their widths stay multiples of 16 (cols % 16 == 0 on this path).
    const int nr = active ? static_cast<int>(min(c.block_rows, c.rows - r0)) : 0;
    const int packs_per_row = static_cast<int>(min(c.block_cols, c.cols - c0) / kPackElems);
    const int npacks = nr * packs_per_row;

    uint32_t w[kSlots][Tr::kWords];
    uint32_t where[kSlots];  // (row in block << 16) | pack in row, or kNone; blocks have < 2^16 packs
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * lanes + lane;
      where[s] = kNone;
      if (s < a.slots && i < npacks) {
        const int dr = nr == 1 ? 0 : i / packs_per_row;
        const int dc = i - dr * packs_per_row;
        where[s] = (static_cast<uint32_t>(dr) << 16) | static_cast<uint32_t>(dc);
        load_pack<T>(c.x, (r0 + dr) * c.x_stride + c0 + dc * kPackElems, w[s]);
      }
    }

    float m = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (where[s] == kNone) continue;
      float v[16];
      unpack<T>(w[s], v);
      if (c.smooth != nullptr) smooth_pack(c.smooth, c0 + (where[s] & 0xFFFFu) * kPackElems, v);
      m = pack_absmax(v, m);
    }
    if constexpr (kCtaTeam) {
      m = cta_max(m, warp_maxima[parity]);
      parity ^= 1;
    } else {
      for (int o = lanes >> 1; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    }
    const float scale = scale_from_absmax(m, c.scale);
    const float inverse = __fdiv_rn(1.0f, scale);
    if (active && lane == 0) c.scales[tile] = scale;  // tile == tile_row * scale_cols + tile_col

#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (where[s] == kNone) continue;
      const int64_t col = c0 + (where[s] & 0xFFFFu) * kPackElems;
      const int64_t flat = (r0 + (where[s] >> 16)) * c.cols + col;
      float v[16];
      unpack<T>(w[s], v);
      if (c.smooth != nullptr) smooth_pack(c.smooth, col, v);
      scale_pack(v, inverse);
      *reinterpret_cast<uint4*>(c.q + flat) = encode_pack<E>(v, c.enc, static_cast<uint64_t>(flat), count, clips);
    }
  }
  flush_clips(clips, c.clip_count);
}

// ---------------------------------------------------------------------------------------------
// Generic tiles: any block shape, alignment or size. One CTA per scale block, two passes over the
// block (the second reads it back from L1/L2), scalar loads. The fallback for odd shapes.
template <InType T, Encoder E>
__global__ void __launch_bounds__(kThreads) quantize_generic_tiles_kernel(const TileArgs a) {
  __shared__ float warp_maxima[2][32];
  const CommonArgs& c = a.c;
  uint32_t clips = 0;
  int parity = 0;
  for (uint32_t tile = blockIdx.x; tile < a.num_tiles; tile += gridDim.x) {
    const uint32_t tile_row = a.scale_cols_div.div(tile);
    const uint32_t tile_col = tile - tile_row * static_cast<uint32_t>(c.scale_cols);
    const int64_t r0 = static_cast<int64_t>(tile_row) * c.block_rows;
    const int64_t c0 = static_cast<int64_t>(tile_col) * c.block_cols;
    const int64_t nr = max(int64_t{0}, min(c.block_rows, c.rows - r0));
    const uint32_t nc = static_cast<uint32_t>(max(int64_t{0}, min(c.block_cols, c.cols - c0)));
    const uint32_t n = static_cast<uint32_t>(nr * nc);  // < 2^32, checked on the host

    float m = 0.0f;
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t dr = j / nc, dc = j - dr * nc;
      float v = load_scalar<T>(c.x, (r0 + dr) * c.x_stride + c0 + dc);
      if (c.smooth != nullptr) v = __fdiv_rn(v, c.smooth[c0 + dc]);
      m = fmaxf(m, fabsf(v));
    }
    m = cta_max(m, warp_maxima[parity]);
    parity ^= 1;
    const float scale = scale_from_absmax(m, c.scale);
    const float inverse = __fdiv_rn(1.0f, scale);
    if (threadIdx.x == 0) c.scales[tile] = scale;

    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t dr = j / nc, dc = j - dr * nc;
      float v = load_scalar<T>(c.x, (r0 + dr) * c.x_stride + c0 + dc);
      if (c.smooth != nullptr) v = __fdiv_rn(v, c.smooth[c0 + dc]);
      const int64_t flat = (r0 + dr) * c.cols + c0 + dc;
      c.q[flat] = static_cast<uint8_t>(encode_one<E>(__fmul_rn(v, inverse), c.enc, static_cast<uint64_t>(flat), clips));
    }
  }
  flush_clips(clips, c.clip_count);
}

// ---------------------------------------------------------------------------------------------
// Elementwise: the scale of every element is known before the kernel starts (or, for kPartials,
// from a few hundred partial maxima every CTA reduces first). Returns 1 / s for the sources with
// one scale; kBlocks looks its scale up per pack (or element).
__device__ __forceinline__ float tensor_inverse(const ElementwiseArgs& a, float* warp_slots) {
  const CommonArgs& c = a.c;
  switch (a.source) {
    case ScaleSource::kTensor:
      return __fdiv_rn(1.0f, __ldg(c.scales));
    case ScaleSource::kUnit: {
      const int64_t count = c.scale_rows * c.scale_cols;
      for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
           i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        c.scales[i] = 1.0f;
      return 1.0f;
    }
    case ScaleSource::kPartials: {
      // The partials were written by the previous kernel on this stream: plain loads.
      float m = 0.0f;
      for (int i = threadIdx.x; i < a.num_partials; i += blockDim.x) m = fmaxf(m, a.partials[i]);
      m = cta_max(m, warp_slots);
      const float scale = scale_from_absmax(m, c.scale);
      if (blockIdx.x == 0 && threadIdx.x == 0) c.scales[0] = scale;
      return __fdiv_rn(1.0f, scale);
    }
    case ScaleSource::kBlocks:
      break;
  }
  return 0.0f;
}

template <InType T, Encoder E>
__global__ void __launch_bounds__(kThreads) quantize_elementwise_packs_kernel(const ElementwiseArgs a) {
  using Tr = InTraits<T>;
  constexpr int kUnroll = slots_for(T, E);
  __shared__ float warp_slots[32];
  const CommonArgs& c = a.c;
  const float tensor_inv = tensor_inverse(a, warp_slots);
  uint32_t clips = 0;
  const bool count = c.clip_count != nullptr;
  // Pass 2 of dynamic per-tensor scales walks the packs backwards: the reduce pass read them
  // forwards, so the tail of x is still in L2 when this pass starts there.
  const bool backwards = a.source == ScaleSource::kPartials;
  const uint32_t last = a.total_packs - 1u;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x * kUnroll;
  for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
       base < a.total_packs; base += step) {
    uint32_t w[kUnroll][Tr::kWords];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * blockDim.x;
      if (i < a.total_packs) {
        const uint32_t p = backwards ? last - static_cast<uint32_t>(i) : static_cast<uint32_t>(i);
        int64_t offset = static_cast<int64_t>(p) * kPackElems;
        if (a.need_row_col) {
          const uint32_t r = a.packs_per_row.div(p);
          const uint32_t pc = p - r * a.packs_per_row.d;
          offset = static_cast<int64_t>(r) * c.x_stride + static_cast<int64_t>(pc) * kPackElems;
        }
        load_pack<T>(c.x, offset, w[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + static_cast<uint64_t>(u) * blockDim.x;
      if (i >= a.total_packs) break;  // later packs are further out
      const uint32_t p = backwards ? last - static_cast<uint32_t>(i) : static_cast<uint32_t>(i);
      float v[16];
      unpack<T>(w[u], v);
      float inverse = tensor_inv;
      if (a.need_row_col) {
        const uint32_t r = a.packs_per_row.div(p);
        const uint32_t col = (p - r * a.packs_per_row.d) * kPackElems;
        if (c.smooth != nullptr) smooth_pack(c.smooth, col, v);
        if (a.source == ScaleSource::kBlocks) {
          // Block widths are multiples of 16 (or span all columns) here: one scale per pack.
          const int64_t si = static_cast<int64_t>(a.block_rows_div.div(r)) * c.scale_cols + a.block_cols_div.div(col);
          inverse = __fdiv_rn(1.0f, __ldg(c.scales + si));
        }
      }
      scale_pack(v, inverse);
      const int64_t flat = static_cast<int64_t>(p) * kPackElems;  // q is contiguous
      *reinterpret_cast<uint4*>(c.q + flat) = encode_pack<E>(v, c.enc, static_cast<uint64_t>(flat), count, clips);
    }
  }
  flush_clips(clips, c.clip_count);
}

// Scalar elementwise: any alignment. 2-D grid: y walks rows, x walks columns.
template <InType T, Encoder E>
__global__ void __launch_bounds__(kThreads) quantize_elementwise_scalar_kernel(const ElementwiseArgs a) {
  __shared__ float warp_slots[32];
  const CommonArgs& c = a.c;
  const float tensor_inv = tensor_inverse(a, warp_slots);
  uint32_t clips = 0;
  for (int64_t r = blockIdx.y; r < c.rows; r += gridDim.y) {
    for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c.cols;
         col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float v = load_scalar<T>(c.x, r * c.x_stride + col);
      if (c.smooth != nullptr) v = __fdiv_rn(v, c.smooth[col]);
      float inverse = tensor_inv;
      if (a.source == ScaleSource::kBlocks)
        inverse = __fdiv_rn(1.0f, __ldg(c.scales + (r / c.block_rows) * c.scale_cols + col / c.block_cols));
      const int64_t flat = r * c.cols + col;
      c.q[flat] = static_cast<uint8_t>(encode_one<E>(__fmul_rn(v, inverse), c.enc, static_cast<uint64_t>(flat), clips));
    }
  }
  flush_clips(clips, c.clip_count);
}

// ---------------------------------------------------------------------------------------------
// Reduce: pass 1 of dynamic per-tensor scales. Each CTA writes the absmax of its share (NaN
// ignored, Inf kept) to partials[cta]; no atomics, so no zeroed workspace and no memset launch.
template <InType T>
__global__ void __launch_bounds__(kThreads) absmax_partials_packs_kernel(const ReduceArgs a) {
  using Tr = InTraits<T>;
  constexpr int kUnroll = Tr::kSlots;
  __shared__ float warp_slots[32];
  const CommonArgs& c = a.c;
  float m = 0.0f;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x * kUnroll;
  for (uint64_t base = static_cast<uint64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
       base < a.total_packs; base += step) {
    uint32_t w[kUnroll][Tr::kWords];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t p = base + static_cast<uint64_t>(u) * blockDim.x;
      if (p < a.total_packs) {
        int64_t offset = static_cast<int64_t>(p) * kPackElems;
        if (a.need_row_col) {
          const uint32_t r = a.packs_per_row.div(static_cast<uint32_t>(p));
          offset = static_cast<int64_t>(r) * c.x_stride +
                   static_cast<int64_t>(static_cast<uint32_t>(p) - r * a.packs_per_row.d) * kPackElems;
        }
        load_pack<T>(c.x, offset, w[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint64_t p = base + static_cast<uint64_t>(u) * blockDim.x;
      if (p < a.total_packs) {
        float v[16];
        unpack<T>(w[u], v);
        if (c.smooth != nullptr) {
          const uint32_t r = a.packs_per_row.div(static_cast<uint32_t>(p));
          smooth_pack(c.smooth, static_cast<int64_t>(static_cast<uint32_t>(p) - r * a.packs_per_row.d) * kPackElems, v);
        }
        m = pack_absmax(v, m);
      }
    }
  }
  m = cta_max(m, warp_slots);
  if (threadIdx.x == 0) a.partials[blockIdx.x] = m;
}

template <InType T>
__global__ void __launch_bounds__(kThreads) absmax_partials_scalar_kernel(const ReduceArgs a) {
  __shared__ float warp_slots[32];
  const CommonArgs& c = a.c;
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < c.rows; r += gridDim.y)
    for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c.cols;
         col += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float v = load_scalar<T>(c.x, r * c.x_stride + col);
      if (c.smooth != nullptr) v = __fdiv_rn(v, c.smooth[col]);
      m = fmaxf(m, fabsf(v));
    }
  m = cta_max(m, warp_slots);
  if (threadIdx.x == 0) a.partials[blockIdx.y * gridDim.x + blockIdx.x] = m;
}

// ---------------------------------------------------------------------------------------------
// Run-time -> compile-time dispatch.

template <typename F>
Status with_in_type(InType t, F&& f) {
  switch (t) {
    case InType::kF32: return f(std::integral_constant<InType, InType::kF32>{});
    case InType::kBF16: return f(std::integral_constant<InType, InType::kBF16>{});
    case InType::kF16: return f(std::integral_constant<InType, InType::kF16>{});
  }
  return {StatusCode::kInternal, "quantize: unknown input type"};
}

template <typename F>
Status with_encoder(Encoder e, F&& f) {
  switch (e) {
    case Encoder::kE4M3Hw: return f(std::integral_constant<Encoder, Encoder::kE4M3Hw>{});
    case Encoder::kE5M2Hw: return f(std::integral_constant<Encoder, Encoder::kE5M2Hw>{});
    case Encoder::kSoftFp8: return f(std::integral_constant<Encoder, Encoder::kSoftFp8>{});
    case Encoder::kInt8: return f(std::integral_constant<Encoder, Encoder::kInt8>{});
    case Encoder::kE4M3HwSr: return f(std::integral_constant<Encoder, Encoder::kE4M3HwSr>{});
    case Encoder::kE5M2HwSr: return f(std::integral_constant<Encoder, Encoder::kE5M2HwSr>{});
    case Encoder::kSoftFp8Sr: return f(std::integral_constant<Encoder, Encoder::kSoftFp8Sr>{});
    case Encoder::kInt8Sr: return f(std::integral_constant<Encoder, Encoder::kInt8Sr>{});
  }
  return {StatusCode::kInternal, "quantize: unknown encoder"};
}

// Persistent grid: no more CTAs than can be resident at once.
Status persistent_grid(const void* kernel, int threads, uint64_t wanted, int device, int sms, unsigned* grid) {
  int per_sm = 0;
  LLMQ_RETURN_IF_ERROR(resident_ctas_per_sm(kernel, threads, device, &per_sm));
  const uint64_t cap = static_cast<uint64_t>(sms > 0 ? sms : 1) * static_cast<uint64_t>(per_sm > 0 ? per_sm : 1);
  *grid = static_cast<unsigned>(wanted < cap ? (wanted > 0 ? wanted : 1) : cap);
  return {};
}

}  // namespace

// Occupancy per (device, kernel, threads): a thread-local list in front of a shared map, so the
// usual call is a short scan with no lock and no CUDA call.
Status resident_ctas_per_sm(const void* kernel, int threads, int device, int* out) {
  struct Entry {
    int device;
    const void* kernel;
    int threads;
    int value;
  };
  thread_local std::vector<Entry> local;
  for (const Entry& e : local)
    if (e.kernel == kernel && e.threads == threads && e.device == device) {
      *out = e.value;
      return {};
    }
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, int> cache;
  const auto key = std::make_tuple(device, kernel, threads);
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) {
      n = it->second;
    } else {
      LLMQ_CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
      if (n < 1)
        return {StatusCode::kInternal, "quantize: a kernel cannot be resident with " + std::to_string(threads) + " threads"};
      cache.emplace(key, n);
    }
  }
  local.push_back(Entry{device, kernel, threads, n});
  *out = n;
  return {};
}

Status launch_tiles(const TileArgs& args, InType in, Encoder enc, bool cta_team, int threads,
                    uint64_t wanted_ctas, int device, int sms, cudaStream_t stream) {
  return with_in_type(in, [&](auto in_c) {
    return with_encoder(enc, [&](auto enc_c) -> Status {
      constexpr InType T = decltype(in_c)::value;
      constexpr Encoder E = decltype(enc_c)::value;
      void (*kernel)(TileArgs) = !cta_team       ? quantize_tiles_kernel<T, E, false, kThreads>
                                 : threads <= 256 ? quantize_tiles_kernel<T, E, true, 256>
                                 : threads <= 512 ? quantize_tiles_kernel<T, E, true, 512>
                                                  : quantize_tiles_kernel<T, E, true, 1024>;
      unsigned grid = 0;
      LLMQ_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(kernel), threads, wanted_ctas, device, sms, &grid));
      kernel<<<grid, threads, 0, stream>>>(args);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("quantize_tiles_kernel");
      return {};
    });
  });
}

Status launch_generic_tiles(const TileArgs& args, InType in, Encoder enc, int device, int sms, cudaStream_t stream) {
  return with_in_type(in, [&](auto in_c) {
    return with_encoder(enc, [&](auto enc_c) -> Status {
      constexpr InType T = decltype(in_c)::value;
      constexpr Encoder E = decltype(enc_c)::value;
      void (*kernel)(TileArgs) = quantize_generic_tiles_kernel<T, E>;
      unsigned grid = 0;
      LLMQ_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(kernel), kThreads, args.num_tiles, device, sms, &grid));
      kernel<<<grid, kThreads, 0, stream>>>(args);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("quantize_generic_tiles_kernel");
      return {};
    });
  });
}

Status launch_elementwise(const ElementwiseArgs& args, InType in, Encoder enc, bool packs, int device, int sms,
                          cudaStream_t stream) {
  return with_in_type(in, [&](auto in_c) {
    return with_encoder(enc, [&](auto enc_c) -> Status {
      constexpr InType T = decltype(in_c)::value;
      constexpr Encoder E = decltype(enc_c)::value;
      if (packs) {
        void (*kernel)(ElementwiseArgs) = quantize_elementwise_packs_kernel<T, E>;
        const uint64_t per_cta = static_cast<uint64_t>(kThreads) * slots_for(T, E);
        unsigned grid = 0;
        LLMQ_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(kernel), kThreads,
                                             (args.total_packs + per_cta - 1) / per_cta, device, sms, &grid));
        kernel<<<grid, kThreads, 0, stream>>>(args);
        LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("quantize_elementwise_packs_kernel");
        return {};
      }
      void (*kernel)(ElementwiseArgs) = quantize_elementwise_scalar_kernel<T, E>;
      int per_sm = 0;
      LLMQ_RETURN_IF_ERROR(resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), kThreads, device, &per_sm));
      const int64_t cap = static_cast<int64_t>(sms) * per_sm;
      const int64_t gx = std::min<int64_t>(std::max<int64_t>((args.c.cols + kThreads - 1) / kThreads, 1), cap);
      const int64_t gy = std::min<int64_t>({std::max<int64_t>(args.c.rows, 1), std::max<int64_t>(cap / gx, 1), 65535});
      kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, 0, stream>>>(args);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("quantize_elementwise_scalar_kernel");
      return {};
    });
  });
}

Status launch_reduce(const ReduceArgs& args, InType in, bool packs, int device, int sms, int max_partials,
                     cudaStream_t stream, int* num_partials) {
  return with_in_type(in, [&](auto in_c) -> Status {
    constexpr InType T = decltype(in_c)::value;
    if (packs) {
      void (*kernel)(ReduceArgs) = absmax_partials_packs_kernel<T>;
      const uint64_t per_cta = static_cast<uint64_t>(kThreads) * InTraits<T>::kSlots;
      unsigned grid = 0;
      LLMQ_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(kernel), kThreads,
                                           (args.total_packs + per_cta - 1) / per_cta, device, sms, &grid));
      grid = std::min(grid, static_cast<unsigned>(max_partials));
      kernel<<<grid, kThreads, 0, stream>>>(args);
      LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("absmax_partials_packs_kernel");
      *num_partials = static_cast<int>(grid);
      return {};
    }
    void (*kernel)(ReduceArgs) = absmax_partials_scalar_kernel<T>;
    int per_sm = 0;
    LLMQ_RETURN_IF_ERROR(resident_ctas_per_sm(reinterpret_cast<const void*>(kernel), kThreads, device, &per_sm));
    const int64_t cap = std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, max_partials);
    const int64_t gx = std::min<int64_t>(std::max<int64_t>((args.c.cols + kThreads - 1) / kThreads, 1), cap);
    const int64_t gy = std::min<int64_t>(std::max<int64_t>(args.c.rows, 1), std::max<int64_t>(cap / gx, 1));
    kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kThreads, 0, stream>>>(args);
    LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("absmax_partials_scalar_kernel");
    *num_partials = static_cast<int>(gx * gy);
    return {};
  });
}

}  // namespace llmq::quant_kernels
