// `tessera bench`: sweeps strategies x device counts x link speeds on local
// worker processes and writes one CSV row per combination (latency vs devices
// and latency vs bandwidth, the papers' plots). The CSV is the checkpoint: rows
// already there are kept, so an interrupted sweep resumes where it stopped.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench_util.h"
#include "cli/commands.h"
#include "comm/link.h"
#include "core/io.h"
#include "model/safetensors.h"
#include "parallel/strategy.h"
#include "cli/plan_flags.h"
#include "core/limits.h"
#include "core/stats.h"
#include "runtime/deployment.h"
#include "runtime/job.h"

extern char** environ;

namespace tessera::cli {

namespace {

struct BenchSweepFlags {
  std::string model;
  // Empty: every exact strategy of the registry that accepts the model.
  std::vector<std::string> strategies;
  std::vector<int> devices = {1, 2, 3, 4};
  std::vector<std::string> links = {"125mbit", "250mbit", "500mbit", "1gbit"};
  std::string latency;
  int64_t seq = 128;
  int reps = 5;
  int warmup = 1;
  int threads = 1;
  int cpus_per_device = 0;
  std::string out = "bench.csv";
  bool plot = false;
  bool plot_only = false;
  bool secure = false;
  bool insecure = false;
  int64_t timeout_s = 60;
  bool planner = false;  // --planner: the planner's grid (bench_planner.cpp)
  std::vector<std::string> speed_mixes = {"1,1", "1,0.5", "1,0.25"};
  std::string memory_limit;
  std::vector<std::string> full_set;
  // The strategies' own flags (--cr, --no-overlap, ...), applied to each
  // strategy that takes them; --strategies entries may add "name:key=value".
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
};

const std::vector<std::string> kColumns = {
    "model", "strategy", "devices", "threads", "cpus_per_device", "secure", "link", "bandwidth_mbit", "seq", "reps",
    "median_ms", "min_ms", "max_bytes_sent", "bytes_sent_per_rank", "compute_ms_rank0", "comm_ms_rank0",
    "compute_ms_max", "comm_ms_max", "status"};
// The columns that identify a measurement (resuming matches on them).
const std::vector<std::string> kKeyColumns = {"model", "strategy", "devices", "threads",
                                              "cpus_per_device", "secure", "link", "seq"};

using Row = std::map<std::string, std::string>;

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return q + "\"";
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> f(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      f.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      f.emplace_back();
    } else if (c != '\r') {
      f.back() += c;
    }
  }
  return f;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string csv_line(const Row& r) {
  std::vector<std::string> f;
  for (const auto& c : kColumns) f.push_back(csv_field(r.count(c) ? r.at(c) : ""));
  return join(f, ",") + "\n";
}

std::string row_key(const Row& r) {
  std::string k;
  for (const auto& c : kKeyColumns) k += (r.count(c) ? r.at(c) : "") + "\x1f";
  return k;
}

// Rows of one configuration (everything in the key but strategy, devices and
// link) belong in the same plot.
std::string config_key(const Row& r) {
  std::string k;
  for (const char* c : {"model", "threads", "cpus_per_device", "secure", "seq"}) k += (r.count(c) ? r.at(c) : "") + "\x1f";
  return k;
}

std::string fmt(double v, const char* f = "%.3f") {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

double num(const Row& r, const std::string& c) {
  auto it = r.find(c);
  if (it == r.end() || it->second.empty()) return 0.0;
  try {
    return std::stod(it->second);
  } catch (...) {
    return 0.0;
  }
}

bool is_ok(const Row& r) { return r.count("status") && r.at("status") == "ok"; }

core::Result<std::vector<Row>> read_csv(const std::string& path) {
  std::vector<Row> rows;
  if (!core::file_exists(path)) return rows;
  TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(path));
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line)) return rows;
  if (split_csv_line(line) != kColumns)
    return core::invalid_argument(path + " has other columns than `tessera bench` writes; choose another --out");
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = split_csv_line(line);
    if (f.size() != kColumns.size()) return core::parse_error(path + ": malformed row: " + line);
    Row r;
    for (size_t i = 0; i < f.size(); ++i) r[kColumns[i]] = f[i];
    rows.push_back(r);
  }
  return rows;
}

