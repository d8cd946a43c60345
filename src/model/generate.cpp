#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (opts.top_k > 0) keep = std::min(keep, static_cast<size_t>(opts.top_k));
  std::vector<double> p(keep);
  const double mx = logits[order[0]] / t;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double z = logits[order[i]] / t;
    // Infinite maxima: exp(inf - inf) is NaN. +inf logits share the mass
    // equally; if all are -inf, every kept token is equally likely.
    double w;
    if (std::isinf(mx)) w = z == mx ? 1.0 : 0.0;
    else w = std::exp(z - mx);
    sum += p[i] = w;
  }
  if (opts.top_p < 1.0f) {
    double cum = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= opts.top_p) { cut = i + 1; break; }
    }
    keep = cut;
    p.resize(keep);
    sum = std::accumulate(p.begin(), p.end(), 0.0);
  }
  std::mt19937_64 rng(*rng_state);
  *rng_state = rng();
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r <= 0.0 && p[i] > 0.0) return order[i];
  }
  for (size_t i = keep; i-- > 0;)  // rounding left r > 0: the last token with mass
    if (p[i] > 0.0) return order[i];
  return order[0];
}

Result<std::vector<int64_t>> generate(const Transformer& model, const std::vector<int64_t>& prompt,
                                      const GenerateOptions& opts, core::ThreadPool* pool) {
  const ModelConfig& c = model.config();
  if (c.family != Family::kGpt2 || c.head != HeadKind::kLmHead)
    return core::invalid_argument("generation needs a GPT-2 model with an LM head (GPT2LMHeadModel)");
  TESSERA_RETURN_IF_ERROR(validate_generate_options(opts));
  ModelInput in{prompt, {}, {}};
  TESSERA_RETURN_IF_ERROR(model.validate_input(in));
  const int64_t eos = opts.eos_token_id == -2 ? c.eos_token_id : opts.eos_token_id;
  std::vector<int64_t> seq = prompt;
  // Sized by this request, not by the model's maximum length.
  const int64_t positions =
      std::min<int64_t>(c.max_positions, static_cast<int64_t>(prompt.size()) +
                                             std::clamp<int64_t>(opts.max_new_tokens, 1, c.max_positions));
  TESSERA_ASSIGN_OR_RETURN(KvCache cache, model.make_cache(positions));
  Workspace ws;
  uint64_t rng_state = opts.seed;
  int64_t pos = 0;
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    if (static_cast<int64_t>(seq.size()) >= c.max_positions) break;
    ModelInput chunk{{seq.begin() + pos, seq.end()}, {}, {}};
    TESSERA_ASSIGN_OR_RETURN(Tensor x, model.embed(chunk, pos));
    for (int64_t l = 0; l < c.layers; ++l) model.layer(l, x, pos, &cache, ws, pool);
    model.finish_hidden(x, pool);
    ForwardOutput out;
    TESSERA_RETURN_IF_ERROR(model.head(x, true, &out, pool));
    pos = static_cast<int64_t>(seq.size());
    const int64_t next = pick_token(out.logits.f32(), c.vocab, opts, &rng_state);
    if (next < 0) return core::internal_error("the model produced only NaN logits at position " + std::to_string(pos));
    seq.push_back(next);
    if (opts.on_token) opts.on_token(next);
    if (next == eos || (opts.stop_requested && opts.stop_requested())) break;
  }
  return seq;
}

}  // namespace tessera::model
