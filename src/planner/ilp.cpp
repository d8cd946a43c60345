#include "planner/ilp.h"

#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "core/check.h"
#include "planner/cost_model.h"

namespace tessera::planner {

using core::Result;
using parallel::Plan;
using parallel::Schedule;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double ms_of(const std::vector<parallel::Work>& work, const DeviceProfile& d) {
  double t = 0;
  for (const auto& w : work) t += work_ms(w, d);
  return t;
}

int64_t logits_bytes(const model::ModelConfig& c, int64_t n) {
  if (c.head == model::HeadKind::kNone) return n * c.hidden * 4;
  return (c.causal() ? n * c.vocab : c.num_labels()) * 4;
}

int64_t input_bytes(const model::ModelConfig& c, int64_t n) {
  if (c.takes_images()) return c.channels * c.image_size * c.image_size * 4;
  return n * 8 * (c.has_token_types() ? 2 : 1);  // ids (and token types)
}

}  // namespace

Result<IlpProblem> build_unit_chain(const parallel::Strategy& s, const model::ModelConfig& c, const ClusterProfile& p,
                                    int64_t rows, UnitGranularity g, bool with_load_time, int64_t ctx,
                                    core::DType kv_dtype, core::WireType wire) {
  if (s.share_kind() != parallel::ShareKind::kLayers)
    return core::invalid_argument("strategy '" + s.name() + "' does not place layers on devices");
  const int K = p.size();
  if (K < 1) return core::invalid_argument("the profile has no device");
  const bool blocks = g == UnitGranularity::kBlocks;
  const int64_t U = blocks ? 2 * c.layers : c.layers;
  // Two-device plans: everything on device 0 but `one` on device 1.
  auto estimate_with = [&](const std::vector<int>& map) -> Result<Schedule> {
    Plan plan;
    plan.strategy = s.name();
    plan.world = 2;
    plan.wire = wire;
    parallel::Partition part;
    part.layer_map = map;
    part.blocks = blocks;
    s.apply_partition(plan, part);
    TESSERA_RETURN_IF_ERROR(parallel::complete_plan(plan, c));
    TESSERA_ASSIGN_OR_RETURN(Schedule sc, parallel::estimate(plan, c, rows));
    parallel::add_kv_cache(sc, plan, c, ctx, kv_dtype);
    return sc;
  };
  auto work_of = [](const parallel::DeviceSchedule& d) {
    std::vector<parallel::Work> w;
    for (const auto& ph : d.phases) w.insert(w.end(), ph.work.begin(), ph.work.end());
    return w;
  };
  auto sent = [](const parallel::DeviceSchedule& d) { return d.bytes_sent(); };

  IlpProblem pr;
  pr.devices = K;
  auto add_unit = [&](std::string name, int pinned, int64_t model_unit, const std::vector<parallel::Work>& work,
                      int64_t weights, int64_t out, int64_t kv = 0) {
    IlpUnit u;
    u.name = std::move(name);
    u.pinned = pinned;
    u.model_unit = model_unit;
    u.weight_bytes = weights + kv;
    u.out_bytes = out;
    for (const auto& d : p.devices) {
      u.compute_ms.push_back(ms_of(work, d));
      // Eq. 2: the weights over the device's memory bandwidth.
      u.load_ms.push_back(with_load_time ? static_cast<double>(weights) / (std::max(d.stream_gbps, 1e-6) * 1e9) * 1e3 : 0.0);
    }
    pr.units.push_back(std::move(u));
  };

  // With every unit on device 1, device 0 holds the terminal's weights and activations.
  TESSERA_ASSIGN_OR_RETURN(const Schedule all1, estimate_with(std::vector<int>(static_cast<size_t>(U), 1)));
  const auto& term = all1.devices[0];
  double act_other = 0;
  // Pseudo layers (§III-A): the source, where the input lives, and the
  // embedding, which only the terminal can run.
  add_unit("source", 0, -1, {}, 0, input_bytes(c, rows));
  std::vector<parallel::Work> units_work;
  for (int64_t u = 0; u < U; ++u) {
    std::vector<int> map(static_cast<size_t>(U), 0);
    map[static_cast<size_t>(u)] = 1;
    TESSERA_ASSIGN_OR_RETURN(const Schedule su, estimate_with(map));
    const auto& d1 = su.devices[1];
    if (u == 0) add_unit("embedding", 0, -1, embed_work(c, rows), term.weight_bytes, sent(su.devices[0]));
    act_other = std::max(act_other, static_cast<double>(d1.activation_bytes));
    const std::string name = blocks ? (u % 2 == 0 ? "attention " : "mlp ") + std::to_string(u / 2) : "layer " + std::to_string(u);
    add_unit(name, -1, u, work_of(d1), d1.weight_bytes, sent(d1), d1.kv_bytes());
  }
  if (U == 0) add_unit("embedding", 0, -1, embed_work(c, rows), term.weight_bytes, rows * c.hidden * 4);
  add_unit("head", 0, -1, head_work(c, rows), 0, logits_bytes(c, rows));
  add_unit("destination", 0, -1, {}, 0, 0);

  const size_t N = pr.units.size();
  pr.xfer_ms.assign(N - 1, std::vector<std::vector<double>>(static_cast<size_t>(K), std::vector<double>(static_cast<size_t>(K), 0.0)));
  for (size_t l = 0; l + 1 < N; ++l)
    for (int a = 0; a < K; ++a)
      for (int b = 0; b < K; ++b) {
        if (a == b) continue;  // the output stays in memory
        parallel::Transfer t;
        t.kind = parallel::CollectiveKind::kSendRecv;
        t.bytes_sent = pr.units[l].out_bytes;
        t.peers = {b};
        pr.xfer_ms[l][static_cast<size_t>(a)][static_cast<size_t>(b)] =
            p.link(a, b).bandwidth_mbps > 0 ? transfer_ms(t, a, p) : kInf;
      }
  for (int d = 0; d < K; ++d) {
    const int64_t m = p.devices[static_cast<size_t>(d)].memory_bytes;
    const double act = d == 0 ? static_cast<double>(term.activation_bytes) : act_other;
    pr.budget.push_back(m > 0 ? static_cast<double>(m) - act : kInf);
  }
  return pr;
}

