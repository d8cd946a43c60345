#include "runtime/session.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/control.h"
#include "core/device_speed.h"
#include "core/duration.h"
#include "core/io.h"
#include "core/limits.h"
#include "core/logging.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"
#include "planner/cost_model.h"
#include "runtime/in_process.h"
#include "runtime/protocol.h"
#include "runtime/rank_figures.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

// fork() on one thread that lasts as long as the process, `child` run in the
// child: a child's PR_SET_PDEATHSIG signal comes when the *thread* that
// forked it ends, and serve starts a failover's session on a request's
// thread, which ends with its connection (its workers were killed then, a
// second or two into the new session). Returns the pid and fork's errno.
std::pair<pid_t, int> fork_on_lasting_thread(const std::function<void()>& child) {
  struct Forker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::packaged_task<std::pair<pid_t, int>()>> tasks;
    Forker() {
      std::thread([this] {
        for (;;) {
          std::packaged_task<std::pair<pid_t, int>()> task;
          {
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [this] { return !tasks.empty(); });
            task = std::move(tasks.front());
            tasks.pop_front();
          }
          task();
        }
      }).detach();
    }
  };
  static Forker* forker = new Forker();  // never destroyed: its thread runs until the process exits
  std::packaged_task<std::pair<pid_t, int>()> task([&child] {
    const pid_t pid = ::fork();
    if (pid == 0) {
      child();
      ::_exit(127);
    }
    return std::pair<pid_t, int>{pid, pid < 0 ? errno : 0};
  });
  std::future<std::pair<pid_t, int>> done = task.get_future();
  {
    std::lock_guard<std::mutex> l(forker->mu);
    forker->tasks.push_back(std::move(task));
  }
  forker->cv.notify_one();
  return done.get();
}

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

