// The input layout of fuzz_chat_template, shared with the seed writer (make_seeds.cpp) so that the
// seeds are read exactly as the target reads them:
//   TEMPLATE [\0 MESSAGES-JSON [\0 OPTIONS-JSON]]
// Without a \0 the template renders over a fixed four-turn conversation, so mutations of the
// template alone still reach the evaluator with realistic values. OPTIONS-JSON (an object; anything
// else means the defaults) may set add_generation_prompt, bos_token, eos_token, date, extra_context
// (passed as is, so a non-object reaches its check), "parsed": true (the messages handed over as
// nlohmann::json, sorted keys, instead of text) and the limits max_nesting, max_loop_iterations,
// max_output_bytes and max_work. The limits default to the server's divided by 64 (nesting apart:
// 256, so that the stack is tested as deep as it goes): a render that stops at its work bound
// then stops in a fraction of a second even under the sanitizers (about 10 times slower than the
// release build), so a timeout means work the bounds do not count, and the corpus replays fast.
// An input may lower a limit, never raise it.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmq/chat_template.hpp"
#include "model/checkpoint/input_file.hpp"

namespace llmq::fuzz {

struct ChatTemplateInput {
  std::string source;
  std::string messages;
  ChatTemplateOptions options;
  bool parsed = false;
};

inline int64_t clamped_option(const nlohmann::json& o, const char* key, int64_t max) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer() || it->is_number_unsigned()) return max;  // unsigned: >= 0, maybe huge
  return std::min(it->get<int64_t>(), max);
}

inline ChatTemplateInput read_chat_template_input(const std::string& in) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t end; parts.size() < 2 && (end = in.find('\0', pos)) != std::string::npos; pos = end + 1)
    parts.push_back(in.substr(pos, end - pos));
  parts.push_back(in.substr(pos));

  ChatTemplateInput r;
  r.source = parts[0];
  r.messages = parts.size() > 1 ? parts[1]
                                : R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9!"},)"
                                  R"( {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}])";
  r.options.date = "2024-02-29";  // a fixed day: a finding must replay the same way tomorrow
  r.options.max_loop_iterations /= 64;
  r.options.max_output_bytes /= 64;
  r.options.max_work /= 64;
  nlohmann::json o;
  if (parts.size() < 3 || !parse_json_text("options", parts[2], &o).ok() || !o.is_object()) return r;
  const auto flag = [&](const char* key, bool* out) {
    if (o.contains(key) && o[key].is_boolean()) *out = o[key].get<bool>();
  };
  const auto text = [&](const char* key, std::string* out) {
    if (o.contains(key) && o[key].is_string()) *out = o[key].get<std::string>();
  };
  flag("add_generation_prompt", &r.options.add_generation_prompt);
  flag("parsed", &r.parsed);
  text("bos_token", &r.options.bos_token);
  text("eos_token", &r.options.eos_token);
  text("date", &r.options.date);
  if (o.contains("extra_context")) r.options.extra_context = o["extra_context"];
  r.options.max_nesting = clamped_option(o, "max_nesting", r.options.max_nesting);
  r.options.max_loop_iterations = clamped_option(o, "max_loop_iterations", r.options.max_loop_iterations);
  r.options.max_output_bytes = clamped_option(o, "max_output_bytes", r.options.max_output_bytes);
  r.options.max_work = clamped_option(o, "max_work", r.options.max_work);
  return r;
}

inline Status render_chat_template_input(const ChatTemplateInput& in, std::string* out) {
  if (!in.parsed) return render_chat_template(in.source, in.messages, in.options, out);
  nlohmann::json messages;
  LLMQ_RETURN_IF_ERROR(parse_json_text("messages", in.messages, &messages));
  return render_chat_template(in.source, messages, in.options, out);
}

// The bytes of one input (the seed writer's side).
inline std::string chat_template_input(const std::string& source, const std::string& messages,
                                       const nlohmann::json& options = nlohmann::json::object()) {
  return source + '\0' + messages + '\0' + options.dump();
}

}  // namespace llmq::fuzz
