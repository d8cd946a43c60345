#include "runtime/distributed.h"

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
#include "core/logging.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

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

// A string member of a peer's message, or `fallback` (never an exception).
std::string text_field(const json& j, const char* key, const char* fallback) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(fallback);
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

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

Result<comm::GroupOptions> group_options(const JobSpec& job, const std::optional<comm::ClusterKey>& key = std::nullopt) {
  comm::GroupOptions o;
  o.rank = job.rank;
  o.endpoints = job.endpoints;
  o.group_id = job.group_id;
  o.insecure = job.insecure;
  o.connect_timeout = comm::Millis(job.timeout_ms);
  if (!job.insecure && key) {
    o.key = key;
  } else if (!job.insecure) {
    TESSERA_ASSIGN_OR_RETURN(comm::ClusterKey k, comm::read_key_file(job.key_file));
    o.key = k;
  }
  if (!job.link.empty()) {
    TESSERA_ASSIGN_OR_RETURN(o.links, comm::LinkMatrix::from_arg(job.link, static_cast<int>(job.endpoints.size())));
  }
  return o;
}

json rank_stats(const parallel::Synchronizer& sync, const comm::Group& g, double total_ms, int64_t weight_bytes) {
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
          {"peak_rss_bytes", peak_rss_bytes()},
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

}  // namespace

Status run_worker(const JobSpec& job, const WorkerEnv& env) {
  JobSpec local = job;
  if (env.key) local.key_file.clear();
  TESSERA_ASSIGN_OR_RETURN(comm::GroupOptions go, group_options(local, env.key));
  go.bind_endpoint = env.bind_endpoint;
  TESSERA_ASSIGN_OR_RETURN(auto group, comm::Group::create(go));
  const StatsOnExit report{group.get(), env.stats};
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(job.model_dir));
  TESSERA_ASSIGN_OR_RETURN(parallel::Plan plan, job.plan(cfg));
  core::Timer load;
  auto model = model::Transformer::load(job.model_dir, parallel::load_options(plan, cfg, job.rank));
  const comm::Millis timeout(job.timeout_ms);
  if (!model.ok()) {
    (void)group->send(0, kToTerminalTag, json_tensor({{"op", "error"}, {"message", model.status().to_string()}}), timeout);
    return model.status();
  }
  const int64_t weight_bytes = static_cast<int64_t>(model->weights().bytes());
  TESSERA_RETURN_IF_ERROR(group->send(
      0, kToTerminalTag, json_tensor({{"op", "ready"}, {"weight_bytes", weight_bytes}, {"load_ms", load.ms()}}), timeout));
  kernels::set_blas_threads(job.threads);
  core::ThreadPool pool(job.threads);
  parallel::CommSynchronizer sync(*group, timeout);
  for (;;) {
    // Idle until the terminal asks; a lost terminal ends the wait with an error.
    auto req = recv_json(*group, 0, kToWorkerTag, comm::Millis(24ll * 3600 * 1000));
    if (!req.ok()) return req.status();
    if ((*req)["op"] == "stop") return core::ok_status();
    if ((*req)["op"] != "run" || !(*req).contains("n") || !(*req)["n"].is_number_integer())
      return core::invalid_argument("unknown request from the terminal");
    const int64_t n = (*req)["n"].get<int64_t>();
    if (n < 1 || n > cfg.max_rows()) return core::out_of_range("request of " + std::to_string(n) + " rows");
    sync.reset_stats();
    group->reset_stats();
    core::Timer t;
    auto y = parallel::run_layers(*model, plan, sync, Tensor(), n, &pool);
    if (!y.ok()) return y.status();
    json done = rank_stats(sync, *group, t.ms(), weight_bytes);
    done["op"] = "done";
    TESSERA_RETURN_IF_ERROR(group->send(0, kToTerminalTag, json_tensor(done), timeout));
  }
}

