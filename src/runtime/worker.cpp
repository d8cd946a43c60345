#include "runtime/worker.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/device_speed.h"
#include "core/io.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "model/transformer.h"
#include "parallel/strategy.h"
#include "runtime/comm_sync.h"
#include "runtime/daemon.h"
#include "runtime/protocol.h"
#include "runtime/rank_figures.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

// Copies a group's figures out when a worker's job ends, whichever way.
struct StatsOnExit {
  const comm::Group* group;
  comm::CommStats* out;
  ~StatsOnExit() {
    if (out != nullptr) *out = group->stats();
  }
};

// What a worker holds for the length of a job, and its answer to each
// request: one overload per message (std::visit), so that a message the
// protocol adds is a compile error here until it is handled.
class WorkerLoop {
 public:
  WorkerLoop(const JobSpec& job, comm::Group& group, const model::Transformer& model, const parallel::Plan& plan,
             const parallel::Strategy& strategy, int64_t weight_bytes, int64_t rss_before_load)
      : job_(job), group_(group), model_(model), plan_(plan), strategy_(strategy), pool_(job.threads),
        sync_(group, comm::Millis(job.run_timeout_ms > 0 ? job.run_timeout_ms : job.timeout_ms)), weight_bytes_(weight_bytes),
        rss_before_load_(rss_before_load) {}

  // Until "stop" (ok) or an error; `silence` ends a job whose terminal
  // stopped pinging.
  Status serve(comm::Millis silence) {
    for (;;) {
      auto req = recv_from_terminal(group_, silence);
      if (!req.ok() && req.status().code() == core::ErrorCode::kTimeout)
        return core::timeout_error("the terminal missed its heartbeats for " + std::to_string(silence.count()) + " ms");
      if (!req.ok()) return req.status();
      if (std::holds_alternative<msg::Stop>(*req)) return core::ok_status();
      TESSERA_RETURN_IF_ERROR(std::visit([this](const auto& m) { return handle(m); }, *req));
    }
  }

 private:
  Status handle(const msg::Stop&) { return core::ok_status(); }
  Status handle(const msg::Ping&) { return core::ok_status(); }

  Status handle(const msg::Run& r) {
    if (r.n > model_.config().max_rows()) return core::out_of_range("request of " + std::to_string(r.n) + " rows");
    sync_.reset_stats();
    group_.reset_stats();
    core::Timer t;
    TESSERA_RETURN_IF_ERROR(parallel::run_layers(model_, plan_, sync_, Tensor(), r.n, &pool_).status());
    core::settle_device_speed();
    return send_done(t.ms());
  }

  // A generation: "generate" makes the decoder (the previous request's
  // caches go first), one "decode" per chunk, "end" drops the caches. With
  // a prefix-cache slot the decoder stays in the slot after "end", and a
  // later "generate" may continue its caches (reuse).
  Status handle(const msg::Generate& g) {
    if (g.positions > model_.config().max_positions)
      return core::out_of_range("a generation of " + std::to_string(g.positions) + " positions");
    dec_ = nullptr;
    own_.reset();
    positions_ = g.positions;
    const model::CacheSpec spec{positions_, g.kv_f16 ? core::DType::kF16 : core::DType::kF32};
    if (g.slot < 0) {
      TESSERA_ASSIGN_OR_RETURN(own_, parallel::make_decoder(strategy_, model_, plan_, sync_, spec));
      dec_ = own_.get();
    } else {
      if (static_cast<size_t>(g.slot) >= slots_.size()) slots_.resize(static_cast<size_t>(g.slot) + 1);
      Slot& s = slots_[static_cast<size_t>(g.slot)];
      if (g.reuse) {
        if (!s.dec || s.spec.positions != spec.positions || s.spec.dtype != spec.dtype)
          return core::invalid_argument("prefix-cache slot " + std::to_string(g.slot) + " holds no caches of this shape");
      } else {
        s.dec.reset();  // the slot's old caches go before the new ones are allocated
        TESSERA_ASSIGN_OR_RETURN(s.dec, parallel::make_decoder(strategy_, model_, plan_, sync_, spec));
        s.spec = spec;
      }
      dec_ = s.dec.get();
    }
    first_chunk_ = true;
    // A rank outside a pair's decode plan may hear of no chunk at all (a
    // prompt after a reused prefix): its figures start from nothing here.
    sync_.reset_stats();
    group_.reset_stats();
    decode_ms_ = 0;
    core::settle_device_speed();
    return core::ok_status();
  }

  Status handle(const msg::Decode& d) {
    if (dec_ == nullptr) return core::invalid_argument("a decode step outside a generation");
    if (d.pos + d.n > positions_)
      return core::out_of_range("decode rows " + std::to_string(d.pos) + ".." + std::to_string(d.pos + d.n - 1) +
                                " outside the cache");
    core::Timer step;
    TESSERA_RETURN_IF_ERROR(dec_->forward(Tensor(), d.n, d.pos, &pool_).status());
    core::settle_device_speed();
    // The figures cover the decode steps, not the prefill (the first chunk,
    // which starts after a reused prefix).
    if (first_chunk_) {
      first_chunk_ = false;
      sync_.reset_stats();
      group_.reset_stats();
      decode_ms_ = 0;
    } else {
      decode_ms_ += step.ms();  // time in steps: idle time between them is neither compute nor waiting
    }
    return core::ok_status();
  }

