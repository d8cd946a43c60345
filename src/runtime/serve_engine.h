// Inside `tessera serve` (serve.h is its interface): the /metrics counters
// and the engine the HTTP server drives. The engine owns the devices, the
// session over them, failover and re-admission, and generation.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "comm/control.h"
#include "model/generate.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "runtime/serve.h"

namespace tessera::runtime::serve_detail {

using core::Result;
using core::Status;
using nlohmann::json;

// --- /metrics --------------------------------------------------------------

// A Prometheus histogram of seconds.
class Histogram {
 public:
  Histogram() = default;
  explicit Histogram(std::vector<double> buckets) : buckets_(std::move(buckets)), counts_(buckets_.size() + 1) {}
  void add(double seconds) {
    size_t b = 0;
    while (b < buckets_.size() && seconds > buckets_[b]) ++b;
    ++counts_[b];
    sum_ += seconds;
    ++count_;
  }
  void render(std::ostringstream& o, const char* name, const char* help) const {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    int64_t cum = 0;
    for (size_t b = 0; b <= buckets_.size(); ++b) {
      cum += counts_[b];
      o << name << "_bucket{le=\"";
      if (b < buckets_.size()) o << buckets_[b];
      else o << "+Inf";
      o << "\"} " << cum << '\n';
    }
    o << name << "_sum " << sum_ << '\n' << name << "_count " << count_ << '\n';
  }

 private:
  std::vector<double> buckets_{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  std::vector<int64_t> counts_ = std::vector<int64_t>(buckets_.size() + 1);
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  void request(int status, double seconds) {
    std::lock_guard<std::mutex> l(mu_);
    ++by_status_[status];
    duration_.add(seconds);
  }
  // A generated token: the first of a request `since` its arrival (time to
  // first token), a later one `since` the one before (inter-token latency).
  void token(bool first, double since) {
    std::lock_guard<std::mutex> l(mu_);
    ++tokens_;
    (first ? ttft_ : itl_).add(since);
  }
  void bytes(const std::string& device, int64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    bytes_[device] += n;
  }
  void failover() { ++failovers_; }
  // A generation with the prefix cache on: whether it found a cached prefix,
  // and how many prompt positions it did not prefill.
  void prefix(bool hit, int64_t cached_tokens) {
    ++prefix_lookups_;
    if (hit) ++prefix_hits_;
    prefix_tokens_ += cached_tokens;
  }
  void abandoned() { ++abandoned_; }
  // A batched decode step (serve --max-batch) of `rows` sequences.
  void batch_step(int rows) {
    std::lock_guard<std::mutex> l(mu_);
    occupancy_.add(rows);
  }
  int64_t failovers() const { return failovers_; }

  std::string render(int queue_depth, int active, int dropped) const {
    std::lock_guard<std::mutex> l(mu_);
    std::ostringstream o;
    o << "# HELP tessera_requests_total Requests answered, by HTTP status.\n# TYPE tessera_requests_total counter\n";
    for (const auto& [s, n] : by_status_) o << "tessera_requests_total{status=\"" << s << "\"} " << n << '\n';
    duration_.render(o, "tessera_request_duration_seconds", "Time from request to the last byte of the answer.");
    o << "# HELP tessera_tokens_generated_total Tokens generated (its rate is the tokens/s).\n"
         "# TYPE tessera_tokens_generated_total counter\ntessera_tokens_generated_total "
      << tokens_ << '\n';
    ttft_.render(o, "tessera_time_to_first_token_seconds", "From a generation request's arrival to its first token.");
    itl_.render(o, "tessera_inter_token_seconds", "Between two tokens of one generation.");
    o << "# HELP tessera_device_bytes_sent_total Bytes each device sent for the requests.\n"
         "# TYPE tessera_device_bytes_sent_total counter\n";
    for (const auto& [d, n] : bytes_) o << "tessera_device_bytes_sent_total{device=\"" << d << "\"} " << n << '\n';
    o << "# HELP tessera_failovers_total Devices dropped and plans remade.\n# TYPE tessera_failovers_total counter\n"
      << "tessera_failovers_total " << failovers_.load() << '\n';
    o << "# HELP tessera_requests_abandoned_total Whole (not streamed) generations stopped because the client left.\n"
         "# TYPE tessera_requests_abandoned_total counter\ntessera_requests_abandoned_total "
      << abandoned_.load() << '\n';
    o << "# HELP tessera_prefix_cache_lookups_total Generations that looked for a cached prompt prefix.\n"
         "# TYPE tessera_prefix_cache_lookups_total counter\ntessera_prefix_cache_lookups_total "
      << prefix_lookups_.load() << '\n';
    o << "# HELP tessera_prefix_cache_hits_total Generations whose prompt started with a cached prefix.\n"
         "# TYPE tessera_prefix_cache_hits_total counter\ntessera_prefix_cache_hits_total "
      << prefix_hits_.load() << '\n';
    o << "# HELP tessera_prefix_cache_tokens_total Prompt tokens taken from the prefix cache, not prefilled.\n"
         "# TYPE tessera_prefix_cache_tokens_total counter\ntessera_prefix_cache_tokens_total "
      << prefix_tokens_.load() << '\n';
    occupancy_.render(o, "tessera_batch_occupancy", "Sequences in each batched decode step (--max-batch).");
    o << "# HELP tessera_queue_depth Requests admitted and not yet answered.\n# TYPE tessera_queue_depth gauge\n"
      << "tessera_queue_depth " << queue_depth << '\n';
    o << "# HELP tessera_devices Devices by state.\n# TYPE tessera_devices gauge\n"
      << "tessera_devices{state=\"active\"} " << active << "\ntessera_devices{state=\"dropped\"} " << dropped << '\n';
    return o.str();
  }

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> by_status_;
  Histogram duration_, ttft_, itl_;
  Histogram occupancy_{{1, 2, 4, 8, 16, 32}};
  int64_t tokens_ = 0;
  std::map<std::string, int64_t> bytes_;
  std::atomic<int64_t> failovers_{0};
  std::atomic<int64_t> abandoned_{0};
  std::atomic<int64_t> prefix_lookups_{0}, prefix_hits_{0}, prefix_tokens_{0};
};

// --- the engine: devices, the session, failover ------------------------------

struct DeviceView {
  std::vector<Device> devices;
  std::vector<int> members;
  std::string strategy;
  bool serving = false;
};

class Engine {
 public:
  Engine(const ServeOptions& opts, Metrics& metrics) : opts_(opts), metrics_(metrics) {}

