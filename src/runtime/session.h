// The terminal's side of a distributed run (rank 0): it starts the workers
// (local processes, or jobs on the daemons of a cluster), forms the group,
// loads its own part, and then runs inferences and generations with the
// workers, over the typed protocol of runtime/protocol.h. The terminal
// tokenizes and embeds, the ranks run the plan's layer loop, and the
// terminal applies the head. Which plan on which devices is decided before
// (runtime/deployment.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <sys/types.h>
#include <thread>
#include <vector>

#include "comm/group.h"
#include "comm/keys.h"
#include "core/status.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/cluster_file.h"
#include "runtime/comm_sync.h"
#include "runtime/job.h"
#include "runtime/protocol.h"
#include "runtime/single_device.h"

namespace tessera::runtime {

struct SessionOptions {
  std::string model_dir;
  // The plan, built once by the caller (runtime/deployment.h); with a
  // cluster its world must be 1 + the number of workers.
  parallel::Plan plan;
  int threads_per_device = 1;
  std::string link;       // emulated links; empty = unpaced
  bool insecure = false;
  std::string key_file;   // empty and secure: an ephemeral key for local workers (kept in memory)
  // Set: these worker daemons, rank r on workers[r - 1], instead of local
  // worker processes (the deployment's members, in the plan's order).
  std::optional<ClusterFile> cluster;
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
  // > 0: the KV caches of a generation with this context count too.
  int64_t budget_ctx = 0;
  core::DType budget_kv_dtype = core::DType::kF32;
  // Emulated speed of each device in (0, 1] (--device-speed,
  // core/device_speed.h); empty: all at full speed.
  std::vector<double> device_speeds;
  // The prefix cache (serve --prefix-cache-mb): this many generations' KV
  // caches are kept on every rank after they end (0: none, at most
  // msg kMaxPrefixSlots). A prompt that starts with a kept generation's
  // tokens prefills only the rest, in that generation's caches; the least
  // recently used is replaced.
  int prefix_slots = 0;
  // > 1: continuous batching (serve --max-batch). Up to this many
  // generate() calls run at once, each from its own thread: each prefills
  // alone, between steps, and their decode steps go together, one row of
  // each sequence per step (parallel::step_rows). Every sequence keeps its
  // caches in a slot on every rank (max(prefix_slots, max_batch) slots, at
  // most msg::kMaxSlots); the prefix cache still reuses them when on.
  int max_batch = 1;
  // With max_batch > 1, a prompt longer than this many rows is prefilled in
  // chunks of it, and the decode steps waiting go between two chunks: a
  // long prompt no longer stalls the other streams for its whole prefill.
  // 0: whole. A pair's prefill is never cut (its later chunks would run on
  // the decode layout).
  int64_t prefill_chunk = 0;
  // Called after each batched step with its rows (serve's occupancy figure).
  std::function<void(int rows)> on_batch_step;
};

class Session {
 public:
  // Starts the local workers, forms the group and waits until every rank has
  // loaded its weights.
  static core::Result<std::unique_ptr<Session>> start(const SessionOptions& opts);
  ~Session();

  // One inference; latency excludes loading and process start.
  core::Result<RunResult> run(const RunRequest& req);
  // GPT-2 generation with a KV cache on every device (the strategy's
  // Decoder): returns prompt + new ids and calls opts.on_token with each new
  // one, the same tokens as model::generate for the same options. Caches
  // live for one call; calls are serialized with run(), and heartbeats go on
  // between tokens (on_token may take its time).
  // With a prefix cache (SessionOptions::prefix_slots) the caches outlive
  // the call, and a prompt that starts with an earlier generation's tokens
  // prefills only the rest; the tokens are the same as without it.
  // With max_batch > 1 calls run concurrently and batch their steps.
  // cached_tokens (when given): the prompt positions a prefix-cache slot
  // already held.
  core::Result<std::vector<int64_t>> generate(const std::vector<int64_t>& prompt, const model::GenerateOptions& opts,
                                              int64_t* cached_tokens = nullptr);
  // The same on an input already built (serve: tokenized or decoded there).
  core::Result<RunResult> run_input(const model::ModelInput& in, const std::string& dump_path = "");
  // Worker ranks whose connection is lost (crashed, or left).
  std::vector<int> lost_workers() const;
  // A session given up after a failure: its end kills the local workers at
  // once instead of waiting up to 5 s for them to leave (a stopped or hung
  // worker never does; the next session starts its own).
  void abandon() { abandoned_ = true; }
  // Per-rank figures of the last run (see docs): latency, compute and
  // communication time, bytes per collective kind, weight bytes.
  // A copy: with --max-batch, another call's prefill may be writing them.
  nlohmann::json last_stats() const {
    std::lock_guard<std::mutex> l(stats_mu_);
    return stats_;
  }
  const parallel::Plan& plan() const { return plan_; }
  // Prefix-cache slots this session keeps (0: no prefix cache).
  int prefix_slots() const { return opts_.prefix_slots; }
  int max_batch() const { return opts_.max_batch; }
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

