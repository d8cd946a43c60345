// Inter-layer placement: any assignment of layers to devices (also back and
// forth), activations sent device to device, and weight pre-loading: while
// a device waits for its next input it pages that stage's weights in.
// Option "layer_map": the device of each unit ("0-5:0,6-11:1" or an array;
// default contiguous equal ranges). Option "units": "layers" (a unit is a
// layer) or "blocks" (unit 2l is layer l's attention block, 2l+1 its MLP
// block, so the ILP planner may put them on different devices). Option
// "preload" (default true): touch the next units' weights while waiting.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

// Micro-batches of a batched decode step (the option "micro_batches").
constexpr int64_t kDefaultMicroBatches = 1;

// Layer l's big matrices that unit `u` uses: the whole layer, or one block.
std::vector<const kernels::PackedLinear*> unit_matrices(const model::Transformer& model, int64_t u, bool blocks) {
  const int64_t l = blocks ? u / 2 : u;
  const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
  if (!blocks) return {&w.qkv_w, &w.attn_out_w, &w.ffn_in_w, &w.ffn_out_w};
  if (u % 2 == 0) return {&w.qkv_w, &w.attn_out_w};
  return {&w.ffn_in_w, &w.ffn_out_w};
}

// A matrix of row ranges in different block types (PackedLinear::parts)
// has no buffer of its own: each range is touched.
void touch(const kernels::PackedLinear& t, size_t page) {
  if (!t.parts().empty()) {
    for (const kernels::PackedLinear& p : t.parts()) touch(p, page);
    return;
  }
  if (t.empty() || t.nbytes() == 0 || t.raw() == nullptr) return;
  const auto addr = reinterpret_cast<uintptr_t>(t.raw());
  const uintptr_t start = addr & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(start), t.nbytes() + (addr - start), MADV_WILLNEED);
  volatile unsigned char sink = 0;
  for (size_t off = 0; off < t.nbytes(); off += page) sink = sink + static_cast<const unsigned char*>(t.raw())[off];
}

// Asks the kernel to read the stage's weight pages (mmap'd tensors are read
// lazily) and touches them, so the first GEMM finds them in memory (and
// the first of them in cache): the paper's weight pre-loading.
void preload(const model::Transformer& model, Range units, bool blocks) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t u = units.begin; u < units.end; ++u)
    for (const kernels::PackedLinear* t : unit_matrices(model, u, blocks)) touch(*t, page);
}

class Pipeline;

struct PipelineDecoder final : Decoder {
  PipelineDecoder(const Pipeline& p, const model::Transformer& m, const Plan& plan, Synchronizer& sync)
      : p(p), m(m), plan(plan), sync(sync) {}
  Result<Tensor> forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) override;
  // A pair's handover: the K/V of this device's own layers (the others' are theirs).
  core::Status take_kv(int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t n) override {
    return model::take_handover(cache, l, k, ldk, v, ldv, m.config().kv_width(), n);
  }
  bool batches(std::span<Decoder* const> decs) const override {
    for (int64_t l = 0; l < m.config().layers; ++l)
      if (m.config().decoupled(l)) return false;
    return std::all_of(decs.begin(), decs.end(), [](Decoder* d) { return dynamic_cast<PipelineDecoder*>(d) != nullptr; });
  }
  Result<Tensor> forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                              core::ThreadPool* pool) override;
  int overlapped_stages(std::span<Decoder* const> decs) const override;
  Result<Tensor> forward_stages(std::span<Decoder* const> decs, std::span<const int64_t> group_rows, Tensor x,
                                std::span<const int64_t> pos, core::ThreadPool* pool) override;
  const Pipeline& p;
  const model::Transformer& m;
  const Plan plan;
  Synchronizer& sync;
  model::KvCache cache;  // this device's layers only
  model::Workspace ws;
  // Overlapped steps: the rows this rank's stage computed for the group
  // this sequence leads, sent on at the next call.
  Tensor carried;
};