IlpCost assignment_cost(const IlpProblem& pr, const std::vector<int>& a) {
  IlpCost cost;
  TESSERA_CHECK(a.size() == pr.units.size());
  for (size_t l = 0; l < a.size(); ++l) {
    const auto d = static_cast<size_t>(a[l]);
    cost.compute_ms += pr.units[l].compute_ms[d];
    if (l == 0) continue;
    const auto prev = static_cast<size_t>(a[l - 1]);
    if (prev == d) cost.load_ms += pr.units[l].load_ms[d];  // z = 1: no idle time to pre-load in
    else cost.transfer_ms += pr.xfer_ms[l - 1][prev][d];
  }
  return cost;
}

bool assignment_feasible(const IlpProblem& pr, const std::vector<int>& a) {
  if (a.size() != pr.units.size()) return false;
  std::vector<double> used(static_cast<size_t>(pr.devices), 0.0);
  std::vector<bool> runs(static_cast<size_t>(pr.devices), false);
  for (size_t l = 0; l < a.size(); ++l) {
    if (a[l] < 0 || a[l] >= pr.devices) return false;
    if (pr.units[l].pinned >= 0 && pr.units[l].pinned != a[l]) return false;
    if (l > 0 && !std::isfinite(pr.xfer_ms[l - 1][static_cast<size_t>(a[l - 1])][static_cast<size_t>(a[l])])) return false;
    used[static_cast<size_t>(a[l])] += static_cast<double>(pr.units[l].weight_bytes);
    runs[static_cast<size_t>(a[l])] = true;
  }
  for (int d = 0; d < pr.devices; ++d)
    if (runs[static_cast<size_t>(d)] && used[static_cast<size_t>(d)] > pr.budget[static_cast<size_t>(d)]) return false;
  return true;
}

const char* ilp_status_name(IlpStatus s) {
  switch (s) {
    case IlpStatus::kOptimal: return "optimal";
    case IlpStatus::kFeasible: return "feasible (limit reached)";
    case IlpStatus::kInfeasible: return "infeasible";
    case IlpStatus::kNoSolution: return "no solution found in the limit";
  }
  return "?";
}

