// CompletionStream (completion_stream.hpp): OpenAI completion chunks, counted into token times.
#include "loadgen/completion_stream.hpp"

#include <nlohmann/json.hpp>

#include "model/checkpoint/input_file.hpp"

namespace llmq::loadgen {

namespace {

using json = nlohmann::json;

// At most this much of a server's own text goes into an error, which is printed and kept in JSON.
std::string clip(const std::string& s) {
  constexpr size_t kMax = 200;
  return s.size() <= kMax ? s : s.substr(0, kMax) + "...";
}

}  // namespace

Status CompletionStream::on_event(const std::string& data, double t_s) {
  if (done_) return invalid_argument("an event after data: [DONE]");
  if (data == "[DONE]") {
    done_ = true;
    return {};
  }
  json chunk;
  // Bounded nesting: a server's text is parsed as any other input llmq reads.
  if (Status st = parse_json_text("a streamed chunk", data, &chunk); !st.ok())
    return invalid_argument("malformed JSON in the stream (" + clip(st.message()) + ")");
  if (!chunk.is_object()) return invalid_argument("a streamed chunk is not a JSON object: " + clip(data));
  if (const auto e = chunk.find("error"); e != chunk.end()) {
    const auto message = e->is_object() ? e->find("message") : e->end();
    return invalid_argument("the server sent an error event: " +
                            clip(message != e->end() && message->is_string() ? message->get<std::string>() : e->dump()));
  }
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && !usage->is_null()) {
    const auto n = usage->is_object() ? usage->find("completion_tokens") : usage->end();
    if (n == usage->end() || !n->is_number_integer() || n->get<int64_t>() < 0)
      return invalid_argument("a usage chunk without a count of completion_tokens: " + clip(usage->dump()));
    usage_tokens_ = n->get<int64_t>();
  }
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array())
    return chunk.contains("usage") ? Status{} : invalid_argument("a streamed chunk without choices: " + clip(data));
  for (const json& c : *choices) {
    if (!c.is_object()) return invalid_argument("a choice is not a JSON object: " + clip(c.dump()));
    int64_t tokens = 0;
    if (const auto ids = c.find("token_ids"); ids != c.end() && !ids->is_null()) {
      if (!ids->is_array()) return invalid_argument("token_ids is not an array: " + clip(ids->dump()));
      for (const json& id : *ids)
        if (!id.is_number_integer()) return invalid_argument("token_ids holds a non-integer: " + clip(ids->dump()));
      tokens = static_cast<int64_t>(ids->size());
      id_tokens_ += tokens;
    } else {
      // Text alone: /v1/completions' "text", or a chat delta's "content" (which some servers send
      // on the completions path too). A chunk with no text (the finish reason alone) holds no token.
      const auto text = c.find("text");
      const auto delta = c.find("delta");
      const json* content = nullptr;
      if (text != c.end()) content = &*text;
      else if (delta != c.end() && delta->is_object() && delta->contains("content")) content = &(*delta)["content"];
      if (content != nullptr && !content->is_null() && !content->is_string())
        return invalid_argument("a choice's text is not a string: " + clip(content->dump()));
      if (content != nullptr && content->is_string() && !content->get<std::string>().empty()) {
        tokens = 1;
        ++text_chunks_;
      }
    }
    // A server that streams past max_tokens would make the client hold times without end.
    if (id_tokens_ + text_chunks_ > asked_)
      return invalid_argument("more tokens than the " + std::to_string(asked_) + " asked (max_tokens)");
    times_.insert(times_.end(), static_cast<size_t>(tokens), t_s);
  }
  return {};
}

Status CompletionStream::finish(StreamedCompletion* out) const {
  if (!done_) return invalid_argument("the stream ended before data: [DONE]");
  StreamedCompletion r;
  r.per_token = text_chunks_ == 0;
  if (r.per_token) {
    r.tokens = id_tokens_;
    if (usage_tokens_ >= 0 && usage_tokens_ != id_tokens_)
      return invalid_argument("usage says " + std::to_string(usage_tokens_) + " completion tokens, the stream carried " +
                              std::to_string(id_tokens_) + " token ids");
  } else {
    // Text without token ids: a chunk holds one token or more (text held back until it completes
    // a character), so only usage can say how many.
    if (usage_tokens_ < 0)
      return invalid_argument("a stream of text without token ids and without a usage chunk: its token count is unknown");
    if (usage_tokens_ < text_chunks_ + id_tokens_)
      return invalid_argument("usage says " + std::to_string(usage_tokens_) + " completion tokens, fewer than the " +
                              std::to_string(text_chunks_ + id_tokens_) + " chunks that carried them");
    r.tokens = usage_tokens_;
  }
  if (r.tokens != asked_)
    return invalid_argument(std::to_string(r.tokens) + " completion tokens, " + std::to_string(asked_) +
                            " asked (max_tokens with ignore_eos: the length is the benchmark's)");
  if (times_.empty()) return invalid_argument("no chunk carried a token");
  r.token_s = times_;
  *out = std::move(r);
  return {};
}

}  // namespace llmq::loadgen
