// What `tessera serve` parses from any HTTP client: the bodies of
// /v1/completions, /v1/embeddings and /v1/classify (the first byte picks
// the parser; /detokenize's and /tokenize's read the same bytes as the
// last two), base64 and the stop-string scan over what the parse left.
#include <cmath>

#include "fuzz_util.h"
#include "runtime/serve_api.h"

namespace api = tessera::runtime::api;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  if (size == 0) return 0;
  const std::string body = tessera::fuzz::text(data + 1, size - 1);
  const api::ApiLimits limits{512, 128, 8, 4};
  switch (data[0] % 4) {
    case 0: {
      auto r = api::parse_completion(body, limits);
      if (r.ok()) {
        if (r->max_tokens < 0 || r->max_tokens > limits.max_positions || r->stop.size() > 4) __builtin_trap();
        for (int64_t id : r->prompt.ids)
          if (id < 0 || id >= limits.vocab) __builtin_trap();
        if (!r->prompt.ids.empty() && static_cast<int64_t>(r->prompt.ids.size()) + r->max_tokens > limits.max_positions)
          __builtin_trap();
        if (r->logprobs < -1 || r->logprobs > api::kMaxTopLogprobs || r->n < 1 || r->n > api::kMaxChoices) __builtin_trap();
        for (const auto& [id, bias] : r->logit_bias)
          if (id < 0 || id >= limits.vocab || !(bias <= 100.0f) || (bias < -100.0f && !std::isinf(bias))) __builtin_trap();
        const std::string text = r->prompt.text.value_or("");
        const api::StopScan s = api::scan_stop(text, r->stop, data[0] & 4);
        if (s.sendable > text.size()) __builtin_trap();
      }
      break;
    }
    case 1: {
      auto r = api::parse_embedding(body, limits);
      if (r.ok() && (r->inputs.empty() || static_cast<int64_t>(r->inputs.size()) > limits.max_inputs)) __builtin_trap();
      auto d = api::parse_detokenize(body, limits);  // the same bytes as /detokenize's body
      if (d.ok())
        for (int64_t id : *d)
          if (id < 0 || id >= limits.vocab) __builtin_trap();
      break;
    }
    case 2: {
      auto r = api::parse_classify(body, limits);
      if (r.ok() && r->image && api::base64_decode(api::base64_encode(*r->image)).value() != *r->image) __builtin_trap();
      (void)api::parse_tokenize(body);  // the same bytes as /tokenize's body
      break;
    }
    default: {
      auto d = api::base64_decode(body);
      if (d.ok() && api::base64_decode(api::base64_encode(*d)).value() != *d) __builtin_trap();
      break;
    }
  }
  return 0;
}
