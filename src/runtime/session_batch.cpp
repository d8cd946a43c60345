// Continuous batching on the terminal (SessionOptions::max_batch > 1):
// concurrent Session::generate calls, each on its own thread running
// model::generate_logits, share the devices. A call prefills alone, between
// steps (a long prompt in chunks, with steps between them:
// SessionOptions::prefill_chunk), and its decode steps meet the other calls' at a rendezvous: the
// first row to arrive waits until every decoding sequence has sent its row
// (or a short gather window passes), then runs one step of all of them
// (msg::Step to the workers, parallel::step_rows here). Sequences join and
// leave at step boundaries; sampling, stopping and streaming stay each
// call's own, so every sequence gets the tokens it would get alone.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/device_speed.h"
#include "core/io.h"
#include "kernels/quant.h"
#include "parallel/strategy.h"
#include "runtime/protocol.h"
#include "runtime/session.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;

namespace {
// How long the first row of a step waits for the rows of the sequences
// still sampling or streaming their last token: as long as the last step
// took, within these bounds. Waking eight threads on two cores took over
// 5 ms often enough to halve the batches (docs/serving.md); a slow client
// delays the others by at most one step's time a step.
constexpr double kMinGatherMs = 5, kMaxGatherMs = 50;
}  // namespace

// Every later batched call fails with it, as a device failure (so serve
// fails the session over rather than keep a broken one): after a chunk or
// step the workers heard of fails, the ranks' states are unknown.
void Session::break_batch(const Status& why) {
  std::lock_guard<std::mutex> l(batch_mu_);
  if (!broken_.ok()) return;
  const bool device = why.code() == core::ErrorCode::kNetwork || why.code() == core::ErrorCode::kTimeout;
  broken_ = device ? why : core::network_error("a batched chunk failed on the terminal: " + why.message());
}

struct Session::StepSeat {
  size_t slot = 0;
  Tensor x;  // [1, F]
  int64_t pos = 0;
  Result<Tensor> out = Tensor();  // the row's logits [1, V]
  bool done = false;
};

int Session::slot_count() const {
  int64_t n = std::min<int64_t>(std::max(opts_.prefix_slots, 0), msg::kMaxPrefixSlots);
  if (opts_.max_batch > 1) n = std::max<int64_t>(n, opts_.max_batch);
  return static_cast<int>(std::clamp<int64_t>(n, 1, msg::kMaxSlots));
}

