// `tessera fidelity`: how close a strategy's outputs are to the exact
// single-device forward on seeded random inputs. The strategy runs in this
// process with one thread per device (LocalGroup), so no network is involved;
// the figures depend only on the arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "kernels/gemm.h"
#include "model/transformer.h"
#include "parallel/local_group.h"
#include "parallel/strategy.h"

namespace tessera::cli {

namespace {

struct FidelityFlags {
  std::string model;
  std::string strategy = "prism";
  std::string rates;  // "8" or "2,4,8": one evaluation per rate, same inputs
  int64_t segments = 0;
  int devices = 2;
  int samples = 10;
  int64_t seq = 128;
  uint64_t seed = 1;
  std::string partition;
  bool json = false;
};

// What the exact forward gives for one input, kept small: hidden.L and the
// top-1 class of each logits row (GPT-2's full logits would be N x vocab).
struct Reference {
  core::Tensor hidden;
  std::vector<int64_t> top1;
};

struct Scores {
  double cosine_sum = 0.0, min_cosine = 1.0, max_abs_err = 0.0;
  int64_t rows = 0, top1_same = 0, top1_rows = 0;
};

std::vector<int64_t> top1_rows(const core::Tensor& logits) {
  std::vector<int64_t> out;
  if (logits.empty()) return out;
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) out.push_back(kernels::argmax_f32(logits.f32() + r * cols, cols));
  return out;
}

std::vector<model::ModelInput> random_inputs(const model::ModelConfig& c, int samples, int64_t seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<model::ModelInput> out(static_cast<size_t>(samples));
  for (auto& in : out) {
    if (c.family == model::Family::kVit) {
      in.pixels = core::Tensor::zeros_f32({1, c.channels, c.image_size, c.image_size});
      for (int64_t i = 0; i < in.pixels.numel(); ++i) in.pixels.f32()[i] = nd(rng);
    } else {
      for (int64_t i = 0; i < seq; ++i) in.ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab)));
    }
  }
  return out;
}

// Runs the plan with one thread per rank; returns the terminal's output.
core::Result<model::ForwardOutput> run_threads(const std::vector<const model::Transformer*>& models,
                                               const parallel::Plan& plan, const model::ModelInput& in) {
  const model::Transformer& terminal = *models[0];
  TESSERA_ASSIGN_OR_RETURN(core::Tensor x, terminal.embed(in));
  const int64_t n = x.dim(0);
  parallel::LocalGroup group(plan.world);
  std::vector<core::Status> status(static_cast<size_t>(plan.world));
  model::ForwardOutput out;
  std::vector<std::thread> threads;
  for (int r = 0; r < plan.world; ++r) {
    threads.emplace_back([&, r] {
      auto sync = group.member(r);
      auto y = parallel::run_layers(*models[static_cast<size_t>(r)], plan, *sync, r == 0 ? x : core::Tensor(), n, nullptr);
      if (!y.ok()) {
        status[static_cast<size_t>(r)] = y.status();
        return;
      }
      if (r != 0) return;
      terminal.finish_hidden(*y, nullptr);
      out.hidden.push_back(*y);
      status[0] = terminal.head(*y, false, &out, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) TESSERA_RETURN_IF_ERROR(s);
  return out;
}

void score(const Reference& ref, const model::ForwardOutput& got, Scores& s) {
  const core::Tensor& a = ref.hidden;
  const core::Tensor& b = got.hidden.back();
  const int64_t rows = a.dim(0), cols = a.dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = a.f32()[r * cols + c], y = b.f32()[r * cols + c];
      dot += x * y;
      na += x * x;
      nb += y * y;
      s.max_abs_err = std::max(s.max_abs_err, std::fabs(x - y));
    }
    const double cos = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
    s.cosine_sum += cos;
    s.min_cosine = std::min(s.min_cosine, cos);
    ++s.rows;
  }
  const auto top = top1_rows(got.logits);
  for (size_t r = 0; r < std::min(top.size(), ref.top1.size()); ++r) {
    s.top1_same += top[r] == ref.top1[r] ? 1 : 0;
    ++s.top1_rows;
  }
}

core::Result<std::vector<double>> parse_rates(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !std::isfinite(v)) return core::invalid_argument("--cr entry '" + item + "' is not a number");
    out.push_back(v);
  }
  return out;
}

