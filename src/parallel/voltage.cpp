// Voltage (position-wise) parallelism: every device holds the whole layer
// input, computes the output rows of its partition (plan.ratios), then one
// AllGather per layer; the last layer goes to the terminal only. Options:
// "overlap" (default true): the first distribution and the AllGathers run as
// ring tiles, and each block of rows is projected to keys and values while
// the next block travels; "chunks" (default 2, with overlap): each device's
// rows leave in that many blocks, each as soon as its FFN output is done, so
// the first blocks travel while the last compute; "adaptive_order" (default
// true): Theorem 2 picks Eq. (3) or Eq. (8) per device, without overlap only.
// With the ring, Eq. (3) projects each block of rows as it arrives, which
// Eq. (8) cannot (it needs every row first), and Eq. (8)'s per-head products
// are small unpacked GEMMs: where Theorem 2 picks Eq. (8) by FLOPs it measured
// 1.2-1.5x slower (K = 2 with 101/27 rows, K = 3 and K = 4, docs/planner.md).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "parallel/partition_attention.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

constexpr int64_t kDefaultChunks = 2;

class Voltage final : public Strategy {
 public:
  std::string name() const override { return "voltage"; }
  // Eq. (3) with each row's absolute rotary position; Eq. (8) never forms K,
  // so it is not chosen for these layers (eq8 below).
  bool takes_llama_layers(const Plan&) const override { return true; }
  ShareKind share_kind() const override { return ShareKind::kRows; }
  std::string summary() const override {
    return "Voltage: position-wise rows, one AllGather per layer (attention in Eq. (3); Theorem 2's choice with --no-overlap)";
  }
  std::vector<OptionFlag> flags() const override {
    return {{"--no-overlap", "overlap", OptionFlag::Kind::kSetsBool, "no overlap of ring communication with the GEMMs", false},
            {"--ring-chunks", "chunks", OptionFlag::Kind::kNumber,
             "blocks each device's rows leave in per layer, each sent when computed (default 2; with overlap)"},
            {"--no-adaptive-order", "adaptive_order", OptionFlag::Kind::kSetsBool,
             "always Eq. (3), never Theorem 2's Eq. (8) (with the ring overlap, the default, Eq. (3) always)", false}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig&) const override {
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"overlap", "chunks", "adaptive_order"}));
    TESSERA_ASSIGN_OR_RETURN(const bool overlap, option(plan, "overlap", true));
    TESSERA_ASSIGN_OR_RETURN(const int64_t chunks, option(plan, "chunks", kDefaultChunks));
    TESSERA_ASSIGN_OR_RETURN(const bool adaptive, option(plan, "adaptive_order", true));
    if (chunks < 1 || chunks > kMaxTileStreams)
      return core::invalid_argument("voltage: chunks must be in [1, " + std::to_string(kMaxTileStreams) + "]");
    plan.options = {{"overlap", overlap}, {"chunks", chunks}, {"adaptive_order", adaptive}};
    return core::ok_status();
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    return run_keeping(m, plan, sync, std::move(x), n, pool, nullptr);
  }
  // Eq. (3) computes every row's K and V on every device with rows: a
  // decode layout takes them as they are.
  bool hands_over_kv(const Plan& plan, int64_t n, int rank) const override {
    return row_share(plan, n, rank).mine.size() > 0;
  }
  Result<Tensor> run_handing_over(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                                  core::ThreadPool* pool, const KvSink& sink) const override {
    return run_keeping(m, plan, sync, std::move(x), n, pool, &sink);
  }
  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override;

 private:
  // Quantized weights round a product's inputs to Q8_0 blocks (kernels/quant.h);
  // Eq. (8) multiplies by W_K's rows, whose inputs are not those blocks, so
  // it would not reproduce the single device: Eq. (3) there.
  // A pair's prefill hands K and V over, which Eq. (8) never forms.
  static bool eq8(const Plan& plan, const model::ModelConfig& c, int64_t p, int64_t n) {
    return !plan.decode && !c.llama_style() && c.weights == kernels::WeightType::kF32 && option(plan, "adaptive_order", true).value_or(true) &&
           !option(plan, "overlap", true).value_or(true) && voltage_prefers_eq8(p, n, c.hidden, c.head_dim());
  }
  // Block b of every device's rows: its row count per rank and its first row
  // within the rank's part, the same on every rank. Without overlap: one.
  struct Blocks {
    std::vector<std::vector<int64_t>> counts, starts;  // [block][rank]
  };
  static Blocks blocks(const Plan& plan, const std::vector<int64_t>& counts) {
    const int64_t nb = !option(plan, "overlap", true).value_or(true)
                           ? 1
                           : std::clamp<int64_t>(option(plan, "chunks", kDefaultChunks).value_or(kDefaultChunks), 1,
                                                 kMaxTileStreams);
    Blocks b;
    b.counts.assign(static_cast<size_t>(nb), std::vector<int64_t>(counts.size(), 0));
    b.starts = b.counts;
    for (size_t r = 0; r < counts.size(); ++r) {
      int64_t at = 0;
      for (size_t k = 0; k < b.counts.size(); ++k) {
        const int64_t rows = counts[r] / nb + (static_cast<int64_t>(k) < counts[r] % nb ? 1 : 0);
        b.counts[k][r] = rows;
        b.starts[k][r] = at;
        at += rows;
      }
    }
    return b;
  }
  struct Run;  // run()'s steps
  Result<Tensor> run_keeping(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                             core::ThreadPool* pool, const KvSink* sink) const;
};