Result<std::vector<int64_t>> Session::generate_batched(const std::vector<int64_t>& prompt,
                                                       const model::GenerateOptions& opts, int64_t* cached_tokens) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan_.strategy));
  const model::CacheSpec spec = model::generation_cache(model_->config(), opts);
  // A free slot: with the prefix cache on, the one whose tokens share the
  // longest prefix with the prompt; else the least recently used.
  size_t si = 0;
  int64_t cached = 0;
  bool reuse = false;
  {
    std::unique_lock<std::mutex> l(batch_mu_);
    if (prefix_.empty()) prefix_.resize(static_cast<size_t>(slot_count()));
    const auto free_slot = [&] {
      return !broken_.ok() || std::any_of(prefix_.begin(), prefix_.end(), [](const PrefixSlot& s) { return !s.in_use; });
    };
    if (!batch_cv_.wait_for(l, std::chrono::milliseconds(opts_.timeout_ms), free_slot))
      return core::timeout_error("no sequence slot came free within --timeout");
    TESSERA_RETURN_IF_ERROR(broken_);
    if (opts_.prefix_slots > 0)
      for (size_t i = 0; i < prefix_.size(); ++i) {
        const PrefixSlot& s = prefix_[i];
        if (s.in_use || !s.dec || s.spec.positions != spec.positions || s.spec.dtype != spec.dtype) continue;
        const int64_t usable = model::reusable_prefix(s.tokens, prompt);
        if (usable > cached) cached = usable, si = i, reuse = true;
      }
    if (!reuse) {
      bool found = false;
      for (size_t i = 0; i < prefix_.size(); ++i)
        if (!prefix_[i].in_use && (!found || prefix_[i].used < prefix_[si].used)) si = i, found = true;
    }
    PrefixSlot& s = prefix_[si];
    s.in_use = true;
    ++prefilling_;
    s.used = ++prefix_clock_;
    s.tokens.clear();  // valid again only when this generation succeeds
  }
  PrefixSlot& slot = prefix_[si];
  bool prefilling = true, decoding = false;
  struct Leave {  // the slot and the batch, however the call ends
    Session& s;
    PrefixSlot& slot;
    bool& prefilling;
    bool& decoding;
    ~Leave() {
      {
        std::lock_guard<std::mutex> l(s.batch_mu_);
        slot.in_use = false;
        if (prefilling) --s.prefilling_;
        if (decoding) --s.decoding_;
      }
      s.batch_cv_.notify_all();
    }
  } leave{*this, slot, prefilling, decoding};

  model::GenerateOptions run_opts = opts;
  run_opts.cached_prefix = cached;
  int64_t processed = 0, chunks = 0;
  double prefill_ms = 0;
  // One chunk of the prefill, alone on the wire, between two steps: rows
  // from pos0 into the slot's caches (new ones first unless `keep`). The
  // workers keep the slot's decoder after "end", for the next chunk and the
  // steps. The last chunk's last row gives the logits.
  auto run_chunk = [&](Tensor x, int64_t pos0, bool keep, bool last) -> Result<Tensor> {
    const std::lock_guard<std::mutex> run_lock(run_mu_);
    {
      std::lock_guard<std::mutex> l(batch_mu_);
      TESSERA_RETURN_IF_ERROR(broken_);
    }
    std::unique_lock<std::mutex> wire_lock(wire_mu_);
    core::Timer t;
    bool heard = false;  // the workers heard of the chunk
    auto y = [&]() -> Result<Tensor> {
      if (!keep) {
        slot.dec.reset();  // the old caches go before the new ones are allocated
        TESSERA_ASSIGN_OR_RETURN(slot.dec, parallel::make_decoder(*strategy, *model_, plan_, *sync_, spec));
        slot.spec = spec;
      }
      heard = group_->size() > 1;
      TESSERA_RETURN_IF_ERROR(tell_workers(
          msg::Generate{spec.positions, spec.dtype == core::DType::kF16, static_cast<int64_t>(si), keep}));
      const int64_t n = x.dim(0);
      const int told = std::min(group_->size(), slot.dec->ranks_in(n, pos0));
      TESSERA_RETURN_IF_ERROR(tell_workers(msg::Decode{n, pos0}, told));
      if (told <= 1) wire_lock.unlock();  // the terminal alone: pings go on
      auto out = slot.dec->forward(std::move(x), n, pos0, pool_.get());
      if (!wire_lock.owns_lock()) wire_lock.lock();
      const double ms = t.ms();
      prefill_ms += ms;
      ++chunks;
      // The workers end the chunk even when it failed; its own error comes first.
      Status st = tell_workers(msg::End{});
      if (st.ok())
        st = collect_stats(ms, {{"rows", n},
                                {"prompt_tokens", prompt.size()},
                                {"prefix_cached_tokens", cached},
                                {"prefill_ms", prefill_ms},
                                {"prefill_chunks", chunks},
                                {"max_batch", opts_.max_batch}});
      TESSERA_RETURN_IF_ERROR(out.status());
      TESSERA_RETURN_IF_ERROR(st);
      processed = pos0 + n;
      if (!last) return Tensor();
      wire_lock.unlock();  // the head is the terminal's alone
      return model::chunk_logits(*model_, std::move(out).value(), true, pool_.get());
    }();
    if (!y.ok() && heard) break_batch(y.status());
    return y;
  };
  // Between two chunks the rows waiting for a step get one; rows still on
  // their way are not waited for past about a gather window.
  auto let_steps_run = [&] {
    std::unique_lock<std::mutex> l(batch_mu_);
    --prefilling_;
    const uint64_t seen = steps_done_;
    batch_cv_.notify_all();
    batch_cv_.wait_for(l, std::chrono::microseconds(static_cast<int64_t>(1000 * (2 * kMaxGatherMs + last_step_ms_))), [&] {
      return steps_done_ != seen || (pending_.empty() && !stepping_) || !broken_.ok();
    });
    ++prefilling_;
  };
  auto prefill = [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    const int64_t n = x.dim(0), F = x.dim(1);
    // A pair's later chunks would run on its decode layout: its prefill stays whole.
    const int64_t chunk = opts_.prefill_chunk > 0 && !plan_.decode ? std::min(opts_.prefill_chunk, n) : n;
    Result<Tensor> y = Tensor();
    int64_t at = 0;
    bool stopped = false;
    do {
      const int64_t rows = std::min(chunk, n - at);
      // A client that left, or a deadline that passed, is seen here rather
      // than after the whole prompt: the slot and the wire come free.
      if (at > 0 && opts.stop_requested && opts.stop_requested()) {
        stopped = true;
        y = Tensor();
        break;
      }
      if (at > 0) let_steps_run();
      Tensor part = rows == n ? std::move(x) : Tensor::zeros_f32({rows, F});
      if (rows != n) std::memcpy(part.f32(), x.f32() + at * F, static_cast<size_t>(rows * F) * sizeof(float));
      y = run_chunk(std::move(part), pos0 + at, reuse || at > 0, at + rows == n);
      at += rows;
    } while (y.ok() && at < n);
    std::lock_guard<std::mutex> l(batch_mu_);
    prefilling = false;
    --prefilling_;
    batch_cv_.notify_all();  // the steps held for it go on
    if (!y.ok() || stopped) return y;
    decoding = true;
    ++decoding_;
    return y;
  };
  // Each chunk's layers, ln_f and head: the head of a step runs on every
  // sequence's row at once (its weights are as large as a few layers').
  auto logits = [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    if (!decoding) return prefill(std::move(x), pos0);
    auto y = batched_step(si, std::move(x), pos0);
    if (y.ok()) processed = pos0 + 1;
    return y;
  };
  auto seq = [&] {
    const core::ScopedDeviceSpeed speed(device_speed_of(0));
    return model::generate_logits(*model_, prompt, run_opts, logits);
  }();
  TESSERA_RETURN_IF_ERROR(seq.status());
  if (opts_.prefix_slots > 0) slot.tokens.assign(seq->begin(), seq->begin() + processed);
  if (cached_tokens != nullptr) *cached_tokens = cached;
  return seq;
}

