// Galaxy hybrid model parallelism (Ye et al., §III-B): tensor parallelism on
// the MHA block (whole heads, partition A: plan.ratios) and the MLP block
// (FFN columns, partition B: option "ffn_ratios"); sequence parallelism on
// the connective blocks (residual add and layer norm) over an equal sequence
// partition S. An AllGather opens each TP block and a ReduceScatter closes
// it, so the residual stream stays split by sequence. With option "overlap"
// (default) both run as rings whose tiles overlap the first and last GEMM of
// the block (§III-D).
#include <algorithm>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Status;
using core::Tensor;
using kernels::Activation;

namespace {

// One TP block: gather the connective block's rows, GEMM1 on each tile as it
// arrives, the middle (attention, or nothing for the MLP), then GEMM2 per
// destination part into the reduce-scatter.
struct TpBlock {
  Synchronizer& sync;
  bool overlap;
  const std::vector<int64_t>& counts;
  int64_t cols;

  template <typename First, typename Middle, typename Last>
  Status run(std::span<const float> mine, First&& first, Middle&& middle, Last&& last, std::span<float> out) const {
    TESSERA_ASSIGN_OR_RETURN(auto tiles, overlap ? sync.allgather_tiles(mine, counts, cols)
                                                 : sync.allgather_tiles_whole(mine, counts, cols));
    while (!tiles->done()) {
      TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles->next());
      first(t);
    }
    TESSERA_RETURN_IF_ERROR(tiles->finish());
    middle();
    TESSERA_ASSIGN_OR_RETURN(auto parts, overlap ? sync.reduce_scatter_parts(counts, cols, out)
                                                 : sync.reduce_scatter_parts_whole(counts, cols, out));
    while (!parts->done()) {
      TESSERA_ASSIGN_OR_RETURN(const PartialSlot slot, parts->next());
      last(slot);
      TESSERA_RETURN_IF_ERROR(parts->submit());
    }
    return parts->finish();
  }
};

class Galaxy final : public Strategy {
 public:
  std::string name() const override { return "galaxy"; }
  bool takes_llama_layers(const Plan&) const override { return true; }  // shards by model::HeadShard
  ShareKind share_kind() const override { return ShareKind::kHeads; }
  void apply_partition(Plan& plan, const Partition& p) const override {
    if (!p.shares.empty()) plan.ratios = p.shares;
    if (!p.ffn_shares.empty()) plan.options["ffn_ratios"] = p.ffn_shares;
  }
  std::string summary() const override {
    return "Galaxy: TP on heads and FFN columns, SP on the connective blocks, ring tiles overlap the GEMMs";
  }
  std::vector<OptionFlag> flags() const override {
    return {{"--ffn-partition", "ffn_ratios", OptionFlag::Kind::kString, "FFN-column share of each device (default: --partition)"},
            {"--no-overlap", "overlap", OptionFlag::Kind::kSetsBool, "no overlap of ring communication with the GEMMs", false}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig&) const override {
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"ffn_ratios", "overlap"}));
    TESSERA_ASSIGN_OR_RETURN(std::vector<double> ffn, ratio_option(plan, "ffn_ratios", plan.ratios));
    TESSERA_ASSIGN_OR_RETURN(const bool overlap, option(plan, "overlap", true));
    plan.options = {{"ffn_ratios", ffn}, {"overlap", overlap}};
    return core::ok_status();
  }

  model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const override {
    const auto r = static_cast<size_t>(rank);
    return shard_load_options(head_ranges(c, plan.ratios)[r], ffn_ranges(c, ffn_ratios(plan))[r], rank);
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    return run_cached(m, plan, sync, std::move(x), n, pool, nullptr, nullptr);
  }
  // A pair's prefill for the terminal's decode: after each MHA block every
  // device sends the K/V of its heads to the terminal (a row per device is
  // Galaxy's own need). A decode on several devices would need its K/V
  // scattered by its own layout: not built.
  bool hands_over_kv(const Plan& plan, int64_t n, int rank) const override { return rank == 0 && n >= plan.world; }
  Result<Tensor> run_handing_over(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                                  core::ThreadPool* pool, const KvSink& sink) const override {
    return run_cached(m, plan, sync, std::move(x), n, pool, nullptr, nullptr, &sink);
  }
  bool decodes() const override { return true; }
  bool batches_steps() const override { return true; }
  Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                                                const model::CacheSpec& spec) const override;
  // run(), and with `cache` the K/V of this rank's heads kept (positions
  // 0..n-1); with `sink`, every head's K/V handed to the terminal's.
  Result<Tensor> run_cached(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                            core::ThreadPool* pool, const TpLayers* kv, model::KvCache* cache,
                            const KvSink* sink = nullptr) const;
  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override;

 private:
  static std::vector<double> ffn_ratios(const Plan& plan) {
    return option<std::vector<double>>(plan, "ffn_ratios", plan.ratios).value_or(plan.ratios);
  }
  // The connective blocks' equal sequence partition S (§III-C).
  static std::vector<int64_t> seq_counts(int64_t n, int world) {
    return range_sizes(split_by_ratio(n, equal_ratios(world)));
  }
};

