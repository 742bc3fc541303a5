// P2pAllReduce (p2p_all_reduce.hpp): the one-shot all-reduce kernel and its buffers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/cuda_check.cuh"
#include "cuda/pdl.cuh"
#include "parallel/p2p_all_reduce.hpp"
#include "parallel/peer_exchange.cuh"

namespace llmq::parallel {
namespace {

constexpr int kThreads = 128;

struct Args {
  uint16_t* data;                             // this rank's partial sums, replaced by the total
  uint16_t* staging[kP2pMaxRanks];            // every rank's staging buffer [2][ranks][slot_elements]
  uint32_t* flags[kP2pMaxRanks];              // every rank's flag array
  uint32_t* counter;                          // this rank's per-block call counters
  int rank;
  int ranks;
  int64_t count;                              // elements, a multiple of 8
  int64_t slot_elements;                      // elements per staging slot
  int64_t chunk;                              // elements per block, a multiple of 8
};

__global__ void __launch_bounds__(kThreads) p2p_all_reduce_kernel(Args a) {
  const int b = blockIdx.x;
  // Launched with PDL: the grid gets onto the SMs while the GEMM before it finishes; nothing it
  // reads or writes is touched before this wait.
  detail::pdl_wait();
  __shared__ uint32_t call_shared;
  if (threadIdx.x == 0) call_shared = a.counter[b] + 1;
  __syncthreads();
  const uint32_t call = call_shared;
  const int64_t begin = b * a.chunk, end = min(a.count, begin + a.chunk);
  // 1. Push this block's chunk of the partial sums into every peer's slot for this rank: stores
  //    over the link are posted, so the only latency on the way is the flag's one way trip.
  for (int64_t i = begin + threadIdx.x * 8; i < end; i += kThreads * 8)
    peer_push(*reinterpret_cast<const uint4*>(a.data + i), a.staging, a.rank, a.ranks, a.slot_elements, call, i);
  // 2. Tell every peer this block's chunk is there, and wait until every peer has said the same.
  peer_handshake(a.flags, a.rank, a.ranks, kP2pMaxBlocks, b, call);
  detail::pdl_launch_dependents();  // the next kernel may launch; it waits for this grid's writes
  // 3. Sum every rank's chunk in rank order (the same bits on every rank) from local memory, round
  //    once.
  for (int64_t i = begin + threadIdx.x * 8; i < end; i += kThreads * 8) {
    float acc[8];
    peer_sum8(*reinterpret_cast<const uint4*>(a.data + i), a.staging[a.rank], a.rank, a.ranks, a.slot_elements, call, i, acc);
    uint4 out;
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
    for (int j = 0; j < 4; ++j) o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    *reinterpret_cast<uint4*>(a.data + i) = out;
  }
  if (threadIdx.x == 0) a.counter[b] = call;
}

}  // namespace

P2pAllReduce::~P2pAllReduce() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    (void)cudaSetDevice(devices_[r]);
    ranks_[r] = Rank();
  }
}

Status P2pAllReduce::create(const std::vector<int>& devices, int64_t max_bytes, int64_t row_max_bytes,
                            std::unique_ptr<P2pAllReduce>* out) {
  const int n = static_cast<int>(devices.size());
  if (n < 2 || n > kP2pMaxRanks) return unsupported("one-shot all-reduce: 2 to 8 ranks");
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      int can = 0;
      LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]));
      if (!can) return unsupported("GPU " + std::to_string(devices[i]) + " cannot access GPU " + std::to_string(devices[j]));
    }
  std::unique_ptr<P2pAllReduce> p(new P2pAllReduce());
  p->devices_ = devices;
  p->max_elements_ = max_bytes / 2 / 8 * 8;
  p->row_elements_ = row_max_bytes / 2 / 8 * 8;
  p->ranks_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[i]));
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else LLMQ_RETURN_IF_ERROR(detail::cuda_status(e, "cudaDeviceEnablePeerAccess"));
    }
    Rank& r = p->ranks_[static_cast<size_t>(i)];
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(2 * n * p->max_elements_ * 2, "all-reduce staging", &r.staging));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kP2pMaxRanks * kP2pMaxBlocks * 4, "all-reduce flags", &r.flags));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kP2pMaxBlocks * 4, "all-reduce counters", &r.counter));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(2 * n * p->row_elements_ * 2, "fused all-reduce staging",
                                                             &r.row_staging));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(kP2pMaxRanks * kRowPeerMaxRows * 4, "fused all-reduce flags",
                                                             &r.row_flags));
    LLMQ_RETURN_IF_ERROR(cuda::DeviceAllocation::allocate(2 * 4, "fused all-reduce counter", &r.row_counter));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(r.row_flags.get(), 0, static_cast<size_t>(r.row_flags.bytes())));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(r.row_counter.get(), 0, static_cast<size_t>(r.row_counter.bytes())));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(r.flags.get(), 0, static_cast<size_t>(r.flags.bytes())));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaMemset(r.counter.get(), 0, static_cast<size_t>(r.counter.bytes())));
  }
  for (int i = 0; i < n; ++i) {
    LLMQ_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[i]));
    LLMQ_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  *out = std::move(p);
  return {};
}

RowPeerSum P2pAllReduce::row_sum(int rank) const {
  RowPeerSum p;
  p.ranks = static_cast<int>(ranks_.size());
  p.rank = rank;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    p.staging[r] = ranks_[r].row_staging.as<uint16_t>();
    p.flags[r] = ranks_[r].row_flags.as<uint32_t>();
  }
  p.counter = ranks_[static_cast<size_t>(rank)].row_counter.as<uint32_t>();
  p.slot_elements = row_elements_;
  return p;
}

bool P2pAllReduce::takes(const void* data, int64_t count) const {
  return count > 0 && count <= max_elements_ && count % 8 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0;
}

Status P2pAllReduce::run(int rank, void* data, int64_t count, CudaStream stream) const {
  if (!takes(data, count)) return invalid_argument("one-shot all-reduce: " + std::to_string(count) + " elements do not fit");
  Args a;
  std::memset(&a, 0, sizeof a);
  a.data = static_cast<uint16_t*>(data);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    a.staging[r] = ranks_[r].staging.as<uint16_t>();
    a.flags[r] = ranks_[r].flags.as<uint32_t>();
  }
  a.counter = ranks_[static_cast<size_t>(rank)].counter.as<uint32_t>();
  a.rank = rank;
  a.ranks = static_cast<int>(ranks_.size());
  a.count = count;
  a.slot_elements = max_elements_;
  // Every call runs all kP2pMaxBlocks blocks (those past the data only exchange flags), so that
  // every block's call counter is the call's: the double-buffering argument (a rank starts call
  // e + 2 only after every peer has finished call e) needs one parity per call.
  const int64_t blocks = kP2pMaxBlocks;
  a.chunk = (count + blocks * 8 - 1) / (blocks * 8) * 8;
  LLMQ_CUDA_RETURN_IF_ERROR(detail::launch_pdl(p2p_all_reduce_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                                stream, a));
  LLMQ_CUDA_RETURN_IF_LAUNCH_ERROR("p2p_all_reduce_kernel");
  return {};
}

}  // namespace llmq::parallel