Result<Tensor> Session::batched_step(size_t slot, Tensor x, int64_t pos) {
  StepSeat seat{slot, std::move(x), pos};
  std::unique_lock<std::mutex> l(batch_mu_);
  TESSERA_RETURN_IF_ERROR(broken_);
  pending_.push_back(&seat);
  batch_cv_.notify_all();
  const auto submitted = std::chrono::steady_clock::now();
  // Not done and no step running: the seat is still pending (a leader
  // marks its seats done before it clears stepping_, under the lock).
  while (!seat.done) {
    // Prefills go first: a sequence that joins then steps with the batch
    // at once (the streams all arrive together), and the slots
    // bound how long steps can wait.
    if (stepping_ || prefilling_ > 0) {
      batch_cv_.wait(l);
      continue;
    }
    // The window opens when this row came or the last step ended, whichever
    // is later: rows that waited through a step must wait for the rows of
    // that step too, or the batch splits into two halves for good.
    const auto gather_until =
        std::max(submitted, last_step_end_) +
        std::chrono::microseconds(static_cast<int64_t>(1000 * std::clamp(last_step_ms_, kMinGatherMs, kMaxGatherMs)));
    // Rows in flight (overlapped steps) are not waited for: they are on their way.
    int in_flight = 0;
    for (const auto& g : flight_) in_flight += static_cast<int>(g.size());
    if (static_cast<int>(pending_.size()) < decoding_ - in_flight && std::chrono::steady_clock::now() < gather_until) {
      batch_cv_.wait_until(l, gather_until);
      continue;
    }
    // Lead this step: the rows pending now, at most max_batch of them. With
    // quantized weights at most the decode kernels' rows (more rows take
    // the prefill's path, whose sums are added in another order): each
    // sequence then gets the bits it gets alone.
    int64_t cap = opts_.max_batch;
    if (model_->config().weights != kernels::WeightType::kF32) cap = std::min(cap, kernels::kQuantDotRows);
    // A layout of k overlapped stages keeps the decoding sequences in k
    // groups, one at each stage: the rows pending enter as the group of
    // stage 0 (a k-th of the sequences), the last stage's group leaves.
    // One sequence alone, with nothing in flight, steps whole.
    parallel::Decoder* const mine = prefix_[seat.slot].dec.get();
    const int stages = mine->overlapped_stages(std::span<parallel::Decoder* const>(&mine, 1));
    const bool overlap = stages > 1 && (in_flight > 0 || decoding_ > 1);
    if (overlap) cap = std::min<int64_t>(cap, (decoding_ + stages - 1) / stages);
    const size_t take = std::min(pending_.size(), static_cast<size_t>(cap));
    std::vector<std::vector<StepSeat*>> groups{std::vector<StepSeat*>(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(take))};
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(take));
    if (overlap) {
      flight_.resize(static_cast<size_t>(stages) - 1);
      groups.insert(groups.end(), flight_.begin(), flight_.end());
    }
    stepping_ = true;
    l.unlock();
    const core::Timer t;
    const Status st = run_step(groups);
    l.lock();
    last_step_ms_ = t.ms();
    last_step_end_ = std::chrono::steady_clock::now();
    if (!st.ok() || !overlap) {  // every row is done (a failed call's with its error)
      for (const auto& g : groups)
        for (StepSeat* s : g) s->done = true;
      flight_.clear();
    } else {  // the last group leaves; the others move one stage on
      for (StepSeat* s : groups.back()) s->done = true;
      groups.pop_back();
      flight_ = std::move(groups);
    }
    ++steps_done_;
    stepping_ = false;
    batch_cv_.notify_all();
  }
  return std::move(seat.out);
}