// The handover of layer l: each device's K/V heads of all n rows (its qkv
// [n, q | k | v]) to the terminal, which puts them in place (a K/V head that
// two devices read comes twice, the same) and hands the whole layer's over.
Status hand_kv_to_terminal(const model::ModelConfig& c, const std::vector<Range>& heads, Synchronizer& sync,
                           const float* qkv, int64_t n, int64_t l, const KvSink& sink, std::vector<float>& buf,
                           std::vector<float>& whole) {
  auto shard_of = [&](int r) { return c.head_shard(heads[static_cast<size_t>(r)].begin, heads[static_cast<size_t>(r)].end); };
  const model::HeadShard mine = shard_of(sync.rank());
  if (sync.rank() != 0) {
    const int64_t kv2 = 2 * mine.kv_width();
    if (kv2 == 0) return core::ok_status();
    buf.resize(static_cast<size_t>(n * kv2));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(qkv + i * mine.qkv_width() + mine.q_width(), kv2, buf.data() + i * kv2);
    return sync.send(0, buf);
  }
  const int64_t W = c.kv_width();
  whole.resize(static_cast<size_t>(2 * n * W));  // K [n, W], then V [n, W]
  auto put = [&](const model::HeadShard& s, const float* rows, int64_t ld) {
    const int64_t kv = s.kv_width(), at = s.kv0 * s.head_dim;
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(rows + i * ld, kv, whole.data() + i * W + at);
      std::copy_n(rows + i * ld + kv, kv, whole.data() + (n + i) * W + at);
    }
  };
  if (mine.kv_width() > 0) put(mine, qkv + mine.q_width(), mine.qkv_width());
  for (int r = 1; r < sync.world(); ++r) {
    const model::HeadShard s = shard_of(r);
    if (s.kv_width() == 0) continue;
    buf.resize(static_cast<size_t>(n * 2 * s.kv_width()));
    TESSERA_RETURN_IF_ERROR(sync.recv(r, buf));
    put(s, buf.data(), 2 * s.kv_width());
  }
  return sink(l, whole.data(), W, whole.data() + n * W, W, n);
}

