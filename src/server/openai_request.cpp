// parse_generate_request (openai_request.hpp): the checks, field by field.
#include "server/openai_request.hpp"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "llmq/text_stream.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq::server {
namespace {

using json = nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Each checker: true when the field is absent or null (left as it was) or valid (stored); false
// with *e set otherwise.
class Fields {
 public:
  Fields(const json& body, ApiError* e) : body_(body), e_(e) {}

  bool fail(const std::string& param, const std::string& message) {
    e_->param = param;
    e_->message = message;
    return false;
  }
  const json* get(const char* name) const {
    auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  bool integer(const char* name, int64_t lo, int64_t hi, int64_t* out) {
    const json* v = get(name);
    if (v == nullptr) return true;
    if (!v->is_number_integer())
      return fail(name, std::string(name) + ": expected an integer, got " + type_name(*v));
    const bool big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    const int64_t x = big ? std::numeric_limits<int64_t>::max() : v->get<int64_t>();
    if (big || x < lo || x > hi)
      return fail(name, std::string(name) + ": " + v->dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *out = x;
    return true;
  }
  bool number(const char* name, double lo, double hi, bool lo_open, float* out) {
    const json* v = get(name);
    if (v == nullptr) return true;
    if (!v->is_number()) return fail(name, std::string(name) + ": expected a number, got " + type_name(*v));
    const double x = v->get<double>();
    // Checked as the float it is stored as: top_p 1e-50 is above 0 but rounds to 0.0f.
    if (!std::isfinite(x) || x > hi || x < lo || (lo_open && static_cast<float>(x) <= static_cast<float>(lo)))
      return fail(name, std::string(name) + ": " + v->dump() + " is outside " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    *out = static_cast<float>(x);
    return true;
  }
  bool boolean(const char* name, bool* out) {
    const json* v = get(name);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return fail(name, std::string(name) + ": expected a boolean, got " + type_name(*v));
    *out = v->get<bool>();
    return true;
  }
  // A field llmq does not implement: accepted only at its neutral value.
  bool neutral(const char* name, const json& neutral_value, const std::string& why) {
    const json* v = get(name);
    if (v == nullptr || *v == neutral_value) return true;
    return fail(name, std::string(name) + ": not supported (" + why + ")");
  }

 private:
  const json& body_;
  ApiError* e_;
};

bool token_ids(const json& v, const char* param, const RequestLimits& limits, std::vector<int32_t>* out, ApiError* e) {
  if (static_cast<int64_t>(v.size()) > limits.max_prompt_tokens) {
    e->param = param;
    e->message = std::string(param) + ": " + std::to_string(v.size()) + " token ids, at most " + std::to_string(limits.max_prompt_tokens);
    return false;
  }
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      e->param = param;
      e->message = std::string(param) + "[" + std::to_string(i) + "]: " + t.dump() + " is not a token id";
      return false;
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

bool prompt(const json& body, const RequestLimits& limits, GenerateRequest* out, ApiError* e) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    e->param = "prompt";
    e->message = "prompt: required";
    return false;
  }
  const json& p = *it;
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    std::vector<int32_t> ids;
    if (!token_ids(p, "prompt", limits, &ids, e)) return false;
    out->prompt_ids = std::move(ids);
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    out->prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
    std::vector<int32_t> ids;
    if (!token_ids(p[0], "prompt", limits, &ids, e)) return false;
    out->prompt_ids = std::move(ids);
  } else {
    e->param = "prompt";
    e->message = p.is_array() && p.size() > 1 && (p[0].is_string() || p[0].is_array())
                     ? "prompt: " + std::to_string(p.size()) + " prompts in one request; send one per request"
                     : "prompt: expected a string, an array of token ids, or one of either in an array, got " + type_name(p);
    return false;
  }
  if (out->prompt_text && static_cast<int64_t>(out->prompt_text->size()) > limits.max_prompt_bytes) {
    e->param = "prompt";
    e->message = "prompt: " + std::to_string(out->prompt_text->size()) + " bytes, at most " + std::to_string(limits.max_prompt_bytes);
    return false;
  }
  if ((out->prompt_text && out->prompt_text->empty()) || (out->prompt_ids && out->prompt_ids->empty())) {
    e->param = "prompt";
    e->message = "prompt: empty";
    return false;
  }
  return true;
}

bool messages(const json& body, const RequestLimits& limits, GenerateRequest* out, ApiError* e) {
  auto it = body.find("messages");
  const auto bad = [&](const std::string& param, const std::string& message) {
    e->param = param;
    e->message = message;
    return false;
  };
  if (it == body.end() || !it->is_array() || it->empty())
    return bad("messages", "messages: expected a non-empty array of messages");
  if (static_cast<int64_t>(it->size()) > limits.max_messages)
    return bad("messages", "messages: " + std::to_string(it->size()) + " messages, at most " + std::to_string(limits.max_messages));
  int64_t bytes = 0;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(at, at + ": expected an object, got " + type_name(m));
    ChatMessage msg;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(at + ".role", at + ".role: required, a string");
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "developer" && msg.role != "tool")
      return bad(at + ".role", at + ".role: '" + msg.role + "' is not system, user, assistant, developer or tool");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) return bad(at + ".tool_calls", at + ".tool_calls: not supported");
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (msg.role != "assistant") return bad(at + ".content", at + ".content: required");
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
          return bad(pat, pat + ": only {\"type\": \"text\", \"text\": ...} parts are supported");
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return bad(at + ".content", at + ".content: expected a string or an array of text parts, got " + type_name(*content));
    }
    bytes += static_cast<int64_t>(msg.content.size());
    if (bytes > limits.max_prompt_bytes)
      return bad("messages", "messages: more than " + std::to_string(limits.max_prompt_bytes) + " bytes of content");
    out->messages.push_back(std::move(msg));
  }
  return true;
}

}  // namespace

