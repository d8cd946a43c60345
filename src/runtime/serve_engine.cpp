// The engine of `tessera serve`: the devices, the session over them,
// failover and re-admission, and generation (Session::generate). The HTTP
// side is serve.cpp.
#include "runtime/serve_engine.h"

#include <malloc.h>

#include <algorithm>
#include <future>

#include "core/logging.h"
#include "model/generate.h"

namespace tessera::runtime::serve_detail {

using Clock = std::chrono::steady_clock;

namespace {
constexpr int kMaxFailoversPerRequest = 8;
constexpr int kProbeWindowMs = 3000;  // how long a surviving daemon may take to be free again
}  // namespace

// A Status that carries the HTTP status to answer with.
Status http_error(int status, const std::string& message) {
  return {core::ErrorCode::kResourceExhausted, "HTTP " + std::to_string(status) + ": " + message};
}

Status Engine::start() {
  TESSERA_ASSIGN_OR_RETURN(config_, model::load_config(opts_.dist.model_dir));
  auto tok = model::load_tokenizer(opts_.dist.model_dir);
  if (tok.ok()) tokenizer_ = std::move(*tok);
  devices_.push_back({"terminal", "", true});
  cluster_ = opts_.dist.cluster;
  if (!cluster_ && !opts_.dist.cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(cluster_, load_cluster_file(opts_.dist.cluster_file));
  }
  if (cluster_) {
    for (const auto& w : cluster_->workers) devices_.push_back({w, w, true});
    if (!opts_.dist.insecure) {
      TESSERA_ASSIGN_OR_RETURN(key_, comm::read_key_file(opts_.dist.key_file));
    }
  } else {
    for (int r = 1; r < opts_.dist.plan.world; ++r) devices_.push_back({"local-" + std::to_string(r), "", true});
  }
  return start_session(true);
}

void Engine::stop() {
  std::lock_guard<std::mutex> l(view_mu_);
  session_.reset();
}

DeviceView Engine::view() const {
  std::lock_guard<std::mutex> l(view_mu_);
  return {devices_, members_, session_ ? session_->plan().strategy : "", session_ != nullptr};
}

void Engine::probe_dropped() {
  std::vector<std::string> dropped;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    if (!cluster_) return;
    for (const auto& d : devices_)
      if (!d.active && !d.endpoint.empty()) dropped.push_back(d.endpoint);
  }
  for (const auto& ep : dropped)
    if (probe(ep, std::chrono::milliseconds(300))) {
      std::lock_guard<std::mutex> l(view_mu_);
      back_.push_back(ep);
    }
}

Status Engine::with_failover(const std::function<Status(Session&)>& attempt) {
  for (int tries = 0;; ++tries) {
    TESSERA_RETURN_IF_ERROR(ensure_session());
    Status st = attempt(*session_);
    if (st.ok() || !device_failure(st)) return st;
    if (tries >= kMaxFailoversPerRequest) return http_error(503, "devices keep failing: " + st.message());
    failover(st);
  }
}

void Engine::count_bytes() {
  const json& stats = session_->last_stats();
  if (!stats.contains("ranks")) return;
  for (const auto& r : stats["ranks"]) {
    const int rank = r.value("rank", -1);
    if (rank < 0 || rank >= static_cast<int>(members_.size())) continue;
    metrics_.bytes(devices_[static_cast<size_t>(members_[static_cast<size_t>(rank)])].name, r.value("bytes_sent", int64_t{0}));
  }
}

Result<std::vector<int64_t>> Engine::generate(Session& session, const std::vector<int64_t>& prompt,
                                      const model::GenerateOptions& opts) {
  auto seq = session.generate(prompt, opts);
  if (seq.ok() || seq.status().code() != core::ErrorCode::kUnimplemented) return seq;
  if (!full_model_) {
    spdlog::warn("{}; generating on the terminal alone", seq.status().to_string());
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(opts_.dist.model_dir));
    full_model_ = std::make_unique<model::Transformer>(std::move(m));
    pool_ = std::make_unique<core::ThreadPool>(opts_.dist.threads_per_device);
  }
  return model::generate(*full_model_, prompt, opts, pool_.get());
}

bool Engine::device_failure(const Status& st) {
  return st.code() == core::ErrorCode::kNetwork || st.code() == core::ErrorCode::kTimeout;
}

bool Engine::probe(const std::string& endpoint, std::chrono::milliseconds timeout) const {
  // Any answer will do: a daemon back in its loop answers.
  return comm::control_request(endpoint, key_, kPingRequest, timeout).ok();
}

