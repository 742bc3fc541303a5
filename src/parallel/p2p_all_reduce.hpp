// A one-shot all-reduce for the small messages of decode steps (tensor_parallel.hpp): every rank's
// kernel writes its partial sums into its slot of every peer's staging buffer (over NVLink / PCIe
// peer access), tells every peer so through a flag in the peer's memory, waits for theirs, and adds
// the ranks' slots, now in its own memory, in rank order into its output. One kernel, no proxy thread, no protocol: at 16 KB a
// call it costs a few microseconds where NCCL's ring costs about 7.5 (measured on H100s,
// docs/tensor-parallel.md). Ranks add in the same order, so they get the same bits, and the sum is
// accumulated in float and rounded to BF16 once.
//
// Staging buffers are double-buffered by call parity and flags carry the call counter, so a call
// needs one flag exchange and no second barrier: a rank can only start call e + 2 after every peer
// signalled call e + 1, which they do only after finishing call e's reads. (Every call runs the same
// grid, so every block's counter is the call's.) All ranks must call
// it with the same counts in the same order (the runtime's forward pass does). A wait longer than
// 20 s traps (a missing rank), so a broken group fails instead of hanging.
// Larger messages (prefill) go to NCCL. No CUDA headers here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"
#include "cuda/device_memory.hpp"
#include "parallel/peer_sum.hpp"

namespace llmq::parallel {

constexpr int kP2pMaxRanks = 8;
constexpr int kP2pMaxBlocks = 32;

class P2pAllReduce {
 public:
  // Needs peer access between every pair of `devices` (enabled here); unsupported otherwise.
  // max_bytes: the largest message of run(); row_max_bytes: the largest of the norm-fused exchange
  // (row_sum: its rows x hidden size x 2), each staged twice (call parity) per rank on every rank.
  static Status create(const std::vector<int>& devices, int64_t max_bytes, int64_t row_max_bytes,
                       std::unique_ptr<P2pAllReduce>* out);
  ~P2pAllReduce();
  // Whether a call of `count` BF16 values at `data` can run here (size, 16-byte alignment).
  bool takes(const void* data, int64_t count) const;
  // In place: data (rank's device) becomes the sum over ranks. Enqueued on `stream`.
  Status run(int rank, void* data, int64_t count, CudaStream stream) const;
  // The same exchange done inside the next add + RMSNorm (row_kernels.hpp's RowPeerSum), with its
  // own staging, flags and counter (a sequence of its own, so both kinds of call can interleave).
  RowPeerSum row_sum(int rank) const;

 private:
  struct Rank {
    cuda::DeviceAllocation staging;  // bf16 [2 (call parity)][ranks (source)][max elements]
    cuda::DeviceAllocation flags;    // u32 [kP2pMaxRanks peers][kP2pMaxBlocks]: peers write their counters here
    cuda::DeviceAllocation counter;  // u32 [kP2pMaxBlocks]: calls so far, per block
    cuda::DeviceAllocation row_staging, row_flags, row_counter;  // the norm-fused exchange's
  };
  std::vector<int> devices_;
  std::vector<Rank> ranks_;
  int64_t max_elements_ = 0;
  int64_t row_elements_ = 0;
};

}  // namespace llmq::parallel
