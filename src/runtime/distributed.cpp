#include "planner/cost_model.h"
#include "runtime/distributed.h"

#include "core/device_speed.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/control.h"
#include "comm/keys.h"
#include "comm/link.h"
#include "core/duration.h"
#include "core/io.h"
#include "kernels/packed_linear.h"
#include "core/logging.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

constexpr int kToTerminalTag = 1;  // worker -> terminal: "ready", "done"
constexpr int kToWorkerTag = 2;    // terminal -> worker: "run", "stop"
constexpr size_t kMaxControlBytes = 1 << 20;

Tensor json_tensor(const json& j) {
  const std::string s = j.dump();
  Tensor t = Tensor::zeros(core::DType::kU8, {static_cast<int64_t>(s.size())});
  std::memcpy(t.raw(), s.data(), s.size());
  return t;
}

Result<json> recv_json(comm::Group& g, int peer, int tag, comm::Millis timeout) {
  TESSERA_ASSIGN_OR_RETURN(Tensor t, g.recv(peer, tag, timeout));
  if (t.dtype() != core::DType::kU8 || t.rank() != 1 || t.nbytes() > kMaxControlBytes)
    return core::invalid_argument("malformed control message from rank " + std::to_string(peer));
  json j = json::parse(std::string(static_cast<const char*>(t.raw()), t.nbytes()), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("op") || !j["op"].is_string())
    return core::invalid_argument("control message from rank " + std::to_string(peer) + " is not valid JSON");
  return j;
}

// A worker's figures are printed and summed by the terminal: every number
// must be a number, so that a peer cannot make the terminal throw.
Status check_rank_stats(const json& j, int rank) {
  const auto bad = [&] { return core::invalid_argument("worker " + std::to_string(rank) + " sent malformed figures"); };
  if (!j.contains("rank") || !j["rank"].is_number_integer() || j["rank"].get<int64_t>() != rank) return bad();
  for (const auto& [key, v] : j.items()) {
    if (v.is_number()) continue;
    if (!v.is_object()) return bad();
    for (const auto& [k2, v2] : v.items())
      if (!v2.is_number()) return bad();
  }
  return core::ok_status();
}

Result<comm::GroupOptions> group_options(const JobSpec& job, const std::optional<comm::ClusterKey>& key) {
  comm::GroupOptions o;
  o.rank = job.rank;
  o.endpoints = job.endpoints;
  o.group_id = job.group_id;
  o.insecure = job.insecure;
  o.connect_timeout = comm::Millis(job.timeout_ms);
  if (!job.insecure) {
    if (!key) return core::invalid_argument("a secure job needs the cluster key");
    o.key = key;
  }
  if (!job.link.empty()) {
    TESSERA_ASSIGN_OR_RETURN(o.links, job_links(job.link, static_cast<int>(job.endpoints.size())));
  }
  return o;
}

// The resident memory a device's figure starts from, just before it loads:
// the GEMM library is initialised first (process start-up, like the binary's
// own code), and the peak starts over from here.
int64_t memory_baseline() {
  (void)kernels::gemm_path();
  core::reset_peak_resident();
  return core::resident_bytes();
}

// memory_bytes is the device's memory as the planner predicts it: peak
// resident memory less what was resident just before the model loaded.
json rank_stats(const parallel::Synchronizer& sync, const comm::Group& g, double total_ms, int64_t weight_bytes,
                int64_t rss_before_load) {
  const auto cs = g.stats();
  json by_kind = json::object(), elems = json::object();
  for (int k = 0; k < comm::kOpKindCount; ++k) {
    const auto& op = cs.per_op[static_cast<size_t>(k)];
    if (op.traffic.bytes_sent > 0) by_kind[comm::op_name(static_cast<comm::OpKind>(k))] = op.traffic.bytes_sent;
  }
  for (size_t k = 0; k < sync.stats().elements_sent.size(); ++k)
    if (sync.stats().elements_sent[k] > 0)
      elems[parallel::collective_name(static_cast<parallel::CollectiveKind>(k))] = sync.stats().elements_sent[k];
  return {{"rank", g.rank()},
          {"compute_ms", total_ms - sync.stats().blocked_ms},
          {"comm_ms", sync.stats().blocked_ms},
          {"bytes_sent", cs.total.bytes_sent},
          {"bytes_sent_by_kind", by_kind},
          {"elements_sent_by_kind", elems},
          {"weight_bytes", weight_bytes},
          {"peak_rss_bytes", core::peak_resident_bytes()},
          {"memory_bytes", core::peak_resident_bytes() - rss_before_load},
          {"unmatched_bytes_peak", cs.unmatched_bytes_peak},
          {"unmatched_frames_dropped", cs.unmatched_frames_dropped}};
}