// Layer l's attention block on x [n, F]: x becomes the output projection
// plus the residual (before the norm that follows attention), as
// Transformer::layer computes it.
void attention_unit(const model::Transformer& m, int64_t l, core::Tensor& x, model::Workspace& ws, core::ThreadPool* pool) {
  const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const int64_t n = x.dim(0), F = m.config().hidden;
  ws.ensure(m.config(), n, n);
  m.layer_input(l, x.f32(), n, ws.a.f32(), pool);
  kernels::linear_rows_f32(pool, ws.a.f32(), n, w.qkv_w, w.qkv_b, kernels::Activation::kNone, nullptr, ws.qkv.f32());
  const kernels::AttentionArgs a = model::attention_args(m, l, model::fused_qkv_io(ws.qkv.f32(), F, n, ws.ctx.f32()));
  kernels::attention_f32(pool, a, ws.scores.f32(), ws.scores.numel());
  kernels::linear_rows_f32(pool, ws.ctx.f32(), n, w.attn_out_w, w.attn_out_b, kernels::Activation::kNone, x.f32(), ws.h.f32());
  std::memcpy(x.f32(), ws.h.f32(), static_cast<size_t>(n * F) * sizeof(float));
}

// Layer l's MLP block on the attention block's output h (in place): the
// norm after attention, the FFN, its residual and norm.
void mlp_unit(const model::Transformer& m, int64_t l, core::Tensor& h, model::Workspace& ws, core::ThreadPool* pool) {
  const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const int64_t n = h.dim(0);
  ws.ensure(m.config(), n, n);
  const float* mlp_in = model::attention_residual(m, l, h.f32(), nullptr, false, n, ws.a.f32(), pool);
  kernels::linear_rows_f32(pool, mlp_in, n, w.ffn_in_w, w.ffn_in_b, m.config().act, nullptr, ws.ffn.f32());
  kernels::linear_rows_f32(pool, ws.ffn.f32(), n, w.ffn_out_w, w.ffn_out_b, kernels::Activation::kNone, h.f32(), ws.qkv.f32());
  model::mlp_residual(m, l, ws.qkv.f32(), h.f32(), false, n, h.f32(), pool);
}

