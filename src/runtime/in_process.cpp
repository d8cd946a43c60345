#include "runtime/in_process.h"

#include "core/io.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "parallel/local_group.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;

core::Status check_request_memory(const parallel::Plan& plan, const model::ModelConfig& c, int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Schedule s, parallel::estimate(plan, c, rows));
  if (s.devices.empty()) return core::ok_status();
  const auto need = static_cast<uint64_t>(s.devices[0].activation_bytes);
  const uint64_t available = core::available_memory_bytes();
  if (available > 0 && need > available)
    return core::resource_exhausted("a request of " + std::to_string(rows) + " rows needs " + std::to_string(need >> 20) +
                                    " MiB of activations on this device; " + std::to_string(available >> 20) +
                                    " MiB are available");
  return core::ok_status();
}

int64_t input_rows(const model::ModelConfig& c, const model::ModelInput& in) {
  return c.takes_images() ? c.max_rows() : static_cast<int64_t>(in.ids.size());
}

Result<model::ForwardOutput> terminal_forward(const model::Transformer& model, const parallel::Plan& plan,
                                              parallel::Synchronizer& sync, const model::ModelInput& in,
                                              core::ThreadPool* pool, const std::function<Status(int64_t)>& started) {
  TESSERA_RETURN_IF_ERROR(model.validate_input(in));
  TESSERA_ASSIGN_OR_RETURN(Tensor x, model.embed(in));
  const int64_t n = x.dim(0);
  if (started) TESSERA_RETURN_IF_ERROR(started(n));
  TESSERA_ASSIGN_OR_RETURN(Tensor y, parallel::run_layers(model, plan, sync, std::move(x), n, pool));
  model.finish_hidden(y, pool);
  model::ForwardOutput out;
  out.hidden.push_back(y);
  TESSERA_RETURN_IF_ERROR(model.head(y, false, &out, pool));
  return out;
}

Result<std::vector<model::Transformer>> load_rank_models(const std::string& dir, const parallel::Plan& plan) {
  TESSERA_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_config(dir));
  std::vector<model::Transformer> models;
  for (int r = 0; r < plan.world; ++r) {
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, parallel::load_rank_model(dir, plan, cfg, r));
    models.push_back(std::move(m));
  }
  return models;
}

Result<InProcessResult> run_in_process(const parallel::Plan& plan, const std::vector<model::Transformer>& models,
                                       const model::ModelInput& in) {
  if (static_cast<int>(models.size()) != plan.world) return core::invalid_argument("one model per rank is required");
  // Checked before any rank starts, so no rank waits for a terminal that gave up.
  TESSERA_RETURN_IF_ERROR(models[0].validate_input(in));
  const int64_t n = input_rows(models[0].config(), in);
  parallel::LocalGroup group(plan.world);
  std::vector<Status> status(static_cast<size_t>(plan.world));
  InProcessResult out;
  out.stats.resize(static_cast<size_t>(plan.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < plan.world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      auto sync = group.member(r);
      if (r == 0) {
        auto y = terminal_forward(models[0], plan, *sync, in, nullptr);
        if (y.ok()) out.output = std::move(y).value();
        status[i] = y.status();
      } else {
        status[i] = parallel::run_layers(models[i], plan, *sync, Tensor(), n, nullptr).status();
      }
      out.stats[i] = sync->stats();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) TESSERA_RETURN_IF_ERROR(s);
  return out;
}

Result<std::vector<int64_t>> generate_in_process(const parallel::Plan& plan, const std::vector<model::Transformer>& models,
                                                const std::vector<int64_t>& prompt, const model::GenerateOptions& opts) {
  if (static_cast<int>(models.size()) != plan.world) return core::invalid_argument("one model per rank is required");
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* strategy, parallel::strategy_for(plan.strategy));
  const model::CacheSpec spec = model::generation_cache(models[0].config(), opts);
  parallel::LocalGroup group(plan.world);
  // The terminal's chunks (n, pos0) for the other ranks, as a worker hears them.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<std::pair<int64_t, int64_t>>> chunks(static_cast<size_t>(plan.world));
  bool finished = false;
  std::vector<Status> status(static_cast<size_t>(plan.world));
  std::vector<std::thread> threads;
  for (int r = 1; r < plan.world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      auto sync = group.member(r);
      std::unique_ptr<parallel::Decoder> dec;
      for (;;) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return finished || !chunks[i].empty(); });
        if (chunks[i].empty()) return;
        const auto [n, pos0] = chunks[i].front();
        chunks[i].pop_front();
        lock.unlock();
        if (!dec) {
          auto d = parallel::make_decoder(*strategy, models[i], plan, *sync, spec);
          if (!d.ok()) { status[i] = d.status(); return; }
          dec = std::move(d).value();
        }
        if (auto y = dec->forward(Tensor(), n, pos0, nullptr); !y.ok()) { status[i] = y.status(); return; }
      }
    });
  }
  auto sync0 = group.member(0);
  std::unique_ptr<parallel::Decoder> dec0;
  auto seq = model::generate_with(models[0], prompt, opts, nullptr, [&](Tensor x, int64_t pos0) -> Result<Tensor> {
    if (!dec0) {
      TESSERA_ASSIGN_OR_RETURN(dec0, parallel::make_decoder(*strategy, models[0], plan, *sync0, spec));
    }
    const int64_t n = x.dim(0);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& q : chunks) q.emplace_back(n, pos0);
    }
    cv.notify_all();
    return dec0->forward(std::move(x), n, pos0, nullptr);
  });
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  TESSERA_RETURN_IF_ERROR(seq.status());
  for (const auto& s : status) TESSERA_RETURN_IF_ERROR(s);
  return seq;
}

}  // namespace tessera::runtime
