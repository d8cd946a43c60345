// A strategy's open choices (Strategy::variants: bp's --bp-plan auto) decided
// on the profiles as DeTransformer's adaptive placement does (paper 002,
// §III-C): the variants over some device's memory budget are excluded, then
// each one's profiled operation durations are summed (linear summation, no
// overlap or waiting modelled) and the smallest sum wins.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "planner/profile.h"

namespace tessera::planner {

struct VariantSum {
  std::string label;       // the patch's values, e.g. "tp"
  nlohmann::json options;  // the patch
  double sum_ms = 0;       // the largest device's sum of its work and transfers
  bool fits = true;
  std::string why_not;
};

struct VariantChoice {
  parallel::Plan plan;  // completed, the chosen patch applied ("auto_ms" holds the sums)
  std::vector<VariantSum> sums;
  int chosen = -1;      // -1: the plan had no open choice
};

// Each device's sum of work_ms and transfer_ms over its schedule; the largest.
// The devices compute at once (streaming_at_once).
double linear_sum_ms(const parallel::Schedule& s, const ClusterProfile& p);

// `plan` with its open choices decided for `rows` rows on `p` (device i of the
// plan runs on device i of the profile); unchanged when it has none. An
// error when no variant fits the budgets (names each one's reason).
[[nodiscard]] core::Result<VariantChoice> choose_variant(const parallel::Plan& plan, const model::ModelConfig& c,
                                                         const ClusterProfile& p, int64_t rows);

}  // namespace tessera::planner