// The CSV without the rows to retry, then appended to after each run.
core::Status write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::string text = join(kColumns, ",") + "\n";
  for (const auto& r : rows) text += csv_line(r);
  const std::string tmp = path + ".tmp";
  TESSERA_RETURN_IF_ERROR(core::write_file(tmp, text));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return core::io_error("cannot replace " + path);
  return core::ok_status();
}

core::Status append_row(const std::string& path, const Row& r) {
  std::ofstream out(path, std::ios::app);
  out << csv_line(r);
  out.flush();
  if (!out) return core::io_error("cannot append to " + path);
  return core::ok_status();
}

double bandwidth_mbit(const std::string& link) {
  auto spec = comm::parse_link_spec(link);
  return spec.ok() ? spec->bandwidth_bps / 1e6 : 0.0;
}

// One combination: warm-up and timed runs in one session; the figures of the
// median run go into the row.
void measure(const BenchSweepFlags& f, const runtime::SessionOptions& base, const parallel::Plan& plan,
             const runtime::RunRequest& req, Row& row) {
  runtime::SessionOptions o = base;
  o.plan = plan;
  o.link = row["link"] == "none" ? "" : row["link"];
  auto session = runtime::Session::start(o);
  if (!session.ok()) {
    const bool impossible = session.status().code() == core::ErrorCode::kInvalidArgument;
    row["status"] = (impossible ? "skipped: " : "error: ") + session.status().message();
    return;
  }
  std::vector<double> latencies;
  std::vector<nlohmann::json> figures;
  for (int i = 0; i < f.warmup + f.reps; ++i) {
    auto r = (*session)->run(req);
    if (!r.ok()) {
      row["status"] = "error: " + r.status().to_string();
      return;
    }
    if (i < f.warmup) continue;
    latencies.push_back(r->latency_ms);
    figures.push_back((*session)->last_stats());
  }
  const double median = core::median(latencies);
  const nlohmann::json& stats = figures[core::median_index(latencies)];
  double max_bytes = 0, compute_max = 0, comm_max = 0;
  std::vector<std::string> bytes;
  for (const auto& rk : stats["ranks"]) {
    const double b = rk.value("bytes_sent", 0.0);
    bytes.push_back(fmt(b, "%.0f"));
    max_bytes = std::max(max_bytes, b);
    compute_max = std::max(compute_max, rk.value("compute_ms", 0.0));
    comm_max = std::max(comm_max, rk.value("comm_ms", 0.0));
  }
  const auto& r0 = stats["ranks"][0];
  row["median_ms"] = fmt(median);
  row["min_ms"] = fmt(*std::min_element(latencies.begin(), latencies.end()));
  row["max_bytes_sent"] = fmt(max_bytes, "%.0f");
  row["bytes_sent_per_rank"] = join(bytes, ";");
  row["compute_ms_rank0"] = fmt(r0.value("compute_ms", 0.0));
  row["comm_ms_rank0"] = fmt(r0.value("comm_ms", 0.0));
  row["compute_ms_max"] = fmt(compute_max);
  row["comm_ms_max"] = fmt(comm_max);
  row["seq"] = std::to_string(stats.value("rows", int64_t{0}));
  row["status"] = "ok";
}

// --- plots -----------------------------------------------------------------

