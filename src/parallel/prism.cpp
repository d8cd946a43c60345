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
#include "model/layer_blocks.h"
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

double prism_rate(const Plan& plan) { return option(plan, "rate", 0.0).value_or(0.0); }
int64_t prism_segments_option(const Plan& plan) { return option(plan, "segments", int64_t{0}).value_or(0); }

PrismLayout prism_layout(const Plan& plan, int64_t n) {
  PrismLayout lay;
  lay.rows = split_by_ratio(n, plan.ratios);
  const double rate = prism_rate(plan);
  const int64_t segments = prism_segments_option(plan);
  for (const Range& r : lay.rows) {
    const int64_t l = prism_segment_count(r.size(), rate, segments);
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

namespace {

class Prism final : public Strategy {
 public:
  std::string name() const override { return "prism"; }
  ShareKind share_kind() const override { return ShareKind::kRows; }
  std::string summary() const override { return "PRISM: position-wise rows, segment means instead of rows (lossy)"; }
  bool exact() const override { return false; }
  // The paper's sweep (Fig. 4, CR 2-64); loss grows with the rate.
  std::vector<nlohmann::json> lossy_settings() const override {
    std::vector<nlohmann::json> out;
    for (double r : {2.0, 4.0, 8.0, 16.0, 32.0, 64.0}) out.push_back({{"rate", r}});
    return out;
  }
  std::vector<OptionFlag> flags() const override {
    return {{"--cr", "rate", OptionFlag::Kind::kNumber, "compression rate R, floor(N_p / R) means per partition"},
            {"--segments", "segments", OptionFlag::Kind::kNumber, "segment means per partition"}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig& c) const override {
    if (!c.plain_layers())
      return core::unimplemented(
          "prism: a segment mean of rows has no single position, so rotary (RoPE) models cannot use it; use an exact strategy");
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"rate", "segments"}));
    TESSERA_ASSIGN_OR_RETURN(const double rate, option(plan, "rate", 0.0));
    TESSERA_ASSIGN_OR_RETURN(const int64_t segments, option(plan, "segments", int64_t{0}));
    const bool has_rate = rate != 0.0, has_segments = segments != 0;
    if (has_rate == has_segments)
      return core::invalid_argument("prism needs exactly one of a compression rate (--cr) or segments (--segments)");
    if (has_rate && !(rate >= 1.0 && rate <= 1e9)) return core::invalid_argument("compression rate must be in [1, 1e9]");
    if (has_segments && segments < 1) return core::invalid_argument("segments must be >= 1");
    plan.options = has_rate ? nlohmann::json{{"rate", rate}} : nlohmann::json{{"segments", segments}};
    return core::ok_status();
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override;
  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override;
};

Result<Tensor> Prism::run(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                          core::ThreadPool* pool) const {
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
    const int64_t total = std::accumulate(init_counts.begin(), init_counts.end(), int64_t{0});
    TESSERA_RETURN_IF_ERROR(sync.scatter_rows(me == 0 ? floats(packed.f32(), total * F) : std::span<const float>(),
                                              init_counts, F, floats(state.f32(), nhat * F), 0));
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
      model::AttentionIo io;
      io.q = q.f32(); io.ldq = F; io.k = kv.f32(); io.ldk = 2 * F; io.v = kv.f32() + F; io.ldv = 2 * F;
      io.out = ctx.f32(); io.ldo = F; io.n_q = np; io.n_kv = nhat; io.q_pos0 = mine.begin;
      kernels::WeightedAttentionArgs at = model::weighted_attention_args(model, l, io);
      at.counts = g.data();
      at.key_pos = key_pos.data();
      kernels::weighted_attention_f32(pool, at, scores.f32(), scores.numel());
      model.layer_tail(l, state.f32(), ctx.f32(), np, state.f32(), ws, pool);
    }
    if (l + 1 == c.layers) break;
    segment_means_f32(state.f32(), F, my_segments, my_means.f32());
    TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(my_means.f32(), lme * F), lay.means, F, floats(z.f32(), lsum * F)));
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
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(floats(state.f32(), np * F), counts, F,
                                           me == 0 ? floats(out.f32(), n * F) : std::span<float>(), 0));
  return out;
}

Schedule Prism::estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const {
  const int K = plan.world;
  const int64_t F = c.hidden;
  const PrismLayout lay = prism_layout(plan, n);
  const auto counts = range_sizes(lay.rows);
  Schedule s;
  for (int r = 0; r < K; ++r) {
    const int64_t np = counts[static_cast<size_t>(r)], nhat = lay.key_rows(r);
    const auto others = everyone_but(r, K);
    DeviceSchedule d;
    int64_t scattered = 0;
    if (r == 0)
      for (int q = 1; q < K; ++q) scattered += lay.key_rows(q) * F;
    Phase first{"scatter rows and means", -1, {}, {transfer(CollectiveKind::kScatter, "x", scattered, others)}, false};
    if (r == 0) first.work.push_back(elementwise("segment means", n, F));
    d.phases.push_back(std::move(first));
    for (int64_t l = 0; l < c.layers; ++l) {
      Phase layer{"layer", l, {}, {}, false};
      if (np > 0) {
        layer.work.push_back(elementwise("norm", nhat, F));
        layer.work.push_back(gemm("q", np, F, F));
        layer.work.push_back(gemm("kv", nhat, F, 2 * F));
        layer.work.push_back(attention("weighted attention", np, nhat, F));
        add_tail_work(layer.work, c, np);
      }
      d.phases.push_back(std::move(layer));
      if (l + 1 == c.layers) break;
      Phase means{"allgather means", l, {elementwise("segment means", np, F)}, {}, false};
      means.transfers.push_back(transfer(CollectiveKind::kAllgather, "means", ring_allgather_sent(lay.means, F, r), others));
      d.phases.push_back(std::move(means));
    }
    d.phases.push_back({"gather rows", -1, {}, {transfer(CollectiveKind::kGather, "y", r == 0 ? 0 : np * F, {0})}, false});
    d.weight_bytes = c.layers * layer_weight_bytes(c, F, c.intermediate) + (r == 0 ? terminal_weight_bytes(c) : 0);
    d.activation_bytes = (3 * nhat * F + 2 * np * F + lay.total_means() * F + np * nhat + np * (3 * F + c.intermediate)) * 4;
    s.devices.push_back(std::move(d));
  }
  return s;
}

}  // namespace

std::unique_ptr<Strategy> make_prism_strategy() { return std::make_unique<Prism>(); }

}  // namespace tessera::parallel
