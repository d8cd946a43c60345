// Inter-layer placement: any assignment of layers to devices (also back and
// forth), activations sent device to device, and weight pre-loading: while
// a device waits for its next input it pages that stage's weights in.
// Option "layer_map": the device of each layer ("0-5:0,6-11:1" or an array;
// default contiguous equal ranges).
#include <sys/mman.h>
#include <unistd.h>

#include <thread>

#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

// Asks the kernel to read the stage's weight pages (mmap'd tensors are read
// lazily) and touches them, so the first GEMM finds them in memory.
void preload(const model::Transformer& model, Range layers) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t l = layers.begin; l < layers.end; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    for (const kernels::PackedLinear* t : {&w.qkv_w, &w.attn_out_w, &w.ffn_in_w, &w.ffn_out_w}) {
      if (t->empty() || t->nbytes() == 0) continue;
      const auto addr = reinterpret_cast<uintptr_t>(t->raw());
      const uintptr_t start = addr & ~(page - 1);
      ::madvise(reinterpret_cast<void*>(start), t->nbytes() + (addr - start), MADV_WILLNEED);
      volatile unsigned char sink = 0;
      for (size_t off = 0; off < t->nbytes(); off += page) sink = sink + static_cast<const unsigned char*>(t->raw())[off];
    }
  }
}

class Pipeline;

struct PipelineDecoder final : Decoder {
  PipelineDecoder(const Pipeline& p, const model::Transformer& m, const Plan& plan, Synchronizer& sync)
      : p(p), m(m), plan(plan), sync(sync) {}
  Result<Tensor> forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) override;
  const Pipeline& p;
  const model::Transformer& m;
  const Plan plan;
  Synchronizer& sync;
  model::KvCache cache;  // this device's layers only
  model::Workspace ws;
};

class Pipeline final : public Strategy {
 public:
  std::string name() const override { return "pipeline"; }
  ShareKind share_kind() const override { return ShareKind::kLayers; }
  void apply_partition(Plan& plan, const Partition& p) const override {
    if (!p.layer_map.empty()) plan.options["layer_map"] = p.layer_map;
  }
  std::string summary() const override { return "layers placed on devices (any map), weights pre-loaded while waiting"; }
  std::vector<OptionFlag> flags() const override {
    return {{"--layers", "layer_map", OptionFlag::Kind::kString, "pipeline placement, e.g. 0-5:0,6-11:1 (default contiguous)"}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig& c) const override {
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"layer_map"}));
    TESSERA_ASSIGN_OR_RETURN(LayerMap map, layer_map(plan, c));
    plan.options["layer_map"] = map.device_of_layer;
    return core::ok_status();
  }

  model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const override {
    model::LoadOptions o;
    o.embeddings = o.head = rank == 0;
    o.only_layers = layer_map(plan, c).value().layers_on(rank);
    if (o.only_layers.empty()) o.layer_end = 0;  // a device with no layer loads none
    return o;
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    model::Workspace ws;
    return run_cached(m, plan, sync, std::move(x), n, 0, nullptr, ws, pool);
  }

  // Each device keeps the cache of its own layers; a step passes one row through the stages.
  Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                                                int64_t positions) const override {
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, layer_map(plan, m.config()));
    const model::ModelConfig& c = m.config();
    if (positions < 1 || positions > c.max_positions)
      return core::out_of_range("a KV cache of " + std::to_string(positions) + " positions");
    auto d = std::make_unique<PipelineDecoder>(*this, m, plan, sync);
    d->cache.k.resize(static_cast<size_t>(c.layers));
    d->cache.v.resize(static_cast<size_t>(c.layers));
    for (int64_t l : map.layers_on(sync.rank())) {
      TESSERA_ASSIGN_OR_RETURN(d->cache.k[static_cast<size_t>(l)], Tensor::try_zeros(core::DType::kF32, {positions, c.hidden}));
      TESSERA_ASSIGN_OR_RETURN(d->cache.v[static_cast<size_t>(l)], Tensor::try_zeros(core::DType::kF32, {positions, c.hidden}));
    }
    return std::unique_ptr<Decoder>(std::move(d));
  }

  // run() on rows at positions pos0.., with this device's layers' K/V in
  // `cache` when set. Decode steps skip the pre-loading: the prefill paged
  // the weights in, and touching every page per token would cost more than a step.
  Result<Tensor> run_cached(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                            int64_t pos0, model::KvCache* cache, model::Workspace& ws, core::ThreadPool* pool) const {
    TESSERA_ASSIGN_OR_RETURN(const LayerMap map, layer_map(plan, m.config()));
    const int64_t F = m.config().hidden;
    const int me = sync.rank();
    int holder = 0;  // the device that holds the activations now
    Tensor cur = me == 0 ? x : Tensor::zeros_f32({n, F});
    for (const auto& stage : map.stages()) {
      if (stage.device != holder) {
        if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(stage.device, floats(cur.f32(), n * F)));
        if (me == stage.device) {
          std::thread pre;
          if (pos0 == 0) pre = std::thread([&] { preload(m, stage.layers); });
          const core::Status st = sync.recv(holder, floats(cur.f32(), n * F));
          if (pre.joinable()) pre.join();
          TESSERA_RETURN_IF_ERROR(st);
        }
        holder = stage.device;
      }
      if (me == holder)
        for (int64_t l = stage.layers.begin; l < stage.layers.end; ++l) m.layer(l, cur, pos0, cache, ws, pool);
    }
    if (holder != 0) {
      if (me == holder) TESSERA_RETURN_IF_ERROR(sync.send(0, floats(cur.f32(), n * F)));
      if (me == 0) TESSERA_RETURN_IF_ERROR(sync.recv(holder, floats(cur.f32(), n * F)));
    }
    return me == 0 ? cur : Tensor();
  }

  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    const LayerMap map = layer_map(plan, c).value();
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
    for (const auto& stage : map.stages()) {
      if (stage.device != holder) hand_over(stage.device, "send activations");
      for (int64_t l = stage.layers.begin; l < stage.layers.end; ++l)
        for (int r = 0; r < plan.world; ++r) {
          Phase ph{"layer", l, {}, {}, false};
          if (r == holder) add_layer_work(ph.work, c, n, n);
          s.devices[static_cast<size_t>(r)].phases.push_back(std::move(ph));
        }
    }
    if (holder != 0) hand_over(0, "return activations");
    for (int r = 0; r < plan.world; ++r) {
      DeviceSchedule& d = s.devices[static_cast<size_t>(r)];
      const auto layers = static_cast<int64_t>(map.layers_on(r).size());
      d.weight_bytes = layers * layer_weight_bytes(c, F, c.intermediate) + (r == 0 ? terminal_weight_bytes(c) : 0);
      d.activation_bytes = layers > 0 || r == 0 ? (n * (7 * F + c.intermediate) + n * n * c.heads) * 4 : 0;
    }
    return s;
  }

 private:
  static Result<LayerMap> layer_map(const Plan& plan, const model::ModelConfig& c) {
    if (!plan.options.is_object() || !plan.options.contains("layer_map")) return contiguous_layers(c.layers, plan.world);
    const auto& v = plan.options.at("layer_map");
    if (v.is_string()) return parse_layer_map(v.get<std::string>(), c.layers, plan.world);
    if (!v.is_array() || static_cast<int64_t>(v.size()) != c.layers)
      return core::invalid_argument("layer map needs one device per layer (" + std::to_string(c.layers) + ")");
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

}  // namespace

std::unique_ptr<Strategy> make_pipeline_strategy() { return std::make_unique<Pipeline>(); }

}  // namespace tessera::parallel
