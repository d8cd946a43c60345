// `tessera serve`: flags -> runtime::ServeOptions; the server is runtime/serve.
#include <cstdio>

#include "cli/cluster_flags.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "core/io.h"
#include "runtime/serve.h"

namespace tessera::cli {

namespace {

struct ServeFlags {
  runtime::ServeOptions serve;
  runtime::ClusterOptions cluster;
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
  std::string api_key_file;
  int64_t timeout_s = 60;
  double deadline_s = 120;
};

int serve_command(ServeFlags& f) {
  runtime::ServeOptions& o = f.serve;
  if (f.timeout_s < 1 || f.timeout_s > 86400) return fail("--timeout must be between 1 and 86400 seconds");
  if (!(f.deadline_s >= 0.001 && f.deadline_s <= 86400)) return fail("--deadline must be between 0.001 and 86400 seconds");
  f.cluster.timeout_ms = f.timeout_s * 1000;
  f.cluster.devices = f.plan->devices;
  auto cluster = runtime::Cluster::open(f.cluster);
  if (!cluster.ok()) return fail(cluster.status().to_string());
  o.cluster = *cluster;
  o.deadline_ms = static_cast<int64_t>(f.deadline_s * 1000);
  if (!f.api_key_file.empty()) {
    auto key = core::read_file(f.api_key_file);
    if (!key.ok()) return fail(key.status().to_string());
    o.api_key = *key;
    while (!o.api_key.empty() && std::isspace(static_cast<unsigned char>(o.api_key.back()))) o.api_key.pop_back();
    if (o.api_key.empty()) return fail("--api-key: '" + f.api_key_file + "' is empty");
  }
  if (f.plan->strategy == "auto") {
    auto plan = auto_plan(*f.plan);
    if (!plan.ok()) return fail(plan.status().to_string());
    o.plan = *plan;
    o.lossy = f.plan->lossy;
    o.max_loss = f.plan->max_loss;
    o.calibration = f.plan->calibration;
  } else {
    // The strategy and its options over every device; after a failover the
    // deployment runs it over the devices left.
    auto plan = build_plan(*f.plan, f.plan->strategy, o.cluster.size(), true);
    if (!plan.ok()) return fail(plan.status().to_string());
    o.plan = *plan;
  }
  const auto st = runtime::serve(o);
  if (!st.ok()) return fail(st.to_string());
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  f->plan->strategy = "auto";
  CLI::App* cmd = app.add_subcommand("serve", "serve one model over an OpenAI-compatible HTTP API (see docs/serving.md)");
  cmd->add_option("--model", f->cluster.model_dir, "Hugging Face model folder")->required();
  add_plan_flags(cmd, f->plan);
  add_lossy_flag(cmd, f->plan);
  cmd->add_option("--cluster", f->cluster.cluster_file, "TOML file: terminal endpoint and worker daemons");
  cmd->add_option("--key", f->cluster.key_file, "cluster key file (tessera keygen); default: an ephemeral key");
  cmd->add_flag("--insecure", f->cluster.insecure, "no CURVE encryption between devices (benchmarks)");
  cmd->add_option("--link", f->cluster.link, "emulated links: 500mbit,1ms, with a tc-style burst 100mbit,64kb, or a JSON matrix file");
  cmd->add_option("--threads-per-device", f->cluster.threads_per_device, "compute threads of each device")->capture_default_str();
  cmd->add_option("--memory-limit", f->cluster.memory_limit, "memory budget of each device, e.g. 1GB,512MB");
  cmd->add_option("--device-order", f->cluster.device_order,
                  "the order in which the devices take ranks, the terminal first, e.g. 0,2,1 (default: 0,1,..)");
  cmd->add_option("--profile", f->cluster.profile_file, "--strategy auto: profile JSON (tessera profile) instead of measuring");
  cmd->add_option("--host", f->serve.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", f->serve.port, "port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--api-key", f->api_key_file, "file holding the key clients must send as 'Authorization: Bearer KEY'");
  cmd->add_option("--queue", f->serve.queue, "requests admitted at once (running or waiting); more get 429")->capture_default_str();
  cmd->add_option("--max-connections", f->serve.max_connections,
                  "HTTP connections served at once, each on its own thread (idle or slow clients hold only theirs); more wait")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--max-body", f->serve.max_body_bytes, "largest request body in bytes (413 beyond)")->capture_default_str();
  cmd->add_option("--deadline", f->deadline_s, "seconds a request may take, queueing included")->capture_default_str();
  cmd->add_option("--failover-timeout", f->serve.failover_ms, "ms a device may stay silent during a run before it is dropped")
      ->capture_default_str();
  cmd->add_option("--timeout", f->timeout_s, "seconds loading and forming the group may take")->capture_default_str();
  add_context_flags(cmd, f->serve.ctx_size, f->serve.kv_dtype);
  cmd->add_option("--prefix-cache-mb", f->serve.prefix_cache_mb,
                  "keep the KV caches of recent generations (LRU, as many as this many MB hold on the busiest device, at "
                  "most 8): a prompt that starts with one's tokens (a chat's history) prefills only the rest; 0: off")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--max-batch", f->serve.max_batch,
                  "continuous batching: up to this many generations run at once, one batched decode step for all of "
                  "them (new ones join between steps); each keeps a KV cache of the whole context on every device; "
                  "1: one request at a time")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", f->serve.prefill_chunk,
                  "with --max-batch > 1: a longer prompt is prefilled in chunks of this many tokens, the other "
                  "streams' decode steps running between two (a long prompt no longer stalls them); 0: whole")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  add_quantize_flag(cmd, f->serve.weights);
  cmd->callback([f] { throw CLI::RuntimeError(serve_command(*f)); });
}

}  // namespace tessera::cli