// gnuplot single-quoted string.
std::string gq(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

struct PlotData {
  std::vector<std::string> strategies;  // in first-seen order, single excluded
  std::vector<std::string> links;       // by bandwidth, unpaced and matrix files last
  double single_ms = 0;                 // 0: no single-device row
  std::string title;
  std::vector<Row> rows;                // the successful rows of one configuration
};

// The one-device strategy's name in the CSV: drawn as the dashed reference line.
const std::string& single_name() {
  static const std::string name = parallel::single_device_plan().strategy;
  return name;
}

std::string line_style(const PlotData& d, const std::string& strategy) {
  const auto it = std::find(d.strategies.begin(), d.strategies.end(), strategy);
  return "lt " + std::to_string(it - d.strategies.begin() + 1) + " lw 2 pt 7 ps 0.8";
}

std::string single_line(const PlotData& d) {
  if (d.single_ms <= 0) return "";
  return fmt(d.single_ms) + " with lines dt 2 lw 2 lc rgb 'black' title 'single device (" + fmt(d.single_ms, "%.1f") +
         " ms)'";
}

// Lines of `x y` as a datablock and the plot clause that draws it.
void add_series(std::string& blocks, std::vector<std::string>& clauses, const std::string& name,
                std::vector<std::pair<double, double>> pts, const std::string& title, const std::string& style) {
  if (pts.empty()) return;
  std::sort(pts.begin(), pts.end());
  blocks += "$" + name + " << EOD\n";
  for (const auto& [x, y] : pts) blocks += fmt(x, "%g") + " " + fmt(y) + "\n";
  blocks += "EOD\n";
  clauses.push_back("$" + name + " using 1:2 with linespoints " + style + " title " + gq(title));
}

std::string plot_command(std::vector<std::string> clauses, const std::string& single) {
  if (!single.empty()) clauses.push_back(single);
  if (clauses.empty()) return "set label 'no successful runs' at graph 0.5,0.5 center\nplot 1/0 notitle\nunset label\n";
  return "plot " + join(clauses, ", \\\n     ") + "\n";
}

// (a) latency vs devices, one panel per link (slowest and fastest when there
// are more than four).
std::string devices_plot(const PlotData& d, std::string& blocks) {
  std::vector<std::string> links = d.links;
  if (links.size() > 4) links = {links.front(), links.back()};
  int kmin = 64, kmax = 1;
  for (const auto& r : d.rows) {
    kmin = std::min(kmin, static_cast<int>(num(r, "devices")));
    kmax = std::max(kmax, static_cast<int>(num(r, "devices")));
  }
  if (kmin > kmax) kmin = kmax;
  const size_t cols = links.size() > 1 ? 2 : 1, rows = (links.size() + cols - 1) / cols;
  std::string s = "set multiplot layout " + std::to_string(std::max<size_t>(rows, 1)) + "," + std::to_string(cols) +
                  " title " + gq("Latency vs devices - " + d.title) + "\n";
  s += "set xlabel 'devices (K)'\nset ylabel 'latency (ms, median)'\nset xtics 1\nunset logscale x\n";
  s += "set xrange [" + fmt(kmin - 0.3, "%g") + ":" + fmt(kmax + 0.3, "%g") + "]\nset yrange [0:*]\n";
  for (size_t li = 0; li < links.size(); ++li) {
    std::vector<std::string> clauses;
    for (size_t si = 0; si < d.strategies.size(); ++si) {
      std::vector<std::pair<double, double>> pts;
      for (const auto& r : d.rows)
        if (r.at("strategy") == d.strategies[si] && r.at("link") == links[li])
          pts.emplace_back(num(r, "devices"), num(r, "median_ms"));
      add_series(blocks, clauses, "dev" + std::to_string(li) + "_" + std::to_string(si), pts, d.strategies[si],
                 line_style(d, d.strategies[si]));
    }
    s += "set title " + gq("link " + links[li]) + "\n" + plot_command(clauses, single_line(d));
  }
  return s + "unset multiplot\n";
}

// (b) latency vs bandwidth at the largest device count.
std::string bandwidth_plot(const PlotData& d, std::string& blocks) {
  int kmax = 1;
  std::set<double> bws;
  for (const auto& r : d.rows) {
    if (r.at("strategy") != single_name()) kmax = std::max(kmax, static_cast<int>(num(r, "devices")));
    if (num(r, "bandwidth_mbit") > 0) bws.insert(num(r, "bandwidth_mbit"));
  }
  std::vector<std::string> clauses;
  for (size_t si = 0; si < d.strategies.size(); ++si) {
    std::vector<std::pair<double, double>> pts;
    for (const auto& r : d.rows)
      if (r.at("strategy") == d.strategies[si] && static_cast<int>(num(r, "devices")) == kmax &&
          num(r, "bandwidth_mbit") > 0)
        pts.emplace_back(num(r, "bandwidth_mbit"), num(r, "median_ms"));
    add_series(blocks, clauses, "bw" + std::to_string(si), pts, d.strategies[si], line_style(d, d.strategies[si]));
  }
  std::string s = "set title " + gq("Latency vs bandwidth, K = " + std::to_string(kmax) + " devices - " + d.title) + "\n";
  s += "set xlabel 'link bandwidth (Mbit/s)'\nset ylabel 'latency (ms, median)'\nset logscale x\nset yrange [0:*]\n";
  if (!bws.empty()) {
    std::vector<std::string> tics;
    for (double b : bws) tics.push_back("'" + fmt(b, "%g") + "' " + fmt(b, "%g"));
    s += "set xtics (" + join(tics, ", ") + ")\n";
    s += "set xrange [" + fmt(*bws.begin() / 1.3, "%g") + ":" + fmt(*bws.rbegin() * 1.3, "%g") + "]\n";
  } else {
    s += "set xrange [1:10000]\n";
  }
  return s + plot_command(clauses, single_line(d));
}

// Draws <out>-devices and <out>-bandwidth as SVG and PNG from the CSV: the
// configuration of `config` (or the CSV's last row when empty).
core::Status plot_csv(const std::string& csv, std::string config) {
  if (!core::file_exists(csv)) return core::not_found(csv + ": no such file");
  TESSERA_ASSIGN_OR_RETURN(std::vector<Row> all, read_csv(csv));
  if (all.empty()) return core::not_found(csv + " has no rows to plot");
  if (config.empty()) config = config_key(all.back());
  PlotData d;
  for (const auto& r : all) {
    if (config_key(r) != config || !is_ok(r)) continue;
    d.rows.push_back(r);
    if (r.at("strategy") == single_name()) {
      if (d.single_ms == 0) d.single_ms = num(r, "median_ms");
    } else if (std::find(d.strategies.begin(), d.strategies.end(), r.at("strategy")) == d.strategies.end()) {
      d.strategies.push_back(r.at("strategy"));
    }
    if (std::find(d.links.begin(), d.links.end(), r.at("link")) == d.links.end()) d.links.push_back(r.at("link"));
  }
  if (d.rows.empty()) return core::not_found(csv + " has no successful rows to plot");
  std::stable_sort(d.links.begin(), d.links.end(), [](const std::string& a, const std::string& b) {
    const double x = bandwidth_mbit(a), y = bandwidth_mbit(b);
    return (x > 0 ? x : 1e300) < (y > 0 ? y : 1e300);
  });
  const Row& r0 = d.rows.front();
  d.title = r0.at("model") + ", " + r0.at("seq") + " rows, " + r0.at("threads") + " thread(s)/device";

  const std::string stem = csv.size() > 4 && csv.substr(csv.size() - 4) == ".csv" ? csv.substr(0, csv.size() - 4) : csv;
  // Data first: `reset` between the outputs keeps datablocks.
  std::string blocks;
  const size_t panels = std::min<size_t>(d.links.size(), 4);
  const std::vector<std::array<std::string, 3>> plots = {
      {stem + "-devices", devices_plot(d, blocks), panels > 2 ? "1400,1000" : panels > 1 ? "1400,600" : "900,600"},
      {stem + "-bandwidth", bandwidth_plot(d, blocks), "900,600"}};
  const std::string prologue = "reset\nset encoding utf8\nset grid\nset key outside right top box\n";
  std::string script = blocks;
  for (const auto& [name, body, size] : plots) {
    script += prologue + "set terminal svg size " + size + " dynamic font 'sans,12' background 'white'\nset output " +
              gq(name + ".svg") + "\n" + body + "set output\n";
    script += prologue + "set terminal pngcairo size " + size + " font 'sans,11' background 'white'\nset output " +
              gq(name + ".png") + "\n" + body + "set output\n";
  }
  const std::string script_path = stem + "-plot.gp";
  TESSERA_RETURN_IF_ERROR(core::write_file(script_path, script));
  TESSERA_RETURN_IF_ERROR(run_gnuplot(script_path));
  std::printf("plots: %s-devices.{svg,png} %s-bandwidth.{svg,png} (script %s)\n", stem.c_str(), stem.c_str(),
              script_path.c_str());
  return core::ok_status();
}

// --- the sweep ---------------------------------------------------------------

PlannerGridFlags planner_grid_flags(const BenchSweepFlags& f) {
  PlannerGridFlags g;
  g.model = f.model;
  g.links = f.links;
  g.latency = f.latency;
  g.seq = f.seq;
  g.reps = f.reps;
  g.warmup = f.warmup;
  g.threads = f.threads;
  g.speed_mixes = f.speed_mixes;
  g.memory_limit = f.memory_limit;
  for (const auto& s : f.full_set)
    if (s != "none") g.full_set.push_back(s);
  g.out = f.out;
  g.plot = f.plot;
  g.timeout_s = f.timeout_s;
  return g;
}

// The sweep's flags checked; the links as the rows name them (--latency added to each spec).
core::Result<std::vector<std::string>> checked_links(const BenchSweepFlags& f) {
  if (f.reps < 1 || f.warmup < 0 || f.threads < 1 || f.cpus_per_device < 0 || f.timeout_s < 1 || f.timeout_s > 86400)
    return core::invalid_argument(
        "--reps, --threads-per-device and --timeout must be >= 1, --warmup and --cpus-per-device >= 0; --timeout at most 86400");
  if (f.strategies.empty() || f.devices.empty() || f.links.empty())
    return core::invalid_argument("--strategies, --devices and --link must not be empty");
  for (const auto& s : f.strategies) {
    auto p = plan_from_spec(s, *f.plan, 1);
    if (!p.ok()) return core::invalid_argument(s + ": " + p.status().message());
  }
  for (int k : f.devices)
    if (k < 1 || k > core::kMaxDevices)
      return core::invalid_argument("--devices entries must be in [1, " + std::to_string(core::kMaxDevices) + "]");
  std::vector<std::string> links;
  for (const auto& l : f.links) {
    const bool spec = l != "none" && !l.ends_with(".json") && !l.starts_with("@");  // not a matrix file
    const std::string link = spec && !f.latency.empty() ? l + "," + f.latency : l;
    if (link != "none") {
      auto m = comm::LinkMatrix::from_arg(link, 2);
      if (!m.ok()) return core::invalid_argument("--link " + link + ": " + m.status().message());
    }
    links.push_back(link);
  }
  return links;
}

// Without --strategies: every exact strategy whose plan the model accepts.
std::vector<std::string> default_strategies(const model::ModelConfig& cfg) {
  std::vector<std::string> out;
  for (const parallel::Strategy* s : parallel::strategies()) {
    if (!s->exact()) continue;
    parallel::Plan p;
    p.strategy = s->name();
    p.world = 1;
    if (parallel::complete_plan(p, cfg).ok()) out.push_back(s->name());
  }
  return out;
}

// Resuming: the rows already in the CSV, finished or skipped, by key; failed
// rows are dropped from the file so that they run again.
core::Result<std::map<std::string, Row>> resumable_rows(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::vector<Row> existing, read_csv(path));
  std::vector<Row> kept;
  for (const auto& r : existing)
    if (!r.at("status").starts_with("error")) kept.push_back(r);
  if (kept.size() != existing.size() || existing.empty()) TESSERA_RETURN_IF_ERROR(write_csv(path, kept));
  std::map<std::string, Row> done;
  for (const auto& r : kept) done[row_key(r)] = r;
  return done;
}

