// Worker commands: the daemon a real device runs, and the hidden local
// worker process that `tessera run --devices K` starts.
#include "cli/commands.h"
#include "runtime/daemon.h"
#include "runtime/worker.h"

namespace tessera::cli {

namespace {

void add_worker(CLI::App& app) {
  auto o = std::make_shared<runtime::DaemonOptions>();
  CLI::App* cmd = app.add_subcommand("worker", "worker daemon: waits for jobs from terminals holding the cluster key");
  cmd->add_option("--listen", o->listen, "control endpoint; data uses the next port")->capture_default_str();
  cmd->add_option("--key", o->key_file, "cluster key file (tessera keygen)");
  cmd->add_flag("--insecure", o->insecure, "no CURVE encryption or key check (benchmarks on a trusted network)");
  cmd->add_option("--jobs", o->jobs, "exit after this many jobs (0: run forever)")->capture_default_str();
  cmd->add_option("--models", o->model_roots, "folder holding the models jobs may name (repeatable)");
  cmd->callback([o] {
    const auto st = runtime::run_worker_daemon(*o);
    if (!st.ok()) throw CLI::RuntimeError(fail(st.to_string()));
  });
}

void add_worker_job(CLI::App& app) {
  auto job = std::make_shared<std::string>();
  auto key_fd = std::make_shared<int>(-1);
  auto listen_fd = std::make_shared<int>(-1);
  CLI::App* cmd = app.add_subcommand("worker-job", "a local worker process (started by `tessera run --devices K`)");
  cmd->group("");  // hidden
  cmd->add_option("--job", *job, "job JSON")->required();
  cmd->add_option("--key-fd", *key_fd, "inherited descriptor holding the cluster key");
  cmd->add_option("--listen-fd", *listen_fd, "inherited socket bound to this rank's endpoint");
  cmd->callback([job, key_fd, listen_fd] {
    auto spec = runtime::JobSpec::from_json(*job);
    if (!spec.ok()) throw CLI::RuntimeError(fail(spec.status().to_string()));
    runtime::WorkerEnv env;
    env.bind_fd = *listen_fd;
    if (*key_fd >= 0) {
      auto key = runtime::read_key_from_fd(*key_fd);
      if (!key.ok()) throw CLI::RuntimeError(fail(key.status().to_string()));
      env.key = *key;
    }
    const auto st = runtime::run_worker(*spec, env);
    if (!st.ok()) throw CLI::RuntimeError(fail("worker " + std::to_string(spec->rank) + ": " + st.to_string()));
  });
}

}  // namespace

void add_worker_commands(CLI::App& app) {
  add_worker(app);
  add_worker_job(app);
}

}  // namespace tessera::cli
