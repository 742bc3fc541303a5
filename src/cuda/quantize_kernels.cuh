// Host entry points of the quantize kernels (src/cuda/quantize_kernels.cu), one per kernel family,
// each taking the element types at run time and launching the matching template instance. The
// planning (which family, how many threads) lives in cuda_quantize.cu.
//
// Families:
//  * tiles: dynamic scales, one team of threads per scale block with the block in registers, so x
//    is read once (per-token, per-channel, per-group, 1 x 128, 128 x 128, small per-tensor).
//  * elementwise: known scales (static, unit, or the per-tensor absmax of the reduce pass).
//  * reduce: per-CTA partial absmax for dynamic per-tensor scales (pass 1 of 2).
//  * generic tiles: any block shape or alignment, one CTA per block, two passes over the block.
// Internal header; CUDA sources only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize_common.cuh"
#include "llmq/quant_spec.hpp"
#include "llmq/status.hpp"

namespace llmq::quant_kernels {

// The constants the element encoders and the scale computation read, derived from the spec and
// from the CPU reference itself (defined in cuda_quantize.cu; the tests check the device
// numerics with exactly these).
EncodeParams encode_params(const QuantSpec& spec);
ScaleParams scale_params(const QuantSpec& spec);

// Resident CTAs per SM of a kernel at a block size on a device (cached per device, kernel and size).
Status resident_ctas_per_sm(const void* kernel, int threads, int device, int* out);

// `device` and `sms` are the current device and its SM count; the persistent grid is capped at
// SM count x residency; the launchers pick the grid.
Status launch_tiles(const TileArgs& args, InType in, Encoder enc, bool cta_team, int threads,
                    uint64_t wanted_ctas, int device, int sms, cudaStream_t stream);
Status launch_generic_tiles(const TileArgs& args, InType in, Encoder enc, int device, int sms, cudaStream_t stream);
Status launch_elementwise(const ElementwiseArgs& args, InType in, Encoder enc, bool packs, int device, int sms,
                          cudaStream_t stream);
// Writes one partial absmax per CTA to args.partials (at most max_partials) and returns how many.
Status launch_reduce(const ReduceArgs& args, InType in, bool packs, int device, int sms, int max_partials,
                     cudaStream_t stream, int* num_partials);

}  // namespace llmq::quant_kernels
