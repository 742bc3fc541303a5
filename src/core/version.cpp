// llmq::library_version (llmq/version.hpp): the version compiled into the library itself.
#include "llmq/version.hpp"

namespace llmq {

const char* library_version() { return LLMQ_VERSION_STRING; }

}  // namespace llmq