  SessionOptions opts_;
  std::optional<comm::ClusterKey> key_;
  std::string bind_;
  comm::LocalListeners listeners_;  // local launches: every rank's socket, held until it is taken
  JobSpec job_;
  parallel::Plan plan_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<CommSynchronizer> sync_;
  std::unique_ptr<core::ThreadPool> pool_;
  std::vector<pid_t> children_;
  std::vector<msg::Ready> ready_;  // what each worker reported after loading
  std::vector<int> unpinned_cpus_;  // the terminal's cores before cpus_per_device pinned it
  mutable std::mutex stats_mu_;
  nlohmann::json stats_;
  // The prefix cache: per slot, the decoder, the tokens its caches hold
  // (positions 0..size-1; empty after a failed generation) and when it was used.
  struct PrefixSlot {
    std::unique_ptr<parallel::Decoder> dec;
    model::CacheSpec spec;
    std::vector<int64_t> tokens;
    uint64_t used = 0;
    bool in_use = false;  // a batched generation holds it
  };
  std::vector<PrefixSlot> prefix_;
  uint64_t prefix_clock_ = 0;
  int64_t rss_before_load_ = 0;  // the terminal's resident memory just before it loaded
  core::Status collect_stats(double latency_ms, nlohmann::json extra);
  // `m` to the workers below rank `upto` (all by default: a chunk names the
  // ranks that take part, Decoder::ranks_in), each send within the run timeout.
  core::Status tell_workers(const ToWorker& m, int upto = core::kMaxDevices);
  // Continuous batching (session_batch.cpp).
  int slot_count() const;
  core::Result<std::vector<int64_t>> generate_batched(const std::vector<int64_t>& prompt, const model::GenerateOptions& opts,
                                                      int64_t* cached_tokens);
  struct StepSeat;
  core::Result<core::Tensor> batched_step(size_t slot, core::Tensor x, int64_t pos);
  core::Status run_step(const std::vector<std::vector<StepSeat*>>& groups);
  void break_batch(const core::Status& why);
  // The slots' in_use flags, the rows waiting for a step, who is decoding,
  // whether a step runs, and broken_. Taken after run_mu_, never before it.
  std::mutex batch_mu_;
  std::condition_variable batch_cv_;
  std::vector<StepSeat*> pending_;
  int prefilling_ = 0;  // sequences with a slot, not yet prefilled (less those between two chunks)
  int decoding_ = 0;    // sequences past their prefill, not yet ended
  uint64_t steps_done_ = 0;
  double last_step_ms_ = 0;
  std::chrono::steady_clock::time_point last_step_end_;
  bool stepping_ = false;
  // Overlapped steps (a pipeline's stages in rank order): the groups of
  // rows in flight, flight_[g] at stage g + 1.
  std::vector<std::vector<StepSeat*>> flight_;
  // A batched chunk or step that failed leaves the ranks' states unknown:
  // every later batched call fails with it (serve fails over).
  core::Status broken_ = core::ok_status();
  std::mutex run_mu_;   // held by a run or a whole generation
  std::mutex wire_mu_;  // held by a run, a generation's chunk, and by the heartbeat thread between its pings
  std::condition_variable heartbeat_cv_;
  bool stopping_ = false;
  std::atomic<bool> abandoned_{false};
  std::thread heartbeat_;
};

}  // namespace tessera::runtime
