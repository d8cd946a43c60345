#include "cli/plan_cmd.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>

#include "cli/commands.h"
#include "core/io.h"
#include "comm/keys.h"
#include "core/json.h"
#include "model/tokenizer.h"
#include "parallel/strategy.h"
#include "runtime/cluster_profile.h"
#include "runtime/distributed.h"

namespace tessera::cli {

using core::Result;
using planner::ClusterProfile;
using planner::DeviceProfile;
using planner::LinkProfile;

namespace {

Result<std::vector<std::string>> split_list(const std::string& text, int k, const char* what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(out.size()) != k)
    return core::invalid_argument(std::string(what) + " needs " + std::to_string(k) + " values, got " + std::to_string(out.size()));
  return out;
}

}  // namespace

Result<std::vector<double>> parse_device_speeds(const std::string& text, int k) {
  TESSERA_ASSIGN_OR_RETURN(const auto v, split_list(text, k, "--device-speed"));
  std::vector<double> out;
  for (const auto& item : v) {
    try {
      size_t used = 0;
      const double s = std::stod(item, &used);
      if (used != item.size() || !(s > 0 && s <= 1)) throw std::invalid_argument("range");
      out.push_back(s);
    } catch (const std::exception&) {
      return core::invalid_argument("--device-speed: '" + item + "' is not a speed in (0, 1]");
    }
  }
  return out;
}

Result<std::vector<int64_t>> parse_memory_limits(const std::string& text, int k) {
  TESSERA_ASSIGN_OR_RETURN(const auto v, split_list(text, k, "--memory-limit"));
  std::vector<int64_t> out;
  for (const auto& x : v) {
    TESSERA_ASSIGN_OR_RETURN(const int64_t b, planner::parse_bytes(x));
    out.push_back(b);
  }
  return out;
}

int64_t plan_rows(const model::ModelConfig& c, int64_t seq) {
  if (c.family == model::Family::kVit) return c.max_rows();
  return seq > 0 ? std::min(seq, c.max_rows()) : std::min<int64_t>(128, c.max_rows());
}

Result<ClusterProfile> cluster_profile(const ProfileRequest& r, const model::ModelConfig& c) {
  std::optional<runtime::ClusterFile> cluster;
  if (!r.cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(cluster, runtime::load_cluster_file(r.cluster_file));
  }
  ClusterProfile p;
  if (!r.profile_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(p, ClusterProfile::load(r.profile_file));
  } else if (cluster) {
    // The terminal and every daemon measure themselves with the same code
    // as local devices; the links are measured through the group they form.
    runtime::ClusterProfileOptions o;
    o.cluster = *cluster;
    o.insecure = r.insecure;
    if (!r.insecure) {
      if (r.key_file.empty()) return core::invalid_argument("profiling a cluster needs --key (the workers' key file) or --insecure");
      TESSERA_ASSIGN_OR_RETURN(o.key, comm::read_key_file(r.key_file));
    }
    o.model_dir = r.model_dir;
    o.threads = r.threads;
    o.rows = plan_rows(c, r.seq);
    o.link = r.link;
    o.reprofile = r.reprofile;
    TESSERA_ASSIGN_OR_RETURN(p, runtime::profile_cluster(o, c));
  } else {
    const int K = r.devices;
    if (K < 1 || K > 64) return core::invalid_argument("--devices must be in [1, 64]");
    if (r.threads < 1) return core::invalid_argument("--threads-per-device must be >= 1");
    TESSERA_ASSIGN_OR_RETURN(DeviceProfile d, runtime::device_profile(c, plan_rows(c, r.seq), r.threads, r.reprofile));
    // Local devices share this machine's memory.
    d.memory_bytes /= K;
    p.devices.assign(static_cast<size_t>(K), d);
    TESSERA_ASSIGN_OR_RETURN(p.links, runtime::measure_local_links(K, r.link));
  }
  const int K = p.size();
  if (!r.device_speed.empty()) {
    TESSERA_ASSIGN_OR_RETURN(const auto v, parse_device_speeds(r.device_speed, K));
    for (int d = 0; d < K; ++d) p.devices[static_cast<size_t>(d)].speed = v[static_cast<size_t>(d)];
  }
  std::vector<int64_t> budgets;
  if (!r.memory_limit.empty()) {
    TESSERA_ASSIGN_OR_RETURN(budgets, parse_memory_limits(r.memory_limit, K));
  } else if (cluster) {  // the cluster file's [[worker]] memory entries
    if (1 + static_cast<int>(cluster->workers.size()) != K)
      return core::invalid_argument("the profile has " + std::to_string(K) + " devices, the cluster file " +
                                    std::to_string(1 + cluster->workers.size()));
    budgets = cluster->memory_limits();
  }
  for (size_t d = 0; d < budgets.size(); ++d)  // a device without a budget keeps what it has
    if (budgets[d] != std::numeric_limits<int64_t>::max()) p.devices[d].memory_bytes = budgets[d];
  return p;
}

