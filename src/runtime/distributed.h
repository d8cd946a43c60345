// Distributed runs: the terminal (rank 0) and the workers (ranks 1..K-1).
// The terminal tokenizes and embeds, the ranks run the plan's layer loop,
// and the terminal applies the head. Local runs start K-1 worker processes
// on loopback; each loads only what its part of the plan needs.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/types.h>
#include <vector>

#include "comm/group.h"
#include "comm/keys.h"
#include "core/status.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/comm_sync.h"
#include "runtime/job.h"
#include "runtime/single_device.h"

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
};

// What a daemon checks before it accepts a job: a worker rank, a model under
// its roots whose config completes the plan, and links that parse.
[[nodiscard]] core::Status check_daemon_job(const JobSpec& job, const std::vector<std::string>& roots);
// The folder of model `name` under one of `roots`: relative names only, no
// "..", and no symbolic link out of the root.
[[nodiscard]] core::Result<std::string> resolve_model(const std::string& name, const std::vector<std::string>& roots);

// A worker's whole life in one job: form the group, load its part, answer
// requests until the terminal says stop or is lost.
core::Status run_worker(const JobSpec& job, const WorkerEnv& env = {});

// `tessera worker`: a daemon on a device. It listens for jobs on `listen`
// (the control channel); for each, it binds its data endpoint on the port
// after the listen port and runs the job. Only terminals holding the cluster
// key can reach it (unless insecure).
struct DaemonOptions {
  std::string listen = "tcp://0.0.0.0:7070";
  std::string key_file;
  bool insecure = false;
  int jobs = 0;  // stop after this many jobs (0: never)
  std::vector<std::string> model_roots;  // --models: where job models are looked up
};
core::Status run_worker_daemon(const DaemonOptions& opts);
// The control request a daemon answers {"ok": true} to, doing nothing.
inline constexpr const char* kPingRequest = R"({"ping":true})";
bool is_ping(const nlohmann::json& request);

// A cluster file (TOML) for the terminal:
//   terminal = "tcp://192.168.1.10:7100"   # this device's data endpoint
//   [[worker]]
//   endpoint = "tcp://192.168.1.11:7070"
//   memory = "512MB"                       # optional budget
// or, without budgets, workers = ["tcp://192.168.1.11:7070", ...]. The
// terminal may be a table too: [terminal] endpoint = "...", memory = "1GB".
// Worker endpoints are the daemons' --listen endpoints; their data endpoint
// is the same host on the next port.
struct ClusterFile {
  std::string terminal;
  std::vector<std::string> workers;
  // Budgets in bytes, terminal first then the workers in order; 0: none.
  std::vector<int64_t> memory;
  // The budgets as --memory-limit gives them (no budget: the largest
  // value); empty when the file names none.
  std::vector<int64_t> memory_limits() const;
};
core::Result<ClusterFile> load_cluster_file(const std::string& path);
// The same from the file's text; `path` labels errors.
core::Result<ClusterFile> parse_cluster_file(const std::string& text, const std::string& path);
// "tcp://host:7070" -> "tcp://host:7071"; "tcp://host:7070" -> "tcp://*:7070" for binding.
core::Result<std::string> next_port_endpoint(const std::string& endpoint);
core::Result<std::string> bind_form(const std::string& endpoint);
// The name a daemon looks a model up by (under its --models roots): the
// terminal's model folder name.
std::string daemon_model_name(const std::string& model_dir);
// "tcp://host:7070" -> "host" (devices behind one host share its memory).
core::Result<std::string> endpoint_host(const std::string& endpoint);
// A daemon's answer to a control request: the JSON object when it says
// {"ok": true}, else a network error "worker EP refused to WHAT: <its error>".
core::Result<nlohmann::json> daemon_answer(const std::string& endpoint, const std::string& answer, const std::string& what);