std::string IlpResult::summary() const {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "ILP %s: T %.3f ms (Tc %.3f + Tx %.3f + Tw %.3f), bound %.3f ms, gap %.3f%%, %.3f s, %d variables, %d constraints",
                ilp_status_name(status), objective_ms, cost.compute_ms, cost.transfer_ms, cost.load_ms, bound_ms, 100 * gap,
                solve_s, variables, constraints);
  return buf;
}

namespace {

// Every unit has a compute and a load time per device, every pin names a
// device, and there is one transfer table between consecutive units.
core::Status check_problem(const IlpProblem& pr) {
  const int D = pr.devices;
  const int L = static_cast<int>(pr.units.size());
  if (D < 1 || L < 1) return core::invalid_argument("the ILP needs a device and a unit");
  if (static_cast<int>(pr.budget.size()) != D || static_cast<int>(pr.xfer_ms.size()) != L - 1)
    return core::invalid_argument("malformed ILP problem");
  for (const auto& u : pr.units)
    if (static_cast<int>(u.compute_ms.size()) != D || static_cast<int>(u.load_ms.size()) != D || u.pinned >= D)
      return core::invalid_argument("malformed ILP unit '" + u.name + "'");
  return core::ok_status();
}

// A device whose pinned units alone exceed its budget: infeasible before
// any search (a negative budget has no memory row below).
bool pinned_units_exceed_a_budget(const IlpProblem& pr) {
  const auto D = static_cast<size_t>(pr.devices);
  std::vector<double> pinned_bytes(D, 0.0);
  std::vector<bool> has_pin(D, false);
  for (const auto& u : pr.units)
    if (u.pinned >= 0) {
      pinned_bytes[static_cast<size_t>(u.pinned)] += static_cast<double>(u.weight_bytes);
      has_pin[static_cast<size_t>(u.pinned)] = true;
    }
  for (size_t d = 0; d < D; ++d)
    if (has_pin[d] && pinned_bytes[d] > pr.budget[d]) return true;
  return false;
}

// Where each variable and constraint sits in CBC's matrix. Columns: x[l][d]
// (binary) for every unit and device, then y[l][d][d'] (continuous in
// [0, 1]) for every unit but the last. y is a flow: its rows out of (l, d)
// sum to x[l][d] and its columns into (l+1, d') to x[l+1][d'], so at
// integral x it is exactly x[l][d]·x[l+1][d'] (Eq. 6), and its diagonal
// y[l][d][d] is z[l+1][d] (Eq. 7). Rows: Eq. 4 (one per unit), flow out of
// and into each (l, d), Eq. 5 (devices with a budget).
struct Layout {
  int D = 0, L = 0;
  int ncols = 0, nrows = 0;
  std::vector<int> mem_row;  // Eq. 5's row of each device; -1: no budget

