// TensorParallelGroup (tensor_parallel.hpp): NCCL communicators over devices of this process.
// NCCL is opened with dlopen, not linked: llmq's binaries then start (and run on one GPU) where no
// libnccl.so.2 is installed, and only --tp > 1 needs it. nccl.h gives the types and signatures.
//
// nvcc (13.0) reports `status = call();` as discarding a [[nodiscard]] value: the value it means is
// the reference operator= returns, not the call's Status, which is kept and checked.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device_facts.cuh"
#include "llmq/tensor_parallel_group.hpp"
#include "parallel/p2p_all_reduce.hpp"

#if LLMQ_HAVE_NCCL_H
#include <nccl.h>
#endif

namespace llmq {

#if LLMQ_HAVE_NCCL_H
namespace {

// The NCCL entry points llmq uses, resolved once per process.
struct NcclLibrary {
  void* handle = nullptr;
  std::string path;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

// Opens NCCL once per process: `preferred` (when not empty) first, then the usual places. A later
// call that prefers another file than the one open is refused rather than silently ignored.
Status open_nccl(const std::string& preferred, const NcclLibrary** out) {
  static NcclLibrary lib;
  static Status status;
  static std::string first_preferred;
  static bool opened = false;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (opened) {
    if (!preferred.empty() && preferred != first_preferred && preferred != lib.path)
      return invalid_argument("--nccl-library " + preferred + ": NCCL is already loaded from " +
                              (lib.path.empty() ? std::string("nowhere") : lib.path) + " in this process");
    *out = &lib;
    return status;
  }
  opened = true;
  first_preferred = preferred;
  std::vector<std::string> candidates;
  if (!preferred.empty()) candidates.push_back(preferred);
  candidates.insert(candidates.end(), {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2",
                                       "/usr/local/cuda/lib/libnccl.so.2",
                                       "/usr/local/cuda/targets/x86_64-linux/lib/libnccl.so.2",
                                       "/usr/lib/x86_64-linux-gnu/libnccl.so.2"});
  std::string tried;
  for (const std::string& c : candidates) {
    lib.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle != nullptr) {
      lib.path = c;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + c;
  }
  if (lib.handle == nullptr) {
    status = unsupported("tensor parallelism needs NCCL (libnccl.so.2), not found (tried " + tried +
                         "): install it or give its path with --nccl-library");
    *out = &lib;
    return status;
  }
  auto sym = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib.handle, name));
    if (*fn == nullptr && status.ok()) status = unsupported(lib.path + " has no " + name);
  };
  sym("ncclGetVersion", &lib.get_version);
  sym("ncclCommInitAll", &lib.comm_init_all);
  sym("ncclCommDestroy", &lib.comm_destroy);
  sym("ncclAllReduce", &lib.all_reduce);
  sym("ncclAllGather", &lib.all_gather);
  sym("ncclGetErrorString", &lib.error_string);
  *out = &lib;
  return status;
}

// Up to this size (decode steps up to batch 32 at hidden size 8192) all-reduces take the one-shot
// peer kernel; prefill steps go through NCCL's bandwidth-optimal ring.
constexpr int64_t kP2pAllReduceMaxBytes = 512 * 1024;
// The norm-fused exchange (runtime/row_kernels.hpp's RowPeerSum) of decode steps up to 1024 rows at
// hidden size 8192 (Llama-3-70B) at two ranks (row_op_fuses_peer_sum: fewer at more ranks): staged
// twice per rank, 64 MB a GPU at two ranks.
constexpr int64_t kRowPeerSumMaxBytes = parallel::kRowPeerMaxRows * 8192 * 2;

