#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "core/check.h"
#include "kernels/quant.h"
#include "planner/search.h"
#include "planner/variants.h"

namespace tessera::planner {

using core::Result;
using parallel::Partition;
using parallel::Plan;
using parallel::ShareKind;
using parallel::Strategy;
using detail::base_plan;
using detail::Best;
using detail::evaluate;
using detail::kInf;

std::vector<int64_t> proportional_counts(int64_t units, const std::vector<double>& weights) {
  std::vector<int64_t> out(weights.size(), 0);
  if (weights.empty() || units <= 0) return out;
  double sum = 0;
  for (double w : weights) sum += std::max(w, 0.0);
  if (!(sum > 0)) {
    out[0] = units;
    return out;
  }
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(units) * std::max(weights[i], 0.0) / sum;
    out[i] = static_cast<int64_t>(std::floor(exact));
    given += out[i];
    rem.push_back({exact - static_cast<double>(out[i]), i});
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < units; ++i, ++given) ++out[rem[i % rem.size()].second];
  return out;
}

Result<std::vector<int64_t>> balance_units(int64_t units, const std::vector<double>& capacity,
                                           const std::vector<double>& fixed, const std::vector<double>& per_unit,
                                           const std::vector<double>& budget) {
  const size_t K = capacity.size();
  TESSERA_CHECK(fixed.size() == K && per_unit.size() == K && budget.size() == K);
  std::vector<int64_t> counts = proportional_counts(units, capacity);
  std::vector<bool> listed(K, true);  // the paper's L: devices that may still change
  for (size_t round = 0; round <= K; ++round) {
    std::vector<size_t> oom, free;
    for (size_t d = 0; d < K; ++d) {
      if (!listed[d]) continue;
      const double need = fixed[d] + per_unit[d] * static_cast<double>(counts[d]);
      (need > budget[d] ? oom : free).push_back(d);
    }
    if (oom.empty()) return counts;
    // Devices with room for at least one more unit receive the excess.
    std::vector<size_t> room;
    for (size_t d : free)
      if (fixed[d] + per_unit[d] * static_cast<double>(counts[d] + 1) <= budget[d]) room.push_back(d);
    for (size_t o : oom) {
      const double can = per_unit[o] > 0 ? std::floor((budget[o] - fixed[o]) / per_unit[o]) : static_cast<double>(counts[o]);
      if (can < 0) return core::resource_exhausted("device " + std::to_string(o) + " is over its budget with no work at all");
      const int64_t keep = std::min<int64_t>(counts[o], static_cast<int64_t>(can));
      const int64_t shift = counts[o] - keep;
      counts[o] = keep;
      listed[o] = false;
      if (shift == 0) continue;
      if (room.empty()) return core::resource_exhausted("no device has room for the work device " + std::to_string(o) + " cannot hold");
      std::vector<double> w;
      for (size_t f : room) w.push_back(capacity[f]);
      const std::vector<int64_t> add = proportional_counts(shift, w);
      for (size_t i = 0; i < room.size(); ++i) counts[room[i]] += add[i];
    }
  }
  for (size_t d = 0; d < K; ++d)
    if (fixed[d] + per_unit[d] * static_cast<double>(counts[d]) > budget[d])
      return core::resource_exhausted("device " + std::to_string(d) + " stays over its budget");
  return counts;
}

Result<Candidate> plan_strategy(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p,
                                const std::vector<int>& members, const PlannerOptions& o) {
  if (members.empty() || members[0] != 0) return core::invalid_argument("the terminal (device 0) always takes part");
  const ClusterProfile sub = p.subset(members);
  const int K = sub.size();
  Candidate cand;
  cand.members = members;
  cand.exact = s.exact() && (K == 1 || o.wire == core::WireType::kF32);
  Best best;
  PlannerOptions layer_o = o;
  if (K != p.size()) layer_o.ilp_lp_file.clear();  // the LP file is the model over every device
  switch (s.share_kind()) {
    case ShareKind::kRows: search_rows(s, c, sub, o, best, cand.notes); break;
    case ShareKind::kHeads: search_heads(s, c, sub, o, best, cand.notes); break;
    case ShareKind::kLayers: search_layers(s, c, sub, layer_o, best, cand.notes); break;
    case ShareKind::kNone: break;
  }
  if (!best.have) {
    Plan plan = base_plan(s, K, o);
    auto pred = evaluate(plan, c, sub, o.rows, o.ctx_size, o.kv_dtype);
    if (!pred.ok()) {
      cand.plan = plan;
      cand.why_not = pred.status().message();
      return cand;
    }
    best.offer(plan, pred.value());
  }
  cand.plan = best.plan;
  cand.prediction = best.pred;
  cand.feasible = best.pred.fits;
  if (!cand.feasible) {
    // In the profile's numbering, not the subset's.
    const int d = best.pred.over_budget;
    TESSERA_CHECK(d >= 0 && d < K);
    const auto& dp = best.pred.devices[static_cast<size_t>(d)];
    cand.why_not = "device " + std::to_string(members[static_cast<size_t>(d)]) + " needs " + format_bytes(dp.memory_bytes) +
                   ", budget " + format_bytes(dp.budget_bytes);
  }
  return cand;
}