// Copies a group's figures out when a worker's job ends, whichever way.
struct StatsOnExit {
  const comm::Group* group;
  comm::CommStats* out;
  ~StatsOnExit() {
    if (out != nullptr) *out = group->stats();
  }
};

// The cores this process may use; cpus_per_device indexes into them, so a
// restricted cpuset still gets valid masks.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

cpu_set_t device_cpus(const std::vector<int>& allowed, int rank, int per_device) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int i = 0; i < per_device && !allowed.empty(); ++i)
    CPU_SET(allowed[static_cast<size_t>(rank * per_device + i) % allowed.size()], &set);
  return set;
}

// Every thread of this process: ZeroMQ and BLAS threads exist before pinning.
void pin_all_threads(const cpu_set_t& set) {
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec))
    (void)::sched_setaffinity(std::atoi(t.path().filename().c_str()), sizeof(set), &set);
}

// A worker's part of a generation: "generate" makes its decoder, "decode"
// runs one chunk (n rows at pos), "end" drops the caches.
Status worker_generation_step(const json& req, const parallel::Strategy& strategy, const model::Transformer& m,
                              const parallel::Plan& plan, parallel::Synchronizer& sync, core::ThreadPool* pool,
                              const model::ModelConfig& cfg, std::unique_ptr<parallel::Decoder>& dec, int64_t& positions) {
  const auto integer = [&](const char* key) -> Result<int64_t> {
    if (!req.contains(key) || !req[key].is_number_integer()) return core::invalid_argument(std::string("generation request without '") + key + "'");
    return req[key].get<int64_t>();
  };
  const std::string op = req["op"].get<std::string>();
  if (op == "end") {
    dec.reset();
    return core::ok_status();
  }
  if (op == "generate") {
    TESSERA_ASSIGN_OR_RETURN(positions, integer("positions"));
    if (positions < 1 || positions > cfg.max_positions) return core::out_of_range("a generation of " + std::to_string(positions) + " positions");
    dec.reset();  // the previous request's caches go first
    TESSERA_ASSIGN_OR_RETURN(dec, strategy.make_decoder(m, plan, sync, positions));
    return core::ok_status();
  }
  TESSERA_ASSIGN_OR_RETURN(const int64_t n, integer("n"));
  TESSERA_ASSIGN_OR_RETURN(const int64_t pos, integer("pos"));
  if (!dec) return core::invalid_argument("a decode step outside a generation");
  if (n < 1 || pos < 0 || pos + n > positions)
    return core::out_of_range("decode rows " + std::to_string(pos) + ".." + std::to_string(pos + n - 1) + " outside the cache");
  return dec->forward(Tensor(), n, pos, pool).status();
}

}  // namespace

