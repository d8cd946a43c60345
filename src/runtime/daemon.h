// `tessera worker`: a daemon on a device. It listens for control requests
// (runtime/protocol.h: pings, profile requests, jobs) on `listen`; for a job
// it binds its data endpoint on the port after the listen port and runs it
// (runtime/worker.h). Only terminals holding the cluster key can reach it
// (unless insecure), and nothing a peer sends ends the daemon.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/job.h"

namespace tessera::runtime {

struct DaemonOptions {
  std::string listen = "tcp://0.0.0.0:7070";
  std::string key_file;
  bool insecure = false;
  int jobs = 0;  // stop after this many jobs (0: never)
  std::vector<std::string> model_roots;  // --models: where job models are looked up
};
core::Status run_worker_daemon(const DaemonOptions& opts);

// What a daemon checks before it accepts a job: a worker rank, a model under
// its roots whose config completes the plan, and links that parse.
[[nodiscard]] core::Status check_daemon_job(const JobSpec& job, const std::vector<std::string>& roots);
// The folder of model `name` under one of `roots`: relative names only, no
// "..", and no symbolic link out of the root.
[[nodiscard]] core::Result<std::string> resolve_model(const std::string& name, const std::vector<std::string>& roots);

}  // namespace tessera::runtime
