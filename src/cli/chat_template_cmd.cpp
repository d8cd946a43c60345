// `tessera render-chat`: a model's chat template rendered for a messages file,
// printed exactly (no newline added). Needs only tokenizer_config.json and/or
// chat_template.jinja in the model folder.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/io.h"
#include "model/chat_template.h"

namespace tessera::cli {

namespace {

struct RenderChatFlags {
  std::string model_dir, messages_file;
  bool no_generation_prompt = false;
};

// One line: a template's message may hold newlines.
std::string one_line(std::string s) {
  for (auto& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

int render_chat(const RenderChatFlags& f) {
  auto tmpl = model::ChatTemplate::load(f.model_dir);
  if (!tmpl.ok()) return fail(one_line(tmpl.status().to_string()));
  auto text = core::read_file(f.messages_file);
  if (!text.ok()) return fail(one_line(text.status().to_string()));
  const auto doc = nlohmann::ordered_json::parse(*text, nullptr, false);
  if (doc.is_discarded()) return fail(f.messages_file + ": not valid JSON");
  // A bare array of messages, or an object {"messages": [...], "tools": [...], ...}.
  nlohmann::ordered_json messages, extra = nlohmann::ordered_json::object();
  if (doc.is_object() && doc.contains("messages")) {
    messages = doc["messages"];
    for (const auto& [k, v] : doc.items())
      if (k != "messages") extra[k] = v;
  } else {
    messages = doc;
  }
  auto out = tmpl->render_ordered(messages, !f.no_generation_prompt, extra);
  if (!out.ok()) return fail(one_line(out.status().to_string()));
  std::fwrite(out->data(), 1, out->size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_render_chat_command(CLI::App& app) {
  auto f = std::make_shared<RenderChatFlags>();
  CLI::App* cmd = app.add_subcommand("render-chat", "render the model's chat template for a messages file (no weights needed)");
  cmd->add_option("--model", f->model_dir, "folder with tokenizer_config.json and/or chat_template.jinja")->required();
  cmd->add_option("--messages", f->messages_file,
                  "JSON file: an array of {role, content}, or {\"messages\": [...], other template variables}")
      ->required();
  cmd->add_flag("--no-generation-prompt", f->no_generation_prompt, "add_generation_prompt=false");
  cmd->callback([f] { throw CLI::RuntimeError(render_chat(*f)); });
}

}  // namespace tessera::cli