Result<std::string> resolve_model(const std::string& name, const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  if (roots.empty()) return core::invalid_argument("this worker serves no models (start it with --models DIR)");
  const fs::path rel(name);
  if (name.empty() || rel.is_absolute() || rel.has_root_name())
    return core::invalid_argument("model '" + name + "': a job names a model relative to the worker's model roots");
  for (const auto& part : rel)
    if (part == "..") return core::invalid_argument("model '" + name + "' leaves the worker's model roots");
  for (const std::string& root : roots) {
    std::error_code ec;
    const fs::path base = fs::canonical(root, ec);
    if (ec) continue;
    const fs::path dir = fs::weakly_canonical(base / rel, ec);  // symlinks resolved
    if (ec) continue;
    const std::string b = base.string() + "/", d = dir.string() + "/";
    if (d.compare(0, b.size(), b) != 0) continue;  // a link out of the root
    if (fs::is_directory(dir, ec) && fs::is_regular_file(dir / "config.json", ec)) return dir.string();
  }
  return core::not_found("model '" + name + "' is not under any of this worker's model roots");
}

Status check_daemon_job(const JobSpec& job, const std::vector<std::string>& roots) {
  if (job.rank == 0) return core::invalid_argument("rank 0 is the terminal");
  TESSERA_ASSIGN_OR_RETURN(const std::string dir, resolve_model(job.model_dir, roots));
  TESSERA_ASSIGN_OR_RETURN(const model::ModelConfig cfg, model::load_config(dir));
  TESSERA_RETURN_IF_ERROR(job.completed_plan(cfg).status());
  return job_links(job.link, static_cast<int>(job.endpoints.size())).status();
}

Status run_worker(const JobSpec& job, const WorkerEnv& env) {
  std::string model_dir = job.model_dir;
  if (env.model_roots) {
    TESSERA_ASSIGN_OR_RETURN(model_dir, resolve_model(job.model_dir, *env.model_roots));
  }
  TESSERA_ASSIGN_OR_RETURN(comm::GroupOptions go, group_options(job, env.key));
  go.bind_endpoint = env.bind_endpoint;
  if (env.max_connect.count() > 0) go.connect_timeout = std::min(go.connect_timeout, env.max_connect);
  TESSERA_ASSIGN_OR_RETURN(auto group, comm::Group::create(go));
  const StatsOnExit report{group.get(), env.stats};
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(model_dir));
  TESSERA_ASSIGN_OR_RETURN(parallel::Plan plan, job.completed_plan(cfg));
  core::Timer load;
  const int64_t rss_before_load = memory_baseline();
  auto model = model::Transformer::load(model_dir, parallel::load_options(plan, cfg, job.rank));
  const comm::Millis timeout(job.timeout_ms);
  if (!model.ok()) {
    (void)group->send(0, kToTerminalTag, json_tensor({{"op", "error"}, {"message", model.status().to_string()}}), timeout);
    return model.status();
  }
  const int64_t weight_bytes = static_cast<int64_t>(model->weights().bytes());
  TESSERA_RETURN_IF_ERROR(group->send(
      0, kToTerminalTag, json_tensor({{"op", "ready"}, {"weight_bytes", weight_bytes}, {"load_ms", load.ms()}}), timeout));
  kernels::set_blas_threads(job.threads);
  core::set_device_speed(job.device_speed);
  core::ThreadPool pool(job.threads);
  CommSynchronizer sync(*group, timeout);
  // Liveness is judged by heartbeats, not progress: an idle terminal pings;
  // one that falls silent loses its job within a few intervals.
  const comm::Millis silence(job.heartbeat_ms * JobSpec::kMissedHeartbeats);
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan.strategy));
  std::unique_ptr<parallel::Decoder> dec;  // during a generation
  int64_t positions = 0;
  double decode_ms = 0;
  for (;;) {
    auto req = recv_json(*group, 0, kToWorkerTag, silence);
    if (!req.ok() && req.status().code() == core::ErrorCode::kTimeout)
      return core::timeout_error("the terminal missed its heartbeats for " + std::to_string(silence.count()) + " ms");
    if (!req.ok()) return req.status();
    if ((*req)["op"] == "ping") continue;
    if ((*req)["op"] == "stop") return core::ok_status();
    if ((*req)["op"] == "generate" || (*req)["op"] == "decode" || (*req)["op"] == "end") {
      core::Timer step_t;
      TESSERA_RETURN_IF_ERROR(worker_generation_step(*req, *strategy, *model, plan, sync, &pool, cfg, dec, positions));
      core::settle_device_speed();
      if ((*req)["op"] == "decode" && (*req)["pos"] == 0) {  // figures cover the decode steps
        sync.reset_stats();
        group->reset_stats();
        decode_ms = 0;
      } else if ((*req)["op"] == "decode") {
        decode_ms += step_t.ms();  // time in steps: idle time between them is neither compute nor waiting
      }
      if ((*req)["op"] == "end") {
        json done = rank_stats(sync, *group, decode_ms, weight_bytes, rss_before_load);
        done["op"] = "done";
        TESSERA_RETURN_IF_ERROR(group->send(0, kToTerminalTag, json_tensor(done), timeout));
      }
      continue;
    }
    if ((*req)["op"] != "run" || !(*req).contains("n") || !(*req)["n"].is_number_integer())
      return core::invalid_argument("unknown request from the terminal");
    const int64_t n = (*req)["n"].get<int64_t>();
    if (n < 1 || n > cfg.max_rows()) return core::out_of_range("request of " + std::to_string(n) + " rows");
    sync.reset_stats();
    group->reset_stats();
    core::Timer t;
    auto y = parallel::run_layers(*model, plan, sync, Tensor(), n, &pool);
    if (!y.ok()) return y.status();
    core::settle_device_speed();
    json done = rank_stats(sync, *group, t.ms(), weight_bytes, rss_before_load);
    done["op"] = "done";
    TESSERA_RETURN_IF_ERROR(group->send(0, kToTerminalTag, json_tensor(done), timeout));
  }
}