namespace {

// Better: feasible first, then faster.
bool better(const Candidate& a, const Candidate& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (!a.feasible) return false;
  return a.prediction.latency_ms < b.prediction.latency_ms;
}

// A generation's time, in `fewer`'s plan, of the phases (prompt, steps) that
// `more` runs on more devices. min_gain guards against the error of
// predicting those phases on more devices: a phase both plans run alike
// (a pair that prefills on two devices and decodes on the terminal, against
// the terminal alone) costs the same on either side, and only dilutes the gain.
double more_devices_ms(const Candidate& more, const Candidate& fewer, int64_t new_tokens) {
  double t = 0;
  if (more.members.size() > fewer.members.size()) t += fewer.prediction.latency_ms;
  if (more.decode_devices > fewer.decode_devices)
    t += static_cast<double>(std::max<int64_t>(new_tokens - 1, 0)) * fewer.step_ms;
  return t;
}

// Every set of w of positions 0..n-1 that holds 0 (the terminal), in
// lexicographic order: the first w come first.
std::vector<std::vector<size_t>> sets_with_first(size_t n, size_t w) {
  std::vector<size_t> pick(w);
  std::iota(pick.begin(), pick.end(), 0);
  std::vector<std::vector<size_t>> sets = {pick};
  for (;;) {
    size_t k = w - 1;
    while (k >= 1 && pick[k] == n - w + k) --k;
    if (k == 0) return sets;
    ++pick[k];
    for (size_t j = k + 1; j < w; ++j) pick[j] = pick[j - 1] + 1;
    sets.push_back(pick);
  }
}

}  // namespace