Result<AutoChoice> choose_plan(const ProfileRequest& r, const model::ModelConfig& c, int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(const ClusterProfile p, cluster_profile(r, c));
  return choose_plan(p, c, rows);
}

Result<AutoChoice> choose_plan(const ClusterProfile& p, const model::ModelConfig& c, int64_t rows) {
  planner::PlannerOptions o;
  o.rows = rows;
  TESSERA_ASSIGN_OR_RETURN(const planner::PlanTable t, planner::plan_all(c, p, o));
  AutoChoice a;
  a.candidate = t.rows[static_cast<size_t>(t.chosen)];
  a.plan = a.candidate.plan;
  return a;
}

Result<planner::VariantChoice> decide_variants(const ProfileRequest& r, const model::ModelConfig& c,
                                               const parallel::Plan& plan, int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* s, parallel::strategy_for(plan.strategy));
  if (s->variants(plan).empty()) return planner::choose_variant(plan, c, {}, rows);
  TESSERA_ASSIGN_OR_RETURN(const ClusterProfile p, cluster_profile(r, c));
  return planner::choose_variant(plan, c, p, rows);
}

Result<int64_t> request_rows(const std::string& model_dir, const model::ModelConfig& c, const std::string& text, size_t ids) {
  if (c.family == model::Family::kVit) return c.max_rows();
  if (ids > 0) return static_cast<int64_t>(ids);
  if (text.empty()) return core::invalid_argument("give --text or --ids");
  TESSERA_ASSIGN_OR_RETURN(auto tok, model::load_tokenizer(model_dir));
  TESSERA_ASSIGN_OR_RETURN(const auto encoded, tok->encode(text, true));
  return static_cast<int64_t>(encoded.size());
}

namespace {

struct PlanCmd {
  ProfileRequest req;
  std::string out;
  bool json = false;
  bool lossy = false;
  std::string pipeline_solver = "ilp";
  std::string units = "layers";
  std::string ilp_lp;
  double ilp_time_limit = 10;
  bool load_time = true;
};

void add_profile_flags(CLI::App* cmd, PlanCmd& f) {
  cmd->add_option("--model", f.req.model_dir, "Hugging Face model folder")->required();
  cmd->add_option("--devices", f.req.devices, "local devices")->capture_default_str();
  cmd->add_option("--cluster", f.req.cluster_file, "TOML cluster file");
  cmd->add_option("--link", f.req.link, "emulated links: 500mbit,1ms, with a tc-style burst 100mbit,64kb, or a JSON matrix file");
  cmd->add_option("--threads-per-device", f.req.threads, "compute threads of each device")->capture_default_str();
  cmd->add_option("--seq", f.req.seq, "rows to plan for (text models; default 128)");
  cmd->add_option("--device-speed", f.req.device_speed, "emulated speed of each device, e.g. 1,0.5");
  cmd->add_option("--memory-limit", f.req.memory_limit, "memory budget of each device, e.g. 1GB,512MB");
  cmd->add_flag("--reprofile", f.req.reprofile, "measure the devices again (ignore the cached profiles)");
  cmd->add_option("--key", f.req.key_file, "with --cluster: the key file the workers were started with");
  cmd->add_flag("--insecure", f.req.insecure, "with --cluster: workers started with --insecure");
}

std::string fmt_ms(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}

void print_table(const planner::PlanTable& t) {
  std::printf("%-3s %-10s %-8s %10s %10s %10s %-6s %-28s %s\n", "", "strategy", "devices", "pred ms", "compute", "comm",
              "bottl.", "memory per device", "feasible");
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const planner::Candidate& r = t.rows[i];
    std::string members, mem;
    for (int m : r.members) members += (members.empty() ? "" : ",") + std::to_string(m);
    for (const auto& d : r.prediction.devices) mem += (mem.empty() ? "" : " ") + planner::format_bytes(d.memory_bytes);
    std::string status = r.feasible ? (r.exact ? "yes" : "yes (lossy: not chosen automatically)") : "no: " + r.why_not;
    const bool priced = !r.prediction.devices.empty();
    std::printf("%-3s %-10s %-8s %10s %10s %10s %-6s %-28s %s\n", static_cast<int>(i) == t.chosen ? "*" : "",
                r.plan.strategy.c_str(), members.c_str(), priced ? fmt_ms(r.prediction.latency_ms).c_str() : "-",
                priced ? fmt_ms(r.prediction.compute_ms).c_str() : "-", priced ? fmt_ms(r.prediction.comm_ms).c_str() : "-",
                priced ? std::to_string(r.members.empty() ? 0 : r.members[static_cast<size_t>(r.prediction.bottleneck)]).c_str() : "-",
                mem.c_str(), status.c_str());
    for (const std::string& note : r.notes) std::printf("      %s\n", note.c_str());
  }
  std::printf("chosen: %s\n", t.reason.c_str());
}

