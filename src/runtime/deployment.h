// Where a request runs, decided in one place. A Cluster is the devices a
// terminal can reach: local worker processes, or the daemons of a cluster
// file (parsed here and nowhere else), with their memory budgets, emulated
// speeds, links and which of them are still up. deploy() turns (cluster,
// request, devices) into a Deployment: the plan (the user's, or the
// planner's choice on the devices' profile), the devices it runs on in rank
// order, and the options to start a Session over them. `run`, `generate`,
// `plan`, `profile`, `bench`, and `serve` at start-up and after a failover
// all go through here; the CLI only parses flags and prints.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/keys.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "planner/planner.h"
#include "planner/profile.h"
#include "planner/variants.h"
#include "runtime/cluster_file.h"
#include "runtime/fidelity.h"
#include "runtime/session.h"

namespace tessera::runtime {

// What the user says about the devices (flags or a server's options).
struct ClusterOptions {
  std::string model_dir;      // the model the devices are profiled and deployed for
  int devices = 1;            // without a cluster file: the terminal and devices-1 local worker processes
  std::string cluster_file;   // set: the terminal and the worker daemons the file names
  std::string memory_limit;   // "1GB,512MB", one per device; overrides the file's budgets
  std::string device_speed;   // "1,0.5": emulated speeds in (0, 1] (core/device_speed.h)
  // "0,2,1": the order in which the devices take ranks (the terminal first;
  // a pair decodes on the first ranks). Empty: 0, 1, .., K-1.
  std::string device_order;
  std::string link;           // emulated links: a spec or a JSON matrix file
  int threads_per_device = 1;
  std::string key_file;       // the daemons' key; empty and local: an ephemeral key
  bool insecure = false;
  std::string profile_file;   // set: the devices' profile is read from it, not measured (without a cluster file it names the devices)
  bool reprofile = false;     // measure the devices again (ignore the cached profiles)
  int64_t timeout_ms = 60000;  // loading and forming a group
  int cpus_per_device = 0;     // > 0: device d pinned to cores d*N..d*N+N-1 (local devices)
};

// A device of the cluster: 0 is the terminal.
struct Device {
  std::string name;      // "terminal", "local-2", or the daemon's endpoint
  std::string endpoint;  // daemons: the control endpoint; empty otherwise
  bool active = true;    // false: dropped after a failure, until it answers again
};

class Cluster {
 public:
  // Parses the cluster file (if any), the budgets and the speeds, and reads
  // the key file when one is given.
  [[nodiscard]] static core::Result<Cluster> open(const ClusterOptions& o);

  int size() const { return static_cast<int>(devices_.size()); }
  const ClusterOptions& options() const { return opts_; }
  bool has_daemons() const { return file_.has_value(); }
  const std::optional<ClusterFile>& file() const { return file_; }
  const std::optional<comm::ClusterKey>& key() const { return key_; }
  // Per device, the terminal first; empty: none given.
  const std::vector<int64_t>& memory_limits() const { return memory_limits_; }
  const std::vector<double>& speeds() const { return speeds_; }

  // Membership: devices dropped after a failure and re-admitted when they answer.
  const std::vector<Device>& devices() const { return devices_; }
  // The devices that are up, in --device-order (by default by index).
  std::vector<int> active() const;
  void set_active(int device, bool active) { devices_.at(static_cast<size_t>(device)).active = active; }

  // Every device's profile for `rows` rows: read from the profile file, or
  // measured (each device's kernels, cached per device; a daemon measures
  // itself; links through the transport), with the speeds and budgets
  // applied. Measured once per row count and kept.
  [[nodiscard]] core::Result<planner::ClusterProfile> profile(const model::ModelConfig& c, int64_t rows);
  // The same, with the GEMM rates of weights quantized at load in `types`
  // as well (--lossy on an F32 model may plan them), where this process
  // measures the devices (local ones); a cluster file's or a --profile's
  // devices price them at their own types' rates (F32's).
  [[nodiscard]] core::Result<planner::ClusterProfile> profile(const model::ModelConfig& c, int64_t rows,
                                                              const std::vector<kernels::WeightType>& types);

  // The --max-loss gate's measure (PlannerOptions::measure_loss): a plan's
  // top-1 disagreement with the exact model, its ranks as threads of this
  // process, on the calibration prompts of `calibration` (a text file, one
  // per line) or, when empty, seeded random inputs of `rows` tokens: 8 for
  // a causal LM (every position's next token is compared), 32 for a
  // classifier (one label each). The exact outputs and each plan's figure are
  // kept, built at the first measure; the function refers to this cluster.
  [[nodiscard]] core::Result<std::function<core::Result<double>(const parallel::Plan&)>> loss_measure(
      const model::ModelConfig& c, int64_t rows, const std::string& calibration);