Result<Candidate> plan_strategy_any_subset(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p,
                                           const PlannerOptions& o) {
  // The ILP chooses the devices itself (one with no unit is left out), so
  // one solve over all of them replaces the subset search.
  if (s.share_kind() == ShareKind::kLayers && o.layer_solver == PlannerOptions::LayerSolver::kIlp && p.size() > 1) {
    std::vector<int> all(static_cast<size_t>(p.size()));
    std::iota(all.begin(), all.end(), 0);
    TESSERA_ASSIGN_OR_RETURN(Candidate cand, plan_strategy(s, c, p, all, o));
    if (!cand.plan.options.contains("layer_map")) return cand;
    const auto map = cand.plan.options.at("layer_map").get<std::vector<int>>();
    std::vector<int> used = {0};
    for (int d : map)
      if (std::find(used.begin(), used.end(), d) == used.end()) used.push_back(d);
    std::sort(used.begin(), used.end());
    if (static_cast<int>(used.size()) == p.size()) return cand;
    // The same plan over the devices it uses, renumbered.
    std::vector<int> sub_map;
    for (int d : map) sub_map.push_back(static_cast<int>(std::find(used.begin(), used.end(), d) - used.begin()));
    Plan plan = cand.plan;
    plan.world = static_cast<int>(used.size());
    plan.ratios.clear();
    plan.options["layer_map"] = sub_map;
    TESSERA_ASSIGN_OR_RETURN(const Prediction pred, evaluate(plan, c, p.subset(used), o.rows, o.ctx_size, o.kv_dtype));
    cand.plan = plan;
    cand.members = used;
    cand.prediction = pred;
    cand.feasible = pred.fits;
    if (!pred.fits) cand.why_not = pred.why_not;
    for (int d = 1; d < p.size(); ++d)
      if (std::find(used.begin(), used.end(), d) == used.end())
        cand.notes.push_back("device " + std::to_string(d) + " left out: the ILP assigns it no unit");
    return cand;
  }
  // Greedy: from the terminal alone, add the device that helps most, down
  // to all of them; keep the best set seen.
  std::vector<int> members = {0};
  std::vector<int> rest(static_cast<size_t>(p.size() - 1));
  std::iota(rest.begin(), rest.end(), 1);
  TESSERA_ASSIGN_OR_RETURN(Candidate best, plan_strategy(s, c, p, members, o));
  // What adding each left-out device to the best set predicted.
  std::vector<std::pair<int, Candidate>> tried_from_best;
  while (!rest.empty()) {
    std::vector<std::pair<int, Candidate>> tried;
    int pick = -1;
    for (int d : rest) {
      std::vector<int> m = members;
      m.push_back(d);
      TESSERA_ASSIGN_OR_RETURN(Candidate cand, plan_strategy(s, c, p, m, o));
      tried.push_back({d, cand});
      if (pick < 0 || better(cand, tried[static_cast<size_t>(pick)].second)) pick = static_cast<int>(tried.size()) - 1;
    }
    if (members == best.members) tried_from_best = tried;
    const auto& [dev, cand] = tried[static_cast<size_t>(pick)];
    members.push_back(dev);
    rest.erase(std::find(rest.begin(), rest.end(), dev));
    if (better(cand, best)) best = cand;
  }
  for (int d = 1; d < p.size(); ++d) {
    if (std::find(best.members.begin(), best.members.end(), d) != best.members.end()) continue;
    std::string why = "device " + std::to_string(d) + " left out: ";
    bool said = false;
    for (const auto& [dev, cand] : tried_from_best)
      if (dev == d) {
        char buf[160];
        if (cand.feasible)
          std::snprintf(buf, sizeof(buf), "with it %.2f ms predicted, without it %.2f ms", cand.prediction.latency_ms,
                        best.prediction.latency_ms);
        else
          std::snprintf(buf, sizeof(buf), "with it the plan is not feasible (%s)", cand.why_not.c_str());
        why += buf;
        said = true;
      }
    if (!said) why += "a set without it is predicted faster";
    best.notes.push_back(why);
  }
  return best;
}

