// Server-sent events (the event-stream format of the WHATWG HTML standard) read from bytes that
// arrive in arbitrary pieces, as an HTTP client hands a streamed response over: lines end in "\n",
// "\r\n" or "\r" (a "\r\n" may be split between two pieces), a line that starts with ':' is a
// comment (servers send them to keep a silent connection open), "data:" lines accumulate (joined
// by '\n'), and a blank line ends the event. Only the data field matters to a completion stream;
// event, id and retry are read and dropped. Bounded: a line or an event past max_event_bytes is an
// error, so a hostile server cannot make the client hold an endless line. Internal header of the
// load generator (src/loadgen/).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "llmq/status.hpp"

namespace llmq::loadgen {

class SseReader {
 public:
  using EventHandler = std::function<Status(const std::string& data)>;

  explicit SseReader(int64_t max_event_bytes = int64_t{1} << 20) : max_event_bytes_(max_event_bytes) {}

  // Reads the next piece of the stream and passes each event it completes to on_event, in order.
  // Returns the first error (on_event's, or the bound's); the reader is not to be fed after one.
  Status feed(std::string_view bytes, const EventHandler& on_event);

  // True while a line or an event has begun but not ended: a stream that stops here was cut.
  bool in_event() const { return !line_.empty() || has_data_; }

 private:
  Status end_line(const EventHandler& on_event);

  int64_t max_event_bytes_;
  std::string line_;       // the current line, without its ending
  std::string data_;       // the current event's data lines, each followed by '\n'
  bool has_data_ = false;  // a data field was seen (an empty "data:" still makes an event)
  bool after_cr_ = false;  // the last byte ended a line with '\r': a '\n' next belongs to it
};

}  // namespace llmq::loadgen