Result<comm::ClusterKey> read_key_from_fd(int fd) {
  // "PUBLIC\nSECRET\n", Z85 keys of 40 characters each.
  std::string text;
  char buf[256];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return core::io_error("reading the key descriptor: " + std::string(std::strerror(errno)));
    if (got == 0) break;
    text.append(buf, static_cast<size_t>(got));
    if (text.size() > 1024) break;
  }
  ::close(fd);
  const size_t nl = text.find('\n');
  if (text.size() != 82 || nl != 40 || text[81] != '\n') return core::invalid_argument("the key descriptor holds no key");
  comm::ClusterKey key{text.substr(0, 40), text.substr(41, 40)};
  TESSERA_RETURN_IF_ERROR(comm::validate_cluster_key(key));
  return key;
}

Status Session::check_options() {
  if (opts_.threads_per_device < 1) return core::invalid_argument("--threads-per-device must be >= 1");
  if (opts_.cpus_per_device < 0) return core::invalid_argument("--cpus-per-device must be >= 0");
  TESSERA_RETURN_IF_ERROR(core::check_duration(comm::Millis(opts_.timeout_ms), "--timeout"));
  if (opts_.run_timeout_ms != 0)
    TESSERA_RETURN_IF_ERROR(core::check_duration(comm::Millis(opts_.run_timeout_ms), "the run timeout"));
  if (opts_.cluster) cluster_ = opts_.cluster;
  if (!opts_.cluster && !opts_.cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(cluster_, load_cluster_file(opts_.cluster_file));
  }
  if (cluster_) {
    if (!opts_.insecure && opts_.key_file.empty())
      return core::invalid_argument("a cluster needs --key (the file every worker was started with) or --insecure");
    const int world = 1 + static_cast<int>(cluster_->workers.size());
    if (opts_.plan.world != world)
      return core::invalid_argument("the plan has " + std::to_string(opts_.plan.world) + " devices, the cluster " +
                                    std::to_string(world));
  }
  if (opts_.plan.world < 1 || opts_.plan.world > 64) return core::invalid_argument("--devices must be in [1, 64]");
  if (!opts_.device_speeds.empty()) {
    if (static_cast<int>(opts_.device_speeds.size()) != opts_.plan.world)
      return core::invalid_argument("--device-speed names " + std::to_string(opts_.device_speeds.size()) +
                                    " devices, the plan has " + std::to_string(opts_.plan.world));
    for (double s : opts_.device_speeds)
      if (!(s > 0 && s <= 1)) return core::invalid_argument("--device-speed: each speed must be in (0, 1]");
  }
  return core::ok_status();
}

