// GPT-2 text generation with a KV cache: one prefill over the prompt, then
// one-token decode steps.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/transformer.h"

namespace tessera::model {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  bool greedy = true;
  int64_t top_k = 0;          // 0: no top-k filter
  float top_p = 1.0f;         // 1: no nucleus filter
  float temperature = 1.0f;
  uint64_t seed = 0;
  // The context (--ctx-size): the positions every KV cache of the generation
  // holds, prompt and new tokens together, allocated up front. 0: the smaller
  // of max_position_embeddings and kDefaultContext.
  int64_t ctx_size = 0;
  core::DType kv_dtype = core::DType::kF32;  // --kv-type: F32 or F16 caches
  int64_t eos_token_id = -2;  // -2: the config's; -1: never stop early
  // Called with each new token (streaming output); may be empty.
  std::function<void(int64_t)> on_token;
  // Added to the logits before each pick (OpenAI's logit_bias: token id,
  // bias); the row on_logits sees is the model's own. -inf bans a token.
  std::vector<std::pair<int64_t, float>> logit_bias;
  // Called just before on_token with the row of logits [vocab] the token
  // was picked from (for its log-probabilities); may be empty.
  std::function<void(const float* logits, int64_t vocab, int64_t token)> on_logits;
  // Asked after each new token, and between the chunks of a chunked
  // prefill (Session's prefill_chunk); true ends the generation there (a
  // stop string, a deadline, a client gone). May be empty.
  std::function<bool()> stop_requested;
  // Positions 0..cached_prefix-1 of the prompt are already in the layers'
  // caches (a prefix cache kept from an earlier generation): the prefill
  // starts at cached_prefix. At most prompt size - 1 (the last row's logits
  // pick the first token). Only generate_with's layers can hold them.
  int64_t cached_prefix = 0;
};

// The cached_prefix a prompt may take from caches that hold `cached`
// (positions 0..size-1): their common prefix, short of the prompt's last
// token, whose row must be computed for its logits.
int64_t reusable_prefix(const std::vector<int64_t>& cached, const std::vector<int64_t>& prompt);

// Rejects options that mean nothing: new tokens < 0, temperature not a
// finite number > 0, top-p outside (0, 1], top-k < 0 (0: no filter).
core::Status validate_generate_options(const GenerateOptions& opts);

// Picks the next token from one row of logits (greedy, or sampled after
// temperature, top-k and top-p filtering). NaN logits are never picked;
// -1 when every logit is NaN.
int64_t pick_token(const float* logits, int64_t vocab, const GenerateOptions& opts, uint64_t* rng_state);

// A token's log-probability under the model's own distribution (the
// log-softmax of the raw logits: no temperature, top-k or top-p), and the
// `top` most likely tokens with theirs, most likely first (ties: lower id
// first). NaN logits count as -inf. A token of no mass gets
// kNoMassLogprob, as OpenAI's API reports one (JSON has no -inf).
struct TokenLogprobs {
  int64_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int64_t, float>> top;
};
constexpr float kNoMassLogprob = -9999.0f;
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int64_t token, int64_t top);

constexpr int64_t kDefaultContext = 4096;
// The context of a generation (see GenerateOptions::ctx_size).
int64_t context_size(const ModelConfig& c, const GenerateOptions& opts);
int64_t context_size(const ModelConfig& c, int64_t ctx_size);  // the same from --ctx-size alone
// What each KV cache of a generation holds: the context, of opts.kv_dtype.
// A prompt longer than it is refused; the generation ends when it is full.
CacheSpec generation_cache(const ModelConfig& c, const GenerateOptions& opts);

// The layers of one chunk: embedded rows x [n, F] at positions pos0..,
// their K/V cached; returns the last layer's output (before ln_f).
using ChunkLayers = std::function<core::Result<core::Tensor>(core::Tensor x, int64_t pos0)>;

// generate()'s loop (checks, embedding, ln_f, head, sampling, stopping) with
// the layers run by `layers`: on one device, or across devices by a
// strategy's decoders, with the same tokens for the same seed.
core::Result<std::vector<int64_t>> generate_with(const Transformer& model, const std::vector<int64_t>& prompt,
                                                 const GenerateOptions& opts, core::ThreadPool* pool,
                                                 const ChunkLayers& layers);

// The same loop with all of a chunk's model work in `logits`: the layers,
// ln_f and the head, returning the logits of the chunk's last row [1, V]
// (continuous batching runs the head on every sequence's row at once).
// An empty tensor (Tensor()) ends the generation there, with no new token: `logits`
// asked opts.stop_requested between two parts of a long prefill.
using ChunkLogits = std::function<core::Result<core::Tensor>(core::Tensor x, int64_t pos0)>;
core::Result<std::vector<int64_t>> generate_logits(const Transformer& model, const std::vector<int64_t>& prompt,
                                                   const GenerateOptions& opts, const ChunkLogits& logits);
// ln_f and the head on a chunk's last layer output y [n, F]: the logits of
// its last row, or of every row (last_row_only false: [n, V]).
core::Result<core::Tensor> chunk_logits(const Transformer& model, core::Tensor y, bool last_row_only,
                                        core::ThreadPool* pool);

// The seed that continues a sampled generation after `tokens` new tokens:
// generate(prompt + those tokens, seed = resume_seed(seed, tokens)) picks
// what the unbroken generation would have picked next (the sampler's state
// advances once per token, whatever the logits). Failover re-prefills this way.
uint64_t resume_seed(uint64_t seed, int64_t tokens);

// Returns prompt + generated ids (stops after EOS, which is kept, or after
// max_new_tokens, or at the model's maximum length).
core::Result<std::vector<int64_t>> generate(const Transformer& model, const std::vector<int64_t>& prompt,
                                            const GenerateOptions& opts, core::ThreadPool* pool);

// generate() on one device whose KV caches outlive each call (`tessera chat`
// on one device): a prompt that continues the tokens the caches hold (a
// chat's next turn) prefills only the rest, with generate()'s tokens.
class CachingGenerator {
 public:
  explicit CachingGenerator(const Transformer& model) : model_(model) {}
  // opts.cached_prefix is set here (reusable_prefix).
  [[nodiscard]] core::Result<std::vector<int64_t>> generate(const std::vector<int64_t>& prompt, GenerateOptions opts,
                                                            core::ThreadPool* pool);
  int64_t last_cached_prefix() const { return last_cached_; }

 private:
  const Transformer& model_;
  std::optional<KvCache> cache_;
  CacheSpec spec_;
  std::vector<int64_t> tokens_;  // what the caches hold (empty after a failed call)
  Workspace ws_;
  int64_t last_cached_ = 0;
};

}  // namespace tessera::model