// One run() on this device: its rows of the layers, `full` (every row of
// the layer input, [n, F]), `a` (what attention reads, the rows computed so
// far), and its own rows' context and output. run() below is the order of
// the steps.
struct Voltage::Run {
  const model::Transformer& m;
  const model::ModelConfig& c;
  Synchronizer& sync;
  core::ThreadPool* pool;
  const int64_t n, F;
  const RowShare share;
  const std::vector<Range>& rows = share.rows;
  const std::vector<int64_t>& counts = share.counts;
  const Range me = share.mine;
  const int64_t p = me.size();
  Tensor full, a, ctx, out, scratch;
  const bool use_eq8;
  // With overlap (and Eq. 3), each block of rows is projected as it arrives:
  // Q of this device's own rows, K and V of every row. Which collectives run
  // must not depend on the rank (p and the order do).
  const bool ring, early;
  Tensor qkv;
  const Blocks blk;
  std::vector<int64_t> my_blocks;  // this device's rows in each block
  model::Workspace ws;

  Run(const model::Transformer& model, const Plan& plan, Synchronizer& s, const Tensor& x, int64_t rows_n,
      core::ThreadPool* tp)
      : m(model), c(model.config()), sync(s), pool(tp), n(rows_n), F(c.hidden),
        share(row_share(plan, rows_n, s.rank())),
        full(s.rank() == 0 ? x : Tensor::zeros_f32({n, F})),
        a(Tensor::zeros_f32({n, F})), ctx(Tensor::zeros_f32({p, c.q_width()})), out(Tensor::zeros_f32({p, F})),
        scratch(Tensor::zeros_f32({partition_attention_scratch(n, F, p, c.qkv_width())})),
        use_eq8(eq8(plan, c, p, n)),
        ring(option(plan, "overlap", true).value_or(true)),
        early(ring && !use_eq8 && p > 0),
        qkv(early ? Tensor::zeros_f32({n, c.qkv_width()}) : Tensor()),
        blk(blocks(plan, counts)) {
    const auto rank = static_cast<size_t>(sync.rank());
    for (const auto& bc : blk.counts) my_blocks.push_back(bc[rank]);
  }