Result<std::unique_ptr<Session>> Session::start(const DistributedOptions& opts) {
  std::unique_ptr<Session> s(new Session());
  s->opts_ = opts;
  if (opts.threads_per_device < 1) return core::invalid_argument("--threads-per-device must be >= 1");
  if (opts.cpus_per_device < 0) return core::invalid_argument("--cpus-per-device must be >= 0");
  TESSERA_RETURN_IF_ERROR(core::check_duration(comm::Millis(opts.timeout_ms), "--timeout"));
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(opts.model_dir));
  std::optional<ClusterFile> cluster;
  if (!opts.cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(cluster, load_cluster_file(opts.cluster_file));
    s->opts_.devices = 1 + static_cast<int>(cluster->workers.size());
    if (!opts.insecure && opts.key_file.empty())
      return core::invalid_argument("a cluster needs --key (the file every worker was started with) or --insecure");
  }
  const int devices = s->opts_.devices;
  if (devices < 1 || devices > 64) return core::invalid_argument("--devices must be in [1, 64]");
  JobSpec& job = s->job_;
  job.model_dir = opts.model_dir;
  job.strategy = opts.strategy;
  job.threads = opts.threads_per_device;
  job.timeout_ms = opts.timeout_ms;
  job.link = opts.link;
  job.insecure = opts.insecure;
  job.adaptive_order = opts.adaptive_order;
  job.prism_rate = opts.prism_rate;
  job.prism_segments = opts.prism_segments;
  job.overlap = opts.overlap;
  job.group_id = "tessera-" + std::to_string(::getpid()) + "-" +
                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (!opts.partition.empty()) {
    TESSERA_ASSIGN_OR_RETURN(job.ratios, parallel::parse_ratios(opts.partition, devices));
  }
  if (!opts.ffn_partition.empty()) {
    TESSERA_ASSIGN_OR_RETURN(job.ffn_ratios, parallel::parse_ratios(opts.ffn_partition, devices));
  }
  if (!opts.layers.empty()) {
    TESSERA_ASSIGN_OR_RETURN(parallel::LayerMap m, parallel::parse_layer_map(opts.layers, cfg.layers, devices));
    job.layer_map = m.device_of_layer;
  }
  std::string bind;
  if (cluster) {
    job.endpoints.push_back(cluster->terminal);
    for (const auto& w : cluster->workers) {
      TESSERA_ASSIGN_OR_RETURN(std::string data, next_port_endpoint(w));
      job.endpoints.push_back(data);
    }
    TESSERA_ASSIGN_OR_RETURN(bind, bind_form(cluster->terminal));
  } else {
    TESSERA_ASSIGN_OR_RETURN(job.endpoints, comm::pick_local_endpoints(devices));
  }
  job.key_file = opts.key_file;
  if (!opts.insecure && job.key_file.empty()) {  // local workers share an ephemeral key
    s->temp_key_ = "/tmp/tessera-key-" + job.group_id + ".json";
    TESSERA_ASSIGN_OR_RETURN(comm::ClusterKey key, comm::generate_cluster_key());
    TESSERA_RETURN_IF_ERROR(comm::write_key_file(s->temp_key_, key));
    job.key_file = s->temp_key_;
  }
  TESSERA_ASSIGN_OR_RETURN(s->plan_, job.plan(cfg));
  std::optional<comm::ClusterKey> key;
  if (!opts.insecure) {
    TESSERA_ASSIGN_OR_RETURN(key, comm::read_key_file(job.key_file));
  }
  const std::vector<int> cpus = opts.cpus_per_device > 0 && !cluster ? allowed_cpus() : std::vector<int>{};
  for (int r = 1; r < devices; ++r) {
    JobSpec w = job;
    w.rank = r;
    if (cluster) {
      w.key_file.clear();  // the daemon uses its own copy of the cluster key
      TESSERA_ASSIGN_OR_RETURN(std::string answer, comm::control_request(cluster->workers[static_cast<size_t>(r - 1)], key,
                                                                         w.to_json().dump(), comm::Millis(opts.timeout_ms)));
      json a = json::parse(answer, nullptr, false);
      if (a.is_discarded() || !a.is_object() || !a.contains("ok") || a["ok"] != true)
        return core::network_error("worker " + cluster->workers[static_cast<size_t>(r - 1)] + " refused the job: " +
                                   text_field(a, "error", "bad answer"));
      continue;
    }
    const std::string arg = w.to_json().dump();
    const pid_t pid = ::fork();
    if (pid < 0) return core::internal_error("fork failed: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the terminal
      if (!cpus.empty()) {  // inherited across exec
        const cpu_set_t set = device_cpus(cpus, r, opts.cpus_per_device);
        (void)::sched_setaffinity(0, sizeof(set), &set);
      }
      // BLAS threads are fixed when OpenBLAS loads (see kernels/gemm.h).
      ::setenv("OPENBLAS_NUM_THREADS", std::to_string(w.threads).c_str(), 1);
      const char* argv[] = {"tessera", "worker-job", "--job", arg.c_str(), nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    s->children_.push_back(pid);
  }
  if (!cpus.empty()) {  // the terminal is device 0 until the session ends
    s->unpinned_cpus_ = cpus;
    pin_all_threads(device_cpus(cpus, 0, opts.cpus_per_device));
  }
  TESSERA_ASSIGN_OR_RETURN(comm::GroupOptions go, group_options(job, key));
  go.bind_endpoint = bind;
  TESSERA_ASSIGN_OR_RETURN(s->group_, comm::Group::create(go));
  TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(opts.model_dir, parallel::load_options(s->plan_, cfg, 0)));
  s->model_ = std::make_unique<model::Transformer>(std::move(m));
  for (int r = 1; r < devices; ++r) {
    TESSERA_ASSIGN_OR_RETURN(json ready, recv_json(*s->group_, r, kToTerminalTag, comm::Millis(opts.timeout_ms)));
    if (ready["op"] == "error")
      return core::internal_error("worker " + std::to_string(r) + ": " + text_field(ready, "message", "failed"));
    if (ready["op"] != "ready") return core::invalid_argument("worker " + std::to_string(r) + " did not report ready");
    s->ready_.push_back(ready);
  }
  kernels::set_blas_threads(opts.threads_per_device);
  s->sync_ = std::make_unique<parallel::CommSynchronizer>(*s->group_, comm::Millis(opts.timeout_ms));
  return s;
}

