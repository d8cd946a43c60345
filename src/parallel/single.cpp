// One device: every layer on the terminal, nothing sent.
#include <algorithm>
#include <vector>

#include "model/layer_blocks.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

namespace {

using core::Result;
using core::Tensor;

constexpr const char* kName = "single";

// model::generate's layers: every layer with the whole cache.
class SingleDecoder final : public Decoder {
 public:
  SingleDecoder(const model::Transformer& m, model::KvCache cache) : m_(m), cache_(std::move(cache)) {}
  Result<Tensor> forward(Tensor x, int64_t, int64_t pos0, core::ThreadPool* pool) override {
    for (int64_t l = 0; l < m_.config().layers; ++l) m_.layer(l, x, pos0, &cache_, ws_, pool);
    return x;
  }
  core::Status take_kv(int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t n) override {
    return model::take_handover(cache_, l, k, ldk, v, ldv, m_.config().kv_width(), n);
  }
  // Decoupled layers (bp's sub-blocks) step one sequence at a time.
  bool batches(std::span<Decoder* const> decs) const override {
    const model::ModelConfig& c = m_.config();
    for (int64_t l = 0; l < c.layers; ++l)
      if (c.decoupled(l)) return false;
    return std::all_of(decs.begin(), decs.end(), [](Decoder* d) { return dynamic_cast<SingleDecoder*>(d) != nullptr; });
  }
  Result<Tensor> forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                              core::ThreadPool* pool) override {
    std::vector<model::KvCache*> caches;
    for (Decoder* d : decs) caches.push_back(&static_cast<SingleDecoder*>(d)->cache_);
    for (int64_t l = 0; l < m_.config().layers; ++l) model::layer_rows(m_, l, x.f32(), pos, caches, ws_, pool);
    return x;
  }

 private:
  const model::Transformer& m_;
  model::KvCache cache_;
  model::Workspace ws_;
};

class Single final : public Strategy {
 public:
  std::string name() const override { return kName; }
  bool takes_llama_layers(const Plan&) const override { return true; }
  std::string summary() const override { return "one device, no communication"; }
  bool runs_decoupled() const override { return true; }

  core::Status complete(Plan& plan, const model::ModelConfig&) const override {
    if (plan.world != 1) return core::invalid_argument("strategy 'single' runs on one device");
    return only_options(plan, {});
  }

  core::Result<core::Tensor> run(const model::Transformer& m, const Plan&, Synchronizer&, core::Tensor x, int64_t,
                                 core::ThreadPool* pool) const override {
    model::Workspace ws;
    for (int64_t l = 0; l < m.config().layers; ++l) m.layer(l, x, 0, nullptr, ws, pool);
    return x;
  }

  bool decodes() const override { return true; }
  bool batches_steps() const override { return true; }
  bool takes_kv() const override { return true; }
  Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan&, Synchronizer&,
                                                const model::CacheSpec& spec) const override {
    TESSERA_ASSIGN_OR_RETURN(model::KvCache cache, m.make_cache(spec.positions, spec.dtype));
    return std::unique_ptr<Decoder>(std::make_unique<SingleDecoder>(m, std::move(cache)));
  }

  Schedule estimate(const Plan&, const model::ModelConfig& c, int64_t n) const override {
    Schedule s;
    DeviceSchedule d;
    for (int64_t l = 0; l < c.layers; ++l) {
      Phase p{"layer", l, {}, {}, false};
      add_model_layer_work(p.work, c, l, n);
      d.phases.push_back(std::move(p));
      d.weight_bytes += model_layer_weight_bytes(c, l);
    }
    d.weight_bytes += terminal_weight_bytes(c);
    // Workspace: QKV, context, two [n, F] buffers, FFN (and a Llama-style
    // gate|up) and the scores.
    d.activation_bytes =
        (n * (c.qkv_width() + c.q_width() + 2 * c.hidden + c.intermediate + (c.llama_style() ? 2 * c.intermediate : 0)) +
         n * n * c.heads) * 4;
    s.devices.push_back(std::move(d));
    return s;
  }
};

}  // namespace

std::unique_ptr<Strategy> make_single_strategy() { return std::make_unique<Single>(); }

Plan single_device_plan() {
  Plan p;
  p.strategy = kName;
  p.world = 1;
  return p;
}

bool is_single_device(const Plan& plan) { return plan.strategy == kName && plan.world == 1; }

}  // namespace tessera::parallel