Result<Tensor> Galaxy::run_cached(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x,
                                  int64_t n, core::ThreadPool* pool, const TpLayers* kv, model::KvCache* cache,
                                  const KvSink* sink) const {
  const model::ModelConfig& c = m.config();
  const int64_t F = c.hidden;
  const auto me = static_cast<size_t>(sync.rank());
  const Range heads = head_ranges(c, plan.ratios)[me];
  const model::HeadShard shard = c.head_shard(heads.begin, heads.end);
  const int64_t fl = shard.q_width(), ql = shard.qkv_width(), il = ffn_ranges(c, ffn_ratios(plan))[me].size();
  const auto counts = seq_counts(n, sync.world());
  const auto at = row_offsets(counts);
  const int64_t s = counts[me];
  std::vector<float> handover_buf, handover_whole;

  // Sequence-parallel state: the residual stream (xr), the input of the next
  // TP block (ar), the reduce-scatter result (g) and the MLP's residual (hr),
  // s rows each.
  Tensor xr = Tensor::zeros_f32({s, F}), ar = Tensor::zeros_f32({s, F}), g = Tensor::zeros_f32({s, F});
  Tensor hr = Tensor::zeros_f32({s, F});
  // Tensor-parallel state over all n rows, for this rank's heads / columns.
  Tensor qkv = Tensor::zeros_f32({n, std::max<int64_t>(ql, 1)}), ctx = Tensor::zeros_f32({n, fl}), f = Tensor::zeros_f32({n, il});
  Tensor gate_up;  // Llama-style MLP input
  const int64_t scratch = std::max<int64_t>(kernels::attention_scratch_floats(n, n, heads.size()), 1);
  Tensor scores = Tensor::zeros_f32({scratch});
  TESSERA_RETURN_IF_ERROR(sync.scatter_rows(sync.rank() == 0 ? floats(x.f32(), n * F) : std::span<const float>(), counts,
                                            F, floats(xr.f32(), s * F), 0));
  const TpBlock block{sync, option(plan, "overlap", true).value_or(true), counts, F};

  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
    // MHA block. GEMM1 (Q, K, V of this rank's heads) tile by tile.
    m.layer_input(l, xr.f32(), s, ar.f32(), pool);
    auto qkv_tile = [&](const Tile& t) {
      if (t.count > 0 && fl > 0)
        kernels::linear_rows_f32(pool, t.rows.data(), t.count, w.qkv_w, w.qkv_b, Activation::kNone, nullptr,
                                 qkv.f32() + at[static_cast<size_t>(t.owner)] * ql);
    };
    auto attention = [&] {
      if (fl == 0) return;
      model::position_qk(m, l, shard, qkv.f32(), n, 0, pool);
      model::AttentionIo io = model::shard_qkv_io(shard, qkv.f32(), n, ctx.f32());
      if (cache != nullptr) {
        // Attention reads the cache back, as one device's does: with F16
        // caches its K and V are the rounded ones.
        kv->cache_kv(l, qkv.f32(), n, 0, *cache);
        model::cache_io(*cache, l, shard.kv_width(), n, io);
      }
      kernels::attention_f32(pool, model::attention_args(m, l, io), scores.f32(), scores.numel());
    };
    // GEMM2 (output projection rows of this rank's heads) per destination
    // part; the bias is added once, after the sum.
    auto out_proj = [&](const PartialSlot& slot) {
      const auto d = static_cast<size_t>(slot.dest);
      kernels::linear_rows_f32(pool, ctx.f32() + at[d] * fl, counts[d], w.attn_out_w, Tensor(), Activation::kNone,
                               nullptr, slot.out.data());
    };
    TESSERA_RETURN_IF_ERROR(block.run(floats(ar.f32(), s * F), qkv_tile, attention, out_proj, floats(g.f32(), s * F)));
    if (sink != nullptr)
      TESSERA_RETURN_IF_ERROR(hand_kv_to_terminal(c, head_ranges(c, plan.ratios), sync, qkv.f32(), n, l, *sink,
                                                  handover_buf, handover_whole));

    // Connective block on this rank's rows: residual add and layer norm.
    const float* mlp_in = model::attention_residual(m, l, g.f32(), xr.f32(), true, s, ar.f32(), pool);
    std::swap(hr, g);  // hr: the MLP's residual

    // MLP block: FFN-in columns of this rank tile by tile, FFN-out per part.
    auto ffn_in = [&](const Tile& t) {
      if (t.count > 0 && il > 0)
        model::mlp_input(m, l, t.rows.data(), t.count, f.f32() + at[static_cast<size_t>(t.owner)] * il, gate_up, pool);
    };
    auto ffn_out = [&](const PartialSlot& slot) {
      const auto d = static_cast<size_t>(slot.dest);
      kernels::linear_rows_f32(pool, f.f32() + at[d] * il, counts[d], w.ffn_out_w, Tensor(), Activation::kNone, nullptr,
                               slot.out.data());
    };
    TESSERA_RETURN_IF_ERROR(block.run(floats(mlp_in, s * F), ffn_in, [] {}, ffn_out, floats(g.f32(), s * F)));

    // Connective block: residual add, and BERT's LN2.
    model::mlp_residual(m, l, g.f32(), hr.f32(), true, s, xr.f32(), pool);
  }
  Tensor out = sync.rank() == 0 ? Tensor::zeros_f32({n, F}) : Tensor();
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(floats(xr.f32(), s * F), counts, F,
                                           sync.rank() == 0 ? floats(out.f32(), n * F) : std::span<float>(), 0));
  return out;
}