  explicit Layout(const IlpProblem& pr) : D(pr.devices), L(static_cast<int>(pr.units.size())) {
    ncols = L * D + (L - 1) * D * D;
    nrows = L + 2 * (L - 1) * D;
    mem_row.assign(static_cast<size_t>(D), -1);
    for (int d = 0; d < D; ++d)
      if (std::isfinite(pr.budget[static_cast<size_t>(d)]) && pr.budget[static_cast<size_t>(d)] >= 0)
        mem_row[static_cast<size_t>(d)] = nrows++;
  }
  int x(int l, int d) const { return l * D + d; }
  int y(int l, int d, int e) const { return L * D + (l * D + d) * D + e; }
  int row_assign(int l) const { return l; }
  int row_out(int l, int d) const { return L + l * D + d; }
  int row_in(int l, int e) const { return L + (L - 1) * D + l * D + e; }
};

// The problem in CBC's column-major form, with its bounds and objective.
struct Matrix {
  std::vector<int> start, index;
  std::vector<double> value, collb, colub, obj, rowlb, rowub;
};

// The x columns: in Eq. 4's row of their unit, the flow rows around it and
// the device's memory row (Eq. 5); priced by compute time (Eq. 8). Pins fix
// a column, and a unit larger than a device's budget cannot go there.
void add_unit_columns(const IlpProblem& pr, const Layout& lay, Matrix& mx) {
  for (int l = 0; l < lay.L; ++l)
    for (int d = 0; d < lay.D; ++d) {
      const IlpUnit& u = pr.units[static_cast<size_t>(l)];
      const int col = lay.x(l, d);
      mx.start.push_back(static_cast<int>(mx.index.size()));
      mx.index.push_back(lay.row_assign(l)), mx.value.push_back(1);
      if (l + 1 < lay.L) mx.index.push_back(lay.row_out(l, d)), mx.value.push_back(-1);
      if (l > 0) mx.index.push_back(lay.row_in(l - 1, d)), mx.value.push_back(-1);
      if (lay.mem_row[static_cast<size_t>(d)] >= 0 && u.weight_bytes > 0)
        mx.index.push_back(lay.mem_row[static_cast<size_t>(d)]), mx.value.push_back(static_cast<double>(u.weight_bytes));
      mx.obj[static_cast<size_t>(col)] = u.compute_ms[static_cast<size_t>(d)];  // Eq. 8
      const double room = pr.budget[static_cast<size_t>(d)];
      const bool cannot = room < 0 || static_cast<double>(u.weight_bytes) > room;
      if (u.pinned >= 0) mx.collb[static_cast<size_t>(col)] = mx.colub[static_cast<size_t>(col)] = u.pinned == d ? 1 : 0;
      else if (cannot) mx.colub[static_cast<size_t>(col)] = 0;
    }
}

// The y columns: priced by the transfer between two devices (Eq. 9) or, on
// the same device, by the next unit's load time (Eq. 10); no link, no flow.
void add_flow_columns(const IlpProblem& pr, const Layout& lay, Matrix& mx) {
  for (int l = 0; l + 1 < lay.L; ++l)
    for (int d = 0; d < lay.D; ++d)
      for (int e = 0; e < lay.D; ++e) {
        const int col = lay.y(l, d, e);
        mx.start.push_back(static_cast<int>(mx.index.size()));
        mx.index.push_back(lay.row_out(l, d)), mx.value.push_back(1);
        mx.index.push_back(lay.row_in(l, e)), mx.value.push_back(1);
        const double t = d == e ? pr.units[static_cast<size_t>(l + 1)].load_ms[static_cast<size_t>(d)]  // Eq. 10
                                : pr.xfer_ms[static_cast<size_t>(l)][static_cast<size_t>(d)][static_cast<size_t>(e)];  // Eq. 9
        if (std::isfinite(t)) mx.obj[static_cast<size_t>(col)] = t;
        else mx.colub[static_cast<size_t>(col)] = 0;  // no link
      }
}

Matrix build_matrix(const IlpProblem& pr, const Layout& lay) {
  Matrix mx;
  const auto ncols = static_cast<size_t>(lay.ncols), nrows = static_cast<size_t>(lay.nrows);
  mx.collb.assign(ncols, 0.0);
  mx.colub.assign(ncols, 1.0);
  mx.obj.assign(ncols, 0.0);
  mx.start.reserve(ncols + 1);
  add_unit_columns(pr, lay, mx);
  add_flow_columns(pr, lay, mx);
  mx.start.push_back(static_cast<int>(mx.index.size()));
  // Flow rows are equalities at 0; Eq. 4 with equality at 1; Eq. 5 at most the budget.
  mx.rowlb.assign(nrows, 0.0);
  mx.rowub.assign(nrows, 0.0);
  for (int l = 0; l < lay.L; ++l) mx.rowlb[static_cast<size_t>(l)] = mx.rowub[static_cast<size_t>(l)] = 1;
  for (int d = 0; d < lay.D; ++d)
    if (lay.mem_row[static_cast<size_t>(d)] >= 0) {
      mx.rowlb[static_cast<size_t>(lay.mem_row[static_cast<size_t>(d)])] = -1e30;
      mx.rowub[static_cast<size_t>(lay.mem_row[static_cast<size_t>(d)])] = pr.budget[static_cast<size_t>(d)];
    }
  return mx;
}

using CbcModel = std::unique_ptr<Cbc_Model, void (*)(Cbc_Model*)>;

CbcModel load_model(const Matrix& mx, const Layout& lay) {
  CbcModel m(Cbc_newModel(), Cbc_deleteModel);
  Cbc_loadProblem(m.get(), lay.ncols, lay.nrows, mx.start.data(), mx.index.data(), mx.value.data(), mx.collb.data(),
                  mx.colub.data(), mx.obj.data(), mx.rowlb.data(), mx.rowub.data());
  for (int l = 0; l < lay.L; ++l)
    for (int d = 0; d < lay.D; ++d) Cbc_setInteger(m.get(), lay.x(l, d));
  return m;
}

// The model as an LP file with readable names (x_l_d, y_l_d_e, assign_l,
// out_l_d, in_l_d, memory_d), for checking it by hand or with another solver.
void write_lp(Cbc_Model* m, const Layout& lay, const std::string& path) {
  const int L = lay.L, D = lay.D;
  for (int l = 0; l < L; ++l)
    for (int d = 0; d < D; ++d) {
      Cbc_setColName(m, lay.x(l, d), ("x_" + std::to_string(l) + "_" + std::to_string(d)).c_str());
      for (int e = 0; e < D && l + 1 < L; ++e)
        Cbc_setColName(m, lay.y(l, d, e), ("y_" + std::to_string(l) + "_" + std::to_string(d) + "_" + std::to_string(e)).c_str());
    }
  const auto name_row = [&](int row, const std::string& name) { Cbc_setRowName(m, row, name.c_str()); };
  for (int l = 0; l < L; ++l) {
    name_row(lay.row_assign(l), "assign_" + std::to_string(l));
    for (int d = 0; d < D && l + 1 < L; ++d) {
      name_row(lay.row_out(l, d), "out_" + std::to_string(l) + "_" + std::to_string(d));
      name_row(lay.row_in(l, d), "in_" + std::to_string(l + 1) + "_" + std::to_string(d));  // flow into (l+1, d)
    }
  }
  for (int d = 0; d < D; ++d)
    if (lay.mem_row[static_cast<size_t>(d)] >= 0) name_row(lay.mem_row[static_cast<size_t>(d)], "memory_" + std::to_string(d));
  std::string base = path;
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".lp") == 0) base.resize(base.size() - 3);
  Cbc_writeLp(m, base.c_str());  // CBC appends ".lp"
}

