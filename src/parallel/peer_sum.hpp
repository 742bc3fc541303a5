// The handles a kernel needs to sum a row over the ranks of a tensor-parallel group in place of an
// all-reduce launch: every rank's staging buffer and flags (peer memory) and this rank's call
// counter. The one-shot all-reduce (p2p_all_reduce.hpp) owns the memory and hands these out; the
// runtime's add + RMSNorm kernel (runtime/row_kernels.hpp, kAddRmsNorm) consumes them through the
// device helpers of peer_exchange.cuh. Plain data, no CUDA headers.
#pragma once

#include <cstdint>

namespace llmq::parallel {

constexpr int kRowPeerMaxRanks = 8;
// A decode step's rows (the serving engine's batches reach 1024). A call's CTAs need not be resident
// together: a row waits only for the same row on the peers, which every GPU reaches in grid order.
constexpr int64_t kRowPeerMaxRows = 1024;

struct RowPeerSum {
  int ranks = 0;  // 0 or 1: no exchange
  int rank = 0;
  uint16_t* staging[kRowPeerMaxRanks] = {};  // every rank's: bf16 [2 (call parity)][ranks (source)][slot_elements]
  uint32_t* flags[kRowPeerMaxRanks] = {};    // every rank's: [ranks (source)][kRowPeerMaxRows]
  uint32_t* counter = nullptr;               // this rank's: {calls so far, CTAs done with the current call}
  int64_t slot_elements = 0;
};

}  // namespace llmq::parallel
