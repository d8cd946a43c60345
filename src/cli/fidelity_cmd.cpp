// `tessera fidelity`: how close a strategy's outputs are to the exact
// single-device forward on seeded random inputs. The strategy runs in this
// process with one thread per device (run_in_process), so no network is involved;
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
#include "cli/plan_flags.h"
#include "runtime/in_process.h"
#include "kernels/gemm.h"
#include "model/transformer.h"
#include "parallel/strategy.h"

namespace tessera::cli {

namespace {

struct FidelityFlags {
  std::string model;
  std::shared_ptr<PlanFlags> plan = std::make_shared<PlanFlags>();
  int samples = 10;
  int64_t seq = 128;
  uint64_t seed = 1;
  bool json = false;
  std::string quantize;  // "q8_0,q4_0": each weight type a setting of its own
  std::string wires;     // "f16,q8": each wire a setting of its own
};

// What the exact forward gives for one input, kept small: hidden.L and the
// top-1 class of each logits row (GPT-2's full logits would be N x vocab).
struct Reference {
  core::Tensor hidden;
  std::vector<int64_t> top1;
  std::vector<double> last_logp;  // log-softmax of the last row's logits (the next token)
};

struct Scores {
  double cosine_sum = 0.0, min_cosine = 1.0, max_abs_err = 0.0;
  int64_t rows = 0, top1_same = 0, top1_rows = 0;
  double kl_sum = 0.0, kl_max = 0.0;
  int64_t kl_count = 0;
};

std::vector<double> last_row_logp(const core::Tensor& logits) {
  if (logits.empty()) return {};
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  const float* x = logits.f32() + (rows - 1) * cols;
  double mx = x[0];
  for (int64_t c = 1; c < cols; ++c) mx = std::max(mx, static_cast<double>(x[c]));
  double sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[c] - mx);
  std::vector<double> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c)] = x[c] - mx - std::log(sum);
  return out;
}

// The default strategy: the registry's first lossy one (fidelity is what it
// trades for speed); the one-device plan when every strategy is exact.
std::string default_strategy() {
  for (const parallel::Strategy* s : parallel::strategies())
    if (!s->exact()) return s->name();
  return parallel::single_device_plan().strategy;
}

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
    if (c.takes_images()) {
      in.pixels = core::Tensor::zeros_f32({1, c.channels, c.image_size, c.image_size});
      for (int64_t i = 0; i < in.pixels.numel(); ++i) in.pixels.f32()[i] = nd(rng);
    } else {
      for (int64_t i = 0; i < seq; ++i) in.ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab)));
    }
  }
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
  // KL(reference || got) of the next-token distribution.
  if (const auto lp = last_row_logp(got.logits); !lp.empty() && lp.size() == ref.last_logp.size()) {
    double kl = 0;
    for (size_t c = 0; c < lp.size(); ++c) kl += std::exp(ref.last_logp[c]) * (ref.last_logp[c] - lp[c]);
    s.kl_sum += kl;
    s.kl_max = std::max(s.kl_max, kl);
    ++s.kl_count;
  }
  const auto top = top1_rows(got.logits);
  for (size_t r = 0; r < std::min(top.size(), ref.top1.size()); ++r) {
    s.top1_same += top[r] == ref.top1[r] ? 1 : 0;
    ++s.top1_rows;
  }
}

// A numeric strategy flag given as a list ("--cr 2,4,8") makes one plan per
// value, evaluated on the same inputs.
core::Result<std::vector<PlanFlags>> expand_lists(const PlanFlags& f) {
  std::vector<PlanFlags> out{f};
  for (const auto& [flag, text] : f.given) {
    if (text.find(',') == std::string::npos) continue;
    bool numeric = false;
    for (const parallel::Strategy* s : parallel::strategies())
      for (const auto& fl : s->flags())
        numeric = numeric || (fl.flag == flag && fl.kind == parallel::OptionFlag::Kind::kNumber);
    if (!numeric) continue;
    std::vector<PlanFlags> next;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ','))
      for (PlanFlags p : out) {
        p.given[flag] = item;
        next.push_back(std::move(p));
      }
    out = std::move(next);
  }
  return out;
}

// "a,b" parsed item by item; empty: {fallback}.
template <typename T, typename Parse>
core::Result<std::vector<T>> parse_list(const std::string& text, Parse parse, T fallback) {
  std::vector<T> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    TESSERA_ASSIGN_OR_RETURN(T v, parse(item));
    out.push_back(v);
  }
  if (out.empty()) out.push_back(fallback);
  return out;
}

