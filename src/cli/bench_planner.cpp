// `tessera bench --planner`: the planner checked against measurement. For
// every grid point (link x device-speed mix) it plans (`plan_all`), runs every
// feasible row of the table on local worker processes with the emulated
// speeds and links, and writes predicted and measured latency, and which row
// `auto` chose, to CSV. Rows are measured in alternating rounds (every
// session stays loaded; round r runs each once), so a load that comes and
// goes touches all alike. Plans with an uneven partition are also run with
// the equal one, to show what heterogeneity-aware partitioning gains; where a
// strategy's best plan leaves devices out (--full-set), its partition over
// every device is run beside the equal one over every device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_util.h"
#include "cli/commands.h"
#include "core/io.h"
#include "core/stats.h"
#include "model/config.h"
#include "planner/planner.h"
#include "runtime/deployment.h"

namespace tessera::cli {

namespace {

struct Entry {
  std::string label;  // the strategy, "<strategy> equal", "<strategy> all", "<strategy> all equal"
  parallel::Plan plan;
  std::vector<int> members;
  double predicted_ms = 0;
  int64_t memory_bytes = 0;  // predicted, summed over its devices
  bool chosen = false;
  std::unique_ptr<runtime::Session> session;
  std::vector<double> latencies;
  std::string error;
};

template <typename T>
std::string list(const std::vector<T>& v) {
  std::string s;
  for (const T& x : v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(x));
    if (!s.empty()) s += ';';
    s += buf;
  }
  return s;
}

template <typename T>
std::vector<T> pick(const std::vector<T>& all, const std::vector<int>& members) {
  std::vector<T> out;
  if (all.empty()) return out;
  for (int m : members) out.push_back(all[static_cast<size_t>(m)]);
  return out;
}

std::string semicolons(std::string s) {
  std::replace(s.begin(), s.end(), ',', ';');
  return s;
}

bool uneven(const std::vector<double>& r) {
  return std::any_of(r.begin(), r.end(), [&](double x) { return std::abs(x - r.front()) > 1e-9 * std::max(1.0, x); });
}

// The plan table of one grid point, as entries to measure.
core::Result<std::vector<Entry>> entries_of(const PlannerGridFlags& f, const model::ModelConfig& cfg, int64_t rows,
                                             const std::string& link, const std::string& speeds, int K) {
  runtime::ClusterOptions co;
  co.model_dir = f.model;
  co.devices = K;
  co.link = link;
  co.threads_per_device = f.threads;
  co.device_speed = speeds;
  co.memory_limit = f.memory_limit;
  TESSERA_ASSIGN_OR_RETURN(runtime::Cluster cluster, runtime::Cluster::open(co));
  TESSERA_ASSIGN_OR_RETURN(const planner::ClusterProfile p, cluster.profile(cfg, rows));
  planner::PlannerOptions o;
  o.rows = rows;
  TESSERA_ASSIGN_OR_RETURN(const planner::PlanTable t, planner::plan_all(cfg, p, o));
  std::vector<Entry> out;
  // `plan`'s strategy and devices split equally, when that fits.
  auto add_equal_split = [&](const parallel::Plan& plan, const std::vector<int>& members, const std::string& label,
                             std::vector<Entry>& to) {
    Entry eq;
    eq.label = label;
    eq.plan.strategy = plan.strategy;
    eq.plan.world = plan.world;
    eq.members = members;
    if (!parallel::complete_plan(eq.plan, cfg).ok()) return;
    auto sched = parallel::estimate(eq.plan, cfg, rows);
    auto pred = sched.ok() ? planner::predict(*sched, p.subset(members)) : core::Result<planner::Prediction>(sched.status());
    if (!pred.ok() || !pred->fits) return;  // the equal split does not fit: nothing to compare
    eq.predicted_ms = pred->latency_ms;
    for (const auto& d : pred->devices) eq.memory_bytes += d.memory_bytes;
    to.push_back(std::move(eq));
  };
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const planner::Candidate& c = t.rows[i];
    if (!c.feasible) continue;
    Entry e;
    e.label = c.plan.strategy;
    e.plan = c.plan;
    e.members = c.members;
    e.predicted_ms = c.prediction.latency_ms;
    for (const auto& d : c.prediction.devices) e.memory_bytes += d.memory_bytes;
    e.chosen = static_cast<int>(i) == t.chosen;
    const bool even_alternative = c.members.size() > 1 && uneven(c.plan.ratios);
    out.push_back(std::move(e));
    if (even_alternative) add_equal_split(c.plan, c.members, c.plan.strategy + " equal", out);
    // The heterogeneity check where the planner left devices out: the
    // strategy's own partition over every device against the equal one.
    const bool full = std::find(f.full_set.begin(), f.full_set.end(), c.plan.strategy) != f.full_set.end();
    if (full && K > 1 && static_cast<int>(c.members.size()) < K) {
      std::vector<int> every(static_cast<size_t>(K));
      for (int d = 0; d < K; ++d) every[static_cast<size_t>(d)] = d;
      auto whole = planner::plan_strategy(*parallel::find_strategy(c.plan.strategy), cfg, p, every, o);
      if (!whole.ok() || !whole->feasible || !uneven(whole->plan.ratios)) continue;
      Entry a;
      a.label = c.plan.strategy + " all";
      a.plan = whole->plan;
      a.members = every;
      a.predicted_ms = whole->prediction.latency_ms;
      for (const auto& d : whole->prediction.devices) a.memory_bytes += d.memory_bytes;
      out.push_back(std::move(a));
      add_equal_split(whole->plan, every, c.plan.strategy + " all equal", out);
    }
  }
  return out;
}