// One step (one group: its rows through every stage), or one call of
// overlapped steps (group g at stage g: the first group's rows enter, the
// last group's leave). The leaving rows get their logits, or every row the
// error.
Status Session::run_step(const std::vector<std::vector<StepSeat*>>& groups) {
  const std::vector<StepSeat*>& entering = groups.front();
  const std::vector<StepSeat*>& leaving = groups.back();
  const auto b = static_cast<int64_t>(leaving.size());
  Status st = [&]() -> Status {
    const std::lock_guard<std::mutex> run_lock(run_mu_);
    {
      std::lock_guard<std::mutex> l(batch_mu_);
      TESSERA_RETURN_IF_ERROR(broken_);
    }
    const int64_t F = model_->config().hidden;
    msg::Step step;
    std::vector<parallel::Decoder*> decs;
    for (const auto& g : groups) {
      for (const StepSeat* s : g) {
        step.slots.push_back(static_cast<int64_t>(s->slot));
        step.pos.push_back(s->pos);
        decs.push_back(prefix_[s->slot].dec.get());
      }
      if (groups.size() > 1) step.groups.push_back(static_cast<int64_t>(g.size()));
    }
    Tensor x;
    if (!entering.empty()) x = Tensor::zeros_f32({static_cast<int64_t>(entering.size()), F});
    for (size_t i = 0; i < entering.size(); ++i)
      std::memcpy(x.f32() + static_cast<int64_t>(i) * F, entering[i]->x.f32(), static_cast<size_t>(F) * sizeof(float));
    std::unique_lock<std::mutex> wire_lock(wire_mu_);
    const int told = std::min(group_->size(), decs[0]->ranks_in(1, step.pos[0]));
    TESSERA_RETURN_IF_ERROR(tell_workers(step, told));
    if (told <= 1) wire_lock.unlock();  // the terminal alone (a pair's steps): pings go on
    TESSERA_ASSIGN_OR_RETURN(Tensor h, step.groups.empty()
                                           ? parallel::step_rows(decs, std::move(x), step.pos, pool_.get())
                                           : parallel::step_stages(decs, step.groups, std::move(x), step.pos, pool_.get()));
    if (b == 0) return core::ok_status();
    if (h.rank() != 2 || h.dim(0) != b) return core::internal_error("a batched step gave the wrong rows");
    if (wire_lock.owns_lock()) wire_lock.unlock();  // the head is the terminal's alone
    TESSERA_ASSIGN_OR_RETURN(Tensor y, model::chunk_logits(*model_, std::move(h), false, pool_.get()));
    const int64_t cols = y.dim(1);
    for (int64_t i = 0; i < b; ++i) {
      Tensor row = Tensor::zeros_f32({1, cols});
      std::memcpy(row.f32(), y.f32() + i * cols, static_cast<size_t>(cols) * sizeof(float));
      leaving[static_cast<size_t>(i)]->out = std::move(row);
    }
    return core::ok_status();
  }();
  if (!st.ok()) {
    if (group_->size() > 1) break_batch(st);
    for (const auto& g : groups)
      for (StepSeat* s : g) s->out = st;
    return st;
  }
  if (opts_.on_batch_step && b > 0) opts_.on_batch_step(static_cast<int>(b));
  return core::ok_status();
}

}  // namespace tessera::runtime