 private:
  ClusterOptions opts_;
  std::optional<ClusterFile> file_;
  std::optional<comm::ClusterKey> key_;
  std::vector<int64_t> memory_limits_;
  std::vector<double> speeds_;
  std::vector<Device> devices_;
  std::vector<int> order_;  // --device-order: every device once, the terminal first
  std::optional<planner::ClusterProfile> given_profile_;  // --profile
  std::map<int64_t, planner::ClusterProfile> profiles_;   // measured, by rows
  std::optional<double> crypto_gbps_;                      // local, encrypted devices: measured once
  std::optional<std::vector<std::vector<planner::LinkProfile>>> local_links_;      // local devices: measured once, for every rows' profile
  std::map<std::string, std::shared_ptr<FidelityMeter>> meters_;  // by calibration file and rows
};

// What to deploy.
struct DeployRequest {
  // strategy "auto": the planner chooses the strategy, its partition and
  // its devices among those offered. Otherwise this plan over every device
  // offered (world is set to their count; ratios, when given, must name as
  // many), its open choices (Strategy::variants) decided on the profile.
  parallel::Plan plan;
  int64_t rows = 0;            // the request's rows: planned for and budgets checked at (0: plan_rows' default)
  int64_t run_timeout_ms = 0;  // > 0: a run's waits end after this long (serve's failover)
  // > 0: a generation with this context (--ctx-size): every device's KV
  // caches at it count against its budget, in the planner and the session.
  int64_t ctx_size = 0;
  core::DType kv_dtype = core::DType::kF32;  // --kv-type
  // > 0 with ctx_size and auto: the generation's new tokens, each priced as
  // a decode step on the devices' one-row profile (PlannerOptions::new_tokens).
  int64_t new_tokens = 0;
  // > 1 with new_tokens: the steps decode this many sequences together
  // (serve --max-batch), priced on a profile at that many rows
  // (PlannerOptions::decode_batch).
  int64_t decode_batch = 1;
  // auto (--lossy): may choose a lossy strategy, a lossy wire unless
  // plan.wire names one, and weights quantized at load for an F32 model.
  bool lossy = false;
  // With lossy: the largest top-1 disagreement a lossy plan may have on the
  // calibration inputs (--max-loss; Cluster::loss_measure), and their file.
  double max_loss = 0.01;
  std::string calibration;
};

struct Deployment {
  parallel::Plan plan;        // over `members`, rank r on members[r]
  std::vector<int> members;   // cluster device indices, members[0] = 0 (the terminal)
  std::optional<planner::Candidate> chosen;  // set when the planner chose (auto)
  SessionOptions session;     // Session::start(session) runs it
  // The planner's choice for --stats ({} without one).
  nlohmann::json planner_json() const;
};

// `devices`: the cluster devices that may take part (0 first); empty: every
// active device.
[[nodiscard]] core::Result<Deployment> deploy(Cluster& cluster, const model::ModelConfig& c, const DeployRequest& r,
                                              std::vector<int> devices = {});

// Each rank's memory as the planner counts it: weights, activations at
// `rows` and, for a generation (ctx > 0), its KV caches at that context.
// `--stats` prints it beside the measured figures.
[[nodiscard]] core::Result<std::vector<int64_t>> predicted_memory(const parallel::Plan& plan, const model::ModelConfig& c,
                                                                  int64_t rows, int64_t ctx, core::DType kv_dtype);

// The plan table over the whole cluster (`tessera plan`).
[[nodiscard]] core::Result<planner::PlanTable> plan_table(Cluster& cluster, const model::ModelConfig& c,
                                                          const planner::PlannerOptions& o);

// A plan's open choices (bp's --bp-plan auto) decided on the profile of the
// cluster's first plan.world devices; the completed plan when it has none.
[[nodiscard]] core::Result<planner::VariantChoice> decide_variants(Cluster& cluster, const model::ModelConfig& c,
                                                                  const parallel::Plan& plan, int64_t rows);

// Whether a request runs in this process with no session: the single-device
// plan on one local device with no budget or emulated speed to honour.
bool runs_in_process(const ClusterOptions& o, const std::string& strategy);

// The rows a plan is made for: `seq` (0: 128), at most the model's, or a
// ViT's patches + CLS.
int64_t plan_rows(const model::ModelConfig& c, int64_t seq);
// The rows of a request: its ids, its text's tokens, or a ViT's patches + CLS.
[[nodiscard]] core::Result<int64_t> request_rows(const std::string& model_dir, const model::ModelConfig& c,
                                                 const std::string& text, size_t ids);
// "1,0.5" for k devices -> speeds in (0, 1]; "1GB,512MB" for k devices -> bytes.
[[nodiscard]] core::Result<std::vector<double>> parse_device_speeds(const std::string& text, int k);
[[nodiscard]] core::Result<std::vector<int64_t>> parse_memory_limits(const std::string& text, int k);

}  // namespace tessera::runtime