Result<PlanTable> plan_all(const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o) {
  if (p.size() < 1) return core::invalid_argument("the profile has no device");
  if (o.rows < 1) return core::invalid_argument("planning needs at least one row");
  PlanTable table;
  double alone_ms = kInf;
  if (o.wires.empty()) return core::invalid_argument("planning needs at least one wire type");
  const std::vector<kernels::WeightType> types = o.weight_types.empty() ? std::vector<kernels::WeightType>{c.weights}
                                                                         : o.weight_types;
  // Per row, how lossy each of its choices is: the index of its setting in
  // the strategy's list, of its weight type and of its wire in the options'
  // lists (each least loss first).
  struct Lossiness {
    int setting = 0, type = 0, wire = 0;
  };
  std::vector<Lossiness> lossiness;
  for (const Strategy* s : parallel::strategies()) {
    std::vector<nlohmann::json> settings = o.lossy_allowed ? s->lossy_settings() : std::vector<nlohmann::json>{};
    if (settings.empty()) settings.push_back(nullptr);
    for (size_t ti = 0; ti < types.size(); ++ti) {
      const kernels::WeightType t = types[ti];
      model::ModelConfig ct = c;
      ct.weights = t;  // every plan below loads (and is priced) in this type
      for (size_t wi = 0; wi < o.wires.size(); ++wi) {
        const core::WireType w = o.wires[wi];
        for (size_t si = 0; si < settings.size(); ++si) {
          PlannerOptions ow = o;
          ow.wire = w;
          ow.strategy_options = settings[si];
          TESSERA_ASSIGN_OR_RETURN(Candidate cand, plan_strategy_any_subset(*s, ct, p, ow));
          // The terminal alone (Voltage's Algorithm 2): the best exact plan on one device.
          TESSERA_ASSIGN_OR_RETURN(const Candidate one, plan_strategy(*s, ct, p, {0}, ow));
          if (one.feasible && one.exact && t == c.weights && (o.ctx_size <= 0 || s->decodes()))
            alone_ms = std::min(alone_ms, one.prediction.latency_ms);
          // A plan on one device sends nothing: the other wires add no row.
          // Nor do the settings of a lossy strategy: one device has no rows to compress.
          if ((w != o.wires.front() || si > 0) && cand.members.size() == 1) continue;
          cand.exact = cand.exact && t == c.weights;
          table.rows.push_back(std::move(cand));
          lossiness.push_back({static_cast<int>(si), static_cast<int>(ti), static_cast<int>(wi)});
        }
      }
    }
  }
  // A generation: each decoding row's step (one row, and its attention over
  // the cached positions), on its own devices' one-row profile.
  const bool generation = o.ctx_size > 0 && o.new_tokens > 0;
  double alone_total = kInf;
  if (generation) {
    // Pairs: a row on several devices whose prefill hands its K/V over, with
    // each decode layout that takes them (complete_plan says which combine);
    // memory is the prefill's weights and the decode's caches.
    const size_t unpaired = table.rows.size();
    // A decode layout on w of a row's devices: that strategy's best plan
    // there (searched for the prompt, as the rows are), one per (strategy,
    // devices, weights, wire). Null where it has none on exactly those
    // devices (a one-device strategy). Memory is the pair's, priced below.
    std::map<std::tuple<std::string, std::vector<int>, int, int>, std::optional<Plan>> decode_plans;
    const auto decode_on = [&](const Strategy& d, const Candidate& r, const std::vector<int>& members) -> const Plan* {
      auto [it, fresh] = decode_plans.try_emplace({d.name(), members, static_cast<int>(r.plan.weights), static_cast<int>(r.plan.wire)});
      if (fresh) {
        PlannerOptions ow = o;
        ow.wire = r.plan.wire;
        ow.strategy_options = nullptr;
        model::ModelConfig ct = c;
        ct.weights = r.plan.weights;
        auto cand = plan_strategy(d, ct, p, members, ow);
        if (cand.ok() && cand->plan.world == static_cast<int>(members.size())) it->second = cand->plan;
      }
      return it->second ? &*it->second : nullptr;
    };
    // A decode runs on the first ranks of its prefill's, so a decode on
    // devices that are not the row's first w takes the row reordered: those
    // devices first, the rest after (each in the row's order), and the
    // prefill planned again on that order. Null where that plan is not the
    // row's strategy on all of them.
    std::map<std::pair<size_t, std::vector<int>>, std::optional<Candidate>> prefills;
    const auto prefill_on = [&](size_t i, const std::vector<int>& order) -> const Candidate* {
      auto [it, fresh] = prefills.try_emplace({i, order});
      if (fresh) {
        const Candidate& r = table.rows[i];
        const Strategy* s = parallel::find_strategy(r.plan.strategy);
        if (s == nullptr) return nullptr;
        // The row's own options: its wire and its lossy setting, as plan_all chose them above.
        std::vector<nlohmann::json> settings = o.lossy_allowed ? s->lossy_settings() : std::vector<nlohmann::json>{};
        if (settings.empty()) settings.push_back(nullptr);
        PlannerOptions ow = o;
        ow.wire = r.plan.wire;
        ow.strategy_options = settings[static_cast<size_t>(lossiness[i].setting)];
        model::ModelConfig ct = c;
        ct.weights = r.plan.weights;
        auto cand = plan_strategy(*s, ct, p, order, ow);
        if (cand.ok() && cand->feasible && cand->plan.world == r.plan.world) it->second = std::move(*cand);
      }
      return it->second ? &*it->second : nullptr;
    };
    // The sets of w of a row's n devices, with the terminal, that a decode
    // is priced on: every one where there are few (n <= kEverySubsetUpTo),
    // else the first w and the terminal with the w - 1 whose one-row step
    // with it alone is priced fastest. As positions in the row; the first w
    // come first.
    constexpr size_t kEverySubsetUpTo = 5;
    const ClusterProfile& step_p = o.step_profile != nullptr && o.step_profile->size() == p.size() ? *o.step_profile : p;
    const int64_t rank_keys = std::min(o.rows + o.new_tokens / 2, o.ctx_size);
    const auto decode_sets = [&](const Strategy& d, const Candidate& r, size_t w) {
      const size_t n = r.members.size();
      if (n <= kEverySubsetUpTo) return sets_with_first(n, w);
      std::vector<size_t> first(w);
      std::iota(first.begin(), first.end(), 0);
      std::vector<std::vector<size_t>> sets = {first};
      std::vector<std::pair<double, size_t>> rank;
      model::ModelConfig ct = c;
      ct.weights = r.plan.weights;
      for (size_t pos = 1; pos < n; ++pos) {
        double ms = kInf;
        const std::vector<int> two = {r.members[0], r.members[pos]};
        if (const Plan* on_two = decode_on(d, r, two)) {
          Plan two_plan = *on_two;
          auto pred = evaluate(two_plan, ct, step_p.subset(two), 1, 0, o.kv_dtype, rank_keys);
          if (pred.ok()) ms = pred->latency_ms;
        }
        rank.push_back({ms, pos});
      }
      std::stable_sort(rank.begin(), rank.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<size_t> fast = {0};
      for (size_t j = 0; j + 1 < w; ++j) fast.push_back(rank[j].second);
      std::sort(fast.begin(), fast.end());
      if (fast != first) sets.push_back(fast);
      return sets;
    };
    // (Into F16 caches nothing is handed over, PairDecoder::handover: a
    // pair would prefill on its decode layout. None is priced then.)
    const size_t pairable = o.kv_dtype == core::DType::kF16 ? 0 : unpaired;
    for (size_t i = 0; i < pairable; ++i) {
      const Candidate r = table.rows[i];  // a copy: rows grow below
      if (!r.feasible || r.members.size() < 2 || r.plan.decode) continue;
      for (const Strategy* d : parallel::strategies()) {
        if (!d->decodes() || !d->takes_kv()) continue;
        // World 0: the prefill's devices, or the terminal for a one-device
        // strategy. Then the decode on each smaller set of them.
        for (size_t w = 0; w < r.members.size(); ++w) {
          if (w == 1) continue;  // the terminal alone is world 0's choice for a one-device strategy
          const std::vector<std::vector<size_t>> sets = w == 0 ? std::vector<std::vector<size_t>>(1) : decode_sets(*d, r, w);
          for (const std::vector<size_t>& set : sets) {
            // The row's devices in the order the pair runs them: the decode's set first.
            std::vector<int> order;
            for (size_t pos : set) order.push_back(r.members[pos]);
            const std::vector<int> decode_members = order;
            for (size_t pos = 0; pos < r.members.size(); ++pos)
              if (std::find(set.begin(), set.end(), pos) == set.end()) order.push_back(r.members[pos]);
            const bool reordered = order != r.members;
            const Candidate* prefill = reordered ? prefill_on(i, order) : &r;
            if (prefill == nullptr) continue;
            Plan dp;
            dp.strategy = d->name();
            dp.world = 0;
            if (w == 0) {
              // On the same devices, the decode layout's own row says how it splits
              // (a pipeline's layer map); it was searched for the prompt.
              for (size_t j = 0; j < unpaired; ++j) {
                const Candidate& o2 = table.rows[j];
                if (o2.feasible && o2.plan.strategy == dp.strategy && o2.members == r.members &&
                    o2.plan.weights == r.plan.weights && o2.plan.wire == r.plan.wire && !o2.plan.decode) {
                  dp.world = o2.plan.world;
                  dp.ratios = o2.plan.ratios;
                  dp.options = o2.plan.options;
                  break;
                }
              }
            } else {
              const Plan* sub = decode_on(*d, r, decode_members);
              if (sub == nullptr) continue;
              dp.world = sub->world;
              dp.ratios = sub->ratios;
              dp.options = sub->options;
            }
            Plan pair = prefill->plan;
            pair.decode = std::make_shared<const Plan>(std::move(dp));
            model::ModelConfig ct = c;
            ct.weights = r.plan.weights;
            auto pred = evaluate(pair, ct, p.subset(order), o.rows, o.ctx_size, o.kv_dtype);
            if (!pred.ok()) continue;  // not a pair these two layouts make
            Candidate pc = r;  // its exactness, lossiness and notes; the order and plan below
            pc.members = order;
            pc.plan = pair;
            pc.prediction = *pred;
            pc.feasible = pred->fits;
            pc.why_not = pred->fits ? "" : "exceeds a device's memory budget with the decode's KV caches";
            std::string on = std::to_string(pair.decode->world) + " device(s)";
            if (reordered) {
              on += " (devices";
              for (size_t k = 0; k < decode_members.size(); ++k) on += (k == 0 ? " " : ", ") + std::to_string(decode_members[k]);
              on += ", which run first)";
            }
            pc.notes.push_back("a pair: " + r.plan.strategy + " prefills and hands the K/V over; " + d->name() + " decodes on " + on);
            table.rows.push_back(std::move(pc));
            lossiness.push_back(lossiness[i]);
          }
        }
      }
    }
    const ClusterProfile& sp = o.step_profile != nullptr ? *o.step_profile : p;
    // The N - 1 steps attend over n + 1 .. n + N - 1 cached positions: N/2 more than the prompt on average.
    const int64_t step_keys = std::min(o.rows + o.new_tokens / 2, o.ctx_size);
    const int64_t batch = std::max<int64_t>(o.decode_batch, 1);
    if (sp.size() != p.size()) return core::invalid_argument("the one-row profile has another device count");
    for (Candidate& r : table.rows) {
      if (!r.feasible || !parallel::plan_decodes(r.plan)) continue;
      // A pair's steps run its decode plan on its first devices.
      Plan step = parallel::decode_plan(r.plan);
      const std::vector<int> step_members(r.members.begin(),
                                          r.members.begin() + std::min<size_t>(r.members.size(), static_cast<size_t>(step.world)));
      model::ModelConfig ct = c;
      ct.weights = r.plan.weights;
      // A step takes the batch's rows at once where the decode layout batches
      // them (quantized: at most the decode kernels' rows, Session::batched_step),
      // else one sequence after another: each sequence waits as many steps a token.
      const parallel::Strategy* ds = parallel::find_strategy(step.strategy);
      int64_t rows = ds != nullptr && ds->batches_steps() ? batch : 1;
      if (ct.weights != kernels::WeightType::kF32) rows = std::min(rows, kernels::kQuantDotRows);
      const int64_t turns = (batch + rows - 1) / rows;
      auto pred = evaluate(step, ct, sp.subset(step_members), rows, 0, o.kv_dtype, step_keys);
      char buf[240];
      if (!pred.ok()) {
        r.notes.push_back("decode step not priced (" + pred.status().message() + "): not chosen for a generation");
        continue;
      }
      r.step_ms = static_cast<double>(turns) * pred->latency_ms;
      // Overlapped steps (a pipeline's): k groups of rows in flight, one at
      // each stage; a call takes the busiest device's time on one group, and
      // a sequence's token takes k calls (more when the groups are capped).
      // A device's transfers on one group count half: it still sends its
      // rows, but receives the next ones while the others compute. Where
      // that is slower (steps bound by reading the weights read them once
      // per group), the plan turns them off.
      const Plan before = r.plan;
      int stages = ds != nullptr && batch > 1 ? ds->overlapped_stages(step, ct) : 1;
      int64_t group = 0;
      const double in_turn_ms = r.step_ms;
      auto calls_of = [&](int k, int64_t g) {
        return std::max<double>(k, std::ceil(static_cast<double>(batch) / static_cast<double>(g)));
      };
      // Every stage computes at once then, sharing a host's bandwidth.
      const ClusterProfile at_once = streaming_at_once(sp.subset(step_members));
      if (stages > 1) {
        const int64_t g = std::min<int64_t>(rows, (batch + stages - 1) / stages);
        auto gp = evaluate(step, ct, at_once, g, 0, o.kv_dtype, step_keys);
        const double calls = calls_of(stages, g);
        if (gp.ok() && calls * detail::overlapped_call_ms(*gp) < r.step_ms) {
          r.step_ms = calls * detail::overlapped_call_ms(*gp);
          group = g;
        } else if (r.plan.decode) {
          Plan dp = *r.plan.decode;
          dp.options["overlap"] = false;
          r.plan.decode = std::make_shared<const Plan>(std::move(dp));
        } else {
          r.plan.options["overlap"] = false;
        }
      }
      // The row's layer map was searched for the prompt; overlapped steps
      // want the stages even, the terminal's LM head included. Taken where
      // the whole generation is faster so.
      std::string evened;
      if (ds != nullptr && batch > 1 && step.world > 1) {
        const int64_t g = std::min<int64_t>(rows, (batch + step.world - 1) / step.world);
        const detail::StageMap sm = detail::balance_stages(*ds, step, ct, at_once, g, o.kv_dtype, step_keys);
        const double ms = sm.map.empty() ? kInf : calls_of(step.world, g) * sm.call_ms;
        if (ms < r.step_ms * 0.99) {
          Plan plan = before;
          if (plan.decode) {
            Plan dp = *plan.decode;
            ds->apply_partition(dp, Partition{{}, {}, sm.map, false});
            plan.decode = std::make_shared<const Plan>(std::move(dp));
          } else {
            ds->apply_partition(plan, Partition{{}, {}, sm.map, false});
          }
          auto whole = evaluate(plan, ct, p.subset(r.members), o.rows, o.ctx_size, o.kv_dtype);
          const double steps = static_cast<double>(std::max<int64_t>(o.new_tokens - 1, 0));
          if (whole.ok() && whole->fits && whole->latency_ms + steps * ms < r.generation_ms(o.new_tokens)) {
            std::vector<int64_t> per(static_cast<size_t>(step.world), 0);
            for (int d : sm.map) ++per[static_cast<size_t>(d)];
            evened = "; the decode's layers per device " + detail::join_counts(per) +
                     " even its stages out (the terminal's also runs the LM head)";
            r.plan = std::move(plan);
            r.prediction = *whole;
            r.step_ms = ms;
            stages = step.world;
            group = g;
          }
        }
      }
      r.decode_devices = static_cast<int>(step_members.size());
      std::snprintf(buf, sizeof(buf), "generation of %lld tokens: %.2f ms to the first + %.3f ms/token = %.1f ms%s",
                    static_cast<long long>(o.new_tokens), r.prediction.latency_ms, r.step_ms, r.generation_ms(o.new_tokens),
                    batch == 1 ? ""
                    : turns == 1 ? (" (steps of " + std::to_string(rows) + " sequences' rows)").c_str()
                                 : (" (" + std::to_string(batch) + " sequences in " + std::to_string(turns) + " steps of " +
                                    std::to_string(rows) + " row(s) a token)").c_str());
      r.notes.push_back(buf);
      if (group > 0) {
        std::snprintf(buf, sizeof(buf), "; overlapped: %d groups of %lld rows, one at each stage (%.3f ms/token in turn)", stages,
                      static_cast<long long>(group), in_turn_ms);
        r.notes.back() += buf + evened;
      }
      if (r.members.size() == 1 && r.exact && r.plan.weights == c.weights)
        alone_total = std::min(alone_total, r.generation_ms(o.new_tokens));
    }
  }
  // Rows the --max-loss gate measured above the limit.
  std::vector<bool> rejected(table.rows.size(), false);
  const bool gate = o.lossy_allowed && o.measure_loss != nullptr;
  for (;;) {
    table.chosen = -1;
    for (size_t i = 0; i < table.rows.size(); ++i) {
      const Candidate& r = table.rows[i];
      const parallel::Strategy* rs = parallel::find_strategy(r.plan.strategy);
      const bool strategy_ok = (rs != nullptr && rs->exact()) || o.lossy_allowed;
      const bool wire_ok = r.plan.wire == core::WireType::kF32 || o.lossy_allowed || o.wire_given;
      const bool weights_ok = r.plan.weights == c.weights || o.lossy_allowed;
      // A generation's plan must decode: the prompt's layout holds the KV caches.
      const bool decodes_ok = o.ctx_size <= 0 || (parallel::plan_decodes(r.plan) && (!generation || r.step_ms > 0));
      if (!r.feasible || !strategy_ok || !wire_ok || !weights_ok || !decodes_ok || rejected[i]) continue;
      if (table.chosen < 0) {
        table.chosen = static_cast<int>(i);
        continue;
      }
      // On as many devices, 1% faster wins (among equals the earlier strategy
      // of the registry); more devices must be o.min_gain faster, and fewer
      // devices win unless the others are (less to go wrong).
      const Candidate& b = table.rows[static_cast<size_t>(table.chosen)];
      const double x = generation ? r.generation_ms(o.new_tokens) : r.prediction.latency_ms;
      const double y = generation ? b.generation_ms(o.new_tokens) : b.prediction.latency_ms;
      const double gain = std::max(0.01, o.min_gain);
      const bool wins = r.members.size() == b.members.size() ? x < y * 0.99
                        : r.members.size() > b.members.size()
                            ? y - x > gain * (generation ? more_devices_ms(r, b, o.new_tokens) : y)
                            : !(x - y > gain * (generation ? more_devices_ms(b, r, o.new_tokens) : x));
      if (wins) table.chosen = static_cast<int>(i);
    }
    if (table.chosen < 0 || !gate) break;
    const auto ci = static_cast<size_t>(table.chosen);
    Candidate& ch = table.rows[ci];
    if (ch.exact) break;
    char buf[160];
    Result<double> loss = o.measure_loss(ch.plan);
    if (loss.ok()) {
      ch.measured_loss = *loss;
      std::snprintf(buf, sizeof(buf), "measured top-1 disagreement %.2f%% (limit %.2f%%)", 100.0 * *loss, 100.0 * o.max_loss);
      ch.notes.push_back(buf);
      if (*loss <= o.max_loss) break;
    } else {
      // Not measured says nothing of the other rows: only this one goes.
      ch.notes.push_back("loss not measured (" + loss.status().message() + "): not chosen");
      rejected[ci] = true;
      continue;
    }
    // Over the limit: this row is not chosen, nor are the same strategy's
    // rows that are at least as lossy in every choice (loss grows with each),
    // which spares measuring them.
    const Lossiness& a = lossiness[ci];
    for (size_t j = 0; j < table.rows.size(); ++j) {
      const Lossiness& b = lossiness[j];
      if (table.rows[j].plan.strategy == ch.plan.strategy && b.setting >= a.setting && b.type >= a.type && b.wire >= a.wire)
        rejected[j] = true;
    }
  }
  if (o.ctx_size > 0)
    for (Candidate& r : table.rows)
      if (!parallel::plan_decodes(r.plan))
        r.notes.push_back("not chosen for a generation: " + r.plan.strategy + " has no decoder" +
                          (generation ? " (the rows below pair it where they can)" : ""));
  if (table.chosen < 0)
    return core::resource_exhausted(gate ? "no strategy has a plan that fits the devices' memory within --max-loss"
                                         : "no strategy has a plan that fits the devices' memory");
  const Candidate& ch = table.rows[static_cast<size_t>(table.chosen)];
  char buf[200];
  const std::string chosen_name = parallel::plan_name(ch.plan);
  std::snprintf(buf, sizeof(buf), "%s on %zu device(s): %.2f ms predicted; the terminal alone %.2f ms", chosen_name.c_str(),
                ch.members.size(), ch.prediction.latency_ms, alone_ms);
  table.reason = buf;
  if (generation) {
    std::snprintf(buf, sizeof(buf), "; a generation of %lld tokens %.1f ms (%.3f ms/token); the terminal alone %.1f ms",
                  static_cast<long long>(o.new_tokens), ch.generation_ms(o.new_tokens), ch.step_ms, alone_total);
    table.reason += buf;
    // The terminal alone is a row ("single"): more devices displace it only
    // when the whole generation is predicted faster.
    TESSERA_CHECK(alone_total == kInf || ch.generation_ms(o.new_tokens) <= alone_total * 1.01 + 1e-9);
  } else {
    // Every strategy's own search starts from the terminal alone, so the
    // choice is never predicted slower than it.
    TESSERA_CHECK(alone_ms == kInf || ch.prediction.latency_ms <= alone_ms * 1.01 + 1e-9);
  }
  return table;
}

nlohmann::json PlanTable::to_json() const {
  nlohmann::json rows_j = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Candidate& r = rows[i];
    rows_j.push_back({{"strategy", r.plan.strategy}, {"plan", r.plan.to_json()}, {"members", r.members},
                      {"feasible", r.feasible}, {"why_not", r.why_not}, {"exact", r.exact},
                      {"prediction", r.prediction.to_json()}, {"notes", r.notes},
                      {"chosen", static_cast<int>(i) == chosen},
                      {"measured_loss", r.measured_loss >= 0 ? nlohmann::json(r.measured_loss) : nlohmann::json(nullptr)},
                      {"step_ms", r.step_ms > 0 ? nlohmann::json(r.step_ms) : nlohmann::json(nullptr)}});
  }
  return {{"rows", rows_j}, {"chosen", chosen}, {"reason", reason}};
}

}  // namespace tessera::planner
