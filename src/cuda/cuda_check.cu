// src/cuda/cuda_check.cuh: CUDA errors as Status, in the words users read.
#include "cuda/cuda_check.cuh"

#include <string>

namespace llmq::detail {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

}  // namespace

std::string operation_name(const char* call) {
  const std::string text = trim(call);
  const size_t paren = text.find('(');
  if (paren == std::string::npos) return text;
  std::string fn = trim(text.substr(0, paren));
  const size_t scope = fn.rfind("::");
  if (scope != std::string::npos) fn = fn.substr(scope + 2);
  if (fn == "launch_pdl") {
    const std::string args = text.substr(paren + 1);
    return "launch " + trim(args.substr(0, args.find_first_of(",<)")));
  }
  return fn;
}

bool cuda_means_no_gpu(cudaError_t err) {
  // InitializationError is what the runtime returns when the driver cannot start (no kernel
  // module); StubLibrary when only the toolkit's libcuda.so stub is found.
  return err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice || err == cudaErrorInitializationError ||
         err == cudaErrorStubLibrary;
}

Status cuda_no_gpu_status(cudaError_t err) {
  int driver = 0;
  // Without a driver cudaDriverGetVersion reports 0; a positive version under InsufficientDriver is
  // a driver that exists but is older than the runtime llmq was built with.
  if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    int runtime = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    return unsupported("the CUDA driver (" + version_text(driver) + ") is older than the CUDA runtime llmq was built with (" +
                       version_text(runtime) + "): update the driver (cudaErrorInsufficientDriver)");
  }
  return unsupported(std::string("no CUDA driver or GPU on this machine (") + cudaGetErrorName(err) + ")");
}

Status cuda_status(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return {};
  if (cuda_means_no_gpu(err)) return cuda_no_gpu_status(err);
  return {StatusCode::kCudaError,
          operation_name(call) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")"};
}

}  // namespace llmq::detail
