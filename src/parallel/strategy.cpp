#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

Result<Strategy> parse_strategy(const std::string& name) {
  if (name == "single") return Strategy::kSingle;
  if (name == "tp") return Strategy::kTp;
  if (name == "sp") return Strategy::kSp;
  if (name == "voltage") return Strategy::kVoltage;
  if (name == "pipeline") return Strategy::kPipeline;
  if (name == "prism") return Strategy::kPrism;
  if (name == "galaxy") return Strategy::kGalaxy;
  return core::invalid_argument("unknown strategy '" + name + "' (single, tp, sp, voltage, pipeline, prism, galaxy)");
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kSingle: return "single";
    case Strategy::kTp: return "tp";
    case Strategy::kSp: return "sp";
    case Strategy::kVoltage: return "voltage";
    case Strategy::kPipeline: return "pipeline";
    case Strategy::kPrism: return "prism";
    case Strategy::kGalaxy: return "galaxy";
  }
  return "?";
}

core::Status complete_plan(Plan& plan, const model::ModelConfig& config) {
  if (plan.world < 1 || plan.world > 64) return core::invalid_argument("device count must be in [1, 64]");
  if (plan.strategy == Strategy::kSingle && plan.world != 1)
    return core::invalid_argument("strategy 'single' runs on one device");
  if (plan.ratios.empty()) plan.ratios = equal_ratios(plan.world);
  if (static_cast<int>(plan.ratios.size()) != plan.world)
    return core::invalid_argument("partition has " + std::to_string(plan.ratios.size()) + " entries for " +
                                  std::to_string(plan.world) + " devices");
  const bool sharded = plan.strategy == Strategy::kTp || plan.strategy == Strategy::kGalaxy;
  if (!plan.ffn_ratios.empty() && !sharded)
    return core::invalid_argument("a separate FFN partition applies to strategies 'tp' and 'galaxy' only");
  if (sharded && plan.ffn_ratios.empty()) plan.ffn_ratios = plan.ratios;
  if (sharded && static_cast<int>(plan.ffn_ratios.size()) != plan.world)
    return core::invalid_argument("FFN partition has " + std::to_string(plan.ffn_ratios.size()) + " entries for " +
                                  std::to_string(plan.world) + " devices");
  if (plan.strategy == Strategy::kPipeline) {
    if (plan.layers.device_of_layer.empty()) plan.layers = contiguous_layers(config.layers, plan.world);
    if (static_cast<int64_t>(plan.layers.device_of_layer.size()) != config.layers || plan.layers.devices != plan.world)
      return core::invalid_argument("layer map does not match the model's layers or the device count");
  }
  const bool has_rate = plan.prism_rate != 0.0, has_segments = plan.prism_segments != 0;
  if (plan.strategy == Strategy::kPrism) {
    if (has_rate == has_segments)
      return core::invalid_argument("prism needs exactly one of a compression rate (--cr) or segments (--segments)");
    if (has_rate && !(plan.prism_rate >= 1.0 && plan.prism_rate <= 1e9))
      return core::invalid_argument("compression rate must be in [1, 1e9]");
    if (has_segments && plan.prism_segments < 1) return core::invalid_argument("segments must be >= 1");
  } else if (has_rate || has_segments) {
    return core::invalid_argument("a compression rate or segment count applies to strategy 'prism' only");
  }
  return core::ok_status();
}

std::vector<Range> tp_head_ranges(const Plan& plan, const model::ModelConfig& c) {
  return split_by_ratio(c.heads, plan.ratios);
}

std::vector<Range> tp_ffn_ranges(const Plan& plan, const model::ModelConfig& c) {
  return split_by_ratio(c.intermediate, plan.ffn_ratios.empty() ? plan.ratios : plan.ffn_ratios);
}

std::vector<Range> galaxy_seq_ranges(int64_t n, int world) { return split_by_ratio(n, equal_ratios(world)); }

model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) {
  model::LoadOptions o;
  o.embeddings = o.head = rank == 0;
  if (plan.strategy == Strategy::kPipeline) {
    o.only_layers = plan.layers.layers_on(rank);
    if (o.only_layers.empty()) o.layer_end = 0;  // a device with no layer loads none
  } else if (plan.strategy == Strategy::kTp || plan.strategy == Strategy::kGalaxy) {
    const Range h = tp_head_ranges(plan, c)[static_cast<size_t>(rank)];
    const Range f = tp_ffn_ranges(plan, c)[static_cast<size_t>(rank)];
    o.head_begin = h.begin;
    o.head_end = h.end;
    o.ffn_begin = f.begin;
    o.ffn_end = f.end;
  }
  return o;
}

Result<Tensor> run_layers(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                          core::ThreadPool* pool) {
  if (sync.world() != plan.world) return core::invalid_argument("synchronizer world size differs from the plan");
  if (sync.rank() == 0 && (x.rank() != 2 || x.dim(0) != n || x.dim(1) != model.config().hidden))
    return core::invalid_argument("terminal input must be [n, hidden]");
  switch (plan.strategy) {
    case Strategy::kSingle: {
      model::Workspace ws;
      for (int64_t l = 0; l < model.config().layers; ++l) model.layer(l, x, 0, nullptr, ws, pool);
      return x;
    }
    case Strategy::kTp: return run_tp(model, plan, sync, std::move(x), n, pool);
    case Strategy::kSp: return run_sp(model, plan, sync, std::move(x), n, pool);
    case Strategy::kVoltage: return run_voltage(model, plan, sync, std::move(x), n, pool);
    case Strategy::kPipeline: return run_pipeline(model, plan, sync, std::move(x), n, pool);
    case Strategy::kPrism: return run_prism(model, plan, sync, std::move(x), n, pool);
    case Strategy::kGalaxy: return run_galaxy(model, plan, sync, std::move(x), n, pool);
  }
  return core::internal_error("unknown strategy");
}

}  // namespace tessera::parallel
