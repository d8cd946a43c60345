// What a worker process is asked to do: its place in the group and the plan.
// Sent as JSON (on the command line for local workers); every field is
// validated, since it may come from another machine.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/strategy.h"

namespace tessera::runtime {

struct JobSpec {
  int rank = 0;
  std::vector<std::string> endpoints;  // one per rank
  std::string group_id = "tessera";
  bool insecure = false;
  std::string key_file;  // cluster key (CURVE) unless insecure
  std::string link;      // "500mbit,1ms" or a matrix file; empty = unpaced
  std::string model_dir;
  std::string strategy = "single";
  std::vector<double> ratios;
  std::vector<double> ffn_ratios;  // tp, galaxy: FFN columns; empty = as ratios
  std::vector<int> layer_map;  // device of each layer (pipeline)
  bool adaptive_order = true;
  double prism_rate = 0.0;     // PRISM compression rate R (0 = unset)
  int64_t prism_segments = 0;  // PRISM segment means per partition L (0 = unset)
  bool overlap = true;          // galaxy, voltage: ring tiles overlap the GEMMs
  int threads = 1;
  int64_t timeout_ms = 60000;

  nlohmann::json to_json() const;
  static core::Result<JobSpec> from_json(const std::string& text);
  // The plan this job describes, completed against the model's config.
  core::Result<parallel::Plan> plan(const model::ModelConfig& config) const;
};

}  // namespace tessera::runtime