// The plan, completed, and the job every worker gets (its rank aside).
Status Session::plan_job(const model::ModelConfig& cfg) {
  plan_ = opts_.plan;
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(plan_, cfg));
  if (!opts_.memory_limits.empty()) {
    const int64_t rows = opts_.budget_rows > 0 ? std::min(opts_.budget_rows, cfg.max_rows()) : cfg.max_rows();
    TESSERA_ASSIGN_OR_RETURN(const parallel::Schedule sched, parallel::estimate(plan_, cfg, rows));
    TESSERA_RETURN_IF_ERROR(planner::check_memory_budgets(sched, opts_.memory_limits));
  }
  JobSpec& job = job_;
  job.model_dir = opts_.model_dir;
  job.threads = opts_.threads_per_device;
  job.timeout_ms = opts_.timeout_ms;
  TESSERA_ASSIGN_OR_RETURN(job.link, inline_link_arg(opts_.link, plan_.world));
  job.insecure = opts_.insecure;
  job.plan = plan_;
  job.group_id = "tessera-" + std::to_string(::getpid()) + "-" +
                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (cluster_) {
    job.endpoints.push_back(cluster_->terminal);
    for (const auto& w : cluster_->workers) {
      TESSERA_ASSIGN_OR_RETURN(std::string data, next_port_endpoint(w));
      job.endpoints.push_back(data);
    }
    TESSERA_ASSIGN_OR_RETURN(bind_, bind_form(cluster_->terminal));
  } else {
    TESSERA_ASSIGN_OR_RETURN(job.endpoints, comm::pick_local_endpoints(plan_.world));
  }
  return core::ok_status();
}

// The key stays in memory: read from the user's file, or made for this session.
Status Session::prepare_key() {
  if (opts_.insecure) return core::ok_status();
  if (!opts_.key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(key_, comm::read_key_file(opts_.key_file));
  } else {
    TESSERA_ASSIGN_OR_RETURN(key_, comm::generate_cluster_key());
  }
  return core::ok_status();
}

Status Session::start_daemon_jobs() {
  for (int r = 1; r < plan_.world; ++r) {
    JobSpec w = job_;
    w.rank = r;
    w.device_speed = device_speed_of(r);
    // A daemon finds the model by name under its own roots.
    w.model_dir = daemon_model_name(opts_.model_dir);
    const std::string& ep = cluster_->workers[static_cast<size_t>(r - 1)];
    TESSERA_ASSIGN_OR_RETURN(std::string answer,
                             comm::control_request(ep, key_, w.to_json().dump(), comm::Millis(opts_.timeout_ms)));
    TESSERA_RETURN_IF_ERROR(daemon_answer(ep, answer, "take the job").status());
  }
  return core::ok_status();
}