Result<RunResult> Session::run(const RunRequest& req) {
  RunRequest r = req;
  r.model_dir = opts_.model_dir;
  TESSERA_ASSIGN_OR_RETURN(model::ModelInput in, build_input(*model_, r));
  if (!pool_) pool_ = std::make_unique<core::ThreadPool>(opts_.threads_per_device);
  core::ThreadPool& pool = *pool_;
  RunResult out;
  out.config = model_->config();
  out.input_ids = in.ids;
  core::Timer t;
  TESSERA_ASSIGN_OR_RETURN(Tensor x, model_->embed(in));
  const int64_t n = x.dim(0);
  const comm::Millis timeout(opts_.timeout_ms);
  for (int w = 1; w < group_->size(); ++w)
    TESSERA_RETURN_IF_ERROR(group_->send(w, kToWorkerTag, json_tensor({{"op", "run"}, {"n", n}}), timeout));
  // Counters cover the strategy's traffic, not the control messages.
  sync_->reset_stats();
  group_->reset_stats();
  TESSERA_ASSIGN_OR_RETURN(Tensor y, parallel::run_layers(*model_, plan_, *sync_, x, n, &pool));
  model_->finish_hidden(y, &pool);
  out.output.hidden.push_back(y);
  TESSERA_RETURN_IF_ERROR(model_->head(y, false, &out.output, &pool));
  out.latency_ms = t.ms();
  json ranks = json::array();
  ranks.push_back(rank_stats(*sync_, *group_, out.latency_ms, static_cast<int64_t>(model_->weights().bytes())));
  for (int w = 1; w < group_->size(); ++w) {
    TESSERA_ASSIGN_OR_RETURN(json done, recv_json(*group_, w, kToTerminalTag, timeout));
    if (done["op"] != "done") return core::invalid_argument("worker " + std::to_string(w) + " sent an unexpected reply");
    done.erase("op");
    TESSERA_RETURN_IF_ERROR(check_rank_stats(done, w));
    ranks.push_back(done);
  }
  stats_ = {{"strategy", parallel::strategy_name(plan_.strategy)},
            {"devices", group_->size()},
            {"threads_per_device", opts_.threads_per_device},
            {"link", opts_.link.empty() ? "unpaced" : opts_.link},
            {"rows", n},
            {"layers", model_->config().layers},
            {"latency_ms", out.latency_ms},
            {"ranks", ranks}};
  if (!r.dump_path.empty()) TESSERA_RETURN_IF_ERROR(write_dump(r.dump_path, out));
  return out;
}

Status Session::stop_workers() {
  if (group_)
    for (int w = 1; w < group_->size(); ++w)
      if (group_->peer_alive(w)) (void)group_->send(w, kToWorkerTag, json_tensor({{"op", "stop"}}), comm::Millis(2000));
  return core::ok_status();
}

Session::~Session() {
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
  if (!temp_key_.empty()) ::unlink(temp_key_.c_str());
  if (!unpinned_cpus_.empty()) pin_all_threads(device_cpus(unpinned_cpus_, 0, static_cast<int>(unpinned_cpus_.size())));
}

}  // namespace tessera::runtime