// One device sends nothing, so the link does not matter: a measurement of
// the same strategy at another link.
const Row* one_device_row(const std::map<std::string, Row>& done, const Row& row, const std::string& strategy, int k) {
  if (k != 1) return nullptr;
  for (const auto& [_, d] : done)
    if (is_ok(d) && d.at("strategy") == strategy && d.at("devices") == "1" && config_key(d) == config_key(row)) return &d;
  return nullptr;
}

// The plan of one combination, checked as Session::start would, its open
// choices (bp's --bp-plan auto) priced on a profile at this link.
core::Result<parallel::Plan> combination_plan(const BenchSweepFlags& f, const model::ModelConfig& cfg,
                                              const std::string& strategy, int k, const std::string& link, int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(parallel::Plan plan, plan_from_spec(strategy, *f.plan, k));
  parallel::Plan checked = plan;
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(checked, cfg));
  if (parallel::find_strategy(plan.strategy)->variants(checked).empty()) return plan;
  runtime::ClusterOptions co;
  co.model_dir = f.model;
  co.devices = k;
  co.link = link == "none" ? "" : link;
  co.threads_per_device = f.threads;
  TESSERA_ASSIGN_OR_RETURN(runtime::Cluster cluster, runtime::Cluster::open(co));
  TESSERA_ASSIGN_OR_RETURN(const planner::VariantChoice v, runtime::decide_variants(cluster, cfg, checked, rows));
  std::fprintf(stderr, "(%s: options %s) ", strategy.c_str(), v.plan.options.dump().c_str());
  return v.plan;
}