  PartitionAttention attention_args(int64_t l) {
    const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
    PartitionAttention pa;
    pa.x = a.f32(); pa.n = n; pa.f = F; pa.heads = c.heads; pa.head_dim = c.head_dim(); pa.rows = me;
    pa.packed_qkv = &w.qkv_w; pa.b_qkv = w.qkv_b.f32(); pa.scale = m.attention_scale(l);
    pa.causal = c.causal(); pa.out = ctx.f32(); pa.qkv = early ? qkv.f32() : nullptr;
    if (c.llama_style()) {
      pa.q_width = c.q_width();
      pa.kv_width = c.kv_width();
      pa.kv_group = c.kv_group();
      pa.position = [this, l](float* x, int64_t ld, int64_t r0, int64_t count, bool keys) {
        model::position_heads(m, l, x, ld, count, r0, keys ? c.kv_head_count() : c.heads, keys, pool);
      };
    }
    return pa;
  }
  // Layer l's attention input for `count` rows from r0, in `full` already ...
  void input_rows(int64_t l, int64_t r0, int64_t count) {
    if (p > 0 && count > 0) m.layer_input(l, full.f32() + r0 * F, count, a.f32() + r0 * F, pool);
  }
  // ... and, once all of `owner`'s rows are in, their keys and values (and
  // this device's queries): one GEMM per part, as each block of rows would
  // stream the weights again.
  void project_part(int64_t l, int owner) {
    const Range& part = rows[static_cast<size_t>(owner)];
    if (!early || part.size() == 0) return;
    const bool own = owner == sync.rank();
    const int64_t q = c.q_width(), kv = 2 * c.kv_width();
    partition_project_f32(attention_args(l), part.begin, part.size(), own ? 0 : q, own ? q + kv : kv, qkv.f32());
  }

  // The terminal's input to every device. With the ring: in parts, this
  // device's part first, received in place, each part's attention input
  // computed (and projected) as it arrives.
  core::Status distribute_input() {
    if (!ring) {
      TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), n * F), 0));
      if (p > 0) m.layer_input(0, full.f32(), n, a.f32(), pool);
      return core::ok_status();
    }
    TESSERA_ASSIGN_OR_RETURN(auto tiles, sync.broadcast_tiles(floats(full.f32(), n * F), counts, F, 0));
    while (!tiles->done()) {
      TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles->next());
      input_rows(0, rows[static_cast<size_t>(t.owner)].begin, t.count);
      project_part(0, t.owner);
    }
    return tiles->finish();
  }

  // This device's output rows of layer l's attention (Algorithm 1).
  void attention(int64_t l) {
    if (p > 0) partition_attention_f32(attention_args(l), use_eq8, scratch.f32());
  }

  // The tiles of block b's stream that are in (with `wait`, all of them):
  // rows of layer l + 1's input, and each owner's part projected once all
  // its blocks are in.
  core::Status take_block(int64_t l, size_t b, TileStream& s, std::vector<size_t>& taken, bool wait) {
    while (!s.done() && (wait || s.ready())) {
      TESSERA_ASSIGN_OR_RETURN(const Tile t, s.next());
      const auto owner = static_cast<size_t>(t.owner);
      const int64_t r0 = rows[owner].begin + blk.starts[b][owner];
      if (t.count > 0) std::memcpy(full.f32() + r0 * F, t.rows.data(), t.rows.size_bytes());
      input_rows(l + 1, r0, t.count);
      if (++taken[owner] == blk.counts.size()) project_part(l + 1, t.owner);
    }
    return core::ok_status();
  }

  // Layer l's tail with the ring: block b's rows leave as soon as they are
  // final, one AllGather stream each; blocks that came in meanwhile are
  // taken between blocks. They write rows of `full` and `a` the rest of
  // this tail never reads.
  core::Status tail_streaming_blocks(int64_t l) {
    std::vector<std::unique_ptr<TileStream>> streams;
    std::vector<size_t> taken(rows.size(), 0);  // blocks in, per owner
    core::Status st = core::ok_status();
    auto send_block = [&](int64_t r0, int64_t count) {
      if (!st.ok()) return;
      const size_t b = streams.size();
      auto s = sync.allgather_tiles(floats(out.f32() + r0 * F, count * F), blk.counts[b], F, static_cast<int>(b));
      if (!s.ok()) {
        st = s.status();
        return;
      }
      streams.push_back(std::move(s).value());
      for (size_t d = 0; d < b && st.ok(); ++d) st = take_block(l, d, *streams[d], taken, false);
    };
    if (p > 0) m.layer_tail(l, full.f32() + me.begin * F, ctx.f32(), p, out.f32(), ws, pool, my_blocks, send_block);
    while (st.ok() && streams.size() < blk.counts.size()) send_block(p, 0);  // a device without rows
    TESSERA_RETURN_IF_ERROR(st);
    // What is in already (this device's last block) before waiting.
    for (size_t b = 0; b < streams.size(); ++b) TESSERA_RETURN_IF_ERROR(take_block(l, b, *streams[b], taken, false));
    for (size_t b = 0; b < streams.size(); ++b) {
      TESSERA_RETURN_IF_ERROR(take_block(l, b, *streams[b], taken, true));
      TESSERA_RETURN_IF_ERROR(streams[b]->finish());
    }
    return core::ok_status();
  }

  // Layer l's tail on this device's rows, whole.
  void tail(int64_t l) {
    if (p > 0) m.layer_tail(l, full.f32() + me.begin * F, ctx.f32(), p, out.f32(), ws, pool);
  }

  // Every device's rows to every device, and layer l + 1's attention input.
  core::Status allgather_next_input(int64_t l) {
    TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(out.f32(), p * F), counts, F, floats(full.f32(), n * F)));
    if (p > 0) m.layer_input(l + 1, full.f32(), n, a.f32(), pool);
    return core::ok_status();
  }

  // The last layer's rows to the terminal only.
  core::Status gather_to_terminal() {
    return sync.gather_rows(floats(out.f32(), p * F), counts, F,
                            sync.rank() == 0 ? floats(full.f32(), n * F) : std::span<float>(), 0);
  }
};