int plan_command(const PlanCmd& f) {
  auto c = model::load_config(f.req.model_dir);
  if (!c.ok()) return fail(c.status().to_string());
  const ProfileRequest& req = f.req;
  auto p = cluster_profile(req, c.value());
  if (!p.ok()) return fail(p.status().to_string());
  planner::PlannerOptions o;
  o.rows = plan_rows(c.value(), req.seq);
  o.lossy_allowed = f.lossy;
  o.layer_solver = f.pipeline_solver == "dp" ? planner::PlannerOptions::LayerSolver::kDp : planner::PlannerOptions::LayerSolver::kIlp;
  o.units = f.units == "blocks" ? planner::UnitGranularity::kBlocks : planner::UnitGranularity::kLayers;
  o.ilp_lp_file = f.ilp_lp;
  o.ilp_time_limit_s = f.ilp_time_limit;
  o.ilp_load_time = f.load_time;
  auto t = planner::plan_all(c.value(), p.value(), o);
  if (!t.ok()) return fail(t.status().to_string());
  if (f.json) {
    nlohmann::json j = t.value().to_json();
    j["rows_planned"] = o.rows;
    std::cout << j.dump() << '\n';
  } else {
    std::printf("%s, %lld rows, %d device(s)\n", model::family_name(c.value().family), static_cast<long long>(o.rows),
                p.value().size());
    print_table(t.value());
  }
  return 0;
}

int profile_command(const PlanCmd& f) {
  auto c = model::load_config(f.req.model_dir);
  if (!c.ok()) return fail(c.status().to_string());
  auto p = cluster_profile(f.req, c.value());
  if (!p.ok()) return fail(p.status().to_string());
  if (auto st = p.value().save(f.out); !st.ok()) return fail(st.to_string());
  std::printf("wrote %s (%d device(s))\n", f.out.c_str(), p.value().size());
  return 0;
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  {
    auto f = std::make_shared<PlanCmd>();
    CLI::App* cmd = app.add_subcommand("profile", "measure the devices (model kernels) and links (the transport); write JSON");
    add_profile_flags(cmd, *f);
    cmd->add_option("--out", f->out, "profile JSON to write")->required();
    cmd->callback([f] { throw CLI::RuntimeError(profile_command(*f)); });
  }
  {
    auto f = std::make_shared<PlanCmd>();
    CLI::App* cmd = app.add_subcommand("plan", "predict every strategy's latency and memory; choose one");
    add_profile_flags(cmd, *f);
    cmd->add_option("--profile", f->req.profile_file, "profile JSON (tessera profile) instead of measuring");
    cmd->add_flag("--json", f->json, "machine-readable output");
    cmd->add_flag("--lossy", f->lossy, "let the choice fall on a lossy strategy (PRISM)");
    cmd->add_option("--pipeline-solver", f->pipeline_solver, "pipeline layer placement: ilp (exact, CBC) or dp (contiguous)")
        ->check(CLI::IsMember({"ilp", "dp"}))
        ->capture_default_str();
    cmd->add_option("--units", f->units, "ILP units: layers or blocks (attention and MLP apart)")
        ->check(CLI::IsMember({"layers", "blocks"}))
        ->capture_default_str();
    cmd->add_option("--ilp-lp", f->ilp_lp, "write the pipeline ILP over every device to FILE (LP format)");
    cmd->add_option("--ilp-time-limit", f->ilp_time_limit, "seconds CBC may search")->check(CLI::PositiveNumber)->capture_default_str();
    cmd->add_flag("--load-time,!--no-load-time", f->load_time,
                  "ILP with the paper's weight-loading term Tw (on by default, see docs/planner.md)");
    cmd->callback([f] { throw CLI::RuntimeError(plan_command(*f)); });
  }
}

}  // namespace tessera::cli