// "<what>: <NCCL's sentence> (NCCL error N)", like cuda_check.cuh's. An invalid argument or usage
// is llmq calling NCCL wrongly (kInternal); the rest are failures of the system, the GPUs or their
// links (kCudaError).
Status nccl_status(const NcclLibrary& lib, ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return {};
  const StatusCode code = (r == ncclInvalidArgument || r == ncclInvalidUsage) ? StatusCode::kInternal : StatusCode::kCudaError;
  return Status(code, what + ": " + lib.error_string(r) + " (NCCL error " + std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace

struct TensorParallelGroup::Impl {
  const NcclLibrary* lib = nullptr;
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  int version = 0;
  // Decode-sized all-reduces (null when the GPUs lack peer access or one_shot_all_reduce is off).
  std::unique_ptr<parallel::P2pAllReduce> p2p;
  ~Impl() {
    for (size_t i = 0; i < comms.size(); ++i)
      if (comms[i] != nullptr) {
        (void)cudaSetDevice(devices[i]);
        (void)lib->comm_destroy(comms[i]);
      }
  }
};

TensorParallelGroup::TensorParallelGroup() : impl_(std::make_unique<Impl>()) {}
TensorParallelGroup::~TensorParallelGroup() = default;

Status TensorParallelGroup::create(const std::vector<int>& devices, std::unique_ptr<TensorParallelGroup>* out,
                                   const TensorParallelGroupOptions& options) {
  if (devices.size() < 2) return invalid_argument("--tp: a tensor-parallel group needs 2 or more devices");
  int count = 0;
  LLMQ_RETURN_IF_ERROR(cuda::device_count(&count));
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      return invalid_argument("--tp " + std::to_string(devices.size()) + ": device " + std::to_string(devices[i]) +
                              " does not exist (" + std::to_string(count) + " present)");
    for (size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i]) return invalid_argument("--tp: device " + std::to_string(devices[i]) + " given twice");
  }
  const NcclLibrary* lib = nullptr;
  LLMQ_RETURN_IF_ERROR(open_nccl(options.nccl_library, &lib));
  std::unique_ptr<TensorParallelGroup> g(new TensorParallelGroup());
  Impl& s = *g->impl_;
  s.lib = lib;
  s.devices = devices;
  s.comms.assign(devices.size(), nullptr);
  LLMQ_RETURN_IF_ERROR(nccl_status(*lib, lib->get_version(&s.version), "ncclGetVersion"));
  LLMQ_RETURN_IF_ERROR(nccl_status(*lib, lib->comm_init_all(s.comms.data(), static_cast<int>(devices.size()), devices.data()),
                                   "ncclCommInitAll over " + std::to_string(devices.size()) + " devices"));
  if (options.one_shot_all_reduce) {
    const Status st = parallel::P2pAllReduce::create(devices, kP2pAllReduceMaxBytes, kRowPeerSumMaxBytes, &s.p2p);
    if (!st.ok() && st.code() != StatusCode::kUnsupported) return st;
  }
  *out = std::move(g);
  return {};
}

const parallel::P2pAllReduce* one_shot_all_reduce(const TensorParallelGroup& group) { return group.impl_->p2p.get(); }

int TensorParallelGroup::size() const { return static_cast<int>(impl_->devices.size()); }
int TensorParallelGroup::device(int rank) const { return impl_->devices.at(static_cast<size_t>(rank)); }
bool TensorParallelGroup::one_shot() const { return impl_->p2p != nullptr; }

std::string TensorParallelGroup::describe() const {
  const int v = impl_->version;
  std::string d;
  for (int dev : impl_->devices) d += (d.empty() ? "" : ",") + std::to_string(dev);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " (" + impl_->lib->path + ") over devices " + d +
         (impl_->p2p ? ", one-shot peer all-reduce up to " + std::to_string(kP2pAllReduceMaxBytes / 1024) + " KB" : ", NCCL only");
}

Status TensorParallelGroup::all_reduce_bf16(int rank, void* data, int64_t count, CudaStream stream) const {
  if (rank < 0 || rank >= size()) return invalid_argument("all_reduce: rank " + std::to_string(rank));
  if (count == 0) return {};
  if (impl_->p2p != nullptr && impl_->p2p->takes(data, count)) return impl_->p2p->run(rank, data, count, stream);
  return nccl_status(*impl_->lib,
                     impl_->lib->all_reduce(data, data, static_cast<size_t>(count), ncclBfloat16, ncclSum,
                                            impl_->comms[static_cast<size_t>(rank)], stream),
                     "all-reduce of " + std::to_string(count) + " bf16 values on rank " + std::to_string(rank));
}

Status TensorParallelGroup::all_gather_f32(int rank, const void* send, void* recv, int64_t count, CudaStream stream) const {
  if (rank < 0 || rank >= size()) return invalid_argument("all_gather: rank " + std::to_string(rank));
  if (count == 0) return {};
  return nccl_status(*impl_->lib,
                     impl_->lib->all_gather(send, recv, static_cast<size_t>(count), ncclFloat32,
                                            impl_->comms[static_cast<size_t>(rank)], stream),
                     "all-gather of " + std::to_string(count) + " floats on rank " + std::to_string(rank));
}

#else  // no nccl.h at build time

struct TensorParallelGroup::Impl {};
const parallel::P2pAllReduce* one_shot_all_reduce(const TensorParallelGroup&) { return nullptr; }
TensorParallelGroup::TensorParallelGroup() : impl_(std::make_unique<Impl>()) {}
TensorParallelGroup::~TensorParallelGroup() = default;
Status TensorParallelGroup::create(const std::vector<int>&, std::unique_ptr<TensorParallelGroup>*,
                                   const TensorParallelGroupOptions&) {
  return unsupported("this llmq was built without nccl.h: tensor parallelism is not available");
}
int TensorParallelGroup::size() const { return 0; }
int TensorParallelGroup::device(int) const { return -1; }
std::string TensorParallelGroup::describe() const { return "no NCCL"; }
bool TensorParallelGroup::one_shot() const { return false; }
Status TensorParallelGroup::all_reduce_bf16(int, void*, int64_t, CudaStream) const {
  return unsupported("built without NCCL");
}
Status TensorParallelGroup::all_gather_f32(int, const void*, void*, int64_t, CudaStream) const {
  return unsupported("built without NCCL");
}

#endif

}  // namespace llmq