int bench(BenchSweepFlags& f) {
  if (f.planner) return bench_planner(planner_grid_flags(f));
  if (f.plot_only) {
    const auto st = plot_csv(f.out, "");
    return st.ok() ? 0 : fail(st.message());
  }
  if (f.model.empty()) return fail("--model is required (unless --plot-only)");
  auto cfg = model::load_config(f.model);
  if (!cfg.ok()) return fail(cfg.status().to_string());
  if (f.strategies.empty()) f.strategies = default_strategies(*cfg);
  auto links = checked_links(f);
  if (!links.ok()) return fail(links.status().message());
  const bool vit = cfg->takes_images();
  if (!vit && (f.seq < 1 || f.seq > cfg->max_positions))
    return fail("--seq must be in [1, " + std::to_string(cfg->max_positions) + "]");
  const int64_t rows = vit ? cfg->max_rows() : f.seq;

  auto input = bench_input(*cfg, rows, f.threads);
  if (!input.ok()) return fail(input.status().to_string());
  const runtime::RunRequest& req = input->request;
  auto resumed_rows = resumable_rows(f.out);
  if (!resumed_rows.ok()) return fail(resumed_rows.status().message());
  std::map<std::string, Row>& done = *resumed_rows;

  runtime::SessionOptions base;
  base.model_dir = f.model;
  base.threads_per_device = f.threads;
  base.insecure = !f.secure;
  base.timeout_ms = f.timeout_s * 1000;
  base.cpus_per_device = f.cpus_per_device;

  std::filesystem::path model_path = std::filesystem::path(f.model).lexically_normal();
  if (!model_path.has_filename()) model_path = model_path.parent_path();  // "models/bert/"
  const std::string model_name = model_path.filename().string();
  const core::Timer sweep_timer;
  const int total = static_cast<int>(f.strategies.size() * f.devices.size() * links->size());
  int index = 0, ran = 0, resumed = 0, skipped = 0, errors = 0, reused = 0;
  Row first;
  for (const auto& strategy : f.strategies) {
    for (int k : f.devices) {
      for (const auto& link : *links) {
        Row row = {{"model", model_name},          {"strategy", strategy},
                   {"devices", std::to_string(k)}, {"threads", std::to_string(f.threads)},
                   {"cpus_per_device", std::to_string(f.cpus_per_device)},
                   {"secure", f.secure ? "1" : "0"}, {"link", link},
                   {"bandwidth_mbit", fmt(bandwidth_mbit(link), "%g")}, {"seq", std::to_string(rows)},
                   {"reps", std::to_string(f.reps)}};
        if (first.empty()) first = row;
        std::fprintf(stderr, "[%*d/%d] %s K=%d %s ... ", total >= 10 ? 2 : 1, ++index, total, strategy.c_str(), k,
                     link.c_str());
        const std::string key = row_key(row);
        if (done.count(key)) {
          ++resumed;
          const Row& d = done[key];
          std::fprintf(stderr, "resumed: %s\n", is_ok(d) ? (d.at("median_ms") + " ms").c_str() : d.at("status").c_str());
          continue;
        }
        const Row* same = one_device_row(done, row, strategy, k);
        if (same) {
          Row copy = *same;
          copy["link"] = row["link"];
          copy["bandwidth_mbit"] = row["bandwidth_mbit"];
          row = copy;
          ++reused;
        } else if (auto plan = combination_plan(f, *cfg, strategy, k, link, rows); !plan.ok()) {
          row["status"] = "skipped: " + plan.status().message();
        } else {
          measure(f, base, *plan, req, row);
        }
        if (is_ok(row) && !same) ++ran;
        if (row["status"].starts_with("skipped")) ++skipped;
        if (row["status"].starts_with("error")) ++errors;
        std::fprintf(stderr, "%s%s\n", is_ok(row) ? (row["median_ms"] + " ms").c_str() : row["status"].c_str(),
                     same ? (" (one device: same as " + same->at("link") + ")").c_str() : "");
        const auto st = append_row(f.out, row);
        if (!st.ok()) return fail(st.to_string());
        if (!row["status"].starts_with("error")) done[key] = row;
      }
    }
  }
  std::printf("%d combinations in %.1f s: %d run, %d resumed from %s, %d reused (one device), %d skipped, %d failed\n",
              total, sweep_timer.ms() / 1000.0, ran, resumed, f.out.c_str(), reused, skipped, errors);
  if (f.plot) {
    const auto st = plot_csv(f.out, config_key(first));
    if (!st.ok()) return fail(st.message());
  }
  if (errors > 0) return fail(std::to_string(errors) + " combinations failed (status in " + f.out + "); rerun to retry them");
  return 0;
}

}  // namespace

