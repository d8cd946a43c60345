// The engine of `tessera serve`: the session over the cluster's devices
// (runtime/deployment.h), failover and re-admission, and generation
// (Session::generate). The HTTP side is serve*.cpp (serve_server.h).
#include "runtime/serve_engine.h"

#include <malloc.h>

#include <algorithm>
#include <future>

#include "core/logging.h"
#include "model/chat.h"
#include "model/generate.h"

namespace tessera::runtime::serve_detail {

using Clock = std::chrono::steady_clock;

namespace {
constexpr int kMaxFailoversPerRequest = 8;
constexpr int kProbeWindowMs = 3000;  // how long a surviving daemon may take to be free again
}  // namespace

Status Engine::start() {
  TESSERA_ASSIGN_OR_RETURN(config_, model::load_config(opts_.cluster.options().model_dir));
  // Every plan (and every rank) loads this type; a quantized GGUF keeps its own unless told.
  if (opts_.weights != kernels::WeightType::kF32) config_.weights = opts_.weights;
  const std::string& dir = opts_.cluster.options().model_dir;
  auto tok = model::load_tokenizer(dir);
  if (tok.ok()) tokenizer_ = std::move(*tok);
  // A template that does not load is the user's to fix before serving.
  if (auto t = model::ChatTemplate::load(dir); t.ok()) {
    chat_ = std::make_unique<model::ChatTemplate>(std::move(*t));
  } else if (t.status().code() != core::ErrorCode::kNotFound) {
    return t.status().with_context("the chat template");
  }
  stop_ids_ = model::end_of_turn_ids(config_, tokenizer_.get(), chat_ ? chat_->eos_token() : "");
  Cluster c = opts_.cluster;
  if (opts_.plan.strategy == "auto") {
    // Every device profiled once, before serving: later plans use the
    // profiles of the devices left.
    TESSERA_RETURN_IF_ERROR(c.profile(config_, plan_rows(config_, 0)).status());
  }
  {
    std::lock_guard<std::mutex> l(view_mu_);
    cluster_ = std::move(c);
  }
  return start_session(true);
}

void Engine::stop() {
  std::lock_guard<std::mutex> l(view_mu_);
  session_.reset();
}

DeviceView Engine::view() const {
  std::lock_guard<std::mutex> l(view_mu_);
  return {cluster_ ? cluster_->devices() : std::vector<Device>{}, members_, session_ ? parallel::plan_name(session_->plan()) : "",
          session_ != nullptr};
}

void Engine::probe_dropped() {
  std::vector<std::string> dropped;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    if (!cluster_ || !cluster_->has_daemons()) return;
    for (const auto& d : cluster_->devices())
      if (!d.active && !d.endpoint.empty()) dropped.push_back(d.endpoint);
  }
  for (const auto& ep : dropped)
    if (probe(ep, std::chrono::milliseconds(300))) {
      std::lock_guard<std::mutex> l(view_mu_);
      if (std::find(back_.begin(), back_.end(), ep) == back_.end()) back_.push_back(ep);  // may wait a while
    }
}

Status Engine::with_failover(const std::function<Status(Session&)>& attempt) {
  for (int tries = 0;; ++tries) {
    std::shared_ptr<Session> s;
    uint64_t epoch = 0;  // which session (an address may be reused)
    {
      const std::lock_guard<std::mutex> l(engine_mu_);
      TESSERA_RETURN_IF_ERROR(ensure_session());
      s = session_;
      epoch = session_epoch_;
      ++users_;
    }
    const Status st = attempt(*s);
    s.reset();  // let go before a failover needs the old session gone
    std::unique_lock<std::mutex> l(engine_mu_);
    --users_;
    users_cv_.notify_all();
    if (st.ok() || !device_failure(st)) return st;
    if (tries >= kMaxFailoversPerRequest) return core::unavailable("devices keep failing: " + st.message());
    if (session_epoch_ != epoch) continue;  // another request failed it over already
    // The other requests on it fail at their next chunk or step (a batched
    // session breaks for all); the old session ends, its workers stopped
    // and daemons freed, only when the last of them lets go.
    users_cv_.wait_for(l, std::chrono::milliseconds(4 * opts_.failover_ms + 1000), [this] { return users_ == 0; });
    if (session_epoch_ == epoch) failover(st);
  }
}

void Engine::count_bytes(const Session& session) {
  const json stats = session.last_stats();
  if (!stats.contains("ranks")) return;
  std::vector<int> members;  // (a failover in another request may rewrite them)
  {
    std::lock_guard<std::mutex> l(view_mu_);
    members = members_;
  }
  for (const auto& r : stats["ranks"]) {
    const int rank = r.value("rank", -1);
    if (rank < 0 || rank >= static_cast<int>(members.size())) continue;
    metrics_.bytes(device(members[static_cast<size_t>(rank)]).name, r.value("bytes_sent", int64_t{0}));
  }
}

