// llmq template: the exact prompt text a model's chat template makes of a conversation, as
// transformers' apply_chat_template would render it (the text the server feeds the model).
#include <cstdio>

#include "commands.hpp"
#include "llmq/chat_template.hpp"

namespace llmq::cli {
namespace {

struct TemplateArgs {
  std::string model;
  std::string template_file;
  std::string messages;
  std::string date;
  std::string bos, eos;
  bool bos_given = false, eos_given = false;
  bool no_generation_prompt = false;
};

int run(const TemplateArgs& a) {
  if (a.model.empty() == a.template_file.empty())
    return fail(invalid_argument("give one of --model DIR or --template FILE"));
  ModelChatTemplate tmpl;
  if (!a.model.empty()) {
    if (Status st = read_model_chat_template(a.model, &tmpl); !st.ok()) return fail(st);
  } else if (Status st = read_chat_file("--template", a.template_file, &tmpl.source); !st.ok()) {
    return fail(st);
  }
  std::string messages;
  if (Status st = read_chat_file("--messages", a.messages, &messages); !st.ok()) return fail(st);
  ChatTemplateOptions options;
  options.add_generation_prompt = !a.no_generation_prompt;
  options.date = a.date;
  options.bos_token = a.bos_given ? a.bos : tmpl.bos_token;
  options.eos_token = a.eos_given ? a.eos : tmpl.eos_token;
  std::string out;
  if (Status st = render_chat_template(tmpl.source, messages, options, &out); !st.ok()) return fail(st);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void add_template_command(CLI::App& app, std::vector<Command>* commands) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* cmd = app.add_subcommand("template", "print the prompt a model's chat template makes of a conversation");
  cmd->add_option("--model", args->model,
                  "a Hugging Face model directory (chat_template.jinja, or tokenizer_config.json's chat_template)");
  cmd->add_option("--template", args->template_file, "a chat template file instead of --model");
  cmd->add_option("--messages", args->messages,
                  "a JSON file: an array of {role, content} messages, or an object with \"messages\" (and \"tools\")")
      ->required();
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt, "render with add_generation_prompt=false");
  cmd->add_option("--date", args->date, "YYYY-MM-DD: the day strftime_now() formats (default: today)");
  cmd->add_option("--bos", args->bos, "bos_token (default: tokenizer_config.json's)")
      ->each([args](const std::string&) { args->bos_given = true; });
  cmd->add_option("--eos", args->eos, "eos_token (default: tokenizer_config.json's)")
      ->each([args](const std::string&) { args->eos_given = true; });
  commands->push_back({cmd, [args] { return run(*args); }});
}

}  // namespace llmq::cli
