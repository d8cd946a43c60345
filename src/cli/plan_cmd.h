// `tessera profile` and `tessera plan`, and the planning `run --strategy
// auto` does: device profiles measured with the model's kernels (cached),
// link profiles measured through the real transport (ZeroMQ over loopback
// with the emulated links), priced by the planner.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "planner/variants.h"

namespace tessera::cli {

struct ProfileRequest {
  std::string model_dir;
  int devices = 1;
  std::string cluster_file;
  std::string link;          // emulated links, as for run
  int threads = 1;           // compute threads of each device
  int64_t seq = 0;           // rows (0: 128, or the image's patches)
  std::string device_speed;  // "1,0.5": emulated speeds
  std::string memory_limit;  // "1GB,512MB": budgets
  std::string profile_file;  // given: read instead of measuring
  bool reprofile = false;    // ignore the cached device profile
  std::string key_file;      // with a cluster file: the workers' key
  bool insecure = false;     // with a cluster file: workers without a key
};

// The rows a plan is made for: --seq, or a ViT's patches + CLS.
int64_t plan_rows(const model::ModelConfig& c, int64_t seq);
// The cluster's profile: read from the file, or measured (each device's
// kernels, cached; local devices are this machine, a cluster file's workers
// measure themselves through their daemons; links through the transport),
// with --device-speed and --memory-limit applied.
[[nodiscard]] core::Result<planner::ClusterProfile> cluster_profile(const ProfileRequest& r, const model::ModelConfig& c);

// What `run --strategy auto` runs: the chosen row of the plan table for
// `rows` rows. Local devices are alike, so a chosen subset of m devices runs
// on the first m.
struct AutoChoice {
  parallel::Plan plan;
  planner::Candidate candidate;
};
[[nodiscard]] core::Result<AutoChoice> choose_plan(const ProfileRequest& r, const model::ModelConfig& c, int64_t rows);
// The same on a profile already measured.
[[nodiscard]] core::Result<AutoChoice> choose_plan(const planner::ClusterProfile& p, const model::ModelConfig& c, int64_t rows);
// The rows of a request: its ids, its text's tokens, or a ViT's patches + CLS.
[[nodiscard]] core::Result<int64_t> request_rows(const std::string& model_dir, const model::ModelConfig& c,
                                                 const std::string& text, size_t ids);

// "1,0.5" for k devices -> speeds in (0, 1].
[[nodiscard]] core::Result<std::vector<double>> parse_device_speeds(const std::string& text, int k);
// A plan's open choices (Strategy::variants: bp's --bp-plan auto) decided on
// the cluster's profile; the plan as it is (completed) when it has none.
[[nodiscard]] core::Result<planner::VariantChoice> decide_variants(const ProfileRequest& r, const model::ModelConfig& c,
                                                                  const parallel::Plan& plan, int64_t rows);

// "1GB,512MB" for k devices -> bytes.
[[nodiscard]] core::Result<std::vector<int64_t>> parse_memory_limits(const std::string& text, int k);

void add_plan_commands(CLI::App& app);  // profile, plan

}  // namespace tessera::cli