Result<std::vector<int64_t>> Engine::generate(Session& session, const std::vector<int64_t>& prompt,
                                      const model::GenerateOptions& opts) {
  int64_t cached = 0;
  auto seq = session.generate(prompt, opts, &cached);
  if (seq.ok() && session.prefix_slots() > 0) metrics_.prefix(cached > 0, cached);
  if (seq.ok() || seq.status().code() != core::ErrorCode::kUnimplemented) return seq;
  const std::lock_guard<std::mutex> l(fallback_mu_);
  if (!full_model_) {
    spdlog::warn("{}; generating on the terminal alone", seq.status().to_string());
    model::LoadOptions lo;
    lo.weights = opts_.weights;
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(opts_.cluster.options().model_dir, lo));
    full_model_ = std::make_unique<model::Transformer>(std::move(m));
    pool_ = std::make_unique<core::ThreadPool>(opts_.cluster.options().threads_per_device);
  }
  return model::generate(*full_model_, prompt, opts, pool_.get());
}

bool Engine::device_failure(const Status& st) {
  return st.code() == core::ErrorCode::kNetwork || st.code() == core::ErrorCode::kTimeout;
}

bool Engine::probe(const std::string& endpoint, std::chrono::milliseconds timeout) const {
  // Any answer will do: a daemon back in its loop answers.
  return comm::control_request(endpoint, cluster_->key(), kPingRequest, timeout).ok();
}

Status Engine::ensure_session() {
  bool readmit = false;
  // Returned devices join only when no request is on the session: a new
  // session's jobs would wait for daemons still in the old one's (a daemon
  // runs one job at a time), for up to --timeout.
  if (users_ == 0) {
    std::lock_guard<std::mutex> l(view_mu_);
    for (const auto& ep : back_)
      for (int d = 0; d < cluster_->size(); ++d)
        if (device(d).endpoint == ep && !device(d).active) {
          cluster_->set_active(d, true);
          readmit = true;
        }
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
  std::shared_ptr<Session> old;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    old = std::move(session_);
    ++session_epoch_;
    members_.clear();
  }
  old.reset();  // stops the workers that are left (outside the lock: it waits)
}

