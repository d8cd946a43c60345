// `tessera serve`: flags -> runtime::ServeOptions; the server is runtime/serve.
#include <cstdio>

#include "cli/commands.h"
#include "cli/plan_cmd.h"
#include "cli/plan_flags.h"
#include "core/io.h"
#include "runtime/serve.h"

namespace tessera::cli {

namespace {

struct ServeFlags {
  runtime::ServeOptions serve;
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
  std::string api_key_file, memory_limit, profile;
  int64_t timeout_s = 60;
  double deadline_s = 120;
};

int serve_command(ServeFlags& f) {
  runtime::ServeOptions& o = f.serve;
  runtime::DistributedOptions& d = o.dist;
  if (f.timeout_s < 1 || f.timeout_s > 86400) return fail("--timeout must be between 1 and 86400 seconds");
  if (!(f.deadline_s >= 0.001 && f.deadline_s <= 86400)) return fail("--deadline must be between 0.001 and 86400 seconds");
  d.timeout_ms = f.timeout_s * 1000;
  o.deadline_ms = static_cast<int64_t>(f.deadline_s * 1000);
  if (!f.api_key_file.empty()) {
    auto key = core::read_file(f.api_key_file);
    if (!key.ok()) return fail(key.status().to_string());
    o.api_key = *key;
    while (!o.api_key.empty() && std::isspace(static_cast<unsigned char>(o.api_key.back()))) o.api_key.pop_back();
    if (o.api_key.empty()) return fail("--api-key: '" + f.api_key_file + "' is empty");
  }
  int world = f.plan->devices;
  if (!d.cluster_file.empty()) {
    auto cluster = runtime::load_cluster_file(d.cluster_file);
    if (!cluster.ok()) return fail(cluster.status().to_string());
    world = 1 + static_cast<int>(cluster->workers.size());
    d.memory_limits = cluster->memory_limits();  // [[worker]] memory = ...; --memory-limit overrides
  }
  if (!f.memory_limit.empty()) {
    auto limits = parse_memory_limits(f.memory_limit, world);
    if (!limits.ok()) return fail(limits.status().to_string());
    d.memory_limits = *limits;
  }
  auto config = model::load_config(d.model_dir);
  if (!config.ok()) return fail(config.status().to_string());
  d.plan.world = world;
  // After a failover: the planner over the devices left under --strategy
  // auto (links measured on loopback with --link: the daemons' own links are
  // measured only for the full cluster), else the same strategy over fewer.
  // The whole cluster's profile is measured once (through the daemons), at
  // the first start, while they are idle; re-admissions reuse it.
  auto cluster_profile_memo = std::make_shared<std::optional<planner::ClusterProfile>>();
  o.plan_for = [&f, world, c = *config, cluster_profile_memo](int k) -> core::Result<runtime::PlanChoice> {
    const auto& dist = f.serve.dist;
    if (f.plan->strategy == "auto") {
      const ProfileRequest pr{dist.model_dir, k, k == world ? dist.cluster_file : "", dist.link, dist.threads_per_device,
                              0, "", k == world ? f.memory_limit : "", f.profile, false, dist.key_file, dist.insecure};
      if (k == world && !cluster_profile_memo->has_value()) {
        TESSERA_ASSIGN_OR_RETURN(*cluster_profile_memo, cluster_profile(pr, c));
      }
      TESSERA_ASSIGN_OR_RETURN(AutoChoice a, k == world ? choose_plan(**cluster_profile_memo, c, plan_rows(c, 0))
                                                        : choose_plan(pr, c, plan_rows(c, 0)));
      return runtime::PlanChoice{a.plan, a.candidate.members};
    }
    TESSERA_ASSIGN_OR_RETURN(parallel::Plan p, build_plan(*f.plan, f.plan->strategy, k, true));
    return runtime::PlanChoice{p, {}};
  };
  o.on_listening = [](const std::string& host, int port) {
    std::printf("listening on http://%s:%d\n", host.c_str(), port);
    std::fflush(stdout);
  };
  const auto st = runtime::serve(o);
  if (!st.ok()) return fail(st.to_string());
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  f->plan->strategy = "auto";
  CLI::App* cmd = app.add_subcommand("serve", "serve one model over an OpenAI-compatible HTTP API (see docs/serving.md)");
  cmd->add_option("--model", f->serve.dist.model_dir, "Hugging Face model folder")->required();
  add_plan_flags(cmd, f->plan);
  cmd->add_option("--cluster", f->serve.dist.cluster_file, "TOML file: terminal endpoint and worker daemons");
  cmd->add_option("--key", f->serve.dist.key_file, "cluster key file (tessera keygen); default: an ephemeral key");
  cmd->add_flag("--insecure", f->serve.dist.insecure, "no CURVE encryption between devices (benchmarks)");
  cmd->add_option("--link", f->serve.dist.link, "emulated links: 500mbit,1ms, with a tc-style burst 100mbit,64kb, or a JSON matrix file");
  cmd->add_option("--threads-per-device", f->serve.dist.threads_per_device, "compute threads of each device")->capture_default_str();
  cmd->add_option("--memory-limit", f->memory_limit, "memory budget of each device, e.g. 1GB,512MB");
  cmd->add_option("--profile", f->profile, "--strategy auto: profile JSON (tessera profile) instead of measuring");
  cmd->add_option("--host", f->serve.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", f->serve.port, "port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--api-key", f->api_key_file, "file holding the key clients must send as 'Authorization: Bearer KEY'");
  cmd->add_option("--queue", f->serve.queue, "requests admitted at once (running or waiting); more get 429")->capture_default_str();
  cmd->add_option("--max-body", f->serve.max_body_bytes, "largest request body in bytes (413 beyond)")->capture_default_str();
  cmd->add_option("--deadline", f->deadline_s, "seconds a request may take, queueing included")->capture_default_str();
  cmd->add_option("--failover-timeout", f->serve.failover_ms, "ms a device may stay silent during a run before it is dropped")
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "seconds loading and forming the group may take")->capture_default_str();
  cmd->callback([f] { throw CLI::RuntimeError(serve_command(*f)); });
}

}  // namespace tessera::cli