struct DistributedOptions {
  std::string model_dir;
  // The plan, built once by the caller; with a cluster file its world must be
  // 1 + the number of workers.
  parallel::Plan plan;
  int threads_per_device = 1;
  std::string link;       // emulated links; empty = unpaced
  bool insecure = false;
  std::string key_file;   // empty and secure: an ephemeral key for local workers (kept in memory)
  std::string cluster_file;  // set: remote worker daemons instead of local processes
  std::optional<ClusterFile> cluster;  // set: these daemons, instead of cluster_file's (serve's failover)
  int64_t timeout_ms = 60000;  // 1 ms .. 24 h
  // > 0: the waits of a run (not of loading) end after this long, so that a
  // silent device is noticed quickly (serve's failover); 0: timeout_ms.
  int64_t run_timeout_ms = 0;
  int cpus_per_device = 0;  // > 0: rank r runs on cores r*N..r*N+N-1 (mod the allowed cores)
  // Bytes each device may use (weights + activations at the model's longest
  // input, as the planner predicts them); empty: no limit. Checked before
  // any device loads.
  std::vector<int64_t> memory_limits;
  // The input rows those budgets are checked at (0: the model's longest
  // input); a longer request is then refused rather than run over budget.
  int64_t budget_rows = 0;
  // Emulated speed of each device in (0, 1] (--device-speed,
  // core/device_speed.h); empty: all at full speed.
  std::vector<double> device_speeds;
};

// A local worker process: `tessera worker-job --job JSON --key-fd N`, the key
// read from the inherited descriptor N (then closed).
[[nodiscard]] core::Result<comm::ClusterKey> read_key_from_fd(int fd);

class Session {
 public:
  // Starts the local workers, forms the group and waits until every rank has
  // loaded its weights.
  static core::Result<std::unique_ptr<Session>> start(const DistributedOptions& opts);
  ~Session();

  // One inference; latency excludes loading and process start.
  core::Result<RunResult> run(const RunRequest& req);
  // GPT-2 generation with a KV cache on every device (the strategy's
  // Decoder): returns prompt + new ids and calls opts.on_token with each new
  // one, the same tokens as model::generate for the same options. Caches
  // live for one call; calls are serialized with run(), and heartbeats go on
  // between tokens (on_token may take its time).
  core::Result<std::vector<int64_t>> generate(const std::vector<int64_t>& prompt, const model::GenerateOptions& opts);
  // The same on an input already built (serve: tokenized or decoded there).
  core::Result<RunResult> run_input(const model::ModelInput& in, const std::string& dump_path = "");
  // Worker ranks whose connection is lost (crashed, or left).
  std::vector<int> lost_workers() const;
  // Per-rank figures of the last run (see docs): latency, compute and
  // communication time, bytes per collective kind, weight bytes.
  const nlohmann::json& last_stats() const { return stats_; }
  const parallel::Plan& plan() const { return plan_; }
  const model::Transformer& model() const { return *model_; }

 private:
  Session() = default;
  core::Status stop_workers();
  double device_speed_of(int rank) const {
    return opts_.device_speeds.empty() ? 1.0 : opts_.device_speeds[static_cast<size_t>(rank)];
  }

  core::Status check_options();
  core::Status plan_job(const model::ModelConfig& cfg);
  core::Status prepare_key();
  core::Status start_daemon_jobs();
  core::Status fork_local_workers();
  core::Status connect_and_load(const model::ModelConfig& cfg);
  void start_heartbeats();
  void stop_heartbeats();
  int64_t run_timeout_ms() const { return opts_.run_timeout_ms > 0 ? opts_.run_timeout_ms : opts_.timeout_ms; }

  DistributedOptions opts_;
  std::optional<ClusterFile> cluster_;
  std::optional<comm::ClusterKey> key_;
  std::string bind_;
  JobSpec job_;
  parallel::Plan plan_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<CommSynchronizer> sync_;
  std::unique_ptr<core::ThreadPool> pool_;
  std::vector<pid_t> children_;
  std::vector<nlohmann::json> ready_;  // what each worker reported after loading
  std::vector<int> unpinned_cpus_;  // the terminal's cores before cpus_per_device pinned it
  nlohmann::json stats_;
  int64_t rss_before_load_ = 0;  // the terminal's resident memory just before it loaded
  core::Status collect_stats(double latency_ms, nlohmann::json extra);
  std::mutex run_mu_;   // held by a run or a whole generation
  std::mutex wire_mu_;  // held by a run, a generation's chunk, and by the heartbeat thread between its pings
  std::condition_variable heartbeat_cv_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

}  // namespace tessera::runtime
