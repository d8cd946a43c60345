#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/elementwise.h"

namespace tessera::model {

using core::Result;
using core::Tensor;

int64_t pick_token(const float* logits, int64_t vocab, const GenerateOptions& opts, uint64_t* rng_state) {
  if (opts.greedy) return kernels::argmax_f32(logits, vocab);
  const float t = opts.temperature > 0.0f ? opts.temperature : 1.0f;
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (opts.top_k > 0) keep = std::min(keep, static_cast<size_t>(opts.top_k));
  std::vector<double> p(keep);
  const double mx = logits[order[0]] / t;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(logits[order[i]] / t - mx);
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
    if (r <= 0.0) return order[i];
  }
  return order[keep - 1];
}

Result<std::vector<int64_t>> generate(const Transformer& model, const std::vector<int64_t>& prompt,
                                      const GenerateOptions& opts, core::ThreadPool* pool) {
  const ModelConfig& c = model.config();
  if (c.family != Family::kGpt2 || c.head != HeadKind::kLmHead)
    return core::invalid_argument("generation needs a GPT-2 model with an LM head (GPT2LMHeadModel)");
  if (opts.max_new_tokens < 0) return core::invalid_argument("max_new_tokens must be >= 0");
  ModelInput in{prompt, {}, {}};
  TESSERA_RETURN_IF_ERROR(model.validate_input(in));
  const int64_t eos = opts.eos_token_id == -2 ? c.eos_token_id : opts.eos_token_id;
  std::vector<int64_t> seq = prompt;
  KvCache cache = model.make_cache();
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
    seq.push_back(next);
    if (opts.on_token) opts.on_token(next);
    if (next == eos) break;
  }
  return seq;
}

}  // namespace tessera::model
