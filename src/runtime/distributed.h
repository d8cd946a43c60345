// Distributed runs: the terminal (rank 0) and the workers (ranks 1..K-1).
// The terminal tokenizes and embeds, the ranks run the plan's layer loop,
// and the terminal applies the head. Local runs start K-1 worker processes
// on loopback; each loads only what its part of the plan needs.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>
#include <vector>

#include "comm/group.h"
#include "core/status.h"
#include "model/transformer.h"
#include "parallel/comm_sync.h"
#include "runtime/job.h"
#include "runtime/single_device.h"

namespace tessera::runtime {

// A worker's whole life: form the group, load its part, answer requests
// until the terminal says stop or is lost.
core::Status run_worker(const JobSpec& job);

struct DistributedOptions {
  std::string model_dir;
  std::string strategy = "voltage";
  int devices = 2;
  int threads_per_device = 1;
  std::string partition;  // "r1,r2,..."; empty = equal
  std::string layers;     // pipeline map "0-5:0,6-11:1"; empty = contiguous
  std::string link;       // emulated links; empty = unpaced
  bool insecure = false;
  std::string key_file;   // empty and secure: an ephemeral key for local workers
  bool adaptive_order = true;
  int timeout_ms = 60000;
};

class Session {
 public:
  // Starts the local workers, forms the group and waits until every rank has
  // loaded its weights.
  static core::Result<std::unique_ptr<Session>> start(const DistributedOptions& opts);
  ~Session();

  // One inference; latency excludes loading and process start.
  core::Result<RunResult> run(const RunRequest& req);
  // Per-rank figures of the last run (see docs): latency, compute and
  // communication time, bytes per collective kind, weight bytes.
  const nlohmann::json& last_stats() const { return stats_; }
  const model::Transformer& model() const { return *model_; }

 private:
  Session() = default;
  core::Status stop_workers();

  DistributedOptions opts_;
  JobSpec job_;
  parallel::Plan plan_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<parallel::CommSynchronizer> sync_;
  std::vector<pid_t> children_;
  std::vector<nlohmann::json> ready_;  // what each worker reported after loading
  std::string temp_key_;
  nlohmann::json stats_;
};

}  // namespace tessera::runtime
