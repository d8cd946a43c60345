#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>

#include "kernels/elementwise.h"

namespace tessera::model {

using core::Result;
using core::Tensor;

core::Status validate_generate_options(const GenerateOptions& o) {
  if (o.max_new_tokens < 0) return core::invalid_argument("the number of new tokens must be >= 0");
  if (!std::isfinite(o.temperature) || !(o.temperature > 0.0f))
    return core::invalid_argument("--temperature must be a finite number > 0");
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) return core::invalid_argument("--top-p must be in (0, 1]");
  if (o.top_k < 0) return core::invalid_argument("--top-k must be >= 0 (0: no top-k filter)");
  return core::ok_status();
}

int64_t pick_token(const float* logits, int64_t vocab, const GenerateOptions& opts, uint64_t* rng_state) {
  // NaN logits are never picked: NaN compares false with everything, which
  // would make the argmax keep a NaN in front and break the sort's ordering.
  if (opts.greedy) {
    int64_t best = -1;
    for (int64_t i = 0; i < vocab; ++i)
      if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best;
  }
  const float t = std::isfinite(opts.temperature) && opts.temperature > 0.0f ? opts.temperature : 1.0f;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) order.push_back(i);
  if (order.empty()) return -1;
  // Any order of the tokens draws from the same distribution, so the draw
  // walks them by id; only top-p needs them from the most likely down (ties:
  // the lower id first), and only as far as the nucleus goes is sorted. (A
  // sort of the whole vocabulary every token took a third of GPT-2's
  // sampled decode.)
  const auto before = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = order.size(), sorted = 0;
  if (opts.top_k > 0 && static_cast<size_t>(opts.top_k) < keep) {
    keep = static_cast<size_t>(opts.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), before);
    order.resize(keep);
    std::sort(order.begin(), order.end());
  }
  auto sort_to = [&](size_t upto) {  // order[0, upto) from the most likely down
    if (upto <= sorted) return;
    // The next stretch: selected in linear time, then sorted; doubling, so
    // a nucleus of the whole vocabulary costs about one sort.
    const size_t to = std::min(keep, std::max({upto, 2 * sorted, size_t{64}}));
    const auto from = order.begin() + static_cast<std::ptrdiff_t>(sorted), end = order.begin() + static_cast<std::ptrdiff_t>(to);
    if (end < order.end()) std::nth_element(from, end, order.end(), before);
    std::sort(from, end, before);
    sorted = to;
  };
  const double mx = logits[*std::min_element(order.begin(), order.end(), before)] / t;
  // Infinite maxima: exp(inf - inf) is NaN. +inf logits share the mass
  // equally; if all are -inf, every kept token is equally likely.
  // Each kept token's weight, by id: computed once, read by the sum, the
  // nucleus and the draw.
  std::vector<double> wt(static_cast<size_t>(vocab));
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double z = logits[order[i]] / t;
    sum += wt[static_cast<size_t>(order[i])] = std::isinf(mx) ? (z == mx ? 1.0 : 0.0) : std::exp(z - mx);
  }
  auto weight = [&](int64_t id) { return wt[static_cast<size_t>(id)]; };
  if (opts.top_p < 1.0f) {
    double cum = 0.0, kept = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      sort_to(i + 1);
      const double w = weight(order[i]);
      kept += w;
      cum += w / sum;
      if (cum >= opts.top_p) { cut = i + 1; break; }
    }
    keep = cut;
    sum = kept;
  }
  std::mt19937_64 rng(*rng_state);
  *rng_state = rng();
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < keep; ++i) {
    const double w = weight(order[i]);
    r -= w;
    if (r <= 0.0 && w > 0.0) return order[i];
  }
  for (size_t i = keep; i-- > 0;)  // rounding left r > 0: the last token with mass
    if (weight(order[i]) > 0.0) return order[i];
  return order[0];
}

TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int64_t token, int64_t top) {
  TokenLogprobs out;
  out.token = token;
  const auto value = [&](int64_t i) { return std::isnan(logits[i]) ? -INFINITY : static_cast<double>(logits[i]); };
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, value(i));
  // log(sum exp(l - mx)) + mx in double; +inf logits share the mass, and a
  // row of -inf has none anywhere.
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double v = value(i);
    sum += std::isinf(mx) ? (v == mx && mx > 0 ? 1.0 : 0.0) : std::exp(v - mx);
  }
  const auto logprob = [&](int64_t i) -> float {
    const double v = value(i);
    if (sum <= 0.0 || v == -INFINITY || (std::isinf(mx) && v != mx)) return kNoMassLogprob;
    const double lp = std::isinf(mx) ? -std::log(sum) : v - mx - std::log(sum);
    return static_cast<float>(std::max(lp, static_cast<double>(kNoMassLogprob)));
  };
  if (token >= 0 && token < vocab) out.logprob = logprob(token);
  const int64_t k = std::clamp<int64_t>(top, 0, vocab);
  if (k > 0) {
    std::vector<int64_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), int64_t{0});
    const auto before = [&](int64_t a, int64_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
    for (int64_t i = 0; i < k; ++i) out.top.emplace_back(ids[static_cast<size_t>(i)], logprob(ids[static_cast<size_t>(i)]));
  }
  return out;
}

uint64_t resume_seed(uint64_t seed, int64_t tokens) {
  for (int64_t i = 0; i < tokens; ++i) seed = std::mt19937_64(seed)();  // as pick_token advances it
  return seed;
}

int64_t context_size(const ModelConfig& c, const GenerateOptions& opts) { return context_size(c, opts.ctx_size); }

int64_t context_size(const ModelConfig& c, int64_t ctx_size) {
  int64_t ctx = ctx_size > 0 ? std::min(ctx_size, c.max_positions) : std::min(c.max_positions, kDefaultContext);
  if (c.sliding_window > 0) ctx = std::min(ctx, c.sliding_window);  // longer is refused (validate_input)
  return ctx;
}

int64_t reusable_prefix(const std::vector<int64_t>& cached, const std::vector<int64_t>& prompt) {
  const auto common = std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end()).first - cached.begin();
  return std::max<int64_t>(0, std::min<int64_t>(common, static_cast<int64_t>(prompt.size()) - 1));
}

CacheSpec generation_cache(const ModelConfig& c, const GenerateOptions& opts) { return {context_size(c, opts), opts.kv_dtype}; }

Result<Tensor> chunk_logits(const Transformer& model, Tensor y, bool last_row_only, core::ThreadPool* pool) {
  model.finish_hidden(y, pool);
  ForwardOutput out;
  TESSERA_RETURN_IF_ERROR(model.head(y, last_row_only, &out, pool));
  return out.logits;
}

Result<std::vector<int64_t>> generate_with(const Transformer& model, const std::vector<int64_t>& prompt,
                                           const GenerateOptions& opts, core::ThreadPool* pool, const ChunkLayers& layers) {
  return generate_logits(model, prompt, opts, [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    TESSERA_ASSIGN_OR_RETURN(Tensor y, layers(std::move(x), pos0));
    return chunk_logits(model, std::move(y), true, pool);
  });
}

