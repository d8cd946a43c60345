#include "runtime/in_process.h"

#include <thread>

#include "parallel/local_group.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;

int64_t input_rows(const model::ModelConfig& c, const model::ModelInput& in) {
  return c.family == model::Family::kVit ? c.max_rows() : static_cast<int64_t>(in.ids.size());
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
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(dir, parallel::load_options(plan, cfg, r)));
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

}  // namespace tessera::runtime
