// The partitioners plan_strategy runs on a strategy's share kind (rows,
// heads and FFN columns, layers), and the pricing they share with
// plan_all (planner/search.h).
#include "planner/search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "planner/ilp.h"
#include "planner/variants.h"

namespace tessera::planner::detail {

using core::Result;
using parallel::Partition;
using parallel::Plan;
using parallel::ShareKind;
using parallel::Strategy;

Result<Prediction> evaluate(Plan& plan, const model::ModelConfig& c, const ClusterProfile& p, int64_t n,
                            int64_t kv_positions, core::DType kv_dtype, int64_t cache_keys) {
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(plan, c));
  {  // open choices (bp's --bp-plan auto) decided on the same profile
    TESSERA_ASSIGN_OR_RETURN(VariantChoice v, choose_variant(plan, c, p, n));
    plan = std::move(v.plan);
  }
  TESSERA_ASSIGN_OR_RETURN(parallel::Schedule s, parallel::estimate(plan, c, n));
  parallel::add_kv_cache(s, plan, c, kv_positions, kv_dtype);
  if (cache_keys > 0) parallel::add_cache_reads(s, c, cache_keys, kv_dtype, n);
  TESSERA_ASSIGN_OR_RETURN(Prediction pred, predict(s, p));
  if (kv_positions > 0)
    add_cache_allocation(pred, s, p, static_cast<double>(std::min(n, kv_positions)) / static_cast<double>(kv_positions));
  // A generation's prefill needs only its last row's logits (the first token).
  model::ModelConfig head = c;
  head.weights = plan.weights;  // the LM head is held in the plan's type
  add_terminal_work(pred, head, p, n, kv_positions > 0 ? 1 : -1);
  return pred;
}

Plan base_plan(const Strategy& s, int world, const PlannerOptions& o) {
  Plan plan;
  plan.strategy = s.name();
  plan.world = world;
  plan.wire = world > 1 ? o.wire : core::WireType::kF32;
  if (o.strategy_options.is_object()) plan.options = o.strategy_options;
  return plan;
}

std::string join_counts(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) {
    if (!out.empty()) out += ',';  // (a prefix concatenated here trips GCC 12's -Wrestrict)
    out += std::to_string(x);
  }
  return out;
}

