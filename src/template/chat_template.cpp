// The chat-template API (include/llmq/chat_template.hpp): the context transformers'
// apply_chat_template passes (messages, tools=None, documents=None, add_generation_prompt,
// bos_token, eos_token, raise_exception, strftime_now), reading a model directory's template, and
// the one place where template exceptions become a Status.
#include "llmq/chat_template.hpp"

#include <ctime>
#include <new>

#include "model/checkpoint/input_file.hpp"
#include "template/eval.hpp"
#include "template/lexer.hpp"
#include "template/parser.hpp"

namespace llmq {
namespace tmpl {
namespace {

const char* const kMonths[] = {"January", "February", "March", "April", "May", "June", "July",
                               "August", "September", "October", "November", "December"};
const char* const kDays[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }
int days_in_month(int y, int m) {
  static const int kDaysIn[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && leap(y) ? 29 : kDaysIn[m - 1];
}
int weekday(int y, int m, int d) {  // 0 = Sunday (Sakamoto's method)
  static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
  if (m < 3) y -= 1;
  return (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7;
}

std::string pad(int v, int width, char fill = '0') {
  std::string s = std::to_string(v);
  while (static_cast<int>(s.size()) < width) s.insert(s.begin(), fill);
  return s;
}

}  // namespace

std::string format_date(const std::string& fmt, int year, int month, int day) {
  std::string out;
  int yday = day;
  for (int m = 1; m < month; ++m) yday += days_in_month(year, m);
  const int wd = weekday(year, month, day);
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%' || k + 1 == fmt.size()) { out += fmt[k]; continue; }
    char c = fmt[++k];
    const bool no_pad = c == '-' && k + 1 < fmt.size();  // glibc's %-d, which Python passes through
    if (no_pad) c = fmt[++k];
    auto num = [&](int v, int width) { out += no_pad ? std::to_string(v) : pad(v, width); };
    switch (c) {
      case 'd': num(day, 2); break;
      case 'e': out += no_pad ? std::to_string(day) : pad(day, 2, ' '); break;
      case 'm': num(month, 2); break;
      case 'Y': out += std::to_string(year); break;
      case 'y': num(year % 100, 2); break;
      case 'j': num(yday, 3); break;
      case 'H': case 'M': case 'S': num(0, 2); break;  // strftime_now is asked about midnight
      case 'I': num(12, 2); break;
      case 'p': out += "AM"; break;
      case 'b': case 'h': out += std::string(kMonths[month - 1]).substr(0, 3); break;
      case 'B': out += kMonths[month - 1]; break;
      case 'a': out += std::string(kDays[wd]).substr(0, 3); break;
      case 'A': out += kDays[wd]; break;
      case 'w': out += std::to_string(wd); break;
      case 'u': out += std::to_string(wd == 0 ? 7 : wd); break;
      case 'F': out += std::to_string(year) + "-" + pad(month, 2) + "-" + pad(day, 2); break;
      case '%': out += '%'; break;
      default: throw TemplateError(std::string("strftime_now: unsupported format code %") + c);
    }
  }
  return out;
}

}  // namespace tmpl

namespace {

Status parse_date(const std::string& date, tmpl::EvalLimits* limits) {
  if (date.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    limits->date_year = local.tm_year + 1900;
    limits->date_month = local.tm_mon + 1;
    limits->date_day = local.tm_mday;
    return Status::ok_status();
  }
  int y = 0, m = 0, d = 0;
  char tail = 0;
  if (date.size() != 10 || std::sscanf(date.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || y < 1 || m < 1 ||
      m > 12 || d < 1 || d > tmpl::days_in_month(y, m))
    return invalid_argument("date: '" + date + "' is not a YYYY-MM-DD day");
  limits->date_year = y;
  limits->date_month = m;
  limits->date_day = d;
  return Status::ok_status();
}

template <typename Json>
Status render_value(const std::string& source, const Json& messages, const ChatTemplateOptions& options,
                    std::string* out) {
  if (options.max_nesting < 1 || options.max_loop_iterations < 0 || options.max_output_bytes < 0 || options.max_work < 0)
    return invalid_argument("chat template: limits must be positive");
  tmpl::EvalLimits limits;
  limits.max_nesting = options.max_nesting;
  limits.max_loop_iterations = options.max_loop_iterations;
  limits.max_output_bytes = options.max_output_bytes;
  limits.max_work = options.max_work;
  LLMQ_RETURN_IF_ERROR(parse_date(options.date, &limits));
  tmpl::Frame root;
  auto& vars = root.vars;
  for (const char* fn : {"raise_exception", "strftime_now", "namespace", "range"}) {
    tmpl::Value f;
    f.kind = tmpl::Kind::kBuiltin;
    f.s = fn;
    vars[fn] = f;
  }
  vars["tools"] = tmpl::Value::none();
  vars["documents"] = tmpl::Value::none();
  try {  // from_json refuses values nested past kMaxValueDepth
    if (messages.is_array()) {
      vars["messages"] = tmpl::from_json(messages);
    } else if (messages.is_object() && messages.contains("messages") && messages["messages"].is_array()) {
      for (auto it = messages.begin(); it != messages.end(); ++it) vars[it.key()] = tmpl::from_json(it.value());
    } else {
      return invalid_argument("messages: expected a JSON array of messages or an object with \"messages\"");
    }
    if (!options.extra_context.is_object()) return invalid_argument("chat template: extra_context must be an object");
    for (auto it = options.extra_context.begin(); it != options.extra_context.end(); ++it)
      vars[it.key()] = tmpl::from_json(it.value());
  } catch (const tmpl::TemplateError& e) {
    return invalid_argument(std::string("messages: ") + e.what());
  }
  vars["add_generation_prompt"] = tmpl::Value::boolean(options.add_generation_prompt);
  vars["bos_token"] = tmpl::Value::string(options.bos_token);
  vars["eos_token"] = tmpl::Value::string(options.eos_token);
  try {
    const std::vector<tmpl::Token> tokens = tmpl::lex_template(source);
    tmpl::ParseLimits parse_limits;
    parse_limits.max_nesting = options.max_nesting;
    const tmpl::Body body = tmpl::parse_template(tokens, parse_limits);
    std::string text;
    tmpl::Evaluator(limits, &root).render(body, &text);
    *out = std::move(text);
    return Status::ok_status();
  } catch (const tmpl::TemplateError& e) {
    const std::string where = e.line > 0 ? "chat template line " + std::to_string(e.line) + " column " +
                                               std::to_string(e.col) + ": " : "chat template: ";
    if (e.from_raise_exception) return invalid_argument(where + "raise_exception: " + e.what());
    return invalid_argument(where + e.what());
  } catch (const std::bad_alloc&) {
    return {StatusCode::kResourceExhausted, "chat template: out of memory"};
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, std::string("chat template: ") + e.what()};
  }
}

// A side file of the model directory: absent is "none"; present, it must be a regular file of at
// most kMaxConfigJsonBytes (a FIFO or a device is refused by name, never read until it ends).
Status read_side_file(const std::string& path, bool* present, std::string* out) {
  *present = path_present(path);
  if (!*present) return Status::ok_status();
  return read_input_file("chat template", path, kMaxConfigJsonBytes, out);
}

std::string token_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

}  // namespace

Status render_chat_template(const std::string& template_source, const nlohmann::json& messages,
                            const ChatTemplateOptions& options, std::string* out) {
  if (!out) return invalid_argument("render_chat_template: out is null");
  return render_value(template_source, messages, options, out);
}

Status render_chat_template(const std::string& template_source, const nlohmann::ordered_json& messages,
                            const ChatTemplateOptions& options, std::string* out) {
  if (!out) return invalid_argument("render_chat_template: out is null");
  return render_value(template_source, messages, options, out);
}

Status render_chat_template(const std::string& template_source, const std::string& messages_json,
                            const ChatTemplateOptions& options, std::string* out) {
  nlohmann::ordered_json parsed;  // the keys in the order written, as Python's json.loads keeps them
  LLMQ_RETURN_IF_ERROR(parse_json_text("messages", messages_json, &parsed));  // nesting capped before parsing
  if (!out) return invalid_argument("render_chat_template: out is null");
  return render_value(template_source, parsed, options, out);
}

Status read_model_chat_template(const std::string& model_dir, ModelChatTemplate* out) {
  if (!out) return invalid_argument("read_model_chat_template: out is null");
  *out = ModelChatTemplate{};
  const std::string config_path = model_dir + "/tokenizer_config.json";
  nlohmann::json config;
  std::string text;
  bool present = false;
  LLMQ_RETURN_IF_ERROR(read_side_file(config_path, &present, &text));
  if (present) {
    LLMQ_RETURN_IF_ERROR(parse_json_text(config_path, text, &config));
    if (!config.is_object()) return invalid_argument(config_path + ": not a JSON object");
    if (config.contains("bos_token")) out->bos_token = token_text(config["bos_token"]);
    if (config.contains("eos_token")) out->eos_token = token_text(config["eos_token"]);
  }
  // transformers 5 prefers chat_template.jinja, the file it writes beside tokenizer_config.json.
  LLMQ_RETURN_IF_ERROR(read_side_file(model_dir + "/chat_template.jinja", &present, &out->source));
  if (present) {
    out->origin = model_dir + "/chat_template.jinja";
    return Status::ok_status();
  }
  if (config.is_object() && config.contains("chat_template")) {
    const nlohmann::json& ct = config["chat_template"];
    if (ct.is_string()) {
      out->source = ct.get<std::string>();
      out->origin = config_path + " chat_template";
      return Status::ok_status();
    }
    if (ct.is_array()) {
      for (const auto& entry : ct)
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          out->source = entry["template"].get<std::string>();
          out->origin = config_path + " chat_template (default)";
          return Status::ok_status();
        }
      return invalid_argument(config_path + ": chat_template is a list without a \"default\" template");
    }
    return invalid_argument(config_path + ": chat_template is neither a string nor a list of {name, template}");
  }
  return invalid_argument(model_dir + ": no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template)");
}

Status read_chat_file(const std::string& what, const std::string& path, std::string* out) {
  if (!out) return invalid_argument("read_chat_file: out is null");
  return read_input_file(what, path, kMaxConfigJsonBytes, out);
}

}  // namespace llmq