class Pipeline final : public Strategy {
 public:
  std::string name() const override { return "pipeline"; }
  bool takes_llama_layers(const Plan& plan) const override {  // whole layers, not blocks
    auto blocks = blocks_option(plan);
    return blocks.ok() && !*blocks;
  }
  ShareKind share_kind() const override { return ShareKind::kLayers; }
  void apply_partition(Plan& plan, const Partition& p) const override {
    if (!p.layer_map.empty()) plan.options["layer_map"] = p.layer_map;
    if (p.blocks) plan.options["units"] = "blocks";
  }
  std::string summary() const override { return "layers placed on devices (any map), weights pre-loaded while waiting"; }
  std::vector<OptionFlag> flags() const override {
    return {{"--layers", "layer_map", OptionFlag::Kind::kString, "pipeline placement, e.g. 0-5:0,6-11:1 (default contiguous)"},
            {"--units", "units", OptionFlag::Kind::kString, "pipeline units: layers (default) or blocks (attention, MLP)"},
            {"--no-preload", "preload", OptionFlag::Kind::kSetsBool, "pipeline: do not touch the next weights while waiting",
             false},
            {"--micro-batches", "micro_batches", OptionFlag::Kind::kNumber,
             "pipeline: a batched decode step (serve --max-batch) goes through the stages in this many parts"},
            {"--no-overlap", "overlap", OptionFlag::Kind::kSetsBool,
             "pipeline: batched decode steps do not keep a group of sequences at each stage", false}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig& c) const override {
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"layer_map", "units", "preload", "micro_batches", "overlap"}));
    TESSERA_ASSIGN_OR_RETURN(const bool overlap, option<bool>(plan, "overlap", true));
    plan.options["overlap"] = overlap;
    TESSERA_ASSIGN_OR_RETURN(const int64_t parts, option<int64_t>(plan, "micro_batches", kDefaultMicroBatches));
    if (parts < 1 || parts > 64) return core::invalid_argument("pipeline micro_batches must be in [1, 64]");
    plan.options["micro_batches"] = parts;
    TESSERA_ASSIGN_OR_RETURN(const bool blocks, blocks_option(plan));
    TESSERA_ASSIGN_OR_RETURN(const bool pre, option<bool>(plan, "preload", true));
    TESSERA_ASSIGN_OR_RETURN(LayerMap map, unit_map(plan, c));
    plan.options["layer_map"] = map.device_of_layer;
    plan.options["units"] = blocks ? "blocks" : "layers";
    plan.options["preload"] = pre;
    return core::ok_status();
  }

  model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const override {
    model::LoadOptions o;
    o.embeddings = o.head = rank == 0;
    const LayerMap map = unit_map(plan, c).value();
    if (!blocks_option(plan).value()) {
      o.only_layers = map.layers_on(rank);
    } else {
      for (int64_t u : map.layers_on(rank)) {
        const int part = u % 2 == 0 ? 1 : 2;
        if (!o.only_layers.empty() && o.only_layers.back() == u / 2) o.only_parts.back() |= part;
        else o.only_layers.push_back(u / 2), o.only_parts.push_back(part);
      }
    }
    if (o.only_layers.empty()) o.layer_end = 0;  // a device with no layer loads none
    return o;
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    model::Workspace ws;
    return run_cached(m, plan, sync, std::move(x), n, 0, nullptr, ws, pool);
  }

  bool decodes() const override { return true; }
  bool batches_steps() const override { return true; }
  bool takes_kv() const override { return true; }
  // Each device keeps the cache of its own layers; a step passes one row through the stages.
  Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                                                const model::CacheSpec& spec) const override {
    const model::ModelConfig& c = m.config();
    const int64_t positions = spec.positions;
    TESSERA_RETURN_IF_ERROR(model::check_kv_dtype(c, spec.dtype));
    if (positions < 1 || positions > c.max_positions)
      return core::out_of_range("a KV cache of " + std::to_string(positions) + " positions");
    TESSERA_ASSIGN_OR_RETURN(const bool blocks, blocks_option(plan));
    if (blocks) return core::unimplemented("pipeline generation places whole layers: use --units layers");
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, unit_map(plan, c));
    auto d = std::make_unique<PipelineDecoder>(*this, m, plan, sync);
    d->cache.k.resize(static_cast<size_t>(c.layers));
    d->cache.v.resize(static_cast<size_t>(c.layers));
    for (int64_t l : map.layers_on(sync.rank())) {
      TESSERA_ASSIGN_OR_RETURN(d->cache.k[static_cast<size_t>(l)], Tensor::try_zeros_lazy(spec.dtype, {positions, c.kv_width()}));
      TESSERA_ASSIGN_OR_RETURN(d->cache.v[static_cast<size_t>(l)], Tensor::try_zeros_lazy(spec.dtype, {positions, c.kv_width()}));
    }
    return std::unique_ptr<Decoder>(std::move(d));
  }

  // run() on rows at positions pos0.., with this device's layers' K/V in
  // `cache` when set. Decode steps skip the pre-loading: the prefill paged
  // the weights in, and touching every page per token would cost more than a step.
  Result<Tensor> run_cached(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                            int64_t pos0, model::KvCache* cache, model::Workspace& ws, core::ThreadPool* pool) const {
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, unit_map(plan, m.config()));
    TESSERA_ASSIGN_OR_RETURN(const bool blocks, blocks_option(plan));
    TESSERA_ASSIGN_OR_RETURN(const bool pre, option<bool>(plan, "preload", true));
    const int64_t F = m.config().hidden;
    const int me = sync.rank();
    int holder = 0;  // the device that holds the activations now
    Tensor cur = me == 0 ? x : Tensor::zeros_f32({n, F});
    for (const auto& stage : map.stages()) {
      if (stage.device != holder) {
        if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(stage.device, floats(cur.f32(), n * F)));
        if (me == stage.device) {
          std::thread loader;
          if (pre && pos0 == 0) loader = std::thread([&] { preload(m, stage.layers, blocks); });
          const core::Status st = sync.recv(holder, floats(cur.f32(), n * F));
          if (loader.joinable()) loader.join();
          TESSERA_RETURN_IF_ERROR(st);
        }
        holder = stage.device;
      }
      if (me != holder) continue;
      for (int64_t u = stage.layers.begin; u < stage.layers.end; ++u) {
        if (!blocks) m.layer(u, cur, pos0, cache, ws, pool);
        else if (u % 2 == 0) attention_unit(m, u / 2, cur, ws, pool);
        else mlp_unit(m, u / 2, cur, ws, pool);
      }
    }
    if (holder != 0) {
      if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(0, floats(cur.f32(), n * F)));
      if (me == 0) TESSERA_RETURN_IF_ERROR(sync.recv(holder, floats(cur.f32(), n * F)));
    }
    return me == 0 ? cur : Tensor();
  }

  // A batched decode step (step_rows): one row of each sequence, row i at
  // pos[i] over caches[i] (this device's layers). The rows go through the
  // stages in `parts` micro-batches, so that a later stage works on one
  // while an earlier stage works on the next; the rows come back to the
  // terminal after the last micro-batch has left it. Every rank runs the
  // same sequence of sends and receives, so no rank waits on a cycle.
  Result<Tensor> run_rows(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x,
                          std::span<const int64_t> pos, std::span<model::KvCache* const> caches, model::Workspace& ws,
                          core::ThreadPool* pool) const {
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, unit_map(plan, m.config()));
    TESSERA_ASSIGN_OR_RETURN(const int64_t want, option<int64_t>(plan, "micro_batches", kDefaultMicroBatches));
    const int64_t F = m.config().hidden, b = static_cast<int64_t>(pos.size());
    const int64_t parts = std::clamp<int64_t>(want, 1, b);
    const int me = sync.rank();
    Tensor cur = me == 0 ? x : Tensor::zeros_f32({b, F});
    std::vector<int> last(static_cast<size_t>(parts), 0);  // where each micro-batch ends
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t r0 = b * part / parts, n = b * (part + 1) / parts - r0;
      float* rows = cur.f32() + r0 * F;
      const auto p = pos.subspan(static_cast<size_t>(r0), static_cast<size_t>(n));
      const auto c = caches.subspan(static_cast<size_t>(r0), static_cast<size_t>(n));
      int holder = 0;
      for (const auto& stage : map.stages()) {
        if (stage.device != holder) {
          if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(stage.device, floats(rows, n * F)));
          if (me == stage.device) TESSERA_RETURN_IF_ERROR(sync.recv(holder, floats(rows, n * F)));
          holder = stage.device;
        }
        if (me != holder) continue;
        for (int64_t u = stage.layers.begin; u < stage.layers.end; ++u) model::layer_rows(m, u, rows, p, c, ws, pool);
      }
      last[static_cast<size_t>(part)] = holder;
    }
    for (int64_t part = 0; part < parts; ++part) {
      const int holder = last[static_cast<size_t>(part)];
      if (holder == 0) continue;
      const int64_t r0 = b * part / parts, n = b * (part + 1) / parts - r0;
      if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(0, floats(cur.f32() + r0 * F, n * F)));
      if (me == 0) TESSERA_RETURN_IF_ERROR(sync.recv(holder, floats(cur.f32() + r0 * F, n * F)));
    }
    return me == 0 ? cur : Tensor();
  }

  // Overlapped steps run where the stages are the ranks in order, each
  // rank one contiguous range of whole layers (option "overlap", default
  // on): stage s's rows then go to rank s+1, the last stage's to the terminal.
  int overlapped_stages(const Plan& plan, const model::ModelConfig& c) const override {
    auto on = option<bool>(plan, "overlap", true);
    auto blocks = blocks_option(plan);
    auto map = unit_map(plan, c);
    if (!on.ok() || !on.value() || !blocks.ok() || blocks.value() || !map.ok() || plan.world < 2) return 1;
    const auto stages = map->stages();
    if (static_cast<int>(stages.size()) != plan.world) return 1;
    for (int s = 0; s < plan.world; ++s)
      if (stages[static_cast<size_t>(s)].device != s) return 1;
    return plan.world;
  }

  // One call of overlapped steps (step_stages). Rank 0 runs stage 0 on the
  // entering group, sends it on and receives the leaving group's rows. A
  // rank s > 0 first sends what it computed in the last call (group s now),
  // then receives group s-1 and runs its stage on it at once, keeping the
  // result for the next call: it computes while the terminal runs the head
  // and waits for the rows that enter next. Sends are queued and no rank
  // receives before it has sent, so no rank waits on a cycle; between calls
  // nothing is left on the wire.
  Result<Tensor> run_stages(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                            std::span<Decoder* const> decs, std::span<const int64_t> group_rows, Tensor x,
                            std::span<const int64_t> pos, std::span<model::KvCache* const> caches, model::Workspace& ws,
                            core::ThreadPool* pool) const {
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, unit_map(plan, m.config()));
    const auto stages = map.stages();
    const int k = static_cast<int>(group_rows.size()), me = sync.rank();
    if (k != plan.world || static_cast<int>(stages.size()) != k || me >= k)
      return core::invalid_argument("an overlapped step of " + std::to_string(k) + " groups on " +
                                    std::to_string(stages.size()) + " stages");
    const int64_t F = m.config().hidden;
    std::vector<size_t> first(static_cast<size_t>(k) + 1, 0);
    for (int g = 0; g < k; ++g)
      first[static_cast<size_t>(g) + 1] = first[static_cast<size_t>(g)] + static_cast<size_t>(group_rows[static_cast<size_t>(g)]);
    auto rows_of = [&](int g) { return group_rows[static_cast<size_t>(g)]; };
    auto leader = [&](int g) { return static_cast<PipelineDecoder*>(decs[first[static_cast<size_t>(g)]]); };
    // This rank's stage on group g's rows, in place.
    auto run_stage = [&](int g, Tensor& rows) {
      const auto p = pos.subspan(first[static_cast<size_t>(g)], static_cast<size_t>(rows_of(g)));
      const auto c = caches.subspan(first[static_cast<size_t>(g)], static_cast<size_t>(rows_of(g)));
      const Range layers = stages[static_cast<size_t>(me)].layers;
      for (int64_t u = layers.begin; u < layers.end; ++u) model::layer_rows(m, u, rows.f32(), p, c, ws, pool);
    };
    const int next = (me + 1) % k, prev = (me + k - 1) % k;
    if (me == 0) {
      const int64_t n = rows_of(0);
      if (n > 0) {
        if (x.rank() != 2 || x.dim(0) != n || x.dim(1) != F) return core::invalid_argument("an overlapped step without its entering rows");
        run_stage(0, x);
        TESSERA_RETURN_IF_ERROR(sync.send(next, floats(x.f32(), n * F)));
      }
      const int64_t out = rows_of(k - 1);
      if (out == 0) return Tensor();
      Tensor y = Tensor::zeros_f32({out, F});
      TESSERA_RETURN_IF_ERROR(sync.recv(prev, floats(y.f32(), out * F)));
      return y;
    }
    if (const int64_t n = rows_of(me); n > 0) {
      Tensor& held = leader(me)->carried;
      if (held.rank() != 2 || held.dim(0) != n || held.dim(1) != F)
        return core::invalid_argument("an overlapped step at stage " + std::to_string(me) + " of a group whose rows it does not hold");
      const Tensor rows = std::move(held);
      held = Tensor();
      TESSERA_RETURN_IF_ERROR(sync.send(next, floats(rows.f32(), n * F)));
    }
    if (const int64_t n = rows_of(me - 1); n > 0) {
      Tensor rows = Tensor::zeros_f32({n, F});
      TESSERA_RETURN_IF_ERROR(sync.recv(prev, floats(rows.f32(), n * F)));
      run_stage(me - 1, rows);
      leader(me - 1)->carried = std::move(rows);
    }
    return Tensor();
  }

  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    const LayerMap map = unit_map(plan, c).value();
    const bool blocks = blocks_option(plan).value();
    const int64_t F = c.hidden;
    Schedule s;
    s.devices.resize(static_cast<size_t>(plan.world));
    // Every device sees every step, so the phases line up across devices.
    int holder = 0;
    auto hand_over = [&](int to, const char* what) {
      for (int r = 0; r < plan.world; ++r) {
        Phase ph{what, -1, {}, {}, false};
        if (r == holder) ph.transfers.push_back(transfer(CollectiveKind::kSendRecv, "x", n * F, {to}));
        if (r == to) ph.transfers.push_back(transfer(CollectiveKind::kSendRecv, "x", 0, {holder}));
        s.devices[static_cast<size_t>(r)].phases.push_back(std::move(ph));
      }
      holder = to;
    };
    // A layer's kernels; the attention block is the first four (norm, QKV,
    // attention, output projection), the MLP block the rest.
    std::vector<Work> layer_work;
    add_layer_work(layer_work, c, n, n);
    for (const auto& stage : map.stages()) {
      if (stage.device != holder) hand_over(stage.device, "send activations");
      for (int64_t u = stage.layers.begin; u < stage.layers.end; ++u)
        for (int r = 0; r < plan.world; ++r) {
          Phase ph{blocks ? (u % 2 == 0 ? "attention" : "mlp") : "layer", blocks ? u / 2 : u, {}, {}, false};
          if (r == holder) {
            const auto mid = layer_work.begin() + 4;
            if (!blocks) ph.work = layer_work;
            else if (u % 2 == 0) ph.work.assign(layer_work.begin(), mid);
            else ph.work.assign(mid, layer_work.end());
          }
          s.devices[static_cast<size_t>(r)].phases.push_back(std::move(ph));
        }
    }
    if (holder != 0) hand_over(0, "return activations");
    // Weights as load_options loads them: a block alone drops the other
    // block's matrices and keeps the layer's norms and biases.
    const int64_t attn = c.matrix_bytes(3 * F, F) + c.matrix_bytes(F, F);
    const int64_t mlp = c.matrix_bytes(c.intermediate, F) + c.matrix_bytes(F, c.intermediate);
    const int64_t whole = layer_weight_bytes(c, F, c.intermediate);
    for (int r = 0; r < plan.world; ++r) {
      DeviceSchedule& d = s.devices[static_cast<size_t>(r)];
      const model::LoadOptions lo = load_options(plan, c, r);
      int64_t w = 0;
      for (size_t i = 0; i < lo.only_layers.size(); ++i) {
        const int part = lo.only_parts.empty() ? 3 : lo.only_parts[i];
        w += part == 3 ? whole : whole - (part == 1 ? mlp : attn);
      }
      d.weight_bytes = w + (r == 0 ? terminal_weight_bytes(c) : 0);
      d.activation_bytes = !lo.only_layers.empty() || r == 0 ? (n * (7 * F + c.intermediate) + n * n * c.heads) * 4 : 0;
    }
    return s;
  }

 private:
  static Result<bool> blocks_option(const Plan& plan) {
    TESSERA_ASSIGN_OR_RETURN(const std::string u, option<std::string>(plan, "units", "layers"));
    if (u != "layers" && u != "blocks") return core::invalid_argument("pipeline units must be layers or blocks, not '" + u + "'");
    return u == "blocks";
  }
  // The device of each unit (layers, or 2 blocks per layer).
  static Result<LayerMap> unit_map(const Plan& plan, const model::ModelConfig& c) {
    TESSERA_ASSIGN_OR_RETURN(const bool blocks, blocks_option(plan));
    const int64_t units = blocks ? 2 * c.layers : c.layers;
    if (!plan.options.is_object() || !plan.options.contains("layer_map")) return contiguous_layers(units, plan.world);
    const auto& v = plan.options.at("layer_map");
    if (v.is_string()) return parse_layer_map(v.get<std::string>(), units, plan.world);
    if (!v.is_array() || static_cast<int64_t>(v.size()) != units)
      return core::invalid_argument("layer map needs one device per " + std::string(blocks ? "block" : "layer") + " (" +
                                    std::to_string(units) + ")");
    LayerMap map;
    map.devices = plan.world;
    for (const auto& d : v) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() >= plan.world)
        return core::invalid_argument("layer map names a device outside the group");
      map.device_of_layer.push_back(d.get<int>());
    }
    return map;
  }
};

