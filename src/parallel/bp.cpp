// DeTransformer block parallelism (paper 002, §III-B and §III-C) on a
// decoupled model (ModelConfig::bp_div). A decoupled layer's N sub-blocks are
// spread over the devices (plan.ratios; contiguous, so a device's features
// are one column range) and run with no communication. Original layers are
// synchronisation points, run by one of the paper's three plans (option
// "plan"): tp (AllGather of the slices, then Megatron TP: two AllReduce),
// sp (AllGather of the slices, SP inside: AllGather of K and of V, then an
// AllGather of the output rows) or allgather (AllGather of the slices, every
// device runs the whole layer). "auto" is priced by the planner on the
// profiles (Strategy::variants, planner/variants.h); a plan still "auto"
// when it runs (no profile: tests, fidelity) takes allgather, the plan with
// the least communication. On an ordinary model every layer is original.
//
// Slices travel block-major: the sub-blocks' [n, h/N] matrices one after the
// other, so a device's part of every collective is contiguous rows. Before an
// original layer the slices go out one sub-block at a time, each as soon as
// it is computed (one AllGather stream per sub-block index), so they travel
// while the device computes its next sub-block.
#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/packed_linear.h"
#include "model/layer_blocks.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;
using kernels::Activation;

namespace {

enum class Orig { kTp, kSp, kAllgather };

const char* const kPlans[] = {"tp", "sp", "allgather"};

// Everything run() and estimate() share about the layout.
struct Layout {
  int K = 1;
  int64_t n = 0, H = 0, Fr = 0, I = 0;
  Orig orig = Orig::kAllgather;
  std::vector<Range> blocks;         // sub-blocks of each device
  std::vector<int64_t> slice_rows;   // block-major rows of each device: blocks * n
  std::vector<int64_t> row_counts;   // SP: sequence rows of each device
  std::vector<Range> heads, ffn;     // TP shards
  int64_t total_slice_rows() const {
    int64_t t = 0;
    for (int64_t x : slice_rows) t += x;
    return t;
  }
};

Orig orig_of(const Plan& plan) {
  const std::string p = option<std::string>(plan, "plan", "auto").value_or("auto");
  return p == "tp" ? Orig::kTp : p == "sp" ? Orig::kSp : Orig::kAllgather;
}

Layout layout_of(const Plan& plan, const model::ModelConfig& c, int64_t n) {
  Layout L;
  L.K = plan.world;
  L.n = n;
  L.H = c.hidden;
  L.Fr = c.block_width();
  L.I = c.intermediate;
  L.orig = orig_of(plan);
  L.blocks = split_by_ratio(c.bp_div, plan.ratios);
  for (const Range& b : L.blocks) L.slice_rows.push_back(b.size() * n);
  L.row_counts = range_sizes(row_ranges(plan, n));
  L.heads = head_ranges(c, plan.ratios);
  L.ffn = ffn_ranges(c, plan.ratios);
  return L;
}

// Row-major [n, H] <-> block-major slices of sub-blocks [b0, b1).
void to_blocks(const float* x, int64_t n, int64_t H, int64_t Fr, int64_t b0, int64_t b1, float* out) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(out + ((b - b0) * n + r) * Fr, x + r * H + b * Fr, static_cast<size_t>(Fr) * sizeof(float));
}
void from_blocks(const float* in, int64_t n, int64_t H, int64_t Fr, int64_t blocks, float* x) {
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(x + r * H + b * Fr, in + (b * n + r) * Fr, static_cast<size_t>(Fr) * sizeof(float));
}

// Where the activations are between layers.
enum class Where { kTerminal, kSliced, kFull, kDone };

// Streams of the AllGather before an original layer: one per sub-block index
// of the device with the most (0: one whole AllGather, too many for streams).
int64_t slice_streams(const Layout& L) {
  int64_t most = 0;
  for (const Range& b : L.blocks) most = std::max<int64_t>(most, b.size());
  return most <= kMaxTileStreams ? most : 0;
}
// Rows each device sends on stream j: its j-th sub-block, if it has one.
std::vector<int64_t> stream_counts(const Layout& L, int64_t j) {
  std::vector<int64_t> counts;
  for (const Range& b : L.blocks) counts.push_back(j < b.size() ? L.n : 0);
  return counts;
}

