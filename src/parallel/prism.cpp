// PRISM's layer loop. The terminal scatters each device its rows X_p and the
// means Z_q of every other partition (one message each); per layer a device
// projects Q from its rows and K, V from [X_p; Z_q, q != p], runs count-scaled
// attention and the rest of the layer on its rows, then AllGathers the means
// of its output (L_p x F). The last layer's rows go to the terminal.
//
// The means stand for rows of the layer's input (the previous layer's
// output), so everything a layer does to a row before attention (LN1 for
// GPT-2 and ViT) is applied to a mean as to a row; projections are affine, so
// the K/V biases apply to a mean as to a row too.
#include "parallel/prism.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/gemm.h"
#include "kernels/weighted_attention.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

int64_t prism_segment_count(int64_t rows, double rate, int64_t segments) {
  if (rows <= 0) return 0;
  if (rate > 0.0) return std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(rows) / rate)));
  return std::clamp<int64_t>(segments, 1, rows);
}

std::vector<Range> prism_segments(int64_t rows, int64_t l) {
  std::vector<Range> out;
  if (rows <= 0 || l <= 0) return out;
  l = std::min(l, rows);
  const int64_t s = rows / l;
  for (int64_t i = 0; i < l; ++i) out.push_back({i * s, i + 1 == l ? rows : (i + 1) * s});
  return out;
}

int64_t PrismLayout::total_means() const { return std::accumulate(means.begin(), means.end(), int64_t{0}); }

int64_t PrismLayout::key_rows(int p) const {
  const int64_t own = rows[static_cast<size_t>(p)].size();
  return own == 0 ? 0 : own + total_means() - means[static_cast<size_t>(p)];  // no queries, no keys
}

PrismLayout prism_layout(const Plan& plan, int64_t n) {
  PrismLayout lay;
  lay.rows = split_by_ratio(n, plan.ratios);
  for (const Range& r : lay.rows) {
    const int64_t l = prism_segment_count(r.size(), plan.prism_rate, plan.prism_segments);
    lay.segments.push_back(prism_segments(r.size(), l));
    lay.means.push_back(l);
  }
  return lay;
}

void segment_means_f32(const float* x, int64_t cols, const std::vector<Range>& segments, float* out) {
  for (size_t s = 0; s < segments.size(); ++s) {
    const Range seg = segments[s];
    TESSERA_CHECK(seg.size() > 0);
    float* o = out + static_cast<int64_t>(s) * cols;
    std::memcpy(o, x + seg.begin * cols, static_cast<size_t>(cols) * sizeof(float));
    for (int64_t r = seg.begin + 1; r < seg.end; ++r)
      for (int64_t c = 0; c < cols; ++c) o[c] += x[r * cols + c];
    // Division rather than a reciprocal: a one-row segment stays bit-exact.
    const float count = static_cast<float>(seg.size());
    if (seg.size() > 1)
      for (int64_t c = 0; c < cols; ++c) o[c] /= count;
  }
}

double layer_gemm_flops(int64_t rows, int64_t key_rows, int64_t hidden, int64_t intermediate) {
  const double p = static_cast<double>(rows), k = static_cast<double>(key_rows), f = static_cast<double>(hidden);
  const double q = 2 * p * f * f, kv = 4 * k * f * f, attn = 4 * p * k * f, out = 2 * p * f * f;
  const double ffn = 4 * p * f * static_cast<double>(intermediate);
  return q + kv + attn + out + ffn;
}