core::Status run_gnuplot(const std::string& script_path) {
  const char* argv[] = {"gnuplot", script_path.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, const_cast<char* const*>(argv), environ);
  if (rc == ENOENT) return core::not_found("gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
  if (rc != 0) return core::internal_error("cannot start gnuplot: " + std::string(std::strerror(rc)));
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return core::internal_error("gnuplot failed on " + script_path + " (its messages are above)");
  return core::ok_status();
}

core::Result<BenchInput> bench_input(const model::ModelConfig& cfg, int64_t rows, int threads) {
  BenchInput in;
  in.request.threads = threads;
  if (cfg.takes_images()) {
    core::Tensor px = core::Tensor::zeros_f32({1, cfg.channels, cfg.image_size, cfg.image_size});
    for (int64_t i = 0; i < px.numel(); ++i) px.f32()[i] = static_cast<float>((i * 37) % 255) / 127.5f - 1.0f;
    auto path = std::make_shared<std::string>("/tmp/tessera-bench-pixels-" + std::to_string(::getpid()) + ".safetensors");
    TESSERA_RETURN_IF_ERROR(model::write_safetensors(*path, {{"pixel_values", px}}));
    in.request.pixels_path = *path;
    in.pixels_file = std::shared_ptr<void>(nullptr, [path](void*) { ::unlink(path->c_str()); });
  } else {
    for (int64_t i = 0; i < rows; ++i) in.request.ids.push_back((1000 + i) % cfg.vocab);
  }
  return in;
}

void add_bench_command(CLI::App& app) {
  auto f = std::make_shared<BenchSweepFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "sweep strategies x devices x link speeds on local worker processes; one CSV row each (resumable)");
  cmd->add_option("--model", f->model, "Hugging Face model folder (required unless --plot-only)");
  f->plan->given["--cr"] = "8";  // PRISM's default rate in a sweep
  add_plan_flags(cmd, f->plan, false);
  cmd->add_option("--strategies", f->strategies,
                  "strategies, comma-separated; NAME:key=value sets an option, NAME-no-overlap is NAME:overlap=false "
                  "(default: every exact strategy the model accepts)")
      ->delimiter(',');
  cmd->add_option("--devices", f->devices, "device counts, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--link", f->links, "link bandwidths, comma-separated (a JSON matrix file, or none: unpaced)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--latency", f->latency, "latency added to every link, e.g. 1ms");
  cmd->add_option("--seq", f->seq, "tokens of the deterministic input (ViT: the config's patches + 1)")->capture_default_str();
  cmd->add_option("--reps", f->reps, "timed runs per combination (median and min reported)")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "untimed runs first")->capture_default_str();
  cmd->add_option("--threads-per-device", f->threads, "compute threads of each device")->capture_default_str();
  cmd->add_option("--cpus-per-device", f->cpus_per_device, "pin device d to cores d*N..d*N+N-1 (0: no pinning)")
      ->capture_default_str();
  cmd->add_option("--out", f->out, "CSV file; rows already there are kept and not rerun")->capture_default_str();
  cmd->add_flag("--plot", f->plot, "draw <out>-devices and <out>-bandwidth (.svg, .png) with gnuplot after the sweep");
  cmd->add_flag("--plot-only", f->plot_only, "only draw the plots from an existing --out CSV");
  cmd->add_flag("--planner", f->planner,
                "the planner against measurement: every feasible row of the plan table per link x --device-speeds mix, "
                "predicted and measured latency and auto's choice to --out (CSV); --plot draws the scatter");
  cmd->add_option("--device-speeds", f->speed_mixes, "--planner: speed mixes, e.g. '1,1' '1,0.5' (K = entries)")
      ->capture_default_str();
  cmd->add_option("--memory-limit", f->memory_limit, "--planner: every device's budget, e.g. 1GB,512MB");
  cmd->add_option("--full-set", f->full_set,
                  "--planner: strategies also run over every device, planned and split equally, where the planner left "
                  "devices out (the heterogeneity check), e.g. galaxy,voltage; comma-separated (default: none)")
      ->delimiter(',');
  auto* secure = cmd->add_flag("--secure", f->secure, "CURVE-encrypt the links (default: off, to measure the strategies)");
  cmd->add_flag("--insecure", f->insecure, "no CURVE encryption (the default here)")->excludes(secure);
  cmd->add_option("--timeout", f->timeout_s, "seconds any network wait may take (1..86400)")->capture_default_str();
  cmd->callback([f] { throw CLI::RuntimeError(bench(*f)); });
}

}  // namespace tessera::cli