Result<Tensor> PipelineDecoder::forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) {
  return p.run_cached(m, plan, sync, std::move(x), n, pos0, &cache, ws, pool);
}

Result<Tensor> PipelineDecoder::forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                                             core::ThreadPool* pool) {
  std::vector<model::KvCache*> caches;
  for (Decoder* d : decs) caches.push_back(&static_cast<PipelineDecoder*>(d)->cache);
  return p.run_rows(m, plan, sync, std::move(x), pos, caches, ws, pool);
}

int PipelineDecoder::overlapped_stages(std::span<Decoder* const> decs) const {
  return batches(decs) ? p.overlapped_stages(plan, m.config()) : 1;
}

Result<Tensor> PipelineDecoder::forward_stages(std::span<Decoder* const> decs, std::span<const int64_t> group_rows,
                                               Tensor x, std::span<const int64_t> pos, core::ThreadPool* pool) {
  std::vector<model::KvCache*> caches;
  for (Decoder* d : decs) caches.push_back(&static_cast<PipelineDecoder*>(d)->cache);
  return p.run_stages(m, plan, sync, decs, group_rows, std::move(x), pos, caches, ws, pool);
}

}  // namespace

std::unique_ptr<Strategy> make_pipeline_strategy() { return std::make_unique<Pipeline>(); }

}  // namespace tessera::parallel
