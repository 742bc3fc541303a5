// The hand-written pre-tokenizers (GPT-2, Llama 3 / Qwen2 digit runs, o200k, Metaspace) and the
// UTF-8 decoder under arbitrary bytes: the words must concatenate back to the text exactly, and
// UTF-8 re-encoding of the decoded code points must cover every byte.
#include "fuzz_support.hpp"
#include "model/tokenizer/tokenizer_bpe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace llmq::tokenizer_detail;
  const std::string text = llmq::fuzz::as_string(data, size);
  const Splitter splitters[] = {{SplitKind::kGpt2, 0, ""},
                                {SplitKind::kLlama3, 3, ""},
                                {SplitKind::kLlama3, 1, ""},
                                {SplitKind::kO200k, 3, ""},
                                {SplitKind::kMetaspace, 0, "\xE2\x96\x81"}};
  for (const Splitter& s : splitters) {
    std::vector<std::string> words;
    split_words(text, s, &words);
    std::string joined;
    for (const std::string& w : words) {
      llmq::fuzz::require(!w.empty(), "an empty word");
      joined += w;
    }
    llmq::fuzz::require(joined == text, "words do not concatenate back to the text");
  }
  int64_t next = 0;
  for (const CodePoint& cp : utf8_code_points(text)) {
    llmq::fuzz::require(cp.begin == next && cp.size >= 1 && cp.size <= 4, "code points do not tile the bytes");
    next = cp.begin + cp.size;
  }
  llmq::fuzz::require(next == static_cast<int64_t>(size), "code points do not reach the end");
  return 0;
}