std::vector<double> layer_flops_per_device(const Plan& plan, const model::ModelConfig& c, int64_t n) {
  const int k = plan.world;
  const int64_t F = c.hidden, I = c.intermediate, layers = c.layers;
  const double f = static_cast<double>(F);
  std::vector<double> out(static_cast<size_t>(k), 0.0);
  const auto rows = split_by_ratio(n, plan.ratios);
  for (int d = 0; d < k; ++d) {
    const int64_t p = rows[static_cast<size_t>(d)].size();
    const double pd = static_cast<double>(p), nd = static_cast<double>(n);
    double per_layer = 0.0;
    int64_t layers_here = layers;
    switch (plan.strategy) {
      case Strategy::kSingle: per_layer = layer_gemm_flops(n, n, F, I); break;
      case Strategy::kSp:  // K, V of own rows only; scores over all n
        per_layer = 8 * pd * f * f + 4 * pd * nd * f + 4 * pd * f * static_cast<double>(I);
        break;
      case Strategy::kVoltage:
        if (plan.adaptive_order && voltage_prefers_eq8(p, n, F, c.head_dim())) {
          // Eq. (8): Q, Q_h W_K,h, (S x) W_V,h and the output projection are
          // 2pF^2 each; scores and S x are 2pnF per head.
          per_layer = 8 * pd * f * f + 4 * static_cast<double>(c.heads) * pd * nd * f + 4 * pd * f * static_cast<double>(I);
        } else {
          per_layer = layer_gemm_flops(p, n, F, I);
        }
        break;
      case Strategy::kTp:
      case Strategy::kGalaxy: {  // the same GEMMs; galaxy splits only the element-wise work further
        const double w = static_cast<double>(tp_head_ranges(plan, c)[static_cast<size_t>(d)].size() * c.head_dim());
        const double fi = static_cast<double>(tp_ffn_ranges(plan, c)[static_cast<size_t>(d)].size());
        per_layer = 6 * nd * f * w + 4 * nd * nd * w + 2 * nd * w * f + 4 * nd * f * fi;
        break;
      }
      case Strategy::kPipeline:
        per_layer = layer_gemm_flops(n, n, F, I);
        layers_here = static_cast<int64_t>(plan.layers.layers_on(d).size());
        break;
      case Strategy::kPrism: {
        const PrismLayout lay = prism_layout(plan, n);
        per_layer = layer_gemm_flops(p, lay.key_rows(d), F, I);
        break;
      }
    }
    out[static_cast<size_t>(d)] = per_layer * static_cast<double>(layers_here);
  }
  return out;
}

