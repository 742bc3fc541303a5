// Status: how every llmq library call reports failure. Library code never prints or exits; it
// returns a Status whose message names the argument, tensor or file at fault.
#pragma once

#include <string>
#include <utility>

namespace llmq {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something wrong (shape, dtype, scale, ...)
  kUnsupported,      // valid request this build or device cannot do
  kIoError,          // a file could not be read or written
  kCudaError,        // a CUDA / cuBLASLt call failed
  kInternal,         // a bug in llmq
  kResourceExhausted,  // a bounded resource is full (the serving engine's KV blocks, its queue)
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: scales: expected 4 x 1 float32, got 4 x 2"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}
inline Status unsupported(std::string message) {
  return {StatusCode::kUnsupported, std::move(message)};
}

const char* status_code_name(StatusCode code);

}  // namespace llmq

// Propagate a failed Status to the caller. The one macro llmq has: C++17 has no better spelling.
#define LLMQ_RETURN_IF_ERROR(expr)            \
  do {                                        \
    ::llmq::Status llmq_status_ = (expr);     \
    if (!llmq_status_.ok()) return llmq_status_; \
  } while (0)
