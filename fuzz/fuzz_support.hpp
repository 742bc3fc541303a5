// Shared pieces of the libFuzzer targets: the input as a string, and a hard stop for a broken
// invariant. A parser that returns OK must hand back something its callers can trust; where a
// target checks that, a violation aborts so libFuzzer saves the input like any crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "llmq/status.hpp"

namespace llmq::fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

[[noreturn]] inline void invariant_failed(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "llmq fuzz: invariant broken: %s %s\n", what, detail.c_str());
  std::abort();
}

inline void require(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) invariant_failed(what, detail);
}

// Every error must say what is at fault: an empty message would leave the user guessing.
inline void require_named_error(const Status& st, const std::string& source) {
  if (st.ok()) return;
  require(!st.message().empty(), "error without a message");
  require(st.message().find(source) != std::string::npos, "error does not name the file:", st.message());
}

}  // namespace llmq::fuzz
