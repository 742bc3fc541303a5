// The communication of tensor parallelism (tensor_parallel.hpp has the split): a group of GPUs of
// this process that add up BF16 partial sums and gather float rows, through NCCL and, for
// decode-sized messages, a one-shot kernel over peer access. The runtime calls it; it knows
// nothing of models. No CUDA headers here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llmq/cuda_stream.hpp"
#include "llmq/status.hpp"

namespace llmq {

namespace parallel {
class P2pAllReduce;
}

// How a group's communication is set up (the CLI's --nccl-library and --allreduce).
struct TensorParallelGroupOptions {
  // libnccl to open before the loader's search path and the CUDA toolkit's lib directories; empty:
  // those alone. NCCL is opened once per process: a later group asking for another file is refused.
  std::string nccl_library;
  // Decode-sized all-reduces (<= 512 KB) through the one-shot peer exchange where every pair of
  // GPUs has peer access; false: NCCL for every message.
  bool one_shot_all_reduce = true;
};

// NCCL communicators over devices of this process (ncclCommInitAll), one per rank, and for
// decode-sized all-reduces a one-shot kernel over peer access (p2p_all_reduce.hpp). NCCL is loaded
// at run time, so llmq's binaries start on machines without it. NVLink multicast (NVLS) can take a
// shared host's GPUs out of service; NCCL reads that switch only from its environment
// (NCCL_NVLS_ENABLE), which a library must not write: the llmq CLI sets NCCL_NVLS_ENABLE=0 at
// start, and programs that make groups should do the same before the first one.
class TensorParallelGroup {
 public:
  static Status create(const std::vector<int>& devices, std::unique_ptr<TensorParallelGroup>* out,
                       const TensorParallelGroupOptions& options = {});
  ~TensorParallelGroup();
  TensorParallelGroup(const TensorParallelGroup&) = delete;
  TensorParallelGroup& operator=(const TensorParallelGroup&) = delete;

  int size() const;
  int device(int rank) const;
  std::string describe() const;  // "NCCL 2.28.9 over devices 0,1"
  // Whether decode-sized all-reduces take the one-shot peer exchange (else all go to NCCL).
  bool one_shot() const;
  // Sum over the group of `count` BF16 values at `data` (rank `rank`'s device), in place, enqueued
  // on `stream`; every rank must call it with the same count, each from its own thread.
  Status all_reduce_bf16(int rank, void* data, int64_t count, CudaStream stream) const;
  // recv [size][count] float32 gets every rank's `count` values (send may be recv + rank * count).
  Status all_gather_f32(int rank, const void* send, void* recv, int64_t count, CudaStream stream) const;

  struct Impl;

 private:
  friend const parallel::P2pAllReduce* one_shot_all_reduce(const TensorParallelGroup& group);
  TensorParallelGroup();
  std::unique_ptr<Impl> impl_;
};

// The group's one-shot all-reduce (src/parallel/p2p_all_reduce.hpp), or null: for the runtime,
// which folds it into its norms.
const parallel::P2pAllReduce* one_shot_all_reduce(const TensorParallelGroup& group);

}  // namespace llmq