Result<Tensor> Voltage::run_keeping(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x,
                                    int64_t n, core::ThreadPool* pool, const KvSink* sink) const {
  Run v(m, plan, sync, x, n, pool);
  if (sink != nullptr && v.use_eq8) return core::internal_error("voltage: a handover needs Eq. (3)");
  TESSERA_RETURN_IF_ERROR(v.distribute_input());
  const model::ModelConfig& c = m.config();
  const int64_t layers = c.layers;
  for (int64_t l = 0; l < layers; ++l) {
    v.attention(l);
    // Eq. (3)'s K and V of every row: in qkv with the ring, else where
    // partition_attention_f32 projected them (the scratch's front).
    if (sink != nullptr && v.p > 0) {
      const float* k = (v.early ? v.qkv.f32() : v.scratch.f32()) + c.q_width();
      TESSERA_RETURN_IF_ERROR((*sink)(l, k, c.qkv_width(), k + c.kv_width(), c.qkv_width(), n));
    }
    const bool last = l + 1 == layers;
    if (!last && v.ring) {
      TESSERA_RETURN_IF_ERROR(v.tail_streaming_blocks(l));
      continue;
    }
    v.tail(l);
    TESSERA_RETURN_IF_ERROR(last ? v.gather_to_terminal() : v.allgather_next_input(l));
  }
  return sync.rank() == 0 ? std::move(v.full) : Tensor();
}