Status Engine::ensure_session() {
  bool readmit = false;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    for (const auto& ep : back_)
      for (auto& d : devices_)
        if (d.endpoint == ep && !d.active) d.active = readmit = true;
    back_.clear();
  }
  if (readmit) {
    spdlog::info("serve: re-admitting returned devices");
    reset_session();
    return start_session(false);
  }
  // A device the heartbeats found gone is dropped before the request runs.
  if (session_ && !session_->lost_workers().empty())
    failover(core::network_error("a device was lost between requests"));
  if (session_) return core::ok_status();
  return start_session(false);
}

void Engine::reset_session() {
  std::unique_ptr<Session> old;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    old = std::move(session_);
    members_.clear();
  }
  old.reset();  // stops the workers that are left (outside the lock: it waits)
}

void Engine::failover(const Status& why) {
  metrics_.failover();
  std::vector<int> lost;
  for (int r : session_->lost_workers()) lost.push_back(members_[static_cast<size_t>(r)]);
  const std::vector<int> members = members_;
  reset_session();
  if (cluster_) {
    // A daemon answers once its side of the old job has ended, which
    // waits for the terminal's goodbye: a few tries before giving up.
    const auto deadline = Clock::now() + std::chrono::milliseconds(kProbeWindowMs);
    std::vector<std::future<bool>> answers;
    for (size_t r = 1; r < members.size(); ++r)
      answers.push_back(std::async(std::launch::async, [this, deadline, ep = devices_[static_cast<size_t>(members[r])].endpoint] {
        do {
          if (probe(ep, std::chrono::milliseconds(300))) return true;
        } while (Clock::now() < deadline);
        return false;
      }));
    for (size_t r = 1; r < members.size(); ++r)
      if (!answers[r - 1].get()) lost.push_back(members[r]);
  }
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  if (lost.empty() && members.size() > 1) lost.push_back(members.back());
  std::lock_guard<std::mutex> l(view_mu_);
  std::string names;
  for (int d : lost) {
    devices_[static_cast<size_t>(d)].active = false;
    names += (names.empty() ? "" : ", ") + devices_[static_cast<size_t>(d)].name;
  }
  spdlog::warn("serve: failover #{}: {} ({}); dropped {}", metrics_.failovers(), why.message(),
               core::error_code_name(why.code()), names.empty() ? "nothing" : names);
}

Status Engine::start_session(bool first) {
  std::vector<int> avail;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    for (size_t d = 0; d < devices_.size(); ++d)
      if (devices_[d].active) avail.push_back(static_cast<int>(d));
  }
  Status last = core::ok_status();
  for (int world = static_cast<int>(avail.size()); world >= 1; --world) {
    PlanChoice choice;
    if (world == 1) {
      choice.plan.strategy = "single";
      choice.plan.world = 1;
    } else {
      auto c = opts_.plan_for(std::vector<int>(avail.begin(), avail.begin() + world));
      if (!c.ok()) {
        last = c.status();
        spdlog::warn("serve: no plan over {} device(s): {}", world, last.to_string());
        continue;
      }
      choice = *c;
    }
    std::vector<int> members;
    if (choice.members.empty())
      members.assign(avail.begin(), avail.begin() + choice.plan.world);
    else
      for (int m : choice.members) members.push_back(avail[static_cast<size_t>(m)]);
    DistributedOptions d = opts_.dist;
    d.plan = choice.plan;
    d.run_timeout_ms = opts_.failover_ms;
    d.cluster_file.clear();
    d.cluster.reset();
    if (cluster_ && members.size() > 1) {
      ClusterFile c = *cluster_;  // the subset of its workers in this plan, with their budgets
      c.workers.clear();
      c.memory.resize(1);
      for (size_t r = 1; r < members.size(); ++r) {
        c.workers.push_back(devices_[static_cast<size_t>(members[r])].endpoint);
        const auto m = static_cast<size_t>(members[r]);
        c.memory.push_back(m < cluster_->memory.size() ? cluster_->memory[m] : 0);
      }
      d.cluster = c;
    }
    if (!opts_.dist.memory_limits.empty()) {
      d.memory_limits.clear();
      for (int m : members) d.memory_limits.push_back(opts_.dist.memory_limits[static_cast<size_t>(m)]);
    }
    auto s = Session::start(d);
    if (s.ok()) {
      std::lock_guard<std::mutex> l(view_mu_);
      session_ = std::move(*s);
      // The replaced session's model part and buffers were freed; hand the
      // pages back so that failovers do not ratchet the server's RSS.
      ::malloc_trim(0);
      members_ = members;
      spdlog::info("serve: {} over {} device(s)", choice.plan.strategy, members.size());
      return core::ok_status();
    }
    last = s.status();
    spdlog::warn("serve: starting {} over {} device(s) failed: {}", choice.plan.strategy, world, last.to_string());
    if (first) return last;  // at start, a wrong setup is the user's to fix
  }
  return http_error(503, "no device can serve this model: " + last.message());
}

}  // namespace tessera::runtime::serve_detail