void set_solver_options(Cbc_Model* m, const IlpOptions& o) {
  Cbc_setLogLevel(m, 0);
  Cbc_setMaximumSeconds(m, std::max(o.time_limit_s, 0.01));
  // Proven optimal means optimal: no gap tolerance, and no cutoff increment
  // that would prune a solution better by less than it.
  Cbc_setAllowableGap(m, 0);
  Cbc_setAllowableFractionGap(m, 0);
  Cbc_setParameter(m, "increment", "0");
  Cbc_setParameter(m, "timeMode", "elapsed");  // the limit is wall-clock time
  // Without presolve and CBC's root heuristics: with Tw = 0 the LP is very
  // degenerate, and a root heuristic's LP (Clp primal, which checks no time
  // limit) ran for minutes at 16 devices; the DP's warm start is the incumbent.
  Cbc_setParameter(m, "presolve", "off");
  Cbc_setParameter(m, "heuristicsOnOff", "off");
}

// A feasible assignment (the DP's) as CBC's first incumbent: x and the
// flow y it implies.
void set_warm_start(Cbc_Model* m, const Layout& lay, const std::vector<int>& a) {
  std::vector<int> cols;
  std::vector<double> vals;
  for (int l = 0; l < lay.L; ++l)
    for (int d = 0; d < lay.D; ++d) {
      cols.push_back(lay.x(l, d));
      vals.push_back(a[static_cast<size_t>(l)] == d ? 1 : 0);
      for (int e = 0; e < lay.D && l + 1 < lay.L; ++e) {
        cols.push_back(lay.y(l, d, e));
        vals.push_back(a[static_cast<size_t>(l)] == d && a[static_cast<size_t>(l + 1)] == e ? 1 : 0);
      }
    }
  Cbc_setMIPStartI(m, static_cast<int>(cols.size()), cols.data(), vals.data());
}

void solve_one_at_a_time(Cbc_Model* m) {
  // CBC 2.10's solver driver (CbcMain1, behind Cbc_solve) keeps static
  // state: one solve at a time in this process.
  static std::mutex cbc_mutex;
  std::lock_guard<std::mutex> lock(cbc_mutex);
  Cbc_solve(m);
}

