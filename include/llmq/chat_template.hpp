// Chat templates: the Jinja subset that real models' chat templates (tokenizer_config.json's
// "chat_template", or chat_template.jinja) are written in, rendered the way transformers'
// apply_chat_template renders them with Python's jinja2: Environment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]), a json.dumps-equal `tojson`, the globals
// raise_exception(msg) and strftime_now(fmt). Hostile templates and messages are bounded (nesting,
// loop iterations, output size) and every failure is a Status naming the template line and column.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "llmq/status.hpp"

namespace llmq {

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string date;  // "YYYY-MM-DD": the day strftime_now formats (at midnight); empty: today (local time)
  std::string bos_token;
  std::string eos_token;
  // Extra template variables (e.g. {"enable_thinking": false, "reasoning_effort": "low"}); an object.
  nlohmann::json extra_context = nlohmann::json::object();
  // Limits against hostile templates: nesting of statements, expressions and macro calls; loop
  // iterations over the whole render; bytes of output (and of any one intermediate string).
  int64_t max_nesting = 256;
  int64_t max_loop_iterations = 1000000;
  int64_t max_output_bytes = int64_t{64} << 20;
  // The render's work, in units of about a nanosecond: each statement, expression and loop
  // iteration, each byte of a string copied and each item made, copied, compared or printed counts
  // (a small template could otherwise copy a 64 MB string a million times). The default stops a
  // hostile template within about a second and as many bytes of memory; the vendor templates over
  // the largest conversation the server takes (4096 messages, 8 MB) spend at most a quarter of it.
  int64_t max_work = int64_t{1} << 30;
};

// Renders template_source over messages_json: a JSON array of messages, or an object with
// "messages" (and optionally "tools", plus any other keys, which become template variables).
Status render_chat_template(const std::string& template_source, const std::string& messages_json,
                            const ChatTemplateOptions& options, std::string* out);
// The same over parsed JSON (strings are bytes: content that is not valid UTF-8 passes through).
Status render_chat_template(const std::string& template_source, const nlohmann::json& messages,
                            const ChatTemplateOptions& options, std::string* out);
// The same keeping every object's key order (nlohmann::json sorts keys; a template's tojson and
// items() show the order, as Python's dicts keep it). The JSON-text overload parses this way.
Status render_chat_template(const std::string& template_source, const nlohmann::ordered_json& messages,
                            const ChatTemplateOptions& options, std::string* out);

struct ModelChatTemplate {
  std::string source;     // the template text
  std::string origin;     // where it came from, e.g. "DIR/tokenizer_config.json chat_template"
  std::string bos_token;  // from tokenizer_config.json (a string or {"content": ...}); may be empty
  std::string eos_token;
};

// Reads a model directory's chat template: chat_template.jinja when present, else
// tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
// "default" is used); bos/eos tokens from tokenizer_config.json.
Status read_model_chat_template(const std::string& model_dir, ModelChatTemplate* out);

// A chat template or a conversation file a user names (`what` is the option, e.g. "--template"):
// a regular file only (a FIFO or a device is refused by name, never read until it ends), at most
// 16 MB.
Status read_chat_file(const std::string& what, const std::string& path, std::string* out);

}  // namespace llmq