Result<Tensor> run_prism(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                         core::ThreadPool* pool) {
  const model::ModelConfig& c = model.config();
  const int64_t F = c.hidden;
  const int world = sync.world(), me = sync.rank();
  const PrismLayout lay = prism_layout(plan, n);
  const auto counts = range_sizes(lay.rows);
  const Range mine = lay.rows[static_cast<size_t>(me)];
  const int64_t np = mine.size(), lsum = lay.total_means();
  const int64_t lme = lay.means[static_cast<size_t>(me)], nhat = lay.key_rows(me), others = nhat - np;
  // Offset of each device's means in the gathered [lsum, F] block.
  std::vector<int64_t> mean_at(static_cast<size_t>(world) + 1, 0);
  for (size_t q = 0; q < static_cast<size_t>(world); ++q) mean_at[q + 1] = mean_at[q] + lay.means[q];

  // Per key: its count g (Eq. 14) and the position the causal mask compares.
  // A mean takes its segment's last row, so every mean of an earlier partition
  // is visible and every mean of a later one masked (Eq. 17).
  std::vector<float> g(static_cast<size_t>(nhat), 1.0f);
  std::vector<int64_t> key_pos(static_cast<size_t>(nhat));
  for (int64_t i = 0; i < np; ++i) key_pos[static_cast<size_t>(i)] = mine.begin + i;
  for (int q = 0, at = static_cast<int>(np); q < world && np > 0; ++q) {
    if (q == me) continue;
    for (const Range& s : lay.segments[static_cast<size_t>(q)]) {
      g[static_cast<size_t>(at)] = static_cast<float>(s.size());
      key_pos[static_cast<size_t>(at)] = lay.rows[static_cast<size_t>(q)].begin + s.end - 1;
      ++at;
    }
  }

  // state = [X_p; Z_q for q != p]: the layer input of this device's keys.
  Tensor state = Tensor::zeros_f32({std::max<int64_t>(nhat, 1), F});
  {
    // One message per device: its rows followed by the other partitions' means.
    std::vector<int64_t> init_counts(static_cast<size_t>(world));
    for (int q = 0; q < world; ++q) init_counts[static_cast<size_t>(q)] = lay.key_rows(q);
    Tensor packed;
    if (me == 0) {
      Tensor z = Tensor::zeros_f32({std::max<int64_t>(lsum, 1), F});
      for (int q = 0; q < world; ++q)
        segment_means_f32(x.f32() + lay.rows[static_cast<size_t>(q)].begin * F, F, lay.segments[static_cast<size_t>(q)],
                          z.f32() + mean_at[static_cast<size_t>(q)] * F);
      const int64_t total = std::accumulate(init_counts.begin(), init_counts.end(), int64_t{0});
      packed = Tensor::zeros_f32({std::max<int64_t>(total, 1), F});
      float* at = packed.f32();
      auto put = [&](const float* src, int64_t rows) {
        if (rows > 0) std::memcpy(at, src, static_cast<size_t>(rows * F) * sizeof(float));
        at += rows * F;
      };
      for (int p = 0; p < world; ++p) {
        if (init_counts[static_cast<size_t>(p)] == 0) continue;  // no rows: nothing to attend
        put(x.f32() + lay.rows[static_cast<size_t>(p)].begin * F, counts[static_cast<size_t>(p)]);
        for (int q = 0; q < world; ++q)
          if (q != p) put(z.f32() + mean_at[static_cast<size_t>(q)] * F, lay.means[static_cast<size_t>(q)]);
      }
    }
    TESSERA_RETURN_IF_ERROR(sync.scatter_rows(me == 0 ? packed.f32() : nullptr, init_counts, F, state.f32(), 0));
  }

  Tensor a = Tensor::zeros_f32({std::max<int64_t>(nhat, 1), F});
  Tensor q = Tensor::zeros_f32({std::max<int64_t>(np, 1), F}), kv = Tensor::zeros_f32({std::max<int64_t>(nhat, 1), 2 * F});
  Tensor ctx = Tensor::zeros_f32({std::max<int64_t>(np, 1), F});
  Tensor scores = Tensor::zeros_f32({std::max<int64_t>(kernels::weighted_attention_scratch_floats(np, nhat), 1)});
  Tensor my_means = Tensor::zeros_f32({std::max<int64_t>(lme, 1), F}), z = Tensor::zeros_f32({std::max<int64_t>(lsum, 1), F});
  const auto& my_segments = lay.segments[static_cast<size_t>(me)];
  model::Workspace ws;
  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    if (np > 0) {
      model.layer_input(l, state.f32(), nhat, a.f32(), pool);
      kernels::LinearArgs la;
      la.x = a.f32(); la.m = np; la.k = F; la.ldx = F;
      la.packed = &w.qkv_w; la.n = F; la.ldw = F; la.bias = w.qkv_b.empty() ? nullptr : w.qkv_b.f32();
      la.y = q.f32(); la.ldy = F;
      kernels::linear_f32(pool, la);
      la.m = nhat; la.packed_row0 = F; la.n = 2 * F; la.bias = w.qkv_b.empty() ? nullptr : w.qkv_b.f32() + F;
      la.y = kv.f32(); la.ldy = 2 * F;
      kernels::linear_f32(pool, la);
      kernels::WeightedAttentionArgs at;
      at.q = q.f32(); at.ldq = F; at.k = kv.f32(); at.ldk = 2 * F; at.v = kv.f32() + F; at.ldv = 2 * F;
      at.out = ctx.f32(); at.ldo = F; at.n_q = np; at.n_kv = nhat; at.heads = c.heads; at.head_dim = c.head_dim();
      at.scale = model.attention_scale(l); at.counts = g.data();
      at.causal = c.causal(); at.q_pos0 = mine.begin; at.key_pos = key_pos.data();
      kernels::weighted_attention_f32(pool, at, scores.f32(), scores.numel());
      model.layer_tail(l, state.f32(), ctx.f32(), np, state.f32(), ws, pool);
    }
    if (l + 1 == c.layers) break;
    segment_means_f32(state.f32(), F, my_segments, my_means.f32());
    TESSERA_RETURN_IF_ERROR(sync.allgather_rows(my_means.f32(), lay.means, F, z.f32()));
    // Keep the other partitions' means, in rank order, after this device's rows.
    const int64_t before = mean_at[static_cast<size_t>(me)], after = lsum - mean_at[static_cast<size_t>(me) + 1];
    if (np == 0) continue;
    TESSERA_CHECK(before + after == others);
    if (before > 0) std::memcpy(state.f32() + np * F, z.f32(), static_cast<size_t>(before * F) * sizeof(float));
    if (after > 0)
      std::memcpy(state.f32() + (np + before) * F, z.f32() + mean_at[static_cast<size_t>(me) + 1] * F,
                  static_cast<size_t>(after * F) * sizeof(float));
  }
  // The terminal gets every row: --dump writes hidden.L and GPT-2's LM head
  // reads every position. BERT's and ViT's heads read only row 0.
  Tensor out = me == 0 ? Tensor::zeros_f32({n, F}) : Tensor();
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(state.f32(), counts, F, me == 0 ? out.f32() : nullptr, 0));
  return out;
}

}  // namespace tessera::parallel