class Bp final : public Strategy {
 public:
  std::string name() const override { return "bp"; }
  std::string summary() const override {
    return "DeTransformer block parallelism: sub-blocks of decoupled layers with no communication, original layers by "
           "--bp-plan";
  }
  ShareKind share_kind() const override { return ShareKind::kRows; }
  bool runs_decoupled() const override { return true; }
  std::vector<OptionFlag> flags() const override {
    return {{"--bp-plan", "plan", OptionFlag::Kind::kString,
             "original layers: tp, sp, allgather or auto (default: auto, the plan with the smallest sum of profiled "
             "durations that fits every device's memory)"}};
  }
  std::vector<nlohmann::json> variants(const Plan& plan) const override {
    if (option<std::string>(plan, "plan", "auto").value_or("") != "auto") return {};
    std::vector<nlohmann::json> out;
    for (const char* p : kPlans) out.push_back({{"plan", p}});
    return out;
  }

  core::Status complete(Plan& plan, const model::ModelConfig& c) const override {
    if (!c.plain_layers())
      return core::unimplemented("strategy 'bp' runs decoupled models (block_parallel), which exist for BERT and GPT-2 only");
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"plan", "auto_ms"}));
    TESSERA_ASSIGN_OR_RETURN(const std::string p, option<std::string>(plan, "plan", "auto"));
    if (p != "auto" && p != "tp" && p != "sp" && p != "allgather")
      return core::invalid_argument("strategy 'bp': --bp-plan must be tp, sp, allgather or auto, not '" + p + "'");
    plan.options["plan"] = p;
    if (plan.options.contains("auto_ms")) {  // the planner's per-plan sums, kept for --stats
      const auto& a = plan.options["auto_ms"];
      if (!a.is_object() || a.size() > 3) return core::invalid_argument("strategy 'bp': 'auto_ms' must be an object of sums");
      for (const auto& [k, v] : a.items())
        if (!v.is_number() && !v.is_null()) return core::invalid_argument("strategy 'bp': 'auto_ms' must hold numbers");
    }
    return core::ok_status();
  }

  model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const override {
    const Layout L = layout_of(plan, c, 1);
    const auto r = static_cast<size_t>(rank);
    model::LoadOptions o;
    if (L.orig == Orig::kTp) o = shard_load_options(L.heads[r], L.ffn[r], rank);  // original layers only
    o.embeddings = o.head = rank == 0;
    o.block_begin = L.blocks[r].begin;
    o.block_end = L.blocks[r].end;
    return o;
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    const model::ModelConfig& c = m.config();
    const Layout L = layout_of(plan, c, n);
    const int r = sync.rank();
    const auto ru = static_cast<size_t>(r);
    const int64_t H = L.H, Fr = L.Fr, nb = L.blocks[ru].size();
    Tensor full = r == 0 ? x : Tensor::zeros_f32({n, H});
    Tensor xs = Tensor::zeros_f32({std::max<int64_t>(nb * n, 1), Fr});  // my slices
    Tensor all;                                                         // everyone's slices
    model::Workspace ws;
    OrigBuffers ob;
    Where at = Where::kTerminal;
    for (int64_t l = 0; l < c.layers; ++l) {
      if (c.decoupled(l)) {
        std::unique_ptr<TileStream> entry;  // the terminal's slices, one sub-block per message
        if (at == Where::kTerminal) {
          if (r == 0) all = blocks_of(full, L, 0, c.bp_div);
          TESSERA_ASSIGN_OR_RETURN(entry, sync.scatter_tiles(r == 0 ? floats(all.f32(), L.total_slice_rows() * Fr) : std::span<const float>(),
                                                             L.slice_rows, Fr, floats(xs.f32(), nb * n * Fr), 0, n));
        } else if (at == Where::kFull) {
          to_blocks(full.f32(), n, H, Fr, L.blocks[ru].begin, L.blocks[ru].end, xs.f32());
        }
        // If the next layer is original, each slice leaves as soon as it is done.
        const bool gather_next = l + 1 < c.layers && !c.decoupled(l + 1);
        const int64_t streams = gather_next ? slice_streams(L) : 0;
        std::vector<std::unique_ptr<TileStream>> out;
        for (int64_t j = 0; j < std::max(nb, streams); ++j) {
          if (j < nb) {
            if (entry) TESSERA_RETURN_IF_ERROR(entry->next().status());  // sub-block j's slice is in
            m.block(l, L.blocks[ru].begin + j, xs.f32() + j * n * Fr, n, 0, nullptr, ws, pool);
          }
          if (j < streams) {
            const int64_t rows = j < nb ? n : 0;
            TESSERA_ASSIGN_OR_RETURN(auto st, sync.allgather_tiles(floats(xs.f32() + j * n * Fr, rows * Fr),
                                                                   stream_counts(L, j), Fr, static_cast<int>(j)));
            out.push_back(std::move(st));
          }
        }
        if (entry) TESSERA_RETURN_IF_ERROR(entry->finish());
        if (streams == 0) {
          at = Where::kSliced;
          continue;
        }
        // Post-LN (BERT) with every device running the original layer: its
        // Q, K, V projection is a sum over the slices' columns, so it starts
        // on the slices that are in while the last ones travel.
        const bool early_qkv = L.orig == Orig::kAllgather && !c.pre_layernorm();
        std::vector<char> have(static_cast<size_t>(c.bp_div), 0);  // 1: in `full`, 2: projected too
        auto take = [&](bool wait) -> core::Status {
          for (int64_t j = 0; j < streams; ++j) {
            TileStream& st = *out[static_cast<size_t>(j)];
            while (!st.done() && (wait || st.ready())) {
              TESSERA_ASSIGN_OR_RETURN(const Tile t, st.next());
              if (t.count == 0) continue;
              const int64_t b = L.blocks[static_cast<size_t>(t.owner)].begin + j;  // the sub-block it holds
              for (int64_t row = 0; row < n; ++row)
                std::memcpy(full.f32() + row * H + b * Fr, t.rows.data() + row * Fr, static_cast<size_t>(Fr) * sizeof(float));
              have[static_cast<size_t>(b)] = 1;
            }
            if (wait) TESSERA_RETURN_IF_ERROR(st.finish());
          }
          return core::ok_status();
        };
        if (early_qkv) {
          TESSERA_RETURN_IF_ERROR(take(false));
          project_slices(m, l + 1, L, full, have, ob, pool);
        }
        TESSERA_RETURN_IF_ERROR(take(true));
        if (early_qkv) project_slices(m, l + 1, L, full, have, ob, pool);
        at = Where::kFull;
        continue;
      }
      if (at == Where::kSliced) {
        if (all.empty()) all = Tensor::zeros_f32({L.total_slice_rows(), Fr});
        TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(xs.f32(), nb * n * Fr), L.slice_rows, Fr,
                                                    floats(all.f32(), L.total_slice_rows() * Fr)));
        from_blocks(all.f32(), n, H, Fr, c.bp_div, full.f32());
        at = Where::kFull;
      }
      TESSERA_ASSIGN_OR_RETURN(at, original_layer(m, l, L, plan, sync, full, at, l + 1 == c.layers, ob, ws, pool));
    }
    if (at == Where::kSliced) {
      if (r == 0 && all.empty()) all = Tensor::zeros_f32({L.total_slice_rows(), Fr});
      TESSERA_RETURN_IF_ERROR(sync.gather_rows(floats(xs.f32(), nb * n * Fr), L.slice_rows, Fr,
                                               r == 0 ? floats(all.f32(), L.total_slice_rows() * Fr) : std::span<float>(), 0));
      if (r == 0) from_blocks(all.f32(), n, H, Fr, c.bp_div, full.f32());
    }
    return r == 0 ? full : Tensor();
  }

  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    const Layout L = layout_of(plan, c, n);
    Schedule s;
    for (int r = 0; r < L.K; ++r) {
      const Share me = share_of(L, c, r);
      DeviceSchedule d;
      Walk walk;
      for (int64_t l = 0; l < c.layers; ++l) {
        if (c.decoupled(l)) estimate_decoupled_layer(L, c, me, l, walk, d);
        else estimate_original_layer(L, c, me, l, walk, d);
      }
      if (walk.at == Where::kSliced)
        d.phases.push_back({"gather slices", -1, {}, {transfer(CollectiveKind::kGather, "slices", r == 0 ? 0 : L.slice_rows[static_cast<size_t>(r)] * L.Fr, {0})}, false});
      estimate_memory(L, c, me, d);
      s.devices.push_back(std::move(d));
    }
    return s;
  }

 private:
  struct OrigBuffers {
    Tensor a, qkv, ctx, part, h, f, scores, xp, kp, vp, k, v;
    int64_t qkv_layer = -1;  // the layer whose Q, K, V `qkv` holds, summed over every slice
    bool qkv_started = false;
  };

  // Layer l's Q, K, V over the columns of the sub-blocks in `full` and not
  // yet projected (have: 1 -> 2), one product per run of adjacent ones,
  // added up in ob.qkv (the bias comes with the first).
  static void project_slices(const model::Transformer& m, int64_t l, const Layout& L, const Tensor& full,
                             std::vector<char>& have, OrigBuffers& ob, core::ThreadPool* pool) {
    const int64_t n = L.n, H = L.H, Fr = L.Fr, nb = static_cast<int64_t>(have.size());
    if (ob.qkv.empty() || ob.qkv.numel() < n * 3 * H) ob.qkv = Tensor::zeros_f32({std::max<int64_t>(n, 1), 3 * H});
    const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
    if (ob.qkv_layer != l) ob.qkv_started = false;
    ob.qkv_layer = l;
    for (int64_t b = 0; b < nb;) {
      if (have[static_cast<size_t>(b)] != 1) {
        ++b;
        continue;
      }
      int64_t e = b;
      while (e < nb && have[static_cast<size_t>(e)] == 1) have[static_cast<size_t>(e++)] = 2;
      kernels::PackedLinearArgs a;
      a.x = full.f32() + b * Fr; a.m = n; a.ldx = H; a.w = &w.qkv_w; a.y = ob.qkv.f32(); a.ldy = 3 * H;
      a.k0 = b * Fr; a.k1 = e * Fr; a.accumulate = ob.qkv_started;
      if (!ob.qkv_started) a.bias = w.qkv_b.f32();
      kernels::packed_linear_f32(pool, a);
      ob.qkv_started = true;
      b = e;
    }
  }

  // estimate()'s steps, for one device (`me`) and one layer at a time.
  // A device's shares under the plan.
  struct Share {
    int r = 0;
    int64_t nb = 0;  // its sub-blocks of each decoupled layer
    int64_t p = 0;   // SP: its sequence rows
    int64_t w = 0, il = 0;  // TP: its head columns and FFN columns
  };
  static Share share_of(const Layout& L, const model::ModelConfig& c, int r) {
    const auto ru = static_cast<size_t>(r);
    return {r, L.blocks[ru].size(), L.row_counts[ru], L.heads[ru].size() * c.head_dim(), L.ffn[ru].size()};
  }
  // Where the activations are after the layers so far, and the Q, K, V
  // columns the next original layer has left (>= 0: it began on the slices).
  struct Walk {
    Where at = Where::kTerminal;
    int64_t qkv_cols_left = -1;
  };

  // A decoupled layer: its sub-blocks, after the terminal's slices if they
  // come from it, and before an original layer the slices' AllGather streams.
  static void estimate_decoupled_layer(const Layout& L, const model::ModelConfig& c, const Share& me, int64_t l, Walk& walk,
                                       DeviceSchedule& d) {
    const int K = L.K, r = me.r;
    const int64_t n = L.n, H = L.H, Fr = L.Fr;
    walk.qkv_cols_left = -1;
    Phase ph{"sub-blocks", l, {}, {}, false};
    if (walk.at == Where::kTerminal) {
      // Each device's first slice, then the rest while the devices compute.
      int64_t first = 0;
      for (int q = 1; q < K; ++q) first += std::min(L.slice_rows[static_cast<size_t>(q)], n);
      const int64_t rest = L.total_slice_rows() - L.slice_rows[0] - first;
      d.phases.push_back({"first slices", l, {},
                          {transfer(CollectiveKind::kScatter, "slices", r == 0 ? first * Fr : 0, everyone_but(r, K))}, false});
      ph.transfers.push_back(transfer(CollectiveKind::kScatter, "slices", r == 0 ? rest * Fr : 0, everyone_but(r, K)));
      ph.overlapped = true;
    }
    const int64_t streams = l + 1 < c.layers && !c.decoupled(l + 1) ? slice_streams(L) : 0;
    if (streams == 0) {
      for (int64_t j = 0; j < me.nb; ++j) add_block_work(ph.work, c, n);
      d.phases.push_back(std::move(ph));
      walk.at = Where::kSliced;
      return;
    }
    // Stream j travels while sub-block j + 1 computes; the last one
    // alone, or (early Q, K, V) while the slices in are projected.
    const bool early_qkv = L.orig == Orig::kAllgather && !c.pre_layernorm();
    int64_t last_cols = 0;  // the columns that come in with the last stream
    for (int q = 0; q < K; ++q)
      if (q != r && L.blocks[static_cast<size_t>(q)].size() == streams) last_cols += Fr;
    if (me.nb > 0) add_block_work(ph.work, c, n);
    d.phases.push_back(std::move(ph));
    for (int64_t j = 0; j < streams; ++j) {
      Phase next{"sub-block and slices", l, {}, {}, j + 1 < streams || early_qkv};
      if (j + 1 < me.nb) add_block_work(next.work, c, n);
      if (early_qkv && j + 1 == streams) next.work.push_back(gemm("qkv", n, H - last_cols, 3 * H));
      next.transfers.push_back(transfer(CollectiveKind::kAllgather, "slices",
                                        ring_allgather_sent(stream_counts(L, j), Fr, r), everyone_but(r, K)));
      d.phases.push_back(std::move(next));
    }
    walk.qkv_cols_left = early_qkv ? last_cols : -1;
    walk.at = Where::kFull;
  }

  // An original layer: the slices gathered if they are still apart, then
  // the layer by the plan's sp, allgather or tp.
  static void estimate_original_layer(const Layout& L, const model::ModelConfig& c, const Share& me, int64_t l, Walk& walk,
                                      DeviceSchedule& d) {
    Phase ph{"original", l, {}, {}, false};
    if (walk.at == Where::kSliced)
      ph.transfers.push_back(transfer(CollectiveKind::kAllgather, "slices", ring_allgather_sent(L.slice_rows, L.Fr, me.r),
                                      everyone_but(me.r, L.K)));
    const bool first = walk.at == Where::kTerminal, last = l + 1 == c.layers;
    if (L.orig == Orig::kSp) {
      estimate_sp_original(L, c, me, l, first, last, std::move(ph), d);
    } else {
      if (first)
        ph.transfers.push_back(transfer(CollectiveKind::kBroadcast, "x", tree_broadcast_sent(L.n * L.H, L.K, me.r, 0),
                                        everyone_but(me.r, L.K)));
      if (L.orig == Orig::kAllgather) estimate_whole_original(c, L.n, L.H, walk.qkv_cols_left, std::move(ph), d);
      else estimate_tp_original(L, c, me, l, std::move(ph), d);
    }
    walk.at = Where::kFull;
    walk.qkv_cols_left = -1;
  }

  // SP: the x rows scattered from the terminal on entry, Q, K, V of this
  // device's rows, K and V gathered, its rows' attention and tail, and the
  // rows gathered (to the terminal after the last layer).
  static void estimate_sp_original(const Layout& L, const model::ModelConfig& c, const Share& me, int64_t l, bool first,
                                   bool last, Phase ph, DeviceSchedule& d) {
    const int K = L.K, r = me.r;
    const int64_t n = L.n, H = L.H, p = me.p;
    if (first) ph.transfers.push_back(transfer(CollectiveKind::kScatter, "x", r == 0 ? (n - p) * H : 0, everyone_but(r, K)));
    ph.work.push_back(elementwise("norm", p, H));
    if (p > 0) ph.work.push_back(gemm("qkv", p, H, 3 * H));
    for (const char* what : {"k", "v"})
      ph.transfers.push_back(transfer(CollectiveKind::kAllgather, what, ring_allgather_sent(L.row_counts, H, r), everyone_but(r, K)));
    Phase rest{"original rows", l, {}, {}, false};
    if (p > 0) rest.work.push_back(attention("attention", p, n, H));
    add_tail_work(rest.work, c, p);
    if (last)
      rest.transfers.push_back(transfer(CollectiveKind::kGather, "y", r == 0 ? 0 : p * H, {0}));
    else
      rest.transfers.push_back(transfer(CollectiveKind::kAllgather, "y", ring_allgather_sent(L.row_counts, H, r), everyone_but(r, K)));
    d.phases.push_back(std::move(ph));
    d.phases.push_back(std::move(rest));
  }

  // allgather: every device runs the whole layer; with early Q, K, V only
  // the columns left (project_slices).
  static void estimate_whole_original(const model::ModelConfig& c, int64_t n, int64_t H, int64_t qkv_cols_left, Phase ph,
                                      DeviceSchedule& d) {
    if (qkv_cols_left >= 0) {
      ph.work.push_back(gemm("qkv", n, qkv_cols_left, 3 * H));
      ph.work.push_back(attention("attention", n, n, H));
      add_tail_work(ph.work, c, n);
    } else {
      add_layer_work(ph.work, c, n, n);
    }
    d.phases.push_back(std::move(ph));
  }

  // tp: this device's heads and FFN columns, two AllReduce, as tp.cpp.
  static void estimate_tp_original(const Layout& L, const model::ModelConfig& c, const Share& me, int64_t l, Phase ph,
                                   DeviceSchedule& d) {
    const int K = L.K, r = me.r;
    const int64_t n = L.n, H = L.H, w = me.w, il = me.il;
    ph.work.push_back(elementwise("norm", n, H));
    if (w > 0) {
      ph.work.push_back(gemm("qkv", n, H, 3 * w));
      ph.work.push_back(attention("attention", n, n, w));
    }
    ph.work.push_back(gemm("attn_out", n, w, H));
    ph.transfers.push_back(transfer(CollectiveKind::kAllreduce, "attn_out", ring_allreduce_sent(n * H, K, r), everyone_but(r, K)));
    Phase mlp{"original mlp", l, {elementwise("residual+norm", n, H), gemm("ffn_in", n, H, il), gemm("ffn_out", n, il, H)}, {}, false};
    mlp.transfers.push_back(transfer(CollectiveKind::kAllreduce, "ffn_out", ring_allreduce_sent(n * H, K, r), everyone_but(r, K)));
    d.phases.push_back(std::move(ph));
    d.phases.push_back(std::move(mlp));
    d.phases.push_back({"residual", l, {elementwise("residual+norm", n, H)}, {}, false});
  }

  // Weights: this device's sub-blocks, the original layers (whole or its TP
  // shard) and the terminal's; activations: full [n, H], slices, workspace
  // (qkv, ctx, h, a, ffn), scores.
  static void estimate_memory(const Layout& L, const model::ModelConfig& c, const Share& me, DeviceSchedule& d) {
    const int64_t n = L.n, H = L.H;
    const int64_t originals = c.layers - decoupled_layers(c);
    const int64_t block_bytes = block_weight_bytes(c) * me.nb * decoupled_layers(c);
    const int64_t orig_bytes = L.orig == Orig::kTp ? layer_weight_bytes(c, me.w, me.il) : layer_weight_bytes(c, H, L.I);
    d.weight_bytes = block_bytes + originals * orig_bytes + (me.r == 0 ? terminal_weight_bytes(c) : 0);
    d.activation_bytes = (n * H * 2 + L.total_slice_rows() * L.Fr + n * (6 * H + L.I) + n * n * c.heads) * 4;
  }

  static int64_t decoupled_layers(const model::ModelConfig& c) {
    int64_t d = 0;
    for (int64_t l = 0; l < c.layers; ++l) d += c.decoupled(l) ? 1 : 0;
    return d;
  }
  static Tensor blocks_of(const Tensor& full, const Layout& L, int64_t b0, int64_t b1) {
    Tensor out = Tensor::zeros_f32({std::max<int64_t>((b1 - b0) * L.n, 1), L.Fr});
    to_blocks(full.f32(), L.n, L.H, L.Fr, b0, b1, out.f32());
    return out;
  }

  // An original layer by the plan, from `at` (kTerminal: only rank 0 holds
  // the rows; kFull: every device does). Returns where the output is.
  Result<Where> original_layer(const model::Transformer& m, int64_t l, const Layout& L, const Plan& plan, Synchronizer& sync,
                               Tensor& full, Where at, bool last, OrigBuffers& b, model::Workspace& ws,
                               core::ThreadPool* pool) const {
    const model::ModelConfig& c = m.config();
    const int64_t n = L.n, H = L.H;
    const auto ru = static_cast<size_t>(sync.rank());
    auto ensure = [](Tensor& t, int64_t rows, int64_t cols) {
      if (t.empty()) t = Tensor::zeros_f32({std::max<int64_t>(rows, 1), cols});
    };
    if (L.orig == Orig::kSp) {
      const RowShare share = row_share(plan, n, sync.rank());
      const int64_t p = share.mine.size();
      ensure(b.xp, p, H); ensure(b.a, p, H); ensure(b.qkv, p, 3 * H); ensure(b.kp, p, H); ensure(b.vp, p, H);
      ensure(b.ctx, p, H); ensure(b.k, n, H); ensure(b.v, n, H);
      if (b.scores.empty()) b.scores = Tensor::zeros_f32({std::max<int64_t>(p * n, 1)});
      if (at == Where::kTerminal) {
        TESSERA_RETURN_IF_ERROR(sync.scatter_rows(sync.rank() == 0 ? floats(full.f32(), n * H) : std::span<const float>(),
                                                  share.counts, H, floats(b.xp.f32(), p * H), 0));
      } else if (p > 0) {
        std::memcpy(b.xp.f32(), full.f32() + share.mine.begin * H, static_cast<size_t>(p * H) * sizeof(float));
      }
      const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
      m.layer_input(l, b.xp.f32(), p, b.a.f32(), pool);
      kernels::linear_rows_f32(pool, b.a.f32(), p, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, b.qkv.f32());
      for (int64_t i = 0; i < p; ++i) {
        std::memcpy(b.kp.f32() + i * H, b.qkv.f32() + i * 3 * H + H, static_cast<size_t>(H) * sizeof(float));
        std::memcpy(b.vp.f32() + i * H, b.qkv.f32() + i * 3 * H + 2 * H, static_cast<size_t>(H) * sizeof(float));
      }
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(b.kp.f32(), p * H), share.counts, H, floats(b.k.f32(), n * H)));
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(b.vp.f32(), p * H), share.counts, H, floats(b.v.f32(), n * H)));
      if (p > 0) {
        model::AttentionIo io;
        io.q = b.qkv.f32(); io.ldq = 3 * H; io.k = b.k.f32(); io.ldk = H; io.v = b.v.f32(); io.ldv = H;
        io.out = b.ctx.f32(); io.ldo = H; io.n_q = p; io.n_kv = n; io.q_pos0 = share.mine.begin;
        kernels::attention_f32(pool, model::attention_args(m, l, io), b.scores.f32(), b.scores.numel());
        m.layer_tail(l, b.xp.f32(), b.ctx.f32(), p, b.xp.f32(), ws, pool);
      }
      // Every device again holds all rows; after the last layer only the terminal needs them.
      if (last) {
        TESSERA_RETURN_IF_ERROR(sync.gather_rows(floats(b.xp.f32(), p * H), share.counts, H,
                                                 sync.rank() == 0 ? floats(full.f32(), n * H) : std::span<float>(), 0));
        return Where::kDone;
      }
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(b.xp.f32(), p * H), share.counts, H, floats(full.f32(), n * H)));
      return Where::kFull;
    }
    if (at == Where::kTerminal) TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), n * H), 0));
    if (L.orig == Orig::kAllgather) {
      if (b.qkv_layer != l) {
        m.layer(l, full, 0, nullptr, ws, pool);
        return Where::kFull;
      }
      // Q, K, V summed over the slices as they came (project_slices).
      b.qkv_layer = -1;
      ensure(b.ctx, n, H);
      if (b.scores.empty() || b.scores.numel() < n * n * c.heads) b.scores = Tensor::zeros_f32({std::max<int64_t>(n * n * c.heads, 1)});
      const model::AttentionIo io = model::fused_qkv_io(b.qkv.f32(), H, n, b.ctx.f32());
      kernels::attention_f32(pool, model::attention_args(m, l, io), b.scores.f32(), b.scores.numel());
      m.layer_tail(l, full.f32(), b.ctx.f32(), n, full.f32(), ws, pool);
      return Where::kFull;
    }
    // TP, as tp.cpp: partial projections summed, bias and residual added once.
    const Range heads = L.heads[ru];
    const int64_t fl = heads.size() * c.head_dim(), il = L.ffn[ru].size();
    ensure(b.a, n, H); ensure(b.qkv, n, 3 * fl); ensure(b.ctx, n, fl); ensure(b.part, n, H); ensure(b.h, n, H);
    ensure(b.f, n, il);
    if (b.scores.empty()) b.scores = Tensor::zeros_f32({std::max<int64_t>(n * n * heads.size(), 1)});
    const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
    float* xf = full.f32();
    m.layer_input(l, xf, n, b.a.f32(), pool);
    if (fl > 0) {
      kernels::linear_rows_f32(pool, b.a.f32(), n, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, b.qkv.f32());
      model::AttentionIo io = model::fused_qkv_io(b.qkv.f32(), fl, n, b.ctx.f32());
      io.heads = heads.size();
      kernels::attention_f32(pool, model::attention_args(m, l, io), b.scores.f32(), b.scores.numel());
    }
    kernels::linear_rows_f32(pool, b.ctx.f32(), n, w.attn_out_w, Tensor(), Activation::kNone, nullptr, b.part.f32());
    TESSERA_RETURN_IF_ERROR(sync.allreduce_sum(floats(b.part.f32(), n * H)));
    const float* mlp_in = model::attention_residual(m, l, b.part.f32(), xf, true, n, b.a.f32(), pool);
    std::memcpy(b.h.f32(), b.part.f32(), static_cast<size_t>(n * H) * sizeof(float));  // the MLP's residual
    if (mlp_in == b.part.f32()) mlp_in = b.h.f32();
    kernels::linear_rows_f32(pool, mlp_in, n, w.ffn_in_w, w.ffn_in_b, c.act, nullptr, b.f.f32());
    kernels::linear_rows_f32(pool, b.f.f32(), n, w.ffn_out_w, Tensor(), Activation::kNone, nullptr, b.part.f32());
    TESSERA_RETURN_IF_ERROR(sync.allreduce_sum(floats(b.part.f32(), n * H)));
    model::mlp_residual(m, l, b.part.f32(), b.h.f32(), true, n, xf, pool);
    return Where::kFull;
  }
};

}  // namespace

std::unique_ptr<Strategy> make_bp_strategy() { return std::make_unique<Bp>(); }

}  // namespace tessera::parallel
