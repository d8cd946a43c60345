// A model's chat template: the Jinja source from tokenizer_config.json's
// `chat_template` (a string, or a list of {name, template} where "default"
// is taken) or from chat_template.jinja, rendered by the project's own Jinja
// interpreter (no Debian package offers one for C++). A construct the
// interpreter does not support is an error at load time naming it, never a
// wrong prompt.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera::model {

namespace jinja {
class Template;  // the parsed program (model/jinja.h)
}

class ChatTemplate {
 public:
  // From <dir>: tokenizer_config.json (chat_template, bos_token, eos_token:
  // strings or {"content": ...} objects) and chat_template.jinja, which wins
  // when present. not_found when the model has no template.
  [[nodiscard]] static core::Result<ChatTemplate> load(const std::string& dir);
  // From the Jinja source; `bos`/`eos` are the special tokens the template
  // may name (bos_token, eos_token).
  [[nodiscard]] static core::Result<ChatTemplate> parse(std::string_view source, std::string bos, std::string eos);

  // The prompt for OpenAI-style `messages` (an array of {"role", "content"}
  // objects; content a string or null), exactly as Hugging Face's
  // apply_chat_template(tokenize=False) renders it. `extra` adds variables
  // (e.g. "tools"); raise_exception in the template is an error carrying its
  // message.
  [[nodiscard]] core::Result<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                                                 const nlohmann::json& extra = nlohmann::json::object()) const;

  // The same with key order kept (tool schemas rendered with tojson keep the
  // caller's order, as Python's dicts do); `now_epoch` fixes strftime_now()
  // (seconds since the epoch, rendered in UTC) for tests.
  [[nodiscard]] core::Result<std::string> render_ordered(const nlohmann::ordered_json& messages,
                                                         bool add_generation_prompt,
                                                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                                         std::optional<int64_t> now_epoch = std::nullopt) const;

  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  const std::string& source() const { return source_; }

 private:
  std::shared_ptr<const jinja::Template> program_;
  std::string source_, bos_, eos_;
};

}  // namespace tessera::model