// The assignment CBC found (each unit on its largest x), priced again by
// assignment_cost, with CBC's bound and status; or why there is none.
Result<IlpResult> read_solution(Cbc_Model* m, const IlpProblem& pr, const Layout& lay) {
  IlpResult r;
  r.variables = lay.ncols;
  r.constraints = lay.nrows;
  const double* best = Cbc_bestSolution(m);
  if (best == nullptr) {
    r.status = Cbc_isProvenInfeasible(m) ? IlpStatus::kInfeasible : IlpStatus::kNoSolution;
    return r;
  }
  r.device_of_unit.assign(static_cast<size_t>(lay.L), 0);
  for (int l = 0; l < lay.L; ++l) {
    int arg = 0;
    for (int d = 1; d < lay.D; ++d)
      if (best[lay.x(l, d)] > best[lay.x(l, arg)]) arg = d;
    r.device_of_unit[static_cast<size_t>(l)] = arg;
  }
  r.cost = assignment_cost(pr, r.device_of_unit);
  r.objective_ms = r.cost.total();
  r.bound_ms = std::min(Cbc_getBestPossibleObjValue(m), r.objective_ms);
  r.gap = r.objective_ms > 0 ? std::max(0.0, (r.objective_ms - r.bound_ms) / r.objective_ms) : 0.0;
  r.status = Cbc_isProvenOptimal(m) ? IlpStatus::kOptimal : IlpStatus::kFeasible;
  if (r.status == IlpStatus::kOptimal) r.gap = 0, r.bound_ms = r.objective_ms;
  if (!assignment_feasible(pr, r.device_of_unit))
    return core::internal_error("CBC returned an assignment that breaks the constraints");
  return r;
}

}  // namespace

// The flow form of Eq. 6-7 (Layout), solved by CBC from the DP's warm start.
Result<IlpResult> solve_ilp(const IlpProblem& pr, const IlpOptions& o) {
  TESSERA_RETURN_IF_ERROR(check_problem(pr));
  const auto t0 = std::chrono::steady_clock::now();
  if (pinned_units_exceed_a_budget(pr)) {
    IlpResult r;
    r.status = IlpStatus::kInfeasible;
    return r;
  }
  const Layout lay(pr);
  const CbcModel m = load_model(build_matrix(pr, lay), lay);
  if (!o.lp_file.empty()) write_lp(m.get(), lay, o.lp_file);
  set_solver_options(m.get(), o);
  if (!o.warm_start.empty() && assignment_feasible(pr, o.warm_start)) set_warm_start(m.get(), lay, o.warm_start);
  solve_one_at_a_time(m.get());
  TESSERA_ASSIGN_OR_RETURN(IlpResult r, read_solution(m.get(), pr, lay));
  r.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

IlpResult brute_force(const IlpProblem& pr) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t L = pr.units.size();
  IlpResult r;
  r.status = IlpStatus::kInfeasible;
  std::vector<int> a(L, 0);
  double best = kInf;
  // Depth first over the free units; the cost is recomputed at the leaves
  // by assignment_cost (the reference is the model, not an increment of it).
  auto visit = [&](auto&& self, size_t l) -> void {
    if (l == L) {
      if (!assignment_feasible(pr, a)) return;
      const double t = assignment_cost(pr, a).total();
      if (t < best) best = t, r.device_of_unit = a;
      return;
    }
    const int pin = pr.units[l].pinned;
    for (int d = pin >= 0 ? pin : 0; d < (pin >= 0 ? pin + 1 : pr.devices); ++d) {
      a[l] = d;
      self(self, l + 1);
    }
  };
  visit(visit, 0);
  if (!r.device_of_unit.empty()) {
    r.status = IlpStatus::kOptimal;
    r.cost = assignment_cost(pr, r.device_of_unit);
    r.objective_ms = r.bound_ms = best;
  }
  r.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<int> model_unit_map(const IlpProblem& pr, const std::vector<int>& a) {
  std::vector<int> map;
  for (size_t l = 0; l < pr.units.size() && l < a.size(); ++l)
    if (pr.units[l].model_unit >= 0) map.push_back(a[l]);
  return map;
}

std::vector<int> chain_assignment(const IlpProblem& pr, const std::vector<int>& model_map) {
  std::vector<int> a;
  for (const auto& u : pr.units) {
    if (u.model_unit < 0) a.push_back(std::max(u.pinned, 0));
    else a.push_back(static_cast<size_t>(u.model_unit) < model_map.size() ? model_map[static_cast<size_t>(u.model_unit)] : 0);
  }
  return a;
}

}  // namespace tessera::planner