namespace {

Plan with_partition(const Strategy& s, int world, const Partition& part, const PlannerOptions& o) {
  Plan plan = base_plan(s, world, o);
  s.apply_partition(plan, part);
  return plan;
}

std::vector<double> as_doubles(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Each device's capacity for this strategy: 1 / its predicted latency
// running the strategy alone.
std::vector<double> capacities(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, int64_t n,
                               const PlannerOptions& o) {
  std::vector<double> cap;
  for (int d = 0; d < p.size(); ++d) {
    Plan plan = base_plan(s, 1, o);
    const auto pred = evaluate(plan, c, p.subset({d}), n, 0);
    double v = pred.ok() && pred.value().latency_ms > 0 ? 1.0 / pred.value().latency_ms : 0.0;
    if (!(v > 0)) {  // the strategy does not run alone: the device's GEMM speed
      const auto& dev = p.devices[static_cast<size_t>(d)];
      v = dev.gemm_gflops(n, c.hidden, c.hidden) * dev.speed;
    }
    cap.push_back(v);
  }
  return cap;
}

double mem_of(const parallel::Schedule& s, int d) {
  const auto& x = s.devices[static_cast<size_t>(d)];
  return static_cast<double>(x.weight_bytes + x.activation_bytes + x.kv_bytes());
}

// What a plan's weights and activations may use: the budget less what the
// kernels' libraries keep (the profile's runtime_bytes).
double budget_of(const ClusterProfile& p, int d) {
  const auto& dev = p.devices[static_cast<size_t>(d)];
  return dev.memory_bytes > 0 ? static_cast<double>(dev.memory_bytes - dev.runtime_bytes) : kInf;
}

// Layers, exactly: the ILP over the unit chain (ilp.h), warm-started from
// the dynamic programme's map `dp_map` (empty: none fits). Its plan is the
// row's, whatever the cost model says of the DP's: the ILP's objective also
// prices the terminal's pseudo layers and weight loading.
void search_layers_ilp(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                       const std::vector<int>& dp_map, Best& best, std::vector<std::string>& notes) {
  const int K = p.size();
  const bool blocks = o.units == UnitGranularity::kBlocks;
  const auto pr = build_unit_chain(s, c, p, o.rows, o.units, o.ilp_load_time, o.ctx_size, o.kv_dtype, o.wire);
  if (!pr.ok()) {
    notes.push_back("ILP: " + pr.status().message());
    return;
  }
  IlpOptions io;
  io.time_limit_s = o.ilp_time_limit_s;
  io.lp_file = o.ilp_lp_file;
  if (!dp_map.empty()) {
    std::vector<int> units;
    for (int d : dp_map) {
      units.push_back(d);
      if (blocks) units.push_back(d);
    }
    io.warm_start = chain_assignment(pr.value(), units);
  }
  const auto r = solve_ilp(pr.value(), io);
  if (!r.ok()) {
    notes.push_back("ILP: " + r.status().message());
    return;
  }
  notes.push_back(r.value().summary());
  if (r.value().device_of_unit.empty()) return;
  const std::vector<int> map = model_unit_map(pr.value(), r.value().device_of_unit);
  Plan plan = with_partition(s, K, Partition{{}, {}, map, blocks}, o);
  const auto pred = evaluate(plan, c, p, o.rows, o.ctx_size, o.kv_dtype);
  if (pred.ok()) best.offer(plan, pred.value());
  std::vector<int64_t> per(static_cast<size_t>(K), 0);
  int64_t switches = 0;
  for (size_t i = 0; i < map.size(); ++i) {
    ++per[static_cast<size_t>(map[i])];
    switches += i > 0 && map[i] != map[i - 1];
  }
  notes.push_back(std::string(blocks ? "blocks" : "layers") + " per device " + join_counts(per) + ", " +
                  std::to_string(switches) + " hand-over(s) between devices (ILP)");
}

}  // namespace

// Rows: proportional to capacity, then moves of rows off the critical
// device while the cost model says it helps.
void search_rows(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                 Best& best, std::vector<std::string>& notes) {
  const int K = p.size();
  const int64_t n = o.rows;
  std::vector<int64_t> counts = proportional_counts(n, capacities(s, c, p, n, o));
  auto eval_counts = [&](const std::vector<int64_t>& cnt) -> Result<std::pair<Plan, Prediction>> {
    Plan plan = with_partition(s, K, Partition{as_doubles(cnt), {}, {}}, o);
    TESSERA_ASSIGN_OR_RETURN(const Prediction pr, evaluate(plan, c, p, n, o.ctx_size, o.kv_dtype));
    return std::make_pair(plan, pr);
  };
  auto cur = eval_counts(counts);
  if (!cur.ok()) return;
  best.offer(cur.value().first, cur.value().second);
  double cur_ms = cur.value().second.latency_ms;
  int steps = 0;
  for (int64_t step = std::max<int64_t>(1, n / (4 * K)); step >= 1 && steps < o.refine_steps; step /= 2) {
    bool moved = true;
    while (moved && steps < o.refine_steps) {
      moved = false;
      ++steps;
      // The device on the critical path gives `step` rows to the one that
      // helps most.
      const int from = best.pred.bottleneck;
      if (counts[static_cast<size_t>(from)] < step) break;
      std::vector<int64_t> best_counts;
      double best_ms = cur_ms;
      for (int to = 0; to < K; ++to) {
        if (to == from) continue;
        std::vector<int64_t> cand = counts;
        cand[static_cast<size_t>(from)] -= step;
        cand[static_cast<size_t>(to)] += step;
        const auto r = eval_counts(cand);
        if (r.ok() && r.value().second.fits && r.value().second.latency_ms < best_ms - 1e-9) {
          best_ms = r.value().second.latency_ms;
          best_counts = cand;
        }
      }
      if (!best_counts.empty()) {
        counts = best_counts;
        const auto r = eval_counts(counts);
        if (r.ok()) best.offer(r.value().first, r.value().second);
        cur_ms = best_ms;
        moved = true;
      }
    }
  }
  notes.push_back("rows " + join_counts(parallel::range_sizes(parallel::split_by_ratio(n, best.plan.ratios))) +
                  " (proportional to speed, refined on the cost model)");
}

// Heads and FFN columns: Galaxy's Algorithm 1. Memory is linear in a
// device's heads and columns; the coefficients come from the strategy's own
// estimate() of extreme plans (everything on one device), KV caches included
// when the plan is for a generation. With grouped K/V heads and no more
// devices than K/V heads, the units are whole K/V groups, as head_ranges
// places them (so no K/V head is held twice and the counts planned are the
// counts run).
void search_heads(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                  Best& best, std::vector<std::string>& notes) {
  const int K = p.size();
  const int64_t n = o.rows, H = c.heads, I = c.intermediate;
  // head_ranges' unit where whole units make up the heads (the counts
  // planned are then the counts run); else whole groups, which it rounds.
  const int64_t unit = parallel::head_unit(c, K);
  const int64_t group = H % unit == 0 ? unit : c.kv_group() > 1 && K <= c.kv_head_count() ? c.kv_group() : 1;
  const int64_t units = H / group;  // attention units: heads, or K/V groups
  const std::vector<double> cap = capacities(s, c, p, n, o);
  auto one_hot = [&](int d) {
    std::vector<double> v(static_cast<size_t>(K), 0.0);
    v[static_cast<size_t>(d)] = 1.0;
    return v;
  };
  std::vector<double> fixed(static_cast<size_t>(K), 0.0), per_head(fixed), per_col(fixed), budget(fixed);
  for (int d = 0; d < K; ++d) budget[static_cast<size_t>(d)] = budget_of(p, d);
  if (K > 1) {
    auto sched = [&](int heads_on, int cols_on) -> Result<parallel::Schedule> {
      Plan plan = with_partition(s, K, Partition{one_hot(heads_on), one_hot(cols_on), {}}, o);
      TESSERA_RETURN_IF_ERROR(parallel::complete_plan(plan, c));
      TESSERA_ASSIGN_OR_RETURN(parallel::Schedule sc, parallel::estimate(plan, c, n));
      parallel::add_kv_cache(sc, plan, c, o.ctx_size, o.kv_dtype);
      return sc;
    };
    const auto w00 = sched(0, 0), w11 = sched(1, 1), w01 = sched(0, 1), w10 = sched(1, 0);
    if (!w00.ok() || !w11.ok() || !w01.ok() || !w10.ok()) return;
    const double a0 = mem_of(w11.value(), 0), a1 = mem_of(w00.value(), 1);
    const double b0 = (mem_of(w01.value(), 0) - a0) / H, c0 = (mem_of(w10.value(), 0) - a0) / I;
    const double b1 = (mem_of(w10.value(), 1) - a1) / H, c1 = (mem_of(w01.value(), 1) - a1) / I;
    for (int d = 0; d < K; ++d) {
      const auto u = static_cast<size_t>(d);
      fixed[u] = d == 0 ? a0 : a1;
      per_head[u] = std::max(d == 0 ? b0 : b1, 0.0) * static_cast<double>(group);  // a unit's bytes
      per_col[u] = std::max(d == 0 ? c0 : c1, 0.0);
    }
  }
  // Step 1: both blocks in proportion to capacity.
  std::vector<int64_t> heads = proportional_counts(units, cap), cols = proportional_counts(I, cap);
  // Step 2: the MLP block, then the MHA block, within the budgets.
  std::vector<double> f(static_cast<size_t>(K));
  for (int d = 0; d < K; ++d) {
    const auto u = static_cast<size_t>(d);
    f[u] = fixed[u] + per_head[u] * static_cast<double>(heads[u]);
  }
  auto balanced_cols = balance_units(I, cap, f, per_col, budget);
  std::string why;
  if (balanced_cols.ok()) {
    cols = balanced_cols.value();
    for (int d = 0; d < K; ++d) {
      const auto u = static_cast<size_t>(d);
      f[u] = fixed[u] + per_col[u] * static_cast<double>(cols[u]);
    }
    auto balanced_heads = balance_units(units, cap, f, per_head, budget);
    if (balanced_heads.ok()) heads = balanced_heads.value();
    else why = balanced_heads.status().message();
  } else {
    why = balanced_cols.status().message();
  }
  for (int64_t& h : heads) h *= group;  // back to query heads
  Plan plan = with_partition(s, K, Partition{as_doubles(heads), as_doubles(cols), {}}, o);
  const auto pred = evaluate(plan, c, p, n, o.ctx_size, o.kv_dtype);
  if (pred.ok()) best.offer(plan, pred.value());
  // The equal split, for comparison: taken only when it fits and is faster.
  Plan equal = base_plan(s, K, o);
  const auto eq = evaluate(equal, c, p, n, o.ctx_size, o.kv_dtype);
  const bool equal_won = eq.ok() && best.offer(equal, eq.value());
  notes.push_back(equal_won ? "equal heads and columns (faster than Algorithm 1's)"
                            : "Algorithm 1: heads " + join_counts(heads) + ", FFN columns " + join_counts(cols) +
                                  (why.empty() ? "" : " (" + why + ")"));
}

// Layers: a contiguous map by dynamic programming over (layers done, last
// device), in the members' order, within each device's budget. Per-layer
// times, hand-over bytes and memory come from the strategy's estimate().
void search_layers(const Strategy& s, const model::ModelConfig& c, const ClusterProfile& p, const PlannerOptions& o,
                   Best& best, std::vector<std::string>& notes) {
  const int K = p.size();
  const int64_t n = o.rows, L = c.layers;
  auto map_plan = [&](std::vector<int> map) {
    return with_partition(s, K, Partition{{}, {}, std::move(map)}, o);
  };
  if (K == 1 || L < 1) {
    Plan plan = map_plan(std::vector<int>(static_cast<size_t>(std::max<int64_t>(L, 0)), 0));
    const auto pred = evaluate(plan, c, p, n, o.ctx_size, o.kv_dtype);
    if (pred.ok()) best.offer(plan, pred.value());
    return;
  }
  Plan on0 = map_plan(std::vector<int>(static_cast<size_t>(L), 0)), on1 = map_plan(std::vector<int>(static_cast<size_t>(L), 1));
  if (!parallel::complete_plan(on0, c).ok() || !parallel::complete_plan(on1, c).ok()) return;
  const auto s0 = parallel::estimate(on0, c, n), s1 = parallel::estimate(on1, c, n);
  if (!s0.ok() || !s1.ok()) return;
  // lt[d][l]: layer l's kernels on device d.
  std::vector<std::vector<double>> lt(static_cast<size_t>(K), std::vector<double>(static_cast<size_t>(L), 0.0));
  for (const auto& ph : s0.value().devices[0].phases)
    if (ph.layer >= 0 && ph.layer < L)
      for (const auto& w : ph.work)
        for (int d = 0; d < K; ++d)
          lt[static_cast<size_t>(d)][static_cast<size_t>(ph.layer)] += work_ms(w, p.devices[static_cast<size_t>(d)]);
  int64_t hand_bytes = 0;
  for (const auto& ph : s1.value().devices[0].phases)
    for (const auto& t : ph.transfers) hand_bytes = std::max(hand_bytes, t.bytes_sent);
  auto hand = [&](int a, int b) {
    return a == b ? 0.0 : transfer_ms(parallel::Transfer{parallel::CollectiveKind::kSendRecv, "x", hand_bytes, {b}}, a, p);
  };
  const double term = mem_of(s1.value(), 0);
  const auto& d1 = s1.value().devices[1];
  // A layer's weights and, in a generation plan, its KV caches.
  const double per_layer =
      static_cast<double>(d1.weight_bytes + parallel::kv_cache_bytes(on1, c, 1, o.ctx_size, o.kv_dtype)) / static_cast<double>(L);
  const double act = static_cast<double>(d1.activation_bytes);
  auto fits = [&](int d, int64_t layers) {
    const double need = d == 0 ? term + per_layer * static_cast<double>(layers) : (layers > 0 ? per_layer * layers + act : 0);
    return need <= budget_of(p, d);
  };
  // g[l][j]: fastest time with layers [0, l) placed, device j holding them.
  std::vector<std::vector<double>> g(static_cast<size_t>(L + 1), std::vector<double>(static_cast<size_t>(K), kInf));
  std::vector<std::vector<std::pair<int64_t, int>>> from(static_cast<size_t>(L + 1),
                                                         std::vector<std::pair<int64_t, int>>(static_cast<size_t>(K), {-1, -1}));
  double acc = 0;
  for (int64_t l = 0; l <= L; ++l) {
    if (fits(0, l)) g[static_cast<size_t>(l)][0] = acc;
    if (l < L) acc += lt[0][static_cast<size_t>(l)];
  }
  for (int64_t l = 0; l < L; ++l)
    for (int j = 0; j < K; ++j) {
      const double base = g[static_cast<size_t>(l)][static_cast<size_t>(j)];
      if (base == kInf) continue;
      for (int j2 = j + 1; j2 < K; ++j2) {
        double run = base + hand(j, j2);
        for (int64_t l2 = l + 1; l2 <= L; ++l2) {
          run += lt[static_cast<size_t>(j2)][static_cast<size_t>(l2 - 1)];
          if (!fits(j2, l2 - l)) break;
          auto& cell = g[static_cast<size_t>(l2)][static_cast<size_t>(j2)];
          if (run < cell) cell = run, from[static_cast<size_t>(l2)][static_cast<size_t>(j2)] = {l, j};
        }
      }
    }
  int last = -1;
  double best_ms = kInf;
  for (int j = 0; j < K; ++j) {
    const double t = g[static_cast<size_t>(L)][static_cast<size_t>(j)] + hand(j, 0);
    if (t < best_ms) best_ms = t, last = j;
  }
  std::vector<int> map;
  if (last >= 0) {
    map.assign(static_cast<size_t>(L), 0);
    for (int64_t l = L; l > 0 && last > 0;) {
      const auto [pl, pj] = from[static_cast<size_t>(l)][static_cast<size_t>(last)];
      TESSERA_CHECK(pl >= 0);
      for (int64_t x = pl; x < l; ++x) map[static_cast<size_t>(x)] = last;
      l = pl;
      last = pj;
    }
  }
  if (o.layer_solver == PlannerOptions::LayerSolver::kIlp) {
    search_layers_ilp(s, c, p, o, map, best, notes);
    return;
  }
  if (map.empty()) {
    notes.push_back("no contiguous layer map fits the budgets");
    return;
  }
  Plan plan = map_plan(map);
  const auto pred = evaluate(plan, c, p, n, o.ctx_size, o.kv_dtype);
  if (pred.ok()) best.offer(plan, pred.value());
  std::vector<int64_t> per(static_cast<size_t>(K), 0);
  for (int d : map) ++per[static_cast<size_t>(d)];
  notes.push_back("layers per device " + join_counts(per) + " (contiguous, dynamic programming)");
}

double overlapped_call_ms(const Prediction& group_step) {
  double busy = 0;
  for (const auto& d : group_step.devices) busy = std::max(busy, d.compute_ms + d.comm_ms / 2);
  return busy;
}

StageMap balance_stages(const Strategy& s, const Plan& step, const model::ModelConfig& c, const ClusterProfile& p,
                        int64_t group, core::DType kv_dtype, int64_t cache_keys) {
  StageMap out;
  const int K = step.world;
  const int64_t L = c.layers;
  if (K < 2 || L < K || s.share_kind() != ShareKind::kLayers) return out;
  auto map_of = [&](const std::vector<int64_t>& counts) {
    std::vector<int> map;
    for (int d = 0; d < K; ++d) map.insert(map.end(), static_cast<size_t>(counts[static_cast<size_t>(d)]), d);
    return map;
  };
  // The call on one group with these counts; kInf where the plan does not overlap.
  auto call = [&](const std::vector<int64_t>& counts) {
    Plan plan = step;
    s.apply_partition(plan, Partition{{}, {}, map_of(counts), false});
    auto pred = evaluate(plan, c, p, group, 0, kv_dtype, cache_keys);
    return pred.ok() && s.overlapped_stages(plan, c) == K ? overlapped_call_ms(*pred) : kInf;
  };
  std::vector<int64_t> counts(static_cast<size_t>(K), L / K);
  for (int64_t d = 0; d < L % K; ++d) ++counts[static_cast<size_t>(K - 1 - d)];  // the terminal's stage the shorter
  double cur = call(counts);
  if (cur == kInf) return out;
  for (int64_t moves = 0; moves < L * K; ++moves) {
    std::vector<int64_t> best_counts;
    double best_ms = cur;
    for (int b = 0; b + 1 < K; ++b)
      for (int dir : {-1, 1}) {  // a layer from rank b to b + 1, or back
        std::vector<int64_t> cand = counts;
        cand[static_cast<size_t>(b)] += dir;
        cand[static_cast<size_t>(b + 1)] -= dir;
        if (cand[static_cast<size_t>(b)] < 1 || cand[static_cast<size_t>(b + 1)] < 1) continue;
        const double ms = call(cand);
        if (ms < best_ms - 1e-9) best_ms = ms, best_counts = cand;
      }
    if (best_counts.empty()) break;
    counts = best_counts;
    cur = best_ms;
  }
  out.map = map_of(counts);
  out.call_ms = cur;
  return out;
}

}  // namespace tessera::planner::detail