  Status start();
  void stop();

  const model::ModelConfig& config() const { return config_; }
  const model::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // The model's chat template (null: none) and the ids that end a turn
  // (model/chat.h): the config's and generation_config.json's eos ids and
  // the template's eos_token.
  const model::ChatTemplate* chat_template() const { return chat_.get(); }
  bool ends_turn(int64_t id) const { return std::binary_search(stop_ids_.begin(), stop_ids_.end(), id); }

  DeviceView view() const;
  // Dropped daemons that answer again: asked from a thread of their own, so
  // that a request never waits on a probe; re-admitted before the next one.
  void probe_dropped();
  // A request's model work, replayed on a new plan when a device fails.
  // Safe from concurrent requests (--max-batch): the first to see a
  // session fail fails it over, once the others have let go of it.
  Status with_failover(const std::function<Status(Session&)>& attempt);
  void count_bytes(const Session& session);
  // Generation runs on the session's devices with a KV cache on each
  // (Session::generate); a failure of `session` here triggers the failover,
  // which resumes from the tokens already produced. A plan whose strategy
  // cannot decode (sp, voltage, prism, bp: docs/generation.md) generates on
  // a full model the terminal loads once instead.
  Result<std::vector<int64_t>> generate(Session& session, const std::vector<int64_t>& prompt,
                                        const model::GenerateOptions& opts);

 private:
  static bool device_failure(const Status& st);
  bool probe(const std::string& endpoint, std::chrono::milliseconds timeout) const;
  Status ensure_session();
  void reset_session();
  // Drops the failed devices: a lost connection names them; otherwise each
  // daemon is asked (the silent one does not answer). A local worker that is
  // merely silent cannot be told apart; the last one is dropped (they are alike).
  void failover(const Status& why);
  // A session over the active devices: the deployment over all of them, or
  // over fewer when that fails (a strategy that cannot split over this
  // many), down to the terminal alone if its budget allows.
  Status start_session(bool first);
  int prefix_slots(const Deployment& d) const;
  const Device& device(int d) const { return cluster_->devices()[static_cast<size_t>(d)]; }

  const ServeOptions& opts_;
  Metrics& metrics_;
  model::ModelConfig config_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::unique_ptr<model::ChatTemplate> chat_;
  std::vector<int64_t> stop_ids_;  // sorted
  // The session's life: ensure_session, failover and start_session run
  // under it, one request at a time; users_ counts the requests in an attempt.
  std::mutex engine_mu_;
  std::condition_variable users_cv_;
  int users_ = 0;
  uint64_t session_epoch_ = 0;  // counts the sessions started and ended
  mutable std::mutex view_mu_;  // the cluster's membership, members_ and session_ (the pointer) for /health
  std::optional<Cluster> cluster_;  // set by start()
  std::vector<int> members_;
  std::shared_ptr<Session> session_;
  std::mutex fallback_mu_;  // full_model_ and pool_: one generation at a time
  std::vector<std::string> back_;  // dropped daemons that answered a probe
  std::unique_ptr<model::Transformer> full_model_;  // generation when the plan cannot decode (see generate)
  std::unique_ptr<core::ThreadPool> pool_;
};

}  // namespace tessera::runtime::serve_detail