Status Session::fork_local_workers() {
  const std::vector<int> cpus = opts_.cpus_per_device > 0 ? allowed_cpus() : std::vector<int>{};
  for (int r = 1; r < plan_.world; ++r) {
    JobSpec w = job_;
    w.rank = r;
    w.device_speed = device_speed_of(r);
    const std::string arg = w.to_json().dump();
    // The key travels over a pipe the child inherits, never through a file or argv.
    int fds[2] = {-1, -1};
    if (key_) {
      if (::pipe2(fds, O_CLOEXEC) != 0) return core::internal_error("pipe failed: " + std::string(std::strerror(errno)));
      const std::string text = key_->public_z85 + "\n" + key_->secret_z85 + "\n";
      const bool written = ::write(fds[1], text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fds[1]);
      if (!written) {
        ::close(fds[0]);
        return core::internal_error("writing the key pipe failed");
      }
    }
    const std::string key_fd = std::to_string(fds[0]);
    const pid_t pid = ::fork();
    if (pid < 0) {
      if (fds[0] >= 0) ::close(fds[0]);
      return core::internal_error("fork failed: " + std::string(std::strerror(errno)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the terminal
      if (!cpus.empty()) {  // inherited across exec
        const cpu_set_t set = device_cpus(cpus, r, opts_.cpus_per_device);
        (void)::sched_setaffinity(0, sizeof(set), &set);
      }
      if (fds[0] >= 0) (void)::fcntl(fds[0], F_SETFD, 0);  // this one descriptor survives exec
      // BLAS threads are fixed when OpenBLAS loads (see kernels/gemm.h).
      ::setenv("OPENBLAS_NUM_THREADS", std::to_string(w.threads).c_str(), 1);
      const char* argv[] = {"tessera", "worker-job", "--job", arg.c_str(), "--key-fd", key_fd.c_str(), nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    if (fds[0] >= 0) ::close(fds[0]);
    children_.push_back(pid);
  }
  if (!cpus.empty()) {  // the terminal is device 0 until the session ends
    unpinned_cpus_ = cpus;
    pin_all_threads(device_cpus(cpus, 0, opts_.cpus_per_device));
  }
  return core::ok_status();
}

// Forms the group, loads the terminal's part and waits until every worker
// has loaded its own.
Status Session::connect_and_load(const model::ModelConfig& cfg) {
  TESSERA_ASSIGN_OR_RETURN(comm::GroupOptions go, group_options(job_, key_));
  go.bind_endpoint = bind_;
  // With a short run timeout (serve's failover), a silent peer must not hold
  // the goodbye that frees the others for the next plan.
  if (opts_.run_timeout_ms > 0) go.close_timeout = std::min(go.close_timeout, comm::Millis(opts_.run_timeout_ms));
  TESSERA_ASSIGN_OR_RETURN(group_, comm::Group::create(go));
  start_heartbeats();  // workers that load faster than the terminal must not give up on it
  rss_before_load_ = memory_baseline();
  TESSERA_ASSIGN_OR_RETURN(model::Transformer m,
                           model::Transformer::load(opts_.model_dir, parallel::load_options(plan_, cfg, 0)));
  model_ = std::make_unique<model::Transformer>(std::move(m));
  for (int r = 1; r < plan_.world; ++r) {
    TESSERA_ASSIGN_OR_RETURN(json ready, recv_json(*group_, r, kToTerminalTag, comm::Millis(opts_.timeout_ms)));
    if (ready["op"] == "error") {
      const bool has = ready.contains("message") && ready["message"].is_string();
      return core::internal_error("worker " + std::to_string(r) + ": " + (has ? ready["message"].get<std::string>() : "failed"));
    }
    if (ready["op"] != "ready") return core::invalid_argument("worker " + std::to_string(r) + " did not report ready");
    ready_.push_back(ready);
  }
  kernels::set_blas_threads(opts_.threads_per_device);
  sync_ = std::make_unique<CommSynchronizer>(*group_, comm::Millis(run_timeout_ms()));
  return core::ok_status();
}

// Pings every worker while no run is in progress (a run's own messages show
// the terminal is alive; pings between them keep idle workers from giving up).
void Session::start_heartbeats() {
  if (plan_.world < 2) return;
  heartbeat_ = std::thread([this] {
    const auto interval = std::chrono::milliseconds(job_.heartbeat_ms);
    std::unique_lock<std::mutex> lock(wire_mu_);
    while (!stopping_) {
      for (int w = 1; w < group_->size(); ++w)
        if (group_->peer_alive(w)) (void)group_->send(w, kToWorkerTag, json_tensor({{"op", "ping"}}), interval);
      heartbeat_cv_.wait_for(lock, interval, [this] { return stopping_; });
    }
  });
}

void Session::stop_heartbeats() {
  {
    std::lock_guard<std::mutex> lock(wire_mu_);
    stopping_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

Result<std::unique_ptr<Session>> Session::start(const DistributedOptions& opts) {
  std::unique_ptr<Session> s(new Session());
  s->opts_ = opts;
  TESSERA_RETURN_IF_ERROR(s->check_options());
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(opts.model_dir));
  TESSERA_RETURN_IF_ERROR(s->plan_job(cfg));
  TESSERA_RETURN_IF_ERROR(s->prepare_key());
  TESSERA_RETURN_IF_ERROR(s->cluster_ ? s->start_daemon_jobs() : s->fork_local_workers());
  TESSERA_RETURN_IF_ERROR(s->connect_and_load(cfg));
  return s;
}

std::vector<int> Session::lost_workers() const {
  std::vector<int> lost;
  for (int w = 1; group_ && w < group_->size(); ++w)
    if (!group_->peer_alive(w)) lost.push_back(w);
  return lost;
}

Result<RunResult> Session::run(const RunRequest& req) {
  RunRequest r = req;
  r.model_dir = opts_.model_dir;
  TESSERA_ASSIGN_OR_RETURN(model::ModelInput in, build_input(*model_, r));
  return run_input(in, r.dump_path);
}

Result<RunResult> Session::run_input(const model::ModelInput& in, const std::string& dump_path) {
  const std::lock_guard<std::mutex> run_lock(run_mu_);
  const std::lock_guard<std::mutex> wire_lock(wire_mu_);  // no pings during a run
  if (const int64_t rows = input_rows(model_->config(), in);
      !opts_.memory_limits.empty() && opts_.budget_rows > 0 && rows > opts_.budget_rows)
    return core::resource_exhausted("a request of " + std::to_string(rows) + " rows; the memory budgets were checked for " +
                                    std::to_string(opts_.budget_rows));
  TESSERA_RETURN_IF_ERROR(check_request_memory(plan_, model_->config(), input_rows(model_->config(), in)));
  if (!pool_) pool_ = std::make_unique<core::ThreadPool>(opts_.threads_per_device);
  RunResult out;
  out.config = model_->config();
  out.input_ids = in.ids;
  const comm::Millis timeout(run_timeout_ms());
  int64_t n = 0;
  core::Timer t;
  auto tell_workers = [&](int64_t rows) {
    n = rows;
    for (int w = 1; w < group_->size(); ++w)
      TESSERA_RETURN_IF_ERROR(group_->send(w, kToWorkerTag, json_tensor({{"op", "run"}, {"n", rows}}), timeout));
    // Counters cover the strategy's traffic, not the control messages.
    sync_->reset_stats();
    group_->reset_stats();
    return core::ok_status();
  };
  {
    const core::ScopedDeviceSpeed speed(device_speed_of(0));
    TESSERA_ASSIGN_OR_RETURN(out.output, terminal_forward(*model_, plan_, *sync_, in, pool_.get(), tell_workers));
  }
  out.latency_ms = t.ms();
  TESSERA_RETURN_IF_ERROR(collect_stats(out.latency_ms, {{"rows", n}}));
  if (!dump_path.empty()) TESSERA_RETURN_IF_ERROR(write_dump(dump_path, out));
  return out;
}

// Every worker's "done" after a run or a generation, with the terminal's own figures.
Status Session::collect_stats(double latency_ms, json extra) {
  const comm::Millis timeout(run_timeout_ms());
  json ranks = json::array();
  ranks.push_back(rank_stats(*sync_, *group_, latency_ms, static_cast<int64_t>(model_->weights().bytes()), rss_before_load_));
  for (int w = 1; w < group_->size(); ++w) {
    TESSERA_ASSIGN_OR_RETURN(json done, recv_json(*group_, w, kToTerminalTag, timeout));
    if (done["op"] != "done") return core::invalid_argument("worker " + std::to_string(w) + " sent an unexpected reply");
    done.erase("op");
    TESSERA_RETURN_IF_ERROR(check_rank_stats(done, w));
    ranks.push_back(done);
  }
  stats_ = {{"strategy", plan_.strategy},
            {"plan", plan_.to_json()},
            {"devices", group_->size()},
            {"threads_per_device", opts_.threads_per_device},
            {"link", opts_.link.empty() ? "unpaced" : opts_.link},
            {"layers", model_->config().layers},
            {"latency_ms", latency_ms},
            {"ranks", ranks}};
  stats_.update(extra);
  return core::ok_status();
}

Result<std::vector<int64_t>> Session::generate(const std::vector<int64_t>& prompt, const model::GenerateOptions& opts) {
  const std::lock_guard<std::mutex> run_lock(run_mu_);
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan_.strategy));
  if (!pool_) pool_ = std::make_unique<core::ThreadPool>(opts_.threads_per_device);
  const comm::Millis timeout(run_timeout_ms());  // serve's failover timeout notices a silent device
  const int64_t positions = model::generation_positions(model_->config(), static_cast<int64_t>(prompt.size()), opts);
  auto tell_workers = [&](const json& msg) {
    for (int w = 1; w < group_->size(); ++w)
      TESSERA_RETURN_IF_ERROR(group_->send(w, kToWorkerTag, json_tensor(msg), timeout));
    return core::ok_status();
  };
  std::unique_ptr<parallel::Decoder> dec;
  core::Timer t, decode_t;
  double prefill_ms = 0;
  int64_t steps = 0;
  // Pings flow between chunks (while the caller streams a token), not during one.
  auto layers = [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    const std::lock_guard<std::mutex> wire_lock(wire_mu_);
    if (!dec) {
      TESSERA_ASSIGN_OR_RETURN(dec, strategy->make_decoder(*model_, plan_, *sync_, positions));
      TESSERA_RETURN_IF_ERROR(tell_workers({{"op", "generate"}, {"positions", positions}}));
    }
    const int64_t n = x.dim(0);
    TESSERA_RETURN_IF_ERROR(tell_workers({{"op", "decode"}, {"n", n}, {"pos", pos0}}));
    auto y = dec->forward(std::move(x), n, pos0, pool_.get());
    if (pos0 == 0) {  // the figures cover the decode steps; the prefill is timed apart
      prefill_ms = t.ms();
      decode_t = core::Timer();
      sync_->reset_stats();
      group_->reset_stats();
    } else {
      ++steps;
    }
    return y;
  };
  auto seq = [&] {
    const core::ScopedDeviceSpeed speed(device_speed_of(0));
    return model::generate_with(*model_, prompt, opts, pool_.get(), layers);
  }();
  if (dec) {
    const std::lock_guard<std::mutex> wire_lock(wire_mu_);
    const double decode_ms = decode_t.ms();
    // The workers end the generation even when it failed; its own error comes first.
    Status st = tell_workers({{"op", "end"}});
    if (st.ok())
      st = collect_stats(decode_ms, {{"rows", 1},
                                     {"prompt_tokens", prompt.size()},
                                     {"decode_steps", steps},
                                     {"prefill_ms", prefill_ms},
                                     {"decode_ms", decode_ms},
                                     {"ms_per_token", steps > 0 ? decode_ms / static_cast<double>(steps) : 0.0}});
    TESSERA_RETURN_IF_ERROR(seq.status());
    TESSERA_RETURN_IF_ERROR(st);
  }
  return seq;
}

Status Session::stop_workers() {
  if (group_)
    for (int w = 1; w < group_->size(); ++w)
      if (group_->peer_alive(w)) (void)group_->send(w, kToWorkerTag, json_tensor({{"op", "stop"}}), comm::Millis(2000));
  return core::ok_status();
}

Session::~Session() {
  stop_heartbeats();
  (void)stop_workers();
  if (group_) group_->close();
  // Give workers a moment to leave by themselves, then make sure.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t pid : children_) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (!unpinned_cpus_.empty()) pin_all_threads(device_cpus(unpinned_cpus_, 0, static_cast<int>(unpinned_cpus_.size())));
}

}  // namespace tessera::runtime