Status Session::check_options() {
  if (opts_.threads_per_device < 1) return core::invalid_argument("--threads-per-device must be >= 1");
  if (opts_.cpus_per_device < 0) return core::invalid_argument("--cpus-per-device must be >= 0");
  TESSERA_RETURN_IF_ERROR(core::check_duration(comm::Millis(opts_.timeout_ms), "--timeout"));
  if (opts_.run_timeout_ms != 0)
    TESSERA_RETURN_IF_ERROR(core::check_duration(comm::Millis(opts_.run_timeout_ms), "the run timeout"));
  if (opts_.cluster) {
    if (!opts_.insecure && opts_.key_file.empty())
      return core::invalid_argument("a cluster needs --key (the file every worker was started with) or --insecure");
    const int world = 1 + static_cast<int>(opts_.cluster->workers.size());
    if (opts_.plan.world != world)
      return core::invalid_argument("the plan has " + std::to_string(opts_.plan.world) + " devices, the cluster " +
                                    std::to_string(world));
  }
  if (opts_.max_batch < 1 || opts_.max_batch > msg::kMaxSlots)
    return core::invalid_argument("--max-batch must be in [1, " + std::to_string(msg::kMaxSlots) + "]");
  if (opts_.plan.world < 1 || opts_.plan.world > core::kMaxDevices)
    return core::invalid_argument("--devices must be in [1, " + std::to_string(core::kMaxDevices) + "]");
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
    TESSERA_ASSIGN_OR_RETURN(parallel::Schedule sched, parallel::estimate(plan_, cfg, rows));
    parallel::add_kv_cache(sched, plan_, cfg, opts_.budget_ctx, opts_.budget_kv_dtype);
    // A prefix cache keeps a whole set of caches per slot (one of them the
    // running generation's).
    const int64_t sets = slot_count();
    for (auto& dev : sched.devices)
      for (int64_t& b : dev.kv_layer_bytes) b *= sets;
    TESSERA_RETURN_IF_ERROR(planner::check_memory_budgets(sched, opts_.memory_limits));
  }
  JobSpec& job = job_;
  job.model_dir = opts_.model_dir;
  job.threads = opts_.threads_per_device;
  job.timeout_ms = opts_.timeout_ms;
  job.run_timeout_ms = opts_.run_timeout_ms;
  TESSERA_ASSIGN_OR_RETURN(job.link, inline_link_arg(opts_.link, plan_.world));
  job.insecure = opts_.insecure;
  job.plan = plan_;
  job.group_id = "tessera-" + std::to_string(::getpid()) + "-" +
                 std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  if (opts_.cluster) {
    job.endpoints.push_back(opts_.cluster->terminal);
    for (const auto& w : opts_.cluster->workers) {
      TESSERA_ASSIGN_OR_RETURN(std::string data, next_port_endpoint(w));
      job.endpoints.push_back(data);
    }
    TESSERA_ASSIGN_OR_RETURN(bind_, bind_form(opts_.cluster->terminal));
  } else {
    TESSERA_ASSIGN_OR_RETURN(listeners_, comm::bind_local_listeners(plan_.world));
    job.endpoints = listeners_.endpoints();
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
    const std::string& ep = opts_.cluster->workers[static_cast<size_t>(r - 1)];
    TESSERA_ASSIGN_OR_RETURN(std::string answer,
                             comm::control_request(ep, key_, to_text(w), comm::Millis(opts_.timeout_ms)));
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
    const int listen_fd = listeners_.fd(r);
    const std::string listen_arg = std::to_string(listen_fd);
    const std::string threads = std::to_string(w.threads);
    const auto [pid, err] = fork_on_lasting_thread([&] {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the terminal
      if (!cpus.empty()) {  // inherited across exec
        const cpu_set_t set = device_cpus(cpus, r, opts_.cpus_per_device);
        (void)::sched_setaffinity(0, sizeof(set), &set);
      }
      // These two descriptors survive exec: the key's pipe and the rank's socket.
      if (fds[0] >= 0) (void)::fcntl(fds[0], F_SETFD, 0);
      (void)::fcntl(listen_fd, F_SETFD, 0);
      // BLAS threads are fixed when OpenBLAS loads (see kernels/gemm.h).
      ::setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
      const char* argv[] = {"tessera",        "worker-job",        "--job", arg.c_str(), "--key-fd", key_fd.c_str(),
                            "--listen-fd", listen_arg.c_str(), nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    });
    if (pid < 0) {
      if (fds[0] >= 0) ::close(fds[0]);
      return core::internal_error("fork failed: " + std::string(std::strerror(err)));
    }
    if (fds[0] >= 0) ::close(fds[0]);
    listeners_.close(r);  // the child has its copy
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
  if (!opts_.cluster) go.bind_fd = listeners_.release(0);
  // With a short run timeout (serve's failover), a silent peer must not hold
  // the goodbye that frees the others for the next plan.
  if (opts_.run_timeout_ms > 0) go.close_timeout = std::min(go.close_timeout, comm::Millis(opts_.run_timeout_ms));
  TESSERA_ASSIGN_OR_RETURN(group_, comm::Group::create(go));
  start_heartbeats();  // workers that load faster than the terminal must not give up on it
  rss_before_load_ = memory_baseline();
  TESSERA_ASSIGN_OR_RETURN(model::Transformer m, parallel::load_rank_model(opts_.model_dir, plan_, cfg, 0));
  model_ = std::make_unique<model::Transformer>(std::move(m));
  for (int r = 1; r < plan_.world; ++r) {
    TESSERA_ASSIGN_OR_RETURN(const ToTerminal reply, recv_from_worker(*group_, r, comm::Millis(opts_.timeout_ms)));
    if (const auto* e = std::get_if<msg::Error>(&reply))
      return core::internal_error("worker " + std::to_string(r) + ": " + e->message);
    const auto* ready = std::get_if<msg::Ready>(&reply);
    if (ready == nullptr) return core::invalid_argument("worker " + std::to_string(r) + " did not report ready");
    ready_.push_back(*ready);
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
        if (group_->peer_alive(w)) (void)send_to_worker(*group_, w, msg::Ping{}, interval);
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

Result<std::unique_ptr<Session>> Session::start(const SessionOptions& opts) {
  std::unique_ptr<Session> s(new Session());
  s->opts_ = opts;
  TESSERA_RETURN_IF_ERROR(s->check_options());
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(opts.model_dir));
  TESSERA_RETURN_IF_ERROR(s->plan_job(cfg));
  TESSERA_RETURN_IF_ERROR(s->prepare_key());
  TESSERA_RETURN_IF_ERROR(s->opts_.cluster ? s->start_daemon_jobs() : s->fork_local_workers());
  TESSERA_RETURN_IF_ERROR(s->connect_and_load(cfg));
  // Batched generations share it from their own threads: made once, here,
  // rather than by whichever call comes first.
  if (s->opts_.max_batch > 1) s->pool_ = std::make_unique<core::ThreadPool>(s->opts_.threads_per_device);
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
      TESSERA_RETURN_IF_ERROR(send_to_worker(*group_, w, msg::Run{rows}, timeout));
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
  ranks.push_back(rank_stats(*sync_, *group_, latency_ms, static_cast<int64_t>(model_->loaded_bytes()), rss_before_load_));
  for (int w = 1; w < group_->size(); ++w) {
    TESSERA_ASSIGN_OR_RETURN(const ToTerminal reply, recv_from_worker(*group_, w, timeout));
    const auto* done = std::get_if<msg::Done>(&reply);
    if (done == nullptr) return core::invalid_argument("worker " + std::to_string(w) + " sent an unexpected reply");
    // The figures are printed with the rank they claim: it must be the sender's.
    if (!done->figures.contains("rank") || !done->figures["rank"].is_number_integer() || done->figures["rank"].get<int64_t>() != w)
      return core::invalid_argument("worker " + std::to_string(w) + " sent malformed figures");
    ranks.push_back(done->figures);
  }
  const std::lock_guard<std::mutex> l(stats_mu_);
  stats_ = {{"strategy", plan_.strategy},
            {"plan", plan_.to_json()},
            {"devices", group_->size()},
            {"threads_per_device", opts_.threads_per_device},
            {"link", opts_.link.empty() ? "unpaced" : opts_.link},
            {"layers", model_->config().layers},
            {"latency_ms", latency_ms},
            {"ranks", ranks}};
  if (plan_.decode) stats_["decode_strategy"] = plan_.decode->strategy;  // a pair: the steps' layout
  stats_.update(extra);
  return core::ok_status();
}

Status Session::tell_workers(const ToWorker& m, int upto) {
  const comm::Millis timeout(run_timeout_ms());  // serve's failover timeout notices a silent device
  for (int w = 1; w < std::min(upto, group_->size()); ++w) TESSERA_RETURN_IF_ERROR(send_to_worker(*group_, w, m, timeout));
  return core::ok_status();
}

Result<std::vector<int64_t>> Session::generate(const std::vector<int64_t>& prompt, const model::GenerateOptions& opts,
                                               int64_t* cached_tokens) {
  if (opts_.max_batch > 1) return generate_batched(prompt, opts, cached_tokens);
  const std::lock_guard<std::mutex> run_lock(run_mu_);
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan_.strategy));
  if (!pool_) pool_ = std::make_unique<core::ThreadPool>(opts_.threads_per_device);
  const model::CacheSpec spec = model::generation_cache(model_->config(), opts);
  // The prefix cache: the slot whose tokens share the longest prefix with
  // the prompt (its caches hold those positions), else the least recently
  // used one, started afresh. One prompt row is always computed: its logits
  // pick the first token.
  PrefixSlot* slot = nullptr;
  int64_t cached = 0;
  bool reuse = false;
  if (opts_.prefix_slots > 0) {
    if (prefix_.empty()) prefix_.resize(static_cast<size_t>(slot_count()));
    for (PrefixSlot& s : prefix_) {
      if (!s.dec || s.spec.positions != spec.positions || s.spec.dtype != spec.dtype) continue;
      const int64_t usable = model::reusable_prefix(s.tokens, prompt);
      if (usable > cached) cached = usable, slot = &s;
    }
    reuse = slot != nullptr;
    if (!reuse)
      slot = &*std::min_element(prefix_.begin(), prefix_.end(),
                                [](const PrefixSlot& a, const PrefixSlot& b) { return a.used < b.used; });
    slot->used = ++prefix_clock_;
    slot->tokens.clear();  // valid again only when this generation succeeds
  }
  model::GenerateOptions run_opts = opts;
  run_opts.cached_prefix = cached;
  std::unique_ptr<parallel::Decoder> own;
  parallel::Decoder* dec = nullptr;
  core::Timer t, decode_t;
  double prefill_ms = 0;
  int64_t steps = 0, processed = 0;
  // Pings flow between chunks (while the caller streams a token), and
  // during a chunk the terminal runs alone, not during one with the workers.
  auto layers = [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    std::unique_lock<std::mutex> wire_lock(wire_mu_);
    if (dec == nullptr) {
      const int64_t slot_index = slot == nullptr ? -1 : slot - prefix_.data();
      if (slot == nullptr) {
        TESSERA_ASSIGN_OR_RETURN(own, parallel::make_decoder(*strategy, *model_, plan_, *sync_, spec));
        dec = own.get();
      } else {
        if (!reuse) {
          slot->dec.reset();  // the old caches go before the new ones are allocated
          TESSERA_ASSIGN_OR_RETURN(slot->dec, parallel::make_decoder(*strategy, *model_, plan_, *sync_, spec));
          slot->spec = spec;
        }
        dec = slot->dec.get();
      }
      TESSERA_RETURN_IF_ERROR(
          tell_workers(msg::Generate{spec.positions, spec.dtype == core::DType::kF16, slot_index, reuse}));
    }
    const int64_t n = x.dim(0);
    // Only the ranks that take part (a pair's steps: its decode plan's):
    // the others would only wake for nothing.
    const int told = std::min(group_->size(), dec->ranks_in(n, pos0));
    TESSERA_RETURN_IF_ERROR(tell_workers(msg::Decode{n, pos0}, told));
    // The terminal alone (a pair's steps, a prompt after a reused prefix):
    // the idle workers still hear pings, however long the chunk.
    if (told <= 1) wire_lock.unlock();
    auto y = dec->forward(std::move(x), n, pos0, pool_.get());
    if (!wire_lock.owns_lock()) wire_lock.lock();
    if (y.ok()) processed = pos0 + n;
    if (pos0 == cached) {  // the figures cover the decode steps; the prefill is timed apart
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
    return model::generate_with(*model_, prompt, run_opts, pool_.get(), layers);
  }();
  if (dec != nullptr) {
    const std::lock_guard<std::mutex> wire_lock(wire_mu_);
    const double decode_ms = decode_t.ms();
    // The workers end the generation even when it failed; its own error comes first.
    Status st = tell_workers(msg::End{});
    if (st.ok())
      st = collect_stats(decode_ms, {{"rows", 1},
                                     {"prompt_tokens", prompt.size()},
                                     {"prefix_cached_tokens", cached},
                                     {"decode_steps", steps},
                                     {"prefill_ms", prefill_ms},
                                     {"decode_ms", decode_ms},
                                     {"ms_per_token", steps > 0 ? decode_ms / static_cast<double>(steps) : 0.0}});
    TESSERA_RETURN_IF_ERROR(seq.status());
    TESSERA_RETURN_IF_ERROR(st);
    // The slot's caches hold the positions every chunk computed; reusable
    // only when every rank ended the generation cleanly.
    if (slot != nullptr) slot->tokens.assign(seq->begin(), seq->begin() + processed);
  }
  if (cached_tokens != nullptr) *cached_tokens = cached;
  return seq;
}

Status Session::stop_workers() {
  if (group_)
    for (int w = 1; w < group_->size(); ++w)
      if (group_->peer_alive(w)) (void)send_to_worker(*group_, w, msg::Stop{}, comm::Millis(2000));
  return core::ok_status();
}

Session::~Session() {
  stop_heartbeats();
  (void)stop_workers();  // daemons end their side of the job on it
  if (group_) group_->close();
  // Give workers a moment to leave by themselves, then make sure (at once
  // when abandoned).
  const auto deadline = std::chrono::steady_clock::now() + (abandoned_ ? std::chrono::seconds(0) : std::chrono::seconds(5));
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
