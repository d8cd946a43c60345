// ChatTemplate: the model's Jinja chat template (model/jinja.h) with the
// variables Hugging Face's apply_chat_template passes.
#include "model/chat_template.h"

#include "core/io.h"
#include "model/jinja.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace tessera::model {

namespace {

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}.
std::string special_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

core::Status check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return core::invalid_argument("messages must be a JSON array of {role, content} objects");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return core::invalid_argument(where + " is not an object");
    if (!m.contains("role") || !m["role"].is_string()) return core::invalid_argument(where + " has no string 'role'");
    if (m.contains("content") && !(m["content"].is_string() || m["content"].is_null() || m["content"].is_array()))
      return core::invalid_argument(where + ".content must be a string, null or an array of parts");
  }
  return core::ok_status();
}

}  // namespace

core::Result<ChatTemplate> ChatTemplate::parse(std::string_view source, std::string bos, std::string eos) {
  auto program = jinja::Template::parse(source);
  if (!program.ok()) return program.status().with_context("chat template");
  ChatTemplate t;
  t.program_ = std::move(program).value();
  t.source_ = std::string(source);
  t.bos_ = std::move(bos);
  t.eos_ = std::move(eos);
  return t;
}

core::Result<ChatTemplate> ChatTemplate::load(const std::string& dir) {
  if (is_gguf_path(dir)) {  // tokenizer.chat_template, with the file's BOS/EOS tokens
    TESSERA_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::open(dir));
    TESSERA_ASSIGN_OR_RETURN(const std::string source, gguf_chat_template(f));
    const nlohmann::json& m = f.metadata();
    auto token = [&](const char* key) -> std::string {
      const nlohmann::json& toks = m.contains("tokenizer.ggml.tokens") ? m["tokenizer.ggml.tokens"] : nlohmann::json();
      if (!m.contains(key) || !m[key].is_number_unsigned() || !toks.is_array()) return "";
      const uint64_t id = m[key].get<uint64_t>();
      return id < toks.size() && toks[id].is_string() ? toks[id].get<std::string>() : "";
    };
    return parse(source, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"));
  }
  nlohmann::json config = nlohmann::json::object();
  const std::string config_path = dir + "/tokenizer_config.json";
  if (core::file_exists(config_path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(config_path));
    config = nlohmann::json::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return core::parse_error(config_path + ": not a JSON object");
  }
  std::string source;
  bool found = false;
  const std::string jinja_path = dir + "/chat_template.jinja";
  if (core::file_exists(jinja_path)) {
    TESSERA_ASSIGN_OR_RETURN(source, core::read_file(jinja_path));
    found = true;
  } else if (config.contains("chat_template")) {
    const auto& ct = config["chat_template"];
    if (ct.is_string()) {
      source = ct.get<std::string>();
      found = true;
    } else if (ct.is_array()) {
      for (const auto& e : ct) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
          source = e["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) return core::not_found(config_path + ": chat_template lists no \"default\" template");
    } else if (!ct.is_null()) {
      return core::parse_error(config_path + ": chat_template must be a string or a list of {name, template}");
    }
  }
  if (!found) return core::not_found("the model in " + dir + " has no chat template (tokenizer_config.json or chat_template.jinja)");
  return parse(source, special_token(config, "bos_token"), special_token(config, "eos_token"));
}

core::Result<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                               const nlohmann::json& extra) const {
  return render_ordered(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt,
                        nlohmann::ordered_json::parse(extra.dump()));
}

core::Result<std::string> ChatTemplate::render_ordered(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                       const nlohmann::ordered_json& extra,
                                                       std::optional<int64_t> now_epoch) const {
  if (!program_) return core::internal_error("chat template not loaded");
  TESSERA_RETURN_IF_ERROR(check_messages(messages));
  if (!extra.is_null() && !extra.is_object()) return core::invalid_argument("chat template variables must be a JSON object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  // As transformers passes them: the special tokens the tokenizer has.
  if (!bos_.empty()) context["bos_token"] = bos_;
  if (!eos_.empty()) context["eos_token"] = eos_;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) context[k] = v;
  jinja::RenderOptions options;
  options.now_epoch = now_epoch;
  auto out = program_->render(context, options);
  if (!out.ok()) return out.status().with_context("chat template");
  return out;
}

}  // namespace tessera::model