void Engine::failover(const Status& why) {
  metrics_.failover();
  std::vector<int> lost;
  const std::vector<int> members = members_;
  // A daemon's lost connection is no proof it died: a survivor's job ends
  // when its collective with the dead rank fails, and it drops the
  // connection too. The probes below judge daemons; lost connections judge
  // the others.
  for (int r : session_->lost_workers()) {
    const int d = members[static_cast<size_t>(r)];
    if (!cluster_->has_daemons() || device(d).endpoint.empty()) lost.push_back(d);
  }
  session_->abandon();  // a stopped worker must not hold the failover for 5 s
  reset_session();
  if (cluster_->has_daemons()) {
    // A daemon answers once its side of the old job has ended, which
    // waits for the terminal's goodbye: a few tries before giving up.
    const auto deadline = Clock::now() + std::chrono::milliseconds(kProbeWindowMs);
    std::vector<std::future<bool>> answers;
    for (size_t r = 1; r < members.size(); ++r)
      answers.push_back(std::async(std::launch::async, [this, deadline, ep = device(members[r]).endpoint] {
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
    cluster_->set_active(d, false);
    names += (names.empty() ? "" : ", ") + device(d).name;
  }
  spdlog::warn("serve: failover #{}: {} ({}); dropped {}", metrics_.failovers(), why.message(),
               core::error_code_name(why.code()), names.empty() ? "nothing" : names);
}

// As many generations' caches as --prefix-cache-mb holds on the device
// whose caches are largest (each slot holds a whole context).
int Engine::prefix_slots(const Deployment& d) const {
  if (opts_.prefix_cache_mb <= 0 || !config_.causal_lm()) return 0;
  parallel::Plan plan = d.plan;  // a named strategy's plan is completed only when the session starts
  if (!parallel::complete_plan(plan, config_).ok()) return 0;
  const int64_t ctx = model::context_size(config_, opts_.ctx_size);
  int64_t largest = 1;
  for (int r = 0; r < plan.world; ++r)
    largest = std::max(largest, parallel::kv_cache_bytes(plan, config_, r, ctx, opts_.kv_dtype));
  int64_t slots = std::min<int64_t>(opts_.prefix_cache_mb * 1000 * 1000 / largest, msg::kMaxPrefixSlots);
  if (slots < 1)
    spdlog::warn("serve: --prefix-cache-mb {} holds no generation's caches ({} MB each); the prefix cache is off",
                 opts_.prefix_cache_mb, (largest + 999999) / 1000000);
  // Each slot is a whole set of caches on every rank: no more than every
  // rank's budget holds beside its weights (the session checks the same).
  const std::vector<int64_t>& limits = d.session.memory_limits;
  if (slots > 1 && !limits.empty()) {
    const int64_t rows = d.session.budget_rows > 0 ? d.session.budget_rows : config_.max_rows();
    if (auto mem = predicted_memory(plan, config_, rows, ctx, opts_.kv_dtype); mem.ok()) {
      const int64_t before = slots;
      for (int r = 0; r < plan.world && static_cast<size_t>(r) < limits.size() && static_cast<size_t>(r) < mem->size(); ++r) {
        const int64_t kv = parallel::kv_cache_bytes(plan, config_, r, ctx, opts_.kv_dtype);
        const int64_t limit = limits[static_cast<size_t>(r)];
        if (kv > 0 && limit > 0) slots = std::min(slots, std::max<int64_t>(1, 1 + (limit - (*mem)[static_cast<size_t>(r)]) / kv));
      }
      if (slots < before)
        spdlog::warn("serve: the devices' memory budgets hold {} prefix-cache slot(s), not the {} of --prefix-cache-mb",
                     slots, before);
    }
  }
  return static_cast<int>(std::max<int64_t>(slots, 0));
}

Status Engine::start_session(bool first) {
  std::vector<int> avail;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    avail = cluster_->active();
  }
  Status last = core::ok_status();
  for (int world = static_cast<int>(avail.size()); world >= 1; --world) {
    DeployRequest req;
    req.plan = world == 1 ? parallel::single_device_plan() : opts_.plan;  // down to the terminal alone
    req.rows = 0;  // planned for plan_rows' default
    req.run_timeout_ms = opts_.failover_ms;
    if (config_.causal_lm()) {
      req.ctx_size = model::context_size(config_, opts_.ctx_size);
      // Requests differ; auto prices a completion of OpenAI's default length
      // (16 tokens) with its decode steps, so a plan whose prompt is fast
      // but whose steps are slow is not taken for it.
      req.new_tokens = 16;
      // With continuous batching, priced for a full batch: each of
      // --max-batch sequences waits a batched step a token.
      req.decode_batch = std::max<int64_t>(opts_.max_batch, 1);
    }
    req.kv_dtype = opts_.kv_dtype;
    req.lossy = opts_.lossy;
    req.max_loss = opts_.max_loss;
    req.calibration = opts_.calibration;
    auto d = deploy(*cluster_, config_, req, std::vector<int>(avail.begin(), avail.begin() + world));
    if (!d.ok()) {
      last = d.status();
      spdlog::warn("serve: no plan over {} device(s): {}", world, last.to_string());
      continue;
    }
    // Budgets are checked for the model's longest input (the server takes any request).
    d->session.budget_rows = 0;
    d->session.prefix_slots = prefix_slots(*d);
    if (config_.causal_lm() && opts_.max_batch > 1) {
      d->session.max_batch = opts_.max_batch;
      d->session.prefill_chunk = opts_.prefill_chunk;
      d->session.on_batch_step = [m = &metrics_](int rows) { m->batch_step(rows); };
    }
    auto s = Session::start(d->session);
    if (s.ok()) {
      std::lock_guard<std::mutex> l(view_mu_);
      session_ = std::move(*s);
      ++session_epoch_;
      // The replaced session's model part and buffers were freed; hand the
      // pages back so that failovers do not ratchet the server's RSS.
      ::malloc_trim(0);
      members_ = d->members;
      spdlog::info("serve: {} over {} device(s){}{}", parallel::plan_name(d->plan), members_.size(),
                   d->session.max_batch > 1 ? fmt::format(", batches of up to {}", d->session.max_batch) : std::string(),
                   d->chosen && d->chosen->measured_loss >= 0
                       ? fmt::format(", measured top-1 disagreement {:.2f}% (--max-loss {:.2f}%)",
                                     100.0 * d->chosen->measured_loss, 100.0 * opts_.max_loss)
                       : std::string());
      return core::ok_status();
    }
    last = s.status();
    spdlog::warn("serve: starting {} over {} device(s) failed: {}", parallel::plan_name(d->plan), world, last.to_string());
    if (first) return last;  // at start, a wrong setup is the user's to fix
  }
  return core::unavailable("no device can serve this model: " + last.message());
}

}  // namespace tessera::runtime::serve_detail
