#include "cli/plan_cmd.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>

#include "cli/cluster_flags.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "core/io.h"
#include "comm/keys.h"
#include "core/json.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "parallel/strategy.h"
#include "runtime/deployment.h"

namespace tessera::cli {

namespace {

struct PlanCmd {
  runtime::ClusterOptions cluster;
  int64_t seq = 0;  // rows (0: 128, or the image's patches)
  std::string out;
  bool json = false;
  bool lossy = false;
  double max_loss = 0.01;
  std::string calibration;
  std::string wire;  // empty: f32, or with --lossy every wire
  kernels::WeightType weights = kernels::WeightType::kF32;  // --quantize
  std::string pipeline_solver = "ilp";
  std::string units = "layers";
  std::string ilp_lp;
  double ilp_time_limit = 10;
  bool load_time = true;
  int64_t generate = 0;  // > 0: plan a generation of this many tokens after the --seq prompt
  int64_t max_batch = 1;  // with generate: its steps batch this many sequences (serve --max-batch)
  int64_t ctx_size = 0;  // with generate: the caches' positions, as run/generate allocate them (0: their default)
  core::DType kv_type = core::DType::kF32;
};

void add_profile_flags(CLI::App* cmd, PlanCmd& f) {
  cmd->add_option("--model", f.cluster.model_dir, "Hugging Face model folder")->required();
  cmd->add_option("--devices", f.cluster.devices, "local devices")->capture_default_str();
  cmd->add_option("--cluster", f.cluster.cluster_file, "TOML cluster file");
  cmd->add_option("--link", f.cluster.link, "emulated links: 500mbit,1ms, with a tc-style burst 100mbit,64kb, or a JSON matrix file");
  cmd->add_option("--threads-per-device", f.cluster.threads_per_device, "compute threads of each device")->capture_default_str();
  cmd->add_option("--seq", f.seq, "rows to plan for (text models; default 128)");
  cmd->add_option("--device-speed", f.cluster.device_speed, "emulated speed of each device, e.g. 1,0.5");
  cmd->add_option("--memory-limit", f.cluster.memory_limit, "memory budget of each device, e.g. 1GB,512MB");
  cmd->add_flag("--reprofile", f.cluster.reprofile, "measure the devices again (ignore the cached profiles)");
  cmd->add_option("--key", f.cluster.key_file, "with --cluster: the key file the workers were started with");
  cmd->add_flag("--insecure", f.cluster.insecure, "with --cluster: workers started with --insecure");
}

std::string fmt_ms(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}

void print_table(const planner::PlanTable& t) {
  std::printf("%-3s %-22s %-8s %10s %10s %10s %-6s %-28s %s\n", "", "strategy", "devices", "pred ms", "compute", "comm",
              "bottl.", "memory per device", "feasible");
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const planner::Candidate& r = t.rows[i];
    std::string members, mem;
    for (int m : r.members) members += (members.empty() ? "" : ",") + std::to_string(m);
    for (const auto& d : r.prediction.devices) mem += (mem.empty() ? "" : " ") + planner::format_bytes(d.memory_bytes);
    std::string status = r.feasible ? (r.exact ? "yes" : "yes (lossy: chosen only with --lossy)") : "no: " + r.why_not;
    const bool priced = !r.prediction.devices.empty();
    std::string name = parallel::plan_name(r.plan);
    if (r.plan.weights != kernels::WeightType::kF32) name += std::string("/") + kernels::weight_type_name(r.plan.weights);
    if (r.plan.wire != core::WireType::kF32) name += std::string("/wire-") + core::wire_type_name(r.plan.wire);
    // A lossy strategy's setting (PRISM's rate) tells its rows apart.
    if (const auto* s = parallel::find_strategy(r.plan.strategy); s != nullptr && !s->exact() && r.plan.options.is_object())
      for (const auto& [k, v] : r.plan.options.items())
        if (!v.is_array() && !v.is_object()) name += " " + k + "=" + v.dump();
    std::printf("%-3s %-22s %-8s %10s %10s %10s %-6s %-28s %s\n", static_cast<int>(i) == t.chosen ? "*" : "",
                name.c_str(), members.c_str(), priced ? fmt_ms(r.prediction.latency_ms).c_str() : "-",
                priced ? fmt_ms(r.prediction.compute_ms).c_str() : "-", priced ? fmt_ms(r.prediction.comm_ms).c_str() : "-",
                priced ? std::to_string(r.members.empty() ? 0 : r.members[static_cast<size_t>(r.prediction.bottleneck)]).c_str() : "-",
                mem.c_str(), status.c_str());
    for (const std::string& note : r.notes) std::printf("      %s\n", note.c_str());
  }
  std::printf("chosen: %s\n", t.reason.c_str());
}

int plan_command(const PlanCmd& f) {
  auto c = model::load_config(f.cluster.model_dir);
  if (!c.ok()) return fail(c.status().to_string());
  if (f.weights != kernels::WeightType::kF32) c->weights = f.weights;  // every plan's weight bytes in this type
  auto cluster = runtime::Cluster::open(f.cluster);
  if (!cluster.ok()) return fail(cluster.status().to_string());
  planner::PlannerOptions o;
  o.rows = runtime::plan_rows(c.value(), f.seq);
  o.lossy_allowed = f.lossy;
  if (!f.wire.empty()) {
    auto w = core::parse_wire_type(f.wire);
    if (!w.ok()) return fail(w.status().to_string());
    o.wire = *w;
    o.wires = {*w};
    o.wire_given = *w != core::WireType::kF32;
  } else if (f.lossy) {
    o.wires = {core::WireType::kF32, core::WireType::kF16, core::WireType::kQ8};
  }
  // --lossy on an F32 model with no --quantize: quantizing at load is a choice too.
  if (f.lossy && c->weights == kernels::WeightType::kF32)
    o.weight_types = {kernels::WeightType::kF32, kernels::WeightType::kQ8_0, kernels::WeightType::kQ4_0};
  o.layer_solver = f.pipeline_solver == "dp" ? planner::PlannerOptions::LayerSolver::kDp : planner::PlannerOptions::LayerSolver::kIlp;
  o.units = f.units == "blocks" ? planner::UnitGranularity::kBlocks : planner::UnitGranularity::kLayers;
  o.ilp_lp_file = f.ilp_lp;
  o.ilp_time_limit_s = f.ilp_time_limit;
  o.ilp_load_time = f.load_time;
  if (f.lossy) {
    o.max_loss = f.max_loss;
    auto measure = cluster->loss_measure(c.value(), o.rows, f.calibration);
    if (!measure.ok()) return fail(measure.status().to_string());
    o.measure_loss = *measure;
  }
  std::optional<planner::ClusterProfile> step;
  if (f.generate > 0) {
    if (!c->causal_lm()) return fail("--generate needs a causal LM");
    // The context run/generate allocate, whose caches the first token pays
    // to zero (not the prompt plus N: GPT-2's default is 1024 positions).
    o.ctx_size = model::context_size(c.value(), f.ctx_size);
    if (o.rows + f.generate > o.ctx_size)
      return fail("--seq + --generate exceeds the context of " + std::to_string(o.ctx_size) + " positions");
    o.kv_dtype = f.kv_type;
    o.new_tokens = f.generate;
    o.decode_batch = f.max_batch;
    auto p = cluster->profile(c.value(), f.max_batch, o.weight_types);  // a decode step's shapes
    if (!p.ok()) return fail(p.status().to_string());
    step = std::move(*p);
    o.step_profile = &*step;
  }
  auto t = runtime::plan_table(*cluster, c.value(), o);
  if (!t.ok()) return fail(t.status().to_string());
  if (f.json) {
    nlohmann::json j = t.value().to_json();
    j["rows_planned"] = o.rows;
    std::cout << j.dump() << '\n';
  } else {
    std::printf("%s, %lld rows, %d device(s)\n", c.value().family.c_str(), static_cast<long long>(o.rows),
                cluster->size());
    print_table(t.value());
  }
  return 0;
}

int profile_command(const PlanCmd& f) {
  auto c = model::load_config(f.cluster.model_dir);
  if (!c.ok()) return fail(c.status().to_string());
  auto cluster = runtime::Cluster::open(f.cluster);
  if (!cluster.ok()) return fail(cluster.status().to_string());
  const int64_t rows = runtime::plan_rows(c.value(), f.seq);
  auto p = cluster->profile(c.value(), rows);
  if (!p.ok()) return fail(p.status().to_string());
  // And a decoder's step profiles, for plan --generate with this file: one
  // row, and a batched step's rows with --max-batch.
  std::vector<int64_t> step_rows;
  if (c->causal_lm()) step_rows = {1, f.max_batch};
  for (const int64_t s : step_rows) {
    if (s == rows || p.value().step(s) != nullptr) continue;  // the prompt's own profile, or already measured
    auto step = cluster->profile(c.value(), s);
    if (!step.ok()) return fail(step.status().to_string());
    p.value().steps.push_back({s, step.value().devices});
  }
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
    cmd->add_option("--max-batch", f->max_batch,
                    "a decoder's file also holds the devices measured at this many rows, for plan --generate "
                    "--max-batch with it (one row always)")
        ->check(CLI::Range(1, 32))
        ->capture_default_str();
    cmd->callback([f] { throw CLI::RuntimeError(profile_command(*f)); });
  }
  {
    auto f = std::make_shared<PlanCmd>();
    CLI::App* cmd = app.add_subcommand("plan", "predict every strategy's latency and memory; choose one");
    add_profile_flags(cmd, *f);
    cmd->add_option("--profile", f->cluster.profile_file, "profile JSON (tessera profile) instead of measuring");
    cmd->add_flag("--json", f->json, "machine-readable output");
    cmd->add_option("--generate", f->generate,
                    "plan a generation of N tokens after the prompt: only strategies that decode, each priced by "
                    "its time to the first token plus N-1 decode steps")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-batch", f->max_batch,
                    "with --generate: price each decode step as a batch of this many sequences' rows, as serve "
                    "--max-batch runs them (the step profile is measured at that many rows)")
        ->check(CLI::Range(1, 32))
        ->capture_default_str();
    add_context_flags(cmd, f->ctx_size, f->kv_type);
    CLI::Option* lossy = cmd->add_flag("--lossy", f->lossy,
                  "let the choice fall on a lossy strategy (PRISM), wire (f16, q8) or, without --quantize, weights "
                  "quantized at load (q8_0, q4_0), each only within --max-loss");
    add_max_loss_flags(cmd, lossy, f->max_loss, f->calibration);
    cmd->add_option("--wire", f->wire, "price every plan with this wire: f32, f16 or q8 (default f32; with --lossy all three)")
        ->check(CLI::IsMember({"f32", "f16", "q8"}));
    add_quantize_flag(cmd, f->weights);
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
