// Chat templates: arbitrary Jinja source is parsed; whatever parses is
// rendered against a fixed conversation (with tools). Parse and render errors
// are fine; crashes, hangs and unbounded memory are not (see jinja.h Limits).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "  Hi <think> {{ x }} 你好 😀 "},
    {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": null}
  ])");
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
  })");
  auto t = tessera::model::ChatTemplate::parse(tessera::fuzz::text(data, size), "<s>", "</s>");
  if (!t.ok()) return 0;
  (void)t->render_ordered(messages, true, extra, 0);
  (void)t->render_ordered(messages, false, extra, 0);
  return 0;
}