// Prefill with Galaxy, decode with TP on the same head and FFN shards: the
// prefill leaves each device the K/V of exactly the heads its steps need.
class GalaxyDecoder final : public Decoder {
 public:
  GalaxyDecoder(const Galaxy& g, const model::Transformer& m, const Plan& plan, Synchronizer& sync, TpLayers layers,
                model::KvCache cache)
      : g_(g), m_(m), plan_(plan), sync_(sync), layers_(std::move(layers)), cache_(std::move(cache)) {}

  Result<Tensor> forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) override {
    // Galaxy's sequence split needs a row per device; shorter or later chunks run as TP.
    if (pos0 == 0 && n >= sync_.world()) return g_.run_cached(m_, plan_, sync_, std::move(x), n, pool, &layers_, &cache_);
    return layers_.decode(sync_, std::move(x), n, pos0, &cache_, pool);
  }
  // Its steps are TP's, so a batch of them is too: each GEMM on every row at once.
  bool batches(std::span<Decoder* const> decs) const override {
    return std::all_of(decs.begin(), decs.end(), [](Decoder* d) { return dynamic_cast<GalaxyDecoder*>(d) != nullptr; });
  }
  Result<Tensor> forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                              core::ThreadPool* pool) override {
    std::vector<model::KvCache*> caches;
    for (Decoder* d : decs) caches.push_back(&static_cast<GalaxyDecoder*>(d)->cache_);
    return layers_.decode_rows(sync_, std::move(x), {pos, caches}, pool);
  }

 private:
  const Galaxy& g_;
  const model::Transformer& m_;
  const Plan plan_;
  Synchronizer& sync_;
  TpLayers layers_;
  model::KvCache cache_;
};

Result<std::unique_ptr<Decoder>> Galaxy::make_decoder(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                                                      const model::CacheSpec& spec) const {
  const auto r = static_cast<size_t>(sync.rank());
  TpLayers layers(m, head_ranges(m.config(), plan.ratios)[r], ffn_ranges(m.config(), ffn_ratios(plan))[r].size());
  TESSERA_ASSIGN_OR_RETURN(model::KvCache cache, layers.make_cache(spec));
  return std::unique_ptr<Decoder>(std::make_unique<GalaxyDecoder>(*this, m, plan, sync, std::move(layers), std::move(cache)));
}

