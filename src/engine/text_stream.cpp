// TextStream (text_stream.hpp): UTF-8 completion and stop strings over a request's tokens.
#include "llmq/text_stream.hpp"

#include <algorithm>

namespace llmq::engine {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
constexpr size_t kMaxStops = 64, kMaxStopBytes = 4096;

}  // namespace

// Unicode's table of well-formed UTF-8 (Table 3-7): the lead byte fixes how many continuation bytes
// follow and the range of the first one (E0, ED, F0 and F4 narrow it to rule out overlong forms,
// surrogates and code points past U+10FFFF). A maximal subpart (a lead byte and the continuation
// bytes that fit the table before one does not) is one U+FFFD; a byte that cannot start a sequence
// is one U+FFFD; the byte that broke a sequence is read again as a possible lead.
int64_t utf8_replace_invalid(const std::string& bytes, bool final, std::string* out) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the first continuation byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out->append(kReplacement);  // 80..C1, F5..FF never start a character
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const auto d = static_cast<unsigned char>(bytes[j]);
      if (d < (got == 0 ? lo : 0x80) || d > (got == 0 ? hi : 0xBF)) break;
      ++j;
      ++got;
    }
    if (got == need) {
      out->append(bytes, i, j - i);
    } else if (j == n && !final) {
      return static_cast<int64_t>(i);  // a character still arriving
    } else {
      out->append(kReplacement);
    }
    i = j;
  }
  return static_cast<int64_t>(n);
}

Status TextStream::create(const Tokenizer* tokenizer, const TextStreamOptions& options, TextStream* out) {
  if (tokenizer == nullptr || out == nullptr) return invalid_argument("TextStream: tokenizer and out must not be null");
  if (options.stop.size() > kMaxStops)
    return invalid_argument("stop: " + std::to_string(options.stop.size()) + " strings, at most " + std::to_string(kMaxStops));
  for (size_t i = 0; i < options.stop.size(); ++i) {
    const std::string& s = options.stop[i];
    if (s.empty() || s.size() > kMaxStopBytes)
      return invalid_argument("stop[" + std::to_string(i) + "]: " + std::to_string(s.size()) + " bytes, must be 1 to " +
                              std::to_string(kMaxStopBytes));
    std::string checked;
    if (utf8_replace_invalid(s, true, &checked) != static_cast<int64_t>(s.size()) || checked != s)
      return invalid_argument("stop[" + std::to_string(i) + "]: not valid UTF-8");
  }
  TextStream t;
  t.tokenizer_ = tokenizer;
  t.stop_ = options.stop;
  t.prev_ = options.prev;
  *out = std::move(t);
  return {};
}

Status TextStream::push(int32_t token, std::string* delta, bool* stopped) {
  if (delta == nullptr || stopped == nullptr) return invalid_argument("TextStream::push: delta and stopped must not be null");
  *stopped = stopped_;
  if (stopped_) return {};
  std::string piece;
  if (!tokenizer_->decode_token(prev_, token, &piece).ok()) piece = kReplacement;
  prev_ = token;
  bytes_ += piece;
  release(delta, false);
  *stopped = stopped_;
  return {};
}

void TextStream::finish(std::string* delta) {
  if (!stopped_) release(delta, true);
}

void TextStream::release(std::string* delta, bool final) {
  std::string decoded;
  bytes_.erase(0, static_cast<size_t>(utf8_replace_invalid(bytes_, final, &decoded)));
  held_ += decoded;
  size_t first = std::string::npos;  // the earliest complete stop string
  for (const std::string& s : stop_) first = std::min(first, held_.find(s));
  size_t send = held_.size();
  if (first != std::string::npos) {
    send = first;
    stopped_ = true;
  } else if (!final) {
    // Keep the longest end of the text that is the start of some stop string (it starts at a
    // character boundary: a stop string's first byte is a lead byte).
    size_t keep = 0;
    for (const std::string& s : stop_)
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    send = held_.size() - keep;
  }
  delta->append(held_, 0, send);
  text_.append(held_, 0, send);
  held_.erase(0, send);
  if (stopped_) {
    held_.clear();
    bytes_.clear();
  }
}

}  // namespace llmq::engine