Schedule Voltage::estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const {
  const int K = plan.world;
  const int64_t F = c.hidden, hd = c.head_dim();
  const auto counts = range_sizes(row_ranges(plan, n));
  const bool ring = option(plan, "overlap", true).value_or(true);
  const Blocks blk = blocks(plan, counts);
  Schedule s;
  for (int r = 0; r < K; ++r) {
    const int64_t p = counts[static_cast<size_t>(r)];
    const bool use_eq8 = eq8(plan, c, p, n), early = ring && !use_eq8 && p > 0;
    DeviceSchedule d;
    // Projections done as parts arrive belong to the phase of the transfer
    // they overlap, but the part that comes in last (`last_in`) is projected
    // only once it is in: a phase of its own after the transfer.
    auto blocks_work = [&](Phase& ph, Phase& after, int last_in) {
      if (p == 0) return;
      ph.work.push_back(elementwise("norm", n, F));
      if (!early) return;
      ph.work.push_back(gemm("q", p, F, c.q_width()));
      for (size_t q = 0; q < counts.size(); ++q)
        if (counts[q] > 0)
          (static_cast<int>(q) == last_in && q != static_cast<size_t>(r) ? after : ph).work.push_back(gemm("kv", counts[q], F, 2 * c.kv_width()));
    };
    Phase first{"distribute input", -1, {}, {}, ring}, first_after{"last part in", -1, {}, {}, false};
    const int64_t first_sent = ring ? (r == 0 ? n * F * (K - 1) : 0) : tree_broadcast_sent(n * F, K, r, 0);
    first.transfers.push_back(transfer(CollectiveKind::kBroadcast, "x", first_sent, everyone_but(r, K)));
    blocks_work(first, first_after, own_part_first(r, K).back());
    d.phases.push_back(std::move(first));
    if (ring) d.phases.push_back(std::move(first_after));
    for (int64_t l = 0; l < c.layers; ++l) {
      Phase layer{"layer", l, {}, {}, false};
      if (p > 0) {
        if (use_eq8) {
          layer.work.push_back(gemm("q", p, F, F));
          for (int64_t h = 0; h < c.heads; ++h) {
            layer.work.push_back(gemm("q_wk", p, hd, F));
            layer.work.push_back(gemm("scores", p, F, n));
            layer.work.push_back(gemm("s_x", p, n, F));
            layer.work.push_back(gemm("sx_wv", p, F, hd));
          }
        } else {
          if (!early) {
            layer.work.push_back(gemm("q", p, F, c.q_width()));
            layer.work.push_back(gemm("kv", n, F, 2 * c.kv_width()));
          }
          layer.work.push_back(attention("attention", p, n, c.q_width()));
        }
        add_tail_work(layer.work, c, p);
      }
      const bool last = l + 1 == c.layers;
      const bool streamed = !last && ring;
      Phase sync_phase{last ? "gather output" : "allgather", l, {}, {}, streamed};
      if (streamed && p > 0) {
        // The FFN output of every block but the first runs while earlier blocks travel.
        layer.work.pop_back();  // its norm
        layer.work.pop_back();  // ffn_out, split by blocks below
        for (size_t b = 0; b < blk.counts.size(); ++b) {
          const int64_t rows_b = blk.counts[b][static_cast<size_t>(r)];
          if (rows_b == 0) continue;
          auto& w = b == 0 ? layer.work : sync_phase.work;
          w.push_back(gemm("ffn_out", rows_b, c.intermediate, F));
          w.push_back(elementwise(c.llama_style() ? "residual" : "norm", rows_b, F));
        }
      }
      d.phases.push_back(std::move(layer));
      Phase after{"last part in", l, {}, {}, false};
      if (last) {
        sync_phase.transfers.push_back(transfer(CollectiveKind::kGather, "y", r == 0 ? 0 : p * F, {0}));
      } else {
        sync_phase.transfers.push_back(transfer(CollectiveKind::kAllgather, "x", ring_allgather_sent(counts, F, r), everyone_but(r, K)));
        if (ring) {
          blocks_work(sync_phase, after, ring_order(r, K).back());
        } else if (p > 0) {
          sync_phase.work.push_back(elementwise("norm", n, F));
        }
      }
      d.phases.push_back(std::move(sync_phase));
      if (streamed) d.phases.push_back(std::move(after));
    }
    d.weight_bytes = c.layers * model_layer_weight_bytes(c, 0) + (r == 0 ? terminal_weight_bytes(c) : 0);
    d.activation_bytes = (2 * n * F + p * (F + c.q_width()) + partition_attention_scratch(n, F, p, c.qkv_width()) +
                          (early ? n * c.qkv_width() : 0) +
                          p * (c.qkv_width() + c.intermediate + (c.llama_style() ? 2 * c.intermediate : 0))) * 4;
    s.devices.push_back(std::move(d));
  }
  return s;
}

}  // namespace

std::unique_ptr<Strategy> make_voltage_strategy() { return std::make_unique<Voltage>(); }

}  // namespace tessera::parallel
