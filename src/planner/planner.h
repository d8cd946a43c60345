// Chooses a plan: for every registered strategy its best partition on the
// best subset of devices, priced by the cost model; then the fastest plan
// that fits, never one predicted slower than the terminal alone.
// Strategies are treated generically: their share kind (Strategy::share_kind)
// says what to search, their estimate() what it costs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "planner/cost_model.h"
#include "planner/ilp.h"
#include "planner/profile.h"

namespace tessera::planner {

// One strategy's best plan.
struct Candidate {
  parallel::Plan plan;        // over `members`, in that order (members[0] = 0, the terminal)
  std::vector<int> members;   // the profile's devices that take part
  Prediction prediction;
  bool feasible = false;      // fits every budget (and the strategy accepts the plan)
  std::string why_not;        // when not feasible
  std::vector<std::string> notes;  // devices left out and why, partition choices
  bool exact = true;          // the strategy's output equals one device's
  // A lossy row's top-1 disagreement on the calibration inputs, when the
  // --max-loss gate measured it (PlannerOptions::measure_loss); < 0: not measured.
  double measured_loss = -1.0;
  // A generation's predicted ms per new token (PlannerOptions::new_tokens):
  // the plan's layers, head and collectives on one row; 0: not priced.
  double step_ms = 0;
  int decode_devices = 0;  // how many devices run those steps (a pair may decode on fewer)
  // Time to the last of `new_tokens` tokens: the prompt's forward (the
  // time to the first token) and a step for each further one.
  double generation_ms(int64_t new_tokens) const {
    return prediction.latency_ms + static_cast<double>(std::max<int64_t>(new_tokens - 1, 0)) * step_ms;
  }
};

struct PlanTable {
  std::vector<Candidate> rows;  // one per strategy, weight type and wire, in registry order
  int chosen = -1;              // the row `auto` runs
  std::string reason;           // why that row
  nlohmann::json to_json() const;
};

struct PlannerOptions {
  int64_t rows = 128;          // the request's row count
  // > 0: plans for a generation; every device also holds its KV caches at
  // this context (--ctx-size), replicated K/V heads included, and only
  // strategies that decode (Strategy::decodes) are chosen.
  int64_t ctx_size = 0;
  core::DType kv_dtype = core::DType::kF32;  // --kv-type
  // > 0 with ctx_size: a generation of this many tokens. Each decoding row
  // is also priced per token (Candidate::step_ms) and rows are compared by
  // Candidate::generation_ms, so a long generation may choose fewer devices
  // than its prompt alone would. Each row's devices and partition are still
  // those best for the prompt. step_profile: the devices' kernels measured
  // at one row (a decode step's shapes); null: `p`'s.
  int64_t new_tokens = 0;
  const ClusterProfile* step_profile = nullptr;
  // > 1 with new_tokens: the steps decode this many sequences together
  // (serve --max-batch, continuous batching): a step is priced on that many
  // rows, each reading its own caches, and step_profile is measured at that
  // many rows. Rows are then compared by what each sequence of a full batch
  // waits: its first token, then a batched step a token.
  int64_t decode_batch = 1;
  bool lossy_allowed = false;  // may auto choose a strategy that is not exact
  // How activations travel in the plans made (Plan::wire); plan_all tries
  // each of `wires` (a lossy one is chosen only with lossy_allowed).
  core::WireType wire = core::WireType::kF32;
  std::vector<core::WireType> wires = {core::WireType::kF32};
  bool wire_given = false;  // the user named a lossy wire: its plans may be chosen
  // Weight types plan_all tries (Plan::weights, quantized at load); empty:
  // the model's own. One other than the model's is lossy: chosen only with
  // lossy_allowed (plan --lossy: an F32 model that fits no device may still
  // run quantized).
  std::vector<kernels::WeightType> weight_types;
  // The --max-loss gate (with lossy_allowed): a lossy row becomes the choice
  // only when measure_loss(its plan), the top-1 disagreement with the exact
  // model on calibration inputs, is at most max_loss. Rows are measured
  // lazily, the fastest first, so the fastest lossy row that meets the limit
  // is chosen (for PRISM: usually the highest rate). A row over the limit also rules
  // out its strategy's rows at least as lossy in setting, weight type and
  // wire, so `wires` and `weight_types` are listed least loss first.
  // Unset: lossy rows are not measured.
  double max_loss = 0.01;
  std::function<core::Result<double>(const parallel::Plan&)> measure_loss;
  // The options every plan of the strategy being priced starts from (a
  // lossy strategy's setting, Strategy::lossy_settings); plan_all sets it.
  nlohmann::json strategy_options;
  int refine_steps = 24;       // cost-model refinements of a row partition
  // Layer placement (pipeline): the exact ILP (ilp.h, warm-started from the
  // dynamic programme) or the contiguous dynamic programme alone.
  enum class LayerSolver { kIlp, kDp };
  LayerSolver layer_solver = LayerSolver::kIlp;
  UnitGranularity units = UnitGranularity::kLayers;
  double ilp_time_limit_s = 10;
  // A plan on more devices displaces one on fewer only when predicted at
  // least this much faster (fraction; for a generation, of the fewer-device
  // plan's time in the phases that would run on more devices). Predictions
  // err (p90 6% on the grid in docs/planner.md) and every device added is
  // one more that can fail; below this gain the terminal alone or the
  // smaller set is kept (our rule; no paper makes this decision).
  double min_gain = 0.10;
  // Tw in the objective (Eq. 10): streaming a unit's weights from memory.
  // On a quiet machine it brings the ILP's T within 15% of every measured
  // plan, against 24% mean error without it (docs/planner.md).
  bool ilp_load_time = true;
  std::string ilp_lp_file;     // the ILP over all devices, in LP format
};

// Galaxy's Algorithm 1 on `units` work units (heads or FFN columns):
// shares proportional to `capacity`, then the excess of every device over its
// `budget` (bytes; `fixed` already used, `per_unit` each) moved to the devices
// with room in proportion to their capacity, repeated until none is over.
// Returns integer unit counts, or an error when the budgets cannot hold it.
[[nodiscard]] core::Result<std::vector<int64_t>> balance_units(int64_t units, const std::vector<double>& capacity,
                                                               const std::vector<double>& fixed,
                                                               const std::vector<double>& per_unit,
                                                               const std::vector<double>& budget);

// Integer counts proportional to `weights` that sum to `units` (largest remainder).
std::vector<int64_t> proportional_counts(int64_t units, const std::vector<double>& weights);

// Best plan of one strategy over `members` of the profile (no subset search).
[[nodiscard]] core::Result<Candidate> plan_strategy(const parallel::Strategy& s, const model::ModelConfig& c,
                                                    const ClusterProfile& p, const std::vector<int>& members,
                                                    const PlannerOptions& o);
// Best plan of one strategy over subsets of the devices (the terminal always
// takes part): greedily from the terminal alone, each step adding the device
// that helps most, keeping the best set seen (pipeline: the ILP's own choice).
[[nodiscard]] core::Result<Candidate> plan_strategy_any_subset(const parallel::Strategy& s, const model::ModelConfig& c,
                                                               const ClusterProfile& p, const PlannerOptions& o);
// Every registered strategy, and the choice.
[[nodiscard]] core::Result<PlanTable> plan_all(const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o);

}  // namespace tessera::planner
