// What `tessera bench` and `bench --planner` share: the deterministic input
// of a benchmark, gnuplot, and the planner grid's flags.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "runtime/single_device.h"

namespace tessera::cli {

// Ids 1000+i (mod vocab) for `rows` tokens, or for ViT a fixed pixel pattern
// in a temporary file that lives as long as the input.
struct BenchInput {
  runtime::RunRequest request;
  std::shared_ptr<void> pixels_file;  // removes the file when the last copy goes
};
[[nodiscard]] core::Result<BenchInput> bench_input(const model::ModelConfig& cfg, int64_t rows, int threads);

// Runs gnuplot on a script file; a missing gnuplot is one clear error.
[[nodiscard]] core::Status run_gnuplot(const std::string& script_path);

struct PlannerGridFlags {
  std::string model;
  std::vector<std::string> links;        // bandwidths: "125mbit", ...
  std::string latency;                   // added to every link
  int64_t seq = 128;
  int reps = 5;
  int warmup = 1;
  int threads = 1;
  std::vector<std::string> speed_mixes;  // "1,1", "1,0.5": one grid axis; K = entries
  std::string memory_limit;              // budgets for every point ("1GB,512MB")
  // Strategies also measured over every device, as planned and split
  // equally, where their best plan leaves devices out.
  std::vector<std::string> full_set;
  std::string out = "planner.csv";
  bool plot = false;
  int64_t timeout_s = 60;
};
int bench_planner(const PlannerGridFlags& f);

}  // namespace tessera::cli