int fidelity(const FidelityFlags& f) {
  if (f.samples < 1) return fail("--samples must be >= 1");
  auto cfg = model::load_config(f.model);
  if (!cfg.ok()) return fail(cfg.status().to_string());
  if (!cfg->takes_images() && (f.seq < 1 || f.seq > cfg->max_positions))
    return fail("--seq must be in [1, max_position_embeddings]");
  auto variants = expand_lists(*f.plan);
  if (!variants.ok()) return fail(variants.status().to_string());
  // --quantize a,b: every plan once per weight type (against the F32
  // reference); --wire a,b: and once per wire.
  auto types = parse_list(f.quantize, kernels::parse_weight_type, kernels::WeightType::kF32);
  if (!types.ok()) return fail(types.status().to_string());
  auto wires = parse_list(f.wires, core::parse_wire_type, core::WireType::kF32);
  if (!wires.ok()) return fail(wires.status().to_string());
  std::vector<parallel::Plan> plans;
  for (kernels::WeightType t : *types)
    for (core::WireType w : *wires)
      for (const PlanFlags& v : *variants) {
        auto p = build_plan(v, v.strategy, v.devices, true);
        if (!p.ok()) return fail(p.status().to_string());
        p->weights = t;
        p->wire = w;
        if (auto st = parallel::complete_plan(*p, *cfg); !st.ok()) return fail(st.to_string());
        plans.push_back(*p);
      }
  auto full = model::Transformer::load(f.model);
  if (!full.ok()) return fail(full.status().to_string());
  auto models = runtime::load_rank_models(f.model, plans[0]);
  if (!models.ok()) return fail(models.status().to_string());
  kernels::WeightType loaded = plans[0].weights;
  kernels::set_blas_threads(1);  // ranks are threads; each runs its GEMMs on one core
  const auto inputs = random_inputs(*cfg, f.samples, f.seq, f.seed);
  std::vector<Reference> refs;
  for (const auto& in : inputs) {
    auto out = full->forward(in, {}, nullptr);
    if (!out.ok()) return fail(out.status().to_string());
    refs.push_back({out->hidden.back(), top1_rows(out->logits), last_row_logp(out->logits)});
  }
  for (const auto& plan : plans) {
    if (plan.weights != loaded) {  // the ranks again, in this plan's weight type
      models = runtime::load_rank_models(f.model, plan);
      if (!models.ok()) return fail(models.status().to_string());
      loaded = plan.weights;
    }
    Scores s;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto got = runtime::run_in_process(plan, *models, inputs[i]);
      if (!got.ok()) return fail(got.status().to_string());
      score(refs[i], got->output, s);
    }
    const double cosine = s.cosine_sum / static_cast<double>(std::max<int64_t>(s.rows, 1));
    const int64_t rows = refs[0].hidden.dim(0);
    nlohmann::json j = {{"model", f.model}, {"model_type", cfg->family},
                        {"strategy", plan.strategy}, {"options", plan.options}, {"devices", plan.world},
                        {"samples", f.samples}, {"rows", rows}, {"cosine", cosine}, {"min_cosine", s.min_cosine},
                        {"max_abs_err", s.max_abs_err}, {"weights", kernels::weight_type_name(plan.weights)},
                        {"wire", core::wire_type_name(plan.wire)}};
    j["next_token_kl"] = s.kl_count > 0 ? nlohmann::json(s.kl_sum / static_cast<double>(s.kl_count)) : nlohmann::json(nullptr);
    j["next_token_kl_max"] = s.kl_count > 0 ? nlohmann::json(s.kl_max) : nlohmann::json(nullptr);
    j["top1_agreement"] = s.top1_rows > 0 ? nlohmann::json(static_cast<double>(s.top1_same) / static_cast<double>(s.top1_rows))
                                          : nlohmann::json(nullptr);
    if (f.json) {
      std::cout << j.dump() << '\n';
      continue;
    }
    std::string label = plan.strategy + " weights=" + kernels::weight_type_name(plan.weights) +
                        " wire=" + core::wire_type_name(plan.wire);
    for (const auto& [k, v] : plan.options.items()) label += " " + k + "=" + v.dump();
    std::printf("%s devices=%d samples=%d rows=%lld: cosine %.6f (min %.6f)  max_abs_err %.3g  top1 %s", label.c_str(),
                plan.world, f.samples, static_cast<long long>(rows), cosine, s.min_cosine, s.max_abs_err,
                s.top1_rows > 0 ? std::to_string(static_cast<double>(s.top1_same) / static_cast<double>(s.top1_rows)).c_str()
                                : "n/a (no head)");
    if (s.kl_count > 0) std::printf("  next-token KL %.3g (max %.3g)", s.kl_sum / static_cast<double>(s.kl_count), s.kl_max);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

void add_fidelity_command(CLI::App& app) {
  auto f = std::make_shared<FidelityFlags>();
  CLI::App* cmd = app.add_subcommand(
      "fidelity", "compare a strategy with the exact single-device forward on random inputs (ranks as threads)");
  cmd->add_option("--model", f->model, "Hugging Face model folder")->required();
  f->plan->strategy = default_strategy();
  f->plan->devices = 2;
  add_plan_flags(cmd, f->plan);
  cmd->add_option("--samples", f->samples, "random inputs")->capture_default_str();
  cmd->add_option("--seq", f->seq, "tokens per input (text models)")->capture_default_str();
  cmd->add_option("--seed", f->seed, "input seed")->capture_default_str();
  cmd->add_flag("--json", f->json, "one JSON object per evaluated setting");
  cmd->add_option("--quantize", f->quantize,
                  "weight types to measure against the F32 reference, e.g. q8_0,q4_0 (each plan once per type)");
  // A list here, where the other commands take one wire.
  cmd->remove_option(cmd->get_option("--wire"));
  cmd->add_option("--wire", f->wires, "wires to measure, e.g. f16,q8 (each plan once per wire; default f32)");
  cmd->callback([f] { throw CLI::RuntimeError(fidelity(*f)); });
}

}  // namespace tessera::cli
