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

// "3,5": counts for the notes.
std::string join_counts(const std::vector<int64_t>& v);

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

// Overlapped decode steps (Strategy::overlapped_stages): a call takes the
// busiest device's compute on one group of rows plus half its transfers (it
// receives the next rows while the others compute).
double overlapped_call_ms(const Prediction& group_step);

// The contiguous layer map, ranks in order, whose overlapped call on one
// group of `group` rows is the shortest, and that call; `step` is a layer
// layout's decode plan on p's devices. Moves of the stage boundaries by a
// layer, from an even split, while the cost model says the call shortens. The map
// searched for the prompt need not even the stages out: the terminal's
// also runs the LM head. Empty map: no map overlaps.
struct StageMap {
  std::vector<int> map;
  double call_ms = kInf;
};
StageMap balance_stages(const parallel::Strategy& s, const parallel::Plan& step, const model::ModelConfig& c,
                        const ClusterProfile& p, int64_t group, core::DType kv_dtype, int64_t cache_keys);

}  // namespace tessera::planner::detail
