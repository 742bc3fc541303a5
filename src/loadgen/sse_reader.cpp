// SseReader (sse_reader.hpp): the event-stream parsing rules of the HTML standard, section
// "Interpreting an event stream", for the data field.
#include "loadgen/sse_reader.hpp"

namespace llmq::loadgen {

Status SseReader::feed(std::string_view bytes, const EventHandler& on_event) {
  size_t begin = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c != '\n' && c != '\r') {
      after_cr_ = false;
      continue;
    }
    // The "\n" of a "\r\n" whose '\r' ended the previous line (in this piece or the last one).
    const bool second_half = c == '\n' && after_cr_;
    after_cr_ = c == '\r';
    if (!second_half) {
      line_.append(bytes.substr(begin, i - begin));
      LLMQ_RETURN_IF_ERROR(end_line(on_event));
    }
    begin = i + 1;
  }
  line_.append(bytes.substr(begin));
  if (static_cast<int64_t>(line_.size() + data_.size()) > max_event_bytes_)
    return invalid_argument("an event of the stream is longer than " + std::to_string(max_event_bytes_) + " bytes");
  return {};
}

Status SseReader::end_line(const EventHandler& on_event) {
  std::string line;
  line.swap(line_);
  if (line.empty()) {  // the end of an event; one without data dispatches nothing
    if (!has_data_) return {};
    std::string data;
    data.swap(data_);
    has_data_ = false;
    data.pop_back();  // the '\n' after its last data line
    return on_event(data);
  }
  if (line[0] == ':') return {};  // a comment
  const size_t colon = line.find(':');
  const std::string_view field = std::string_view(line).substr(0, colon);
  if (field != "data") return {};  // event, id, retry and unknown fields: nothing a completion uses
  std::string_view value;
  if (colon != std::string::npos) {
    value = std::string_view(line).substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);  // one space after the colon is not data
  }
  if (static_cast<int64_t>(data_.size() + value.size()) + 1 > max_event_bytes_)
    return invalid_argument("an event of the stream is longer than " + std::to_string(max_event_bytes_) + " bytes");
  data_.append(value);
  data_ += '\n';
  has_data_ = true;
  return {};
}

}  // namespace llmq::loadgen
