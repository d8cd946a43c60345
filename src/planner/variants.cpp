#include "planner/variants.h"

#include <algorithm>

#include "planner/cost_model.h"

namespace tessera::planner {

using core::Result;

double linear_sum_ms(const parallel::Schedule& s, const ClusterProfile& given) {
  // A variant's devices compute at once: those of one host share its bandwidth.
  std::vector<int> members;
  for (int d = 0; d < std::min(static_cast<int>(s.devices.size()), given.size()); ++d) members.push_back(d);
  const ClusterProfile p = streaming_at_once(given.subset(members));
  double worst = 0;
  for (size_t d = 0; d < s.devices.size(); ++d) {
    const DeviceProfile& dev = p.devices[std::min(d, p.devices.size() - 1)];
    double sum = 0;
    for (const parallel::Phase& ph : s.devices[d].phases) {
      for (const parallel::Work& w : ph.work) sum += work_ms(w, dev);
      for (const parallel::Transfer& t : ph.transfers) sum += transfer_ms(t, static_cast<int>(d), p);
    }
    worst = std::max(worst, sum);
  }
  return worst;
}

Result<VariantChoice> choose_variant(const parallel::Plan& plan, const model::ModelConfig& c, const ClusterProfile& p,
                                     int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* s, parallel::strategy_for(plan.strategy));
  VariantChoice out;
  out.plan = plan;
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(out.plan, c));
  const std::vector<nlohmann::json> patches = s->variants(out.plan);
  if (patches.empty()) return out;
  if (p.size() < plan.world)
    return core::invalid_argument("the profile has " + std::to_string(p.size()) + " devices for a plan of " +
                                  std::to_string(plan.world));
  std::vector<int64_t> budgets;
  for (int d = 0; d < plan.world; ++d) budgets.push_back(p.devices[static_cast<size_t>(d)].memory_bytes);
  nlohmann::json sums = nlohmann::json::object();
  std::string reasons;
  for (const nlohmann::json& patch : patches) {
    VariantSum v;
    v.options = patch;
    for (const auto& [k, val] : patch.items()) {
      if (!v.label.empty()) v.label += ",";
      v.label += val.is_string() ? val.get<std::string>() : val.dump();
    }
    parallel::Plan cand = out.plan;
    cand.options.update(patch);
    TESSERA_RETURN_IF_ERROR(parallel::complete_plan(cand, c));
    TESSERA_ASSIGN_OR_RETURN(const parallel::Schedule sched, parallel::estimate(cand, c, rows));
    const core::Status mem = check_memory_budgets(sched, budgets);
    v.fits = mem.ok();
    v.why_not = mem.ok() ? "" : mem.message();
    v.sum_ms = linear_sum_ms(sched, p);
    sums[v.label] = v.fits ? nlohmann::json(v.sum_ms) : nlohmann::json(nullptr);
    if (!v.fits) reasons += (reasons.empty() ? "" : "; ") + v.label + ": " + v.why_not;
    const bool better = v.fits && (out.chosen < 0 || v.sum_ms < out.sums[static_cast<size_t>(out.chosen)].sum_ms);
    out.sums.push_back(v);
    if (better) out.chosen = static_cast<int>(out.sums.size()) - 1;
  }
  if (out.chosen < 0) return core::resource_exhausted("no " + plan.strategy + " plan fits the memory budgets (" + reasons + ")");
  out.plan.options.update(out.sums[static_cast<size_t>(out.chosen)].options);
  out.plan.options["auto_ms"] = sums;
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(out.plan, c));
  return out;
}

}  // namespace tessera::planner
