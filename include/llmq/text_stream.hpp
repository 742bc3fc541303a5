// A request's tokens as streamed text: what a server sends as each token is sampled. Two things make
// it more than concatenating decode_token pieces:
//  * A piece may end inside a UTF-8 character (byte-level BPE splits characters over tokens), so
//    bytes are held back until they complete a character; ill-formed bytes become U+FFFD, one per
//    maximal ill-formed subpart, as Python's bytes.decode(errors="replace") and ICU replace them
//    (Unicode's recommended practice), so the streamed text equals what transformers' decode gives.
//  * Stop strings (OpenAI's `stop`) may span tokens: text that could still be the start of a stop
//    string is held back until it is known not to be; when one completes, the text before it is
//    the whole output and the stop string itself is not sent.
// Every delta is valid UTF-8, and their concatenation (with finish()) is the sequence's text, cut
// before the first stop string.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llmq/status.hpp"
#include "llmq/tokenizer.hpp"

namespace llmq::engine {

// Appends the UTF-8 text of `bytes` to *out with ill-formed subparts replaced by U+FFFD, and
// returns how many bytes it consumed: all of them, except a trailing incomplete character when
// `final` is false (those bytes wait for more).
int64_t utf8_replace_invalid(const std::string& bytes, bool final, std::string* out);

struct TextStreamOptions {
  std::vector<std::string> stop;  // stop strings (non-empty, at most 64, each at most 4096 bytes)
  int32_t prev = -1;              // the token before the first streamed one (the prompt's last), -1: none
};

class TextStream {
 public:
  // `tokenizer` must outlive the stream. Refused: empty or oversized stop strings.
  static Status create(const Tokenizer* tokenizer, const TextStreamOptions& options, TextStream* out);

  // Feeds the next sampled token and appends the text it made certain to *delta. *stopped is set
  // when a stop string completed (the stream then ignores further tokens). An id the tokenizer
  // cannot decode becomes U+FFFD, as Tokenizer::decode does.
  Status push(int32_t token, std::string* delta, bool* stopped);
  // The end of the sequence (no stop string matched): appends what was held back (an incomplete
  // character becomes U+FFFD; a partial stop string is text after all).
  void finish(std::string* delta);

  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything sent so far

 private:
  void release(std::string* delta, bool final);

  const Tokenizer* tokenizer_ = nullptr;
  std::vector<std::string> stop_;
  int32_t prev_ = -1;
  std::string bytes_;  // raw bytes not yet decoded (an incomplete trailing character)
  std::string held_;   // decoded text that may still begin a stop string
  std::string text_;
  bool stopped_ = false;
};

}  // namespace llmq::engine
