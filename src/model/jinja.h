// A small Jinja interpreter for chat templates: a lexer (with the whitespace
// control Hugging Face renders with: trim_blocks and lstrip_blocks on, one
// trailing newline dropped), a parser to an AST, and an evaluator over its own
// value type. It covers what real chat templates use (see chat_template.h);
// a tag, filter, test, method or function outside that set is a parse-time
// error naming it, so an unsupported template never renders a wrong prompt.
//
// Semantics follow Python Jinja as transformers runs it (sandboxed, default
// Undefined: falsy, renders as empty, attribute access on it stays
// undefined), with @huggingface/jinja as the reference renderer in the tests.
// Evaluation is bounded (steps, output size, call depth, value nesting), so a
// hostile template fails with an error instead of hanging or overflowing the
// stack.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera::model::jinja {

struct Limits {
  int64_t max_steps = 2'000'000;           // expression and statement evaluations
  int64_t max_output_bytes = 64ll << 20;   // the rendered text, and any string built
  int64_t max_items = 1'000'000;           // elements of a list built by the template
  int max_call_depth = 100;                // nested macro calls
  int max_nesting = 200;                   // syntax nesting (parser) and value nesting
};

struct RenderOptions {
  // strftime_now() renders this time (seconds since the epoch, UTC) instead
  // of the clock: for tests.
  std::optional<int64_t> now_epoch;
  Limits limits;
};

struct Node;

class Template {
 public:
  // Parse errors: parse_error / unimplemented with the line and what is wrong.
  [[nodiscard]] static core::Result<std::shared_ptr<const Template>> parse(std::string_view source,
                                                                           const Limits& limits = {});
  // `context`: a JSON object whose members are the template's variables.
  // raise_exception(msg) gives invalid_argument carrying msg.
  [[nodiscard]] core::Result<std::string> render(const nlohmann::ordered_json& context,
                                                 const RenderOptions& options = {}) const;

  Template();
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace tessera::model::jinja