Result<std::vector<int64_t>> generate_logits(const Transformer& model, const std::vector<int64_t>& prompt,
                                             const GenerateOptions& opts, const ChunkLogits& logits) {
  const ModelConfig& c = model.config();
  if (!c.causal_lm())
    return core::invalid_argument("generation needs a causal LM with its head (GPT2LMHeadModel, LlamaForCausalLM, ...)");
  TESSERA_RETURN_IF_ERROR(validate_generate_options(opts));
  ModelInput in{prompt, {}, {}};
  TESSERA_RETURN_IF_ERROR(model.validate_input(in));
  if (opts.ctx_size < 0 || opts.ctx_size > c.max_positions)
    return core::out_of_range("--ctx-size " + std::to_string(opts.ctx_size) + " outside [1, max_position_embeddings = " +
                              std::to_string(c.max_positions) + "]");
  const int64_t ctx = context_size(c, opts);
  if (static_cast<int64_t>(prompt.size()) > ctx)
    return core::out_of_range("a prompt of " + std::to_string(prompt.size()) + " tokens is longer than the context of " +
                              std::to_string(ctx) + " positions (--ctx-size)");
  // -2: every end-of-generation id of the model (config.json and generation_config.json).
  const auto ends = [&](int64_t id) {
    if (opts.eos_token_id == -2) return c.ends_generation(id) || id == c.eos_token_id;
    return id == opts.eos_token_id;
  };
  for (const auto& [id, bias] : opts.logit_bias)
    if (id < 0 || id >= c.vocab || std::isnan(bias))
      return core::invalid_argument("a logit bias for token " + std::to_string(id) + " (the vocabulary has " +
                                    std::to_string(c.vocab) + "), or a NaN bias");
  if (opts.cached_prefix < 0 || opts.cached_prefix >= static_cast<int64_t>(prompt.size()))
    return core::invalid_argument("a cached prefix of " + std::to_string(opts.cached_prefix) + " positions for a prompt of " +
                                  std::to_string(prompt.size()));
  std::vector<int64_t> seq = prompt;
  uint64_t rng_state = opts.seed;
  int64_t pos = opts.cached_prefix;
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    if (static_cast<int64_t>(seq.size()) >= ctx) break;  // the context is full
    ModelInput chunk{{seq.begin() + pos, seq.end()}, {}, {}};
    TESSERA_ASSIGN_OR_RETURN(Tensor x, model.embed(chunk, pos));
    TESSERA_ASSIGN_OR_RETURN(const Tensor row, logits(std::move(x), pos));
    if (row.empty()) break;  // stopped between two chunks of the prefill
    if (row.numel() < c.vocab) return core::internal_error("a chunk gave " + std::to_string(row.numel()) + " logits");
    pos = static_cast<int64_t>(seq.size());
    const float* picked_from = row.f32();
    std::vector<float> biased;
    if (!opts.logit_bias.empty()) {
      biased.assign(row.f32(), row.f32() + c.vocab);
      for (const auto& [id, bias] : opts.logit_bias)
        if (id >= 0 && id < c.vocab) biased[static_cast<size_t>(id)] += bias;
      picked_from = biased.data();
    }
    const int64_t next = pick_token(picked_from, c.vocab, opts, &rng_state);
    if (next < 0) return core::internal_error("the model produced only NaN logits at position " + std::to_string(pos));
    seq.push_back(next);
    if (opts.on_logits) opts.on_logits(row.f32(), c.vocab, next);
    if (opts.on_token) opts.on_token(next);
    if (ends(next) || (opts.stop_requested && opts.stop_requested())) break;
  }
  return seq;
}

Result<std::vector<int64_t>> generate(const Transformer& model, const std::vector<int64_t>& prompt,
                                      const GenerateOptions& opts, core::ThreadPool* pool) {
  if (opts.cached_prefix != 0) return core::invalid_argument("model::generate keeps no cache between generations");
  std::optional<KvCache> cache;
  Workspace ws;
  const CacheSpec spec = generation_cache(model.config(), opts);
  return generate_with(model, prompt, opts, pool, [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    if (!cache) {
      TESSERA_ASSIGN_OR_RETURN(KvCache c, model.make_cache(spec.positions, spec.dtype));
      cache = std::move(c);
    }
    for (int64_t l = 0; l < model.config().layers; ++l) model.layer(l, x, pos0, &*cache, ws, pool);
    return x;
  });
}

Result<std::vector<int64_t>> CachingGenerator::generate(const std::vector<int64_t>& prompt, GenerateOptions opts,
                                                       core::ThreadPool* pool) {
  const CacheSpec spec = generation_cache(model_.config(), opts);
  if (!cache_ || spec.positions != spec_.positions || spec.dtype != spec_.dtype) {
    cache_.reset();  // the old caches go before the new ones are allocated
    TESSERA_ASSIGN_OR_RETURN(KvCache c, model_.make_cache(spec.positions, spec.dtype));
    cache_ = std::move(c);
    spec_ = spec;
    tokens_.clear();
  }
  opts.cached_prefix = last_cached_ = reusable_prefix(tokens_, prompt);
  tokens_.clear();  // valid again only when this call succeeds
  int64_t processed = 0;
  auto seq = generate_with(model_, prompt, opts, pool, [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    for (int64_t l = 0; l < model_.config().layers; ++l) model_.layer(l, x, pos0, &*cache_, ws_, pool);
    processed = pos0 + x.dim(0);
    return x;
  });
  if (seq.ok()) tokens_.assign(seq->begin(), seq->begin() + processed);
  return seq;
}

}  // namespace tessera::model