Schedule Galaxy::estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const {
  const int K = plan.world;
  const int64_t F = c.hidden;
  const auto heads = head_ranges(c, plan.ratios);
  const auto ffn = ffn_ranges(c, ffn_ratios(plan));
  const auto counts = seq_counts(n, K);
  const bool overlap = option(plan, "overlap", true).value_or(true);
  Schedule sched;
  for (int r = 0; r < K; ++r) {
    const int64_t il = ffn[static_cast<size_t>(r)].size();
    const ShardDims sd = shard_dims(c, heads[static_cast<size_t>(r)], il);
    const int64_t w = sd.q;
    const int64_t s = counts[static_cast<size_t>(r)];
    const auto others = everyone_but(r, K);
    DeviceSchedule d;
    d.phases.push_back({"scatter rows", -1, {}, {transfer(CollectiveKind::kScatter, "x", r == 0 ? (n - s) * F : 0, others)}, false});
    // With tiles, an AllGather's last part is computed only once it is in,
    // and a ReduceScatter's first part before anything is sent: those GEMMs
    // get a phase of their own, after (before) the overlapped one.
    const size_t last_in = static_cast<size_t>(ring_order(r, K).back());
    for (int64_t l = 0; l < c.layers; ++l) {
      // Each TP block: AllGather overlapping GEMM1, the middle, GEMM2 overlapping the ReduceScatter.
      Phase gather1{"mha allgather", l, {elementwise("norm", s, F)}, {}, overlap}, after1{"mha last part", l, {}, {}, false};
      for (size_t q = 0; q < counts.size(); ++q)
        if (counts[q] > 0 && w > 0) (overlap && q == last_in ? after1 : gather1).work.push_back(gemm("qkv", counts[q], F, sd.qkv));
      gather1.transfers.push_back(transfer(CollectiveKind::kAllgather, "x", ring_allgather_sent(counts, F, r), others));
      Phase middle{"attention", l, {}, {}, false};
      if (w > 0) middle.work.push_back(attention("attention", n, n, w));
      Phase before1{"mha first part", l, {}, {}, false}, scatter1{"mha reduce-scatter", l, {}, {}, overlap};
      for (size_t q = 0; q < counts.size(); ++q)
        (overlap && q == last_in ? before1 : scatter1).work.push_back(gemm("attn_out", counts[q], w, F));
      scatter1.transfers.push_back(transfer(CollectiveKind::kReduceScatter, "attn_out", ring_reduce_scatter_sent(counts, F, r), others));
      // A pair's handover: this device's K/V heads of every row, to the terminal.
      Phase handover{"kv handover", l, {}, {}, false};
      if (plan.decode)
        handover.transfers.push_back(
            transfer(CollectiveKind::kGather, "kv", r == 0 ? 0 : n * (sd.qkv - sd.q), {0}));  // K and V
      Phase gather2{"mlp allgather", l, {elementwise("residual+norm", s, F)}, {}, overlap}, after2{"mlp last part", l, {}, {}, false};
      for (size_t q = 0; q < counts.size(); ++q)
        if (counts[q] > 0 && il > 0) (overlap && q == last_in ? after2 : gather2).work.push_back(gemm("ffn_in", counts[q], F, sd.ffn_in));
      gather2.transfers.push_back(transfer(CollectiveKind::kAllgather, "h", ring_allgather_sent(counts, F, r), others));
      Phase before2{"mlp first part", l, {}, {}, false}, scatter2{"mlp reduce-scatter", l, {}, {}, overlap};
      for (size_t q = 0; q < counts.size(); ++q)
        (overlap && q == last_in ? before2 : scatter2).work.push_back(gemm("ffn_out", counts[q], il, F));
      scatter2.transfers.push_back(transfer(CollectiveKind::kReduceScatter, "ffn_out", ring_reduce_scatter_sent(counts, F, r), others));
      for (Phase* ph : {&gather1, &after1, &middle, &before1, &scatter1, &handover, &gather2, &after2, &before2, &scatter2})
        d.phases.push_back(std::move(*ph));
      d.phases.push_back({"residual", l, {elementwise("residual+norm", s, F)}, {}, false});
    }
    d.phases.push_back({"gather rows", -1, {}, {transfer(CollectiveKind::kGather, "y", r == 0 ? 0 : s * F, {0})}, false});
    d.weight_bytes =
        c.layers * shard_weight_bytes(c, heads[static_cast<size_t>(r)], il) + (r == 0 ? terminal_weight_bytes(c) : 0);
    d.activation_bytes = (4 * s * F + n * (sd.qkv + w + il + (c.llama_style() ? sd.ffn_in : 0)) + kernels::attention_scratch_floats(n, n, heads[static_cast<size_t>(r)].size())) * 4;
    sched.devices.push_back(std::move(d));
  }
  return sched;
}

}  // namespace

std::unique_ptr<Strategy> make_galaxy_strategy() { return std::make_unique<Galaxy>(); }

}  // namespace tessera::parallel
