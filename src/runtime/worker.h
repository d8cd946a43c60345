// A worker's side of a job: form the group, load its part of the plan,
// answer the terminal's requests (runtime/protocol.h) until it says stop or
// falls silent. A local worker process runs it with the job on its command
// line and the key on an inherited descriptor; a daemon runs it per job.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/keys.h"
#include "comm/stats.h"
#include "core/status.h"
#include "runtime/job.h"

namespace tessera::runtime {

// Where a worker binds and which key it uses, when that is the worker's own
// business (a daemon) rather than the job's (a local worker process).
struct WorkerEnv {
  std::string bind_endpoint;          // empty: endpoints[rank]
  std::optional<comm::ClusterKey> key;  // required unless the job is insecure
  comm::CommStats* stats = nullptr;     // set: the group's figures when the job ends
  // A daemon's: the job's model is a name under one of these roots.
  const std::vector<std::string>* model_roots = nullptr;
  // A daemon's cap on waiting for the group to form, whatever the job asks.
  comm::Millis max_connect{0};
  int bind_fd = -1;  // a socket the local launcher bound for this rank (GroupOptions::bind_fd)
};

// A worker's whole life in one job.
core::Status run_worker(const JobSpec& job, const WorkerEnv& env = {});

// A local worker process: `tessera worker-job --job JSON --key-fd N --listen-fd M`, the key
// read from the inherited descriptor N (then closed).
[[nodiscard]] core::Result<comm::ClusterKey> read_key_from_fd(int fd);

}  // namespace tessera::runtime