// The devices of one grid point: every entry started (weights loaded),
// then timed in alternating rounds, so that load that comes and goes touches
// all alike; one at a time when they do not fit in memory together.
struct GridPoint {
  const PlannerGridFlags& f;
  std::string link;
  std::vector<double> speeds;
  std::vector<int64_t> limits;
  int64_t rows;
  const runtime::RunRequest& request;

  void start(Entry& e) const {
    runtime::SessionOptions o;
    o.model_dir = f.model;
    o.plan = e.plan;
    o.threads_per_device = f.threads;
    o.link = e.members.size() > 1 ? link : "";
    o.insecure = true;  // measuring the strategies, as bench does
    o.timeout_ms = f.timeout_s * 1000;
    o.device_speeds = pick(speeds, e.members);
    o.memory_limits = pick(limits, e.members);
    o.budget_rows = rows;
    auto s = runtime::Session::start(o);
    if (!s.ok()) {
      e.error = s.status().to_string();
      return;
    }
    e.session = std::move(*s);
  }

  void measure(const std::vector<Entry*>& batch) const {
    for (Entry* e : batch) start(*e);
    for (int round = 0; round < f.warmup + f.reps; ++round)
      for (Entry* e : batch) {
        if (!e->session) continue;
        auto r = e->session->run(request);
        if (!r.ok()) {
          e->error = r.status().to_string();
          e->session.reset();
          continue;
        }
        if (round >= f.warmup) e->latencies.push_back(r->latency_ms);
      }
    for (Entry* e : batch) e->session.reset();  // stops its workers
  }

  void measure_all(std::vector<Entry>& entries) const {
    int64_t total = 0;
    for (const Entry& e : entries) total += e.memory_bytes;
    std::vector<Entry*> all;
    for (Entry& e : entries) all.push_back(&e);
    if (static_cast<double>(total) <= 0.8 * static_cast<double>(core::available_memory_bytes())) {
      measure(all);
    } else {
      std::fprintf(stderr, "  (the rows need %.1f GB together: measured one at a time)\n", static_cast<double>(total) / 1e9);
      for (Entry* e : all) measure({e});
    }
  }
};

// The figures over the whole grid: prediction errors and how auto did.
struct GridTally {
  std::vector<double> errors;
  int points = 0, auto_within_5 = 0, auto_slower_than_single = 0, auto_oom = 0;
  double auto_worst = 0;

  void add(const std::vector<Entry>& entries) {
    double best = 1e300, single = 0, chosen = 0;
    bool chosen_ran = false;
    for (const Entry& e : entries) {
      const double m = e.latencies.empty() ? 0 : core::median(e.latencies);
      if (m <= 0 || e.label.find(' ') != std::string::npos) continue;  // the planner's rows only
      errors.push_back(std::abs((e.predicted_ms - m) / m));
      best = std::min(best, m);
      if (parallel::is_single_device(e.plan)) single = m;
      if (e.chosen) chosen = m, chosen_ran = true;
    }
    ++points;
    if (!chosen_ran) {
      ++auto_oom;  // auto's plan did not run
      return;
    }
    if (chosen <= 1.05 * best) ++auto_within_5;
    auto_worst = std::max(auto_worst, chosen / best);
    if (single > 0 && chosen > 1.05 * single) ++auto_slower_than_single;
  }

  void print() {
    const double med = errors.empty() ? 0 : core::median(errors);
    std::sort(errors.begin(), errors.end());
    const double p90 = errors.empty() ? 0 : errors[static_cast<size_t>(0.9 * static_cast<double>(errors.size() - 1) + 0.5)];
    std::printf(
        "%d grid points, %zu measured plans: |predicted - measured| / measured median %.1f%%, p90 %.1f%%; auto within 5%% "
        "of the best measured at %d of %d points, at worst %.2fx; auto more than 5%% slower than one device: %d; auto's "
        "plan failed to run: %d\n",
        points, errors.size(), 100 * med, 100 * p90, auto_within_5, points, auto_worst, auto_slower_than_single, auto_oom);
  }
};

