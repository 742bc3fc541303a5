// The chat-template engine (src/template/) with a hostile template and hostile messages at once;
// the input layout (template, messages, options split at \0) is chat_template_input.hpp's.
// Invariants: nothing escapes render_chat_template (libFuzzer reports an uncaught exception as a
// crash), an accepted render is within max_output_bytes, a refused one leaves the output alone and
// has a message naming the template, the messages or the option at fault. Hangs, memory growth
// and leaks (namespaces that hold themselves) are caught by -timeout, -rss_limit_mb and
// LeakSanitizer.
#include <string>

#include "chat_template_input.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq;
  const fuzz::ChatTemplateInput in = fuzz::read_chat_template_input(fuzz::as_string(data, size));
  std::string out = "unchanged";
  const Status st = fuzz::render_chat_template_input(in, &out);
  if (st.ok()) {
    fuzz::require(static_cast<int64_t>(out.size()) <= in.options.max_output_bytes, "render longer than max_output_bytes",
                  std::to_string(out.size()));
    return 0;
  }
  const std::string& m = st.message();
  fuzz::require(!m.empty(), "error without a message");
  const bool named = m.rfind("chat template", 0) == 0 || m.rfind("messages", 0) == 0 || m.rfind("date:", 0) == 0;
  fuzz::require(named, "error names neither the template, the messages nor the option:", m.substr(0, 200));
  fuzz::require(out == "unchanged", "a failed render wrote its output");
  return 0;
}