std::string ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool parse_generate_request(const std::string& body_text, bool chat, const RequestLimits& limits, GenerateRequest* out,
                            ApiError* e) {
  *out = GenerateRequest{};
  *e = ApiError{};
  json body;
  if (Status st = parse_json_text("request body", body_text, &body); !st.ok()) {
    // The parser quotes what it last read, which may be the ill-formed bytes themselves: the
    // message goes to a client as JSON, so it is made valid UTF-8 first.
    engine::utf8_replace_invalid(st.message(), true, &e->message);
    return false;
  }
  if (!body.is_object()) {
    e->message = "request body: expected a JSON object, got " + type_name(body);
    return false;
  }
  Fields f(body, e);
  out->chat = chat;
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) return f.fail("model", "model: required, a string");
  out->model = model->get<std::string>();
  if (chat ? !messages(body, limits, out, e) : !prompt(body, limits, out, e)) return false;

  out->max_tokens = chat ? -1 : 16;  // OpenAI's defaults: completions 16, chat as long as the context allows
  if (!f.integer("max_tokens", 1, limits.max_tokens, &out->max_tokens)) return false;
  if (chat && !f.integer("max_completion_tokens", 1, limits.max_tokens, &out->max_tokens)) return false;
  if (!f.number("temperature", 0.0, 2.0, false, &out->temperature)) return false;
  if (!f.number("top_p", 0.0, 1.0, true, &out->top_p)) return false;
  int64_t top_k = 0;
  if (!f.integer("top_k", -1, INT32_MAX, &top_k)) return false;
  out->top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);  // vLLM: -1 is every token
  int64_t seed = 0;
  if (f.get("seed") != nullptr) {
    if (!f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed)) return false;
    out->seed = static_cast<uint64_t>(seed);
  }
  if (const json* stop = f.get("stop")) {
    const json list = stop->is_string() ? json::array({*stop}) : *stop;
    if (!list.is_array()) return f.fail("stop", "stop: expected a string or an array of strings, got " + type_name(*stop));
    if (static_cast<int64_t>(list.size()) > limits.max_stop)
      return f.fail("stop", "stop: " + std::to_string(list.size()) + " strings, at most " + std::to_string(limits.max_stop));
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string() || list[i].get<std::string>().empty())
        return f.fail("stop", "stop[" + std::to_string(i) + "]: expected a non-empty string");
      out->stop.push_back(list[i].get<std::string>());
    }
  }
  if (const json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) return f.fail("stop_token_ids", "stop_token_ids: expected an array of token ids");
    if (!token_ids(*ids, "stop_token_ids", limits, &out->stop_token_ids, e)) return false;
  }
  if (!f.boolean("ignore_eos", &out->ignore_eos) || !f.boolean("stream", &out->stream)) return false;
  if (const json* so = f.get("stream_options")) {
    if (!out->stream) return f.fail("stream_options", "stream_options: only allowed when stream is true");
    if (!so->is_object()) return f.fail("stream_options", "stream_options: expected an object, got " + type_name(*so));
    Fields g(*so, e);
    if (!g.boolean("include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      return false;
    }
  }
  if (chat) {
    bool want = false;
    if (!f.boolean("logprobs", &want)) return false;
    int64_t top = 0;
    if (!f.integer("top_logprobs", 0, limits.max_logprobs, &top)) return false;
    if (f.get("top_logprobs") != nullptr && !want) return f.fail("top_logprobs", "top_logprobs: needs logprobs true");
    out->logprobs = want ? top : -1;
    if (!f.boolean("add_generation_prompt", &out->add_generation_prompt)) return false;
    if (!f.neutral("tools", json::array(), "tool calling") || !f.neutral("tool_choice", "none", "tool calling") ||
        !f.neutral("functions", json::array(), "tool calling"))
      return false;
    if (const json* rf = f.get("response_format"))
      if (!(rf->is_object() && rf->contains("type") && (*rf)["type"].is_string() && (*rf)["type"] == "text"))
        return f.fail("response_format", "response_format: only {\"type\": \"text\"} is supported");
  } else {
    if (!f.integer("logprobs", 0, limits.max_completion_logprobs, &out->logprobs) || !f.boolean("echo", &out->echo)) return false;
    if (!f.neutral("best_of", 1, "one completion per request") || !f.neutral("suffix", "", "insertion")) return false;
  }
  return f.neutral("n", 1, "one choice per request") && f.neutral("logit_bias", json::object(), "logit bias") &&
         f.neutral("presence_penalty", 0, "penalties") && f.neutral("frequency_penalty", 0, "penalties") &&
         f.neutral("repetition_penalty", 1, "penalties");
}

}  // namespace llmq::server