int fidelity(const FidelityFlags& f) {
  if (f.samples < 1) return fail("--samples must be >= 1");
  auto cfg = model::load_config(f.model);
  if (!cfg.ok()) return fail(cfg.status().to_string());
  if (cfg->family != model::Family::kVit && (f.seq < 1 || f.seq > cfg->max_positions))
    return fail("--seq must be in [1, max_position_embeddings]");
  auto strategy = parallel::parse_strategy(f.strategy);
  if (!strategy.ok()) return fail(strategy.status().to_string());
  auto rates = parse_rates(f.rates);
  if (!rates.ok()) return fail(rates.status().to_string());
  if (rates->empty()) rates->push_back(0.0);
  std::vector<parallel::Plan> plans;
  for (double rate : *rates) {
    parallel::Plan p;
    p.strategy = *strategy;
    p.world = f.devices;
    p.prism_rate = rate;
    p.prism_segments = f.segments;
    if (!f.partition.empty()) {
      auto r = parallel::parse_ratios(f.partition, f.devices);
      if (!r.ok()) return fail(r.status().to_string());
      p.ratios = *r;
    }
    if (auto st = parallel::complete_plan(p, *cfg); !st.ok()) return fail(st.to_string());
    plans.push_back(p);
  }
  auto full = model::Transformer::load(f.model);
  if (!full.ok()) return fail(full.status().to_string());
  // Position-wise strategies need every layer on every rank, so the ranks
  // share one copy; tp, galaxy and pipeline load each rank's shard.
  std::vector<model::Transformer> shards;
  std::vector<const model::Transformer*> models(static_cast<size_t>(f.devices), &*full);
  if (*strategy == parallel::Strategy::kTp || *strategy == parallel::Strategy::kGalaxy ||
      *strategy == parallel::Strategy::kPipeline) {
    for (int r = 0; r < f.devices; ++r) {
      auto m = model::Transformer::load(f.model, parallel::load_options(plans[0], *cfg, r));
      if (!m.ok()) return fail(m.status().to_string());
      shards.push_back(std::move(*m));
    }
    for (int r = 0; r < f.devices; ++r) models[static_cast<size_t>(r)] = &shards[static_cast<size_t>(r)];
  }
  kernels::set_blas_threads(1);  // ranks are threads; each runs its GEMMs on one core
  const auto inputs = random_inputs(*cfg, f.samples, f.seq, f.seed);
  std::vector<Reference> refs;
  for (const auto& in : inputs) {
    auto out = full->forward(in, {}, nullptr);
    if (!out.ok()) return fail(out.status().to_string());
    refs.push_back({out->hidden.back(), top1_rows(out->logits)});
  }
  for (const auto& plan : plans) {
    Scores s;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto got = run_threads(models, plan, inputs[i]);
      if (!got.ok()) return fail(got.status().to_string());
      score(refs[i], *got, s);
    }
    const double cosine = s.cosine_sum / static_cast<double>(std::max<int64_t>(s.rows, 1));
    const int64_t rows = refs[0].hidden.dim(0);
    nlohmann::json j = {{"model", f.model}, {"model_type", model::family_name(cfg->family)},
                        {"strategy", parallel::strategy_name(plan.strategy)}, {"devices", plan.world},
                        {"samples", f.samples}, {"rows", rows}, {"cosine", cosine}, {"min_cosine", s.min_cosine},
                        {"max_abs_err", s.max_abs_err}};
    if (plan.prism_rate > 0) j["cr"] = plan.prism_rate;
    if (plan.prism_segments > 0) j["segments"] = plan.prism_segments;
    j["top1_agreement"] = s.top1_rows > 0 ? nlohmann::json(static_cast<double>(s.top1_same) / static_cast<double>(s.top1_rows))
                                          : nlohmann::json(nullptr);
    if (f.json) {
      std::cout << j.dump() << '\n';
      continue;
    }
    std::string label = parallel::strategy_name(plan.strategy);
    if (plan.prism_rate > 0) label += " cr=" + nlohmann::json(plan.prism_rate).dump();
    if (plan.prism_segments > 0) label += " segments=" + std::to_string(plan.prism_segments);
    std::printf("%s devices=%d samples=%d rows=%lld: cosine %.6f (min %.6f)  max_abs_err %.3g  top1 %s\n", label.c_str(),
                plan.world, f.samples, static_cast<long long>(rows), cosine, s.min_cosine, s.max_abs_err,
                s.top1_rows > 0 ? std::to_string(static_cast<double>(s.top1_same) / static_cast<double>(s.top1_rows)).c_str()
                                : "n/a (no head)");
  }
  return 0;
}

}  // namespace

void add_fidelity_command(CLI::App& app) {
  auto f = std::make_shared<FidelityFlags>();
  CLI::App* cmd = app.add_subcommand(
      "fidelity", "compare a strategy with the exact single-device forward on random inputs (ranks as threads)");
  cmd->add_option("--model", f->model, "Hugging Face model folder")->required();
  cmd->add_option("--strategy", f->strategy, "single, tp, sp, voltage, pipeline, prism")->capture_default_str();
  auto* cr = cmd->add_option("--cr", f->rates, "prism compression rate R; a list (2,4,8) evaluates each on the same inputs");
  cmd->add_option("--segments", f->segments, "prism: segment means per partition")->excludes(cr);
  cmd->add_option("--devices", f->devices, "devices (threads)")->capture_default_str();
  cmd->add_option("--partition", f->partition, "work share of each device, e.g. 3,1 (default equal)");
  cmd->add_option("--samples", f->samples, "random inputs")->capture_default_str();
  cmd->add_option("--seq", f->seq, "tokens per input (text models)")->capture_default_str();
  cmd->add_option("--seed", f->seed, "input seed")->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per evaluated setting");
  cmd->callback([f] { throw CLI::RuntimeError(fidelity(*f)); });
}

}  // namespace tessera::cli
