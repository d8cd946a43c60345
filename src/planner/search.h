// What plan_strategy and plan_all share (search.cpp): pricing a plan, and
// the partitioners that search a strategy's shares on a set of devices.
// Internal to the planner.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "planner/planner.h"

namespace tessera::planner::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The plan completed, estimated and priced; an error when the strategy
// refuses the plan.
// kv_positions > 0: a generation plan, whose devices also hold their KV
// caches at that context.
// cache_keys > 0: a decode step of n sequences' rows, each of whose
// attention reads that many cached positions.
[[nodiscard]] core::Result<Prediction> evaluate(parallel::Plan& plan, const model::ModelConfig& c, const ClusterProfile& p,
                                                int64_t n, int64_t kv_positions, core::DType kv_dtype = core::DType::kF32,
                                                int64_t cache_keys = 0);

// The options' wire (a plan on one device sends nothing) and the setting
// of a lossy strategy being priced (PlannerOptions::strategy_options).
parallel::Plan base_plan(const parallel::Strategy& s, int world, const PlannerOptions& o);

// The best plan offered so far: fitting first, then faster.
struct Best {
  parallel::Plan plan;
  Prediction pred;
  bool have = false;
  bool offer(const parallel::Plan& plan_in, const Prediction& p) {
    const bool wins = !have || (p.fits && !pred.fits) || (p.fits == pred.fits && p.latency_ms < pred.latency_ms);
    if (!wins) return false;
    plan = plan_in;
    pred = p;
    have = true;
    return true;
  }
};

// The partitioners, one per share kind; each offers its plans to `best`
// and says what it chose in `notes`.
void search_rows(const parallel::Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                 Best& best, std::vector<std::string>& notes);
void search_heads(const parallel::Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                  Best& best, std::vector<std::string>& notes);
void search_layers(const parallel::Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                   Best& best, std::vector<std::string>& notes);

}  // namespace tessera::planner::detail
