// The HTTP API's request bodies and response shapes (OpenAI's where they
// exist), as pure functions: JSON text -> typed request or a one-line error.
// No model, network or file is touched here, so the parsers can be fuzzed
// (tests/fuzz/fuzz_request.cpp) and unit-tested on their own.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tessera::model {
class Tokenizer;
}

namespace tessera::runtime::api {

// What the parsers check sizes against (the model's, and the server's caps).
struct ApiLimits {
  int64_t vocab = 0;           // token ids must be in [0, vocab)
  int64_t max_positions = 0;   // prompt + max_tokens must fit (text models)
  int64_t max_inputs = 64;     // entries of an embeddings/classify batch
  int64_t max_stop = 4;        // stop strings (OpenAI's limit)
  int64_t max_messages = 1024;  // messages of a chat request
};

// A prompt: text (tokenized by the server) or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<int64_t> ids;
};

struct CompletionRequest {
  Prompt prompt;
  int64_t max_tokens = 16;  // OpenAI's default
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;         // an extension: 0 = no filter
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities of the tokens made, each with this many alternatives
  // (0..kMaxTopLogprobs); -1: none. Completions' "logprobs": N, chat's
  // "logprobs": true with "top_logprobs": N.
  int64_t logprobs = -1;
  bool echo = false;  // completions: the answer starts with the prompt (and its logprobs)
  int64_t n = 1;      // choices, generated one after another (1..kMaxChoices)
  // OpenAI's logit_bias: token id -> bias in [-100, 100], added to the
  // logits before sampling (-100 bans the token here).
  std::vector<std::pair<int64_t, float>> logit_bias;
};
// "echo" with "logprobs" keeps every prompt row's logits at once: prompt
// tokens x vocabulary at most this many floats (512 MB).
constexpr int64_t kMaxEchoLogits = int64_t{128} << 20;
// A 400 when a prompt of `tokens` is too long for that.
core::Status check_echo_logits(int64_t tokens, int64_t vocab);
constexpr int64_t kMaxTopLogprobs = 20;
constexpr int64_t kMaxChoices = 16;
// Choice i's sampling seed for a request seeded with `seed`: choice 0 takes
// it as it is (n = 1 draws what it always did), the others their own.
uint64_t choice_seed(uint64_t seed, int64_t i);
// A token's text and bytes for its log-probability: the token decoded alone.
// A token that holds part of a character has no text of its own: it reads
// "bytes:" and its bytes as \xNN ("bytes:\xe2\x80", as OpenAI's API spells
// such tokens), so two of them stay apart as keys of "top_logprobs", and
// `bytes` are its own, not U+FFFD's. "token_id:N" without a tokenizer.
struct LogprobToken {
  std::string text, bytes;
};
LogprobToken logprob_token(const model::Tokenizer* tok, int64_t id);

// /v1/chat/completions: the messages as the chat template takes them
// ({role, content} with content a string, or null for an assistant turn
// that only calls tools; "developer" read as "system"), the tools as data,
// and the sampling fields of a completion (its prompt unused).
// Kept in the client's key order: a template's tojson of tool schemas and
// tool calls renders them as Python's dicts would.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: none
  CompletionRequest sampling;
  bool max_tokens_given = false;  // else: up to the end of the context
};

struct EmbeddingRequest {
  std::vector<Prompt> inputs;
  bool base64 = false;  // encoding_format
};

struct ClassifyRequest {
  std::vector<Prompt> inputs;        // BERT: text or ids
  std::optional<std::string> image;  // ViT: the decoded bytes of a base64 PNG/JPEG
};

// POST /tokenize (llama.cpp's and vLLM's): "content" or "prompt", and
// "add_special" / "add_special_tokens" (false: as /v1/completions encodes a
// text prompt).
struct TokenizeRequest {
  std::string text;
  bool add_special = false;
};

// The HTTP status that answers an error of this code: the request's fault
// (400), no device to serve it now (503), a wait that ran out (504), or ours (500).
int http_status(core::ErrorCode code);

// Unknown fields are ignored; known fields of the wrong type, out of range,
// or missing are errors (the server answers 400).
[[nodiscard]] core::Result<CompletionRequest> parse_completion(std::string_view body, const ApiLimits& limits);
[[nodiscard]] core::Result<ChatRequest> parse_chat(std::string_view body, const ApiLimits& limits);
[[nodiscard]] core::Result<EmbeddingRequest> parse_embedding(std::string_view body, const ApiLimits& limits);
[[nodiscard]] core::Result<ClassifyRequest> parse_classify(std::string_view body, const ApiLimits& limits);
[[nodiscard]] core::Result<TokenizeRequest> parse_tokenize(std::string_view body);
// POST /detokenize: "tokens", a list of ids of the model (may be empty).
[[nodiscard]] core::Result<std::vector<int64_t>> parse_detokenize(std::string_view body, const ApiLimits& limits);

// Standard base64 (padding optional); a "data:...;base64," prefix is skipped.
[[nodiscard]] core::Result<std::string> base64_decode(std::string_view text);
std::string base64_encode(std::string_view bytes);

// OpenAI's error body: {"error": {"message", "type", "code"}}.
nlohmann::json error_body(const std::string& message, const std::string& type);

// The state advanced past `picks` sampled tokens, as model::pick_token
// advances it (one draw of mt19937_64 per pick): a generation resumed after
// a failover samples what the uninterrupted one would have.
uint64_t advance_seed(uint64_t seed, int64_t picks);

// Stop strings over the text produced so far: how much may be sent now (the
// rest could still turn out to start a stop string, or be an incomplete
// UTF-8 character), and whether a stop string ended the text.
struct StopScan {
  size_t sendable = 0;  // bytes of `text` safe to send
  bool stopped = false;  // a stop string was found; text ends at `sendable`
};
StopScan scan_stop(const std::string& text, const std::vector<std::string>& stop, bool final);

// An answer's text as it grows, and what of it may be sent at each step
// (scan_stop). At the end (an end-of-turn token, max_tokens; a deadline is
// an error instead), what was held back is sent, unless a stop string
// ended the text: a held-back "\n" of a "\n\n" that never came
// is part of the answer.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  // Appends a piece; returns what became sendable ("" once stopped).
  std::string add(const std::string& piece);
  // Appends the decoder's last bytes; returns the rest (cut at a stop
  // string they complete; "" once stopped).
  std::string finish(const std::string& tail);
  bool stopped() const { return stopped_; }

 private:
  std::string advance(const std::string& more, bool final);
  std::vector<std::string> stop_;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera::runtime::api
