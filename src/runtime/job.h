// The job description, defined once: what a worker is asked to do, as the
// transport fields of its place in the group plus the Plan. Sent as JSON (on
// the command line for local workers, over the control channel to daemons);
// every field is validated, since it may come from another machine. The key
// is never part of a job: daemons hold their own copy, and local workers
// receive it over an inherited pipe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/strategy.h"

namespace tessera::runtime {

struct JobSpec {
  // Transport.
  int rank = 0;
  std::vector<std::string> endpoints;  // one per rank
  std::string group_id = "tessera";
  bool insecure = false;
  std::string link;  // "500mbit,1ms" or a matrix file; empty = unpaced
  int64_t timeout_ms = 60000;
  // Work.
  std::string model_dir;
  int threads = 1;
  parallel::Plan plan;  // plan.world == endpoints.size()

  nlohmann::json to_json() const;
  [[nodiscard]] static core::Result<JobSpec> from_json(const std::string& text);
  // The plan completed against the model's config.
  [[nodiscard]] core::Result<parallel::Plan> completed_plan(const model::ModelConfig& config) const;
};

}  // namespace tessera::runtime
