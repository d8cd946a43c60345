// A test-only strategy, added the way a new strategy is: one class, one
// registration line (register_strategy). The terminal broadcasts its rows,
// every rank runs every layer, and only the terminal's result counts.
#pragma once

#include "parallel/strategy.h"

namespace tessera::parallel::testing {

class Replicate final : public Strategy {
 public:
  std::string name() const override { return "test-replicate"; }
  std::string summary() const override { return "test only: every rank runs everything"; }
  core::Status complete(Plan& plan, const model::ModelConfig&) const override { return only_options(plan, {}); }
  core::Result<core::Tensor> run(const model::Transformer& m, const Plan&, Synchronizer& sync, core::Tensor x, int64_t n,
                                 core::ThreadPool* pool) const override {
    const int64_t F = m.config().hidden;
    core::Tensor full = sync.rank() == 0 ? x : core::Tensor::zeros_f32({n, F});
    TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), n * F), 0));
    model::Workspace ws;
    for (int64_t l = 0; l < m.config().layers; ++l) m.layer(l, full, 0, nullptr, ws, pool);
    return sync.rank() == 0 ? full : core::Tensor();
  }
  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    Schedule s;
    for (int r = 0; r < plan.world; ++r) {
      DeviceSchedule d;
      const int64_t sent = tree_broadcast_sent(n * c.hidden, plan.world, r, 0);
      d.phases.push_back({"broadcast", -1, {}, {transfer(CollectiveKind::kBroadcast, "x", sent, everyone_but(r, plan.world))}, false});
      s.devices.push_back(d);
    }
    return s;
  }
};

}  // namespace tessera::parallel::testing