// One CSV row and one line on stderr per entry; lists inside a field are
// ';'-separated, so the file needs no quoting.
void write_entries(std::ofstream& csv, const std::string& model_name, const std::string& bw, const std::string& mix,
                   const PlannerGridFlags& f, const std::vector<Entry>& entries) {
  for (const Entry& e : entries) {
    const double m = e.latencies.empty() ? 0 : core::median(e.latencies);
    const double err = m > 0 ? (e.predicted_ms - m) / m : 0;
    csv << model_name << ',' << bw << ',' << semicolons(mix) << ',' << semicolons(f.memory_limit) << ',' << e.label << ','
        << e.plan.strategy << ',' << list(e.members) << ',' << list(e.plan.ratios) << ',' << e.predicted_ms << ',' << m << ','
        << (e.latencies.empty() ? 0 : *std::min_element(e.latencies.begin(), e.latencies.end())) << ','
        << (e.chosen ? 1 : 0) << ',' << err << '\n';
    std::fprintf(stderr, "  %-16s members %-6s predicted %8.2f ms measured %8.2f ms%s%s\n", e.label.c_str(),
                 list(e.members).c_str(), e.predicted_ms, m, e.chosen ? "  <- auto" : "",
                 e.error.empty() ? "" : ("  " + e.error).c_str());
  }
  csv.flush();
}

core::Status plot_scatter(const PlannerGridFlags& f, const std::string& model_name) {
  const std::string script = f.out + ".gp";
  std::ofstream gp(script);
  gp << "set datafile separator ','\nset key off\nset logscale xy\n"
     << "set xlabel 'measured ms'\nset ylabel 'predicted ms'\nset title 'tessera bench --planner: " << model_name
     << "'\nset terminal svg size 640,640\nset output '" << f.out << "-scatter.svg'\n"
     << "plot '" << f.out << "' every ::1 using 10:9 with points pt 7, x with lines dt 2\n"
     << "set terminal pngcairo size 640,640\nset output '" << f.out << "-scatter.png'\nreplot\n";
  gp.close();
  return run_gnuplot(script);
}

}  // namespace

int bench_planner(const PlannerGridFlags& f) {
  if (f.model.empty()) return fail("--model is required");
  if (f.reps < 1 || f.warmup < 0 || f.threads < 1) return fail("--reps and --threads-per-device must be >= 1, --warmup >= 0");
  if (f.links.empty() || f.speed_mixes.empty()) return fail("--link and --device-speeds must not be empty");
  auto cfg = model::load_config(f.model);
  if (!cfg.ok()) return fail(cfg.status().to_string());
  const int64_t rows = runtime::plan_rows(*cfg, f.seq);
  auto input = bench_input(*cfg, rows, f.threads);
  if (!input.ok()) return fail(input.status().to_string());
  std::filesystem::path mp = std::filesystem::path(f.model).lexically_normal();
  if (!mp.has_filename()) mp = mp.parent_path();  // "models/bert/"
  const std::string model_name = mp.filename().string();
  std::ofstream csv(f.out);
  if (!csv) return fail("cannot write " + f.out);
  csv << "model,link,speeds,memory_limit,label,strategy,members,ratios,predicted_ms,measured_ms,min_ms,chosen,error_rel\n";
  GridTally tally;
  for (const std::string& bw : f.links) {
    const std::string link = f.latency.empty() ? bw : bw + "," + f.latency;
    for (const std::string& mix : f.speed_mixes) {
      const int K = static_cast<int>(std::count(mix.begin(), mix.end(), ',')) + 1;
      auto speeds = runtime::parse_device_speeds(mix, K);
      if (!speeds.ok()) return fail(speeds.status().to_string());
      std::vector<int64_t> limits;
      if (!f.memory_limit.empty()) {
        auto l = runtime::parse_memory_limits(f.memory_limit, K);
        if (!l.ok()) return fail(l.status().to_string());
        limits = *l;
      }
      auto entries = entries_of(f, *cfg, rows, link, mix, K);
      if (!entries.ok()) return fail(link + " " + mix + ": " + entries.status().to_string());
      std::fprintf(stderr, "%s speeds %s: %zu plans\n", link.c_str(), mix.c_str(), entries->size());
      const GridPoint point{f, link, *speeds, limits, rows, input->request};
      point.measure_all(*entries);
      write_entries(csv, model_name, bw, mix, f, *entries);
      tally.add(*entries);
    }
  }
  tally.print();
  if (f.plot) {
    const auto st = plot_scatter(f, model_name);
    if (!st.ok()) return fail(st.message());
  }
  return 0;
}

}  // namespace tessera::cli
