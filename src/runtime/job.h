// The job description, defined once: what a worker is asked to do, as the
// transport fields of its place in the group plus the Plan. Sent as JSON (on
// the command line for local workers, over the control channel to daemons);
// every field is validated, since it may come from another machine. The key
// is never part of a job: daemons hold their own copy, and local workers
// receive it over an inherited pipe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/keys.h"
#include "comm/link.h"
#include "core/status.h"
#include "parallel/strategy.h"

namespace tessera::runtime {

struct JobSpec {
  // Transport.
  int rank = 0;
  std::vector<std::string> endpoints;  // one per rank
  std::string group_id = "tessera";
  bool insecure = false;
  // Emulated links: a spec ("500mbit,1ms") or the matrix itself as JSON text
  // ({"bandwidth_bps": ..., "latency_ms": ...}); never a path. Empty = unpaced.
  std::string link;
  int64_t timeout_ms = 60000;
  // The terminal pings an idle worker this often; a worker that hears
  // nothing for kMissedHeartbeats intervals ends the job.
  int64_t heartbeat_ms = 1000;
  // > 0: the waits of a run end after this long (serve's failover timeout),
  // so that a worker stuck on a silent peer is free again as soon as the
  // terminal gives the run up; 0: timeout_ms.
  int64_t run_timeout_ms = 0;
  static constexpr int kMissedHeartbeats = 5;
  // Work. A local worker gets the model's folder; a daemon gets a name that
  // it looks up under the roots its operator allowed (worker --models).
  std::string model_dir;
  int threads = 1;
  // Emulated speed of this device in (0, 1] (core/device_speed.h); 1: as is.
  double device_speed = 1.0;
  parallel::Plan plan;  // plan.world == endpoints.size()

  nlohmann::json to_json() const;
  [[nodiscard]] static core::Result<JobSpec> from_json(const std::string& text);
  [[nodiscard]] static core::Result<JobSpec> from_object(const nlohmann::json& j);  // already parsed
  // The plan completed against the model's config.
  [[nodiscard]] core::Result<parallel::Plan> completed_plan(const model::ModelConfig& config) const;
};

// The group a job forms (its rank's place, the links it emulates); `key` is
// required unless the job is insecure.
[[nodiscard]] core::Result<comm::GroupOptions> group_options(const JobSpec& job, const std::optional<comm::ClusterKey>& key);
// The links a job describes, built without touching the file system.
[[nodiscard]] core::Result<comm::LinkMatrix> job_links(const std::string& link, int world);
// The terminal's --link argument as a job carries it: a spec as it is, a
// matrix file (@path or *.json) read and inlined as JSON text.
[[nodiscard]] core::Result<std::string> inline_link_arg(const std::string& arg, int world);

}  // namespace tessera::runtime