  Status handle(const msg::End&) {
    dec_ = nullptr;
    own_.reset();
    return send_done(decode_ms_);
  }

  // Continuous batching: one row of each slot's sequence, every slot's
  // decoder left there by its generation's "end". Checked before any
  // collective, as the terminal checked it: a refusal stops no rank halfway.
  Status handle(const msg::Step& s) {
    if (dec_ != nullptr) return core::invalid_argument("a batched step during a generation");
    std::vector<parallel::Decoder*> decs;
    for (size_t i = 0; i < s.slots.size(); ++i) {
      const auto slot = static_cast<size_t>(s.slots[i]);
      if (slot >= slots_.size() || !slots_[slot].dec)
        return core::invalid_argument("a batched step of slot " + std::to_string(slot) + ", which holds no generation");
      if (s.pos[i] >= slots_[slot].spec.positions)
        return core::out_of_range("a batched step at position " + std::to_string(s.pos[i]) + " of a " +
                                  std::to_string(slots_[slot].spec.positions) + "-position cache");
      decs.push_back(slots_[slot].dec.get());
    }
    if (!s.groups.empty()) TESSERA_RETURN_IF_ERROR(parallel::step_stages(decs, s.groups, Tensor(), s.pos, &pool_).status());
    else TESSERA_RETURN_IF_ERROR(parallel::step_rows(decs, Tensor(), s.pos, &pool_).status());
    core::settle_device_speed();
    return core::ok_status();
  }

  Status send_done(double ms) {
    return send_to_terminal(group_, msg::Done{rank_stats(sync_, group_, ms, weight_bytes_, rss_before_load_)},
                            comm::Millis(job_.timeout_ms));
  }

  const JobSpec& job_;
  comm::Group& group_;
  const model::Transformer& model_;
  const parallel::Plan& plan_;
  const parallel::Strategy& strategy_;
  core::ThreadPool pool_;
  CommSynchronizer sync_;
  const int64_t weight_bytes_;
  const int64_t rss_before_load_;
  // The generation's decoder (during one): own_, or a prefix-cache slot's.
  parallel::Decoder* dec_ = nullptr;
  std::unique_ptr<parallel::Decoder> own_;
  struct Slot {
    model::CacheSpec spec;
    std::unique_ptr<parallel::Decoder> dec;
  };
  std::vector<Slot> slots_;
  int64_t positions_ = 0;
  bool first_chunk_ = false;
  double decode_ms_ = 0;
};

}  // namespace

Status run_worker(const JobSpec& job, const WorkerEnv& env) {
  std::string model_dir = job.model_dir;
  if (env.model_roots) {
    TESSERA_ASSIGN_OR_RETURN(model_dir, resolve_model(job.model_dir, *env.model_roots));
  }
  TESSERA_ASSIGN_OR_RETURN(comm::GroupOptions go, group_options(job, env.key));
  go.bind_endpoint = env.bind_endpoint;
  go.bind_fd = env.bind_fd;
  if (env.max_connect.count() > 0) go.connect_timeout = std::min(go.connect_timeout, env.max_connect);
  // As on the terminal: with a short run timeout (serve's failover), a silent
  // peer must not hold the goodbye that frees this device for the next plan.
  if (job.run_timeout_ms > 0) go.close_timeout = std::min(go.close_timeout, comm::Millis(job.run_timeout_ms));
  TESSERA_ASSIGN_OR_RETURN(auto group, comm::Group::create(go));
  const StatsOnExit report{group.get(), env.stats};
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(model_dir));
  TESSERA_ASSIGN_OR_RETURN(parallel::Plan plan, job.completed_plan(cfg));
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan.strategy));
  core::Timer load;
  const int64_t rss_before_load = memory_baseline();
  auto model = parallel::load_rank_model(model_dir, plan, cfg, job.rank);
  const comm::Millis timeout(job.timeout_ms);
  if (!model.ok()) {
    (void)send_to_terminal(*group, msg::Error{model.status().to_string()}, timeout);
    return model.status();
  }
  const int64_t weight_bytes = static_cast<int64_t>(model->loaded_bytes());
  TESSERA_RETURN_IF_ERROR(send_to_terminal(*group, msg::Ready{weight_bytes, load.ms()}, timeout));
  kernels::set_blas_threads(job.threads);
  // For this job only: a daemon's later profiles run at full speed.
  const core::ScopedDeviceSpeed speed(job.device_speed);
  WorkerLoop loop(job, *group, *model, plan, *strategy, weight_bytes, rss_before_load);
  // Liveness is judged by heartbeats, not progress: an idle terminal pings;
  // one that falls silent loses its job within a few intervals.
  return loop.serve(comm::Millis(job.heartbeat_ms * JobSpec::kMissedHeartbeats));
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


}  // namespace tessera::runtime
