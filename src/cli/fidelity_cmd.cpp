// `tessera fidelity`: how close a strategy's outputs are to the exact
// single-device forward on seeded random inputs. The strategy runs in this
// process with one thread per device (run_in_process), so no network is involved;
// the figures depend only on the arithmetic.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "runtime/fidelity.h"
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

// The default strategy: the registry's first lossy one (fidelity is what it
// trades for speed); the one-device plan when every strategy is exact.
std::string default_strategy() {
  for (const parallel::Strategy* s : parallel::strategies())
    if (!s->exact()) return s->name();
  return parallel::single_device_plan().strategy;
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
  auto meter = runtime::FidelityMeter::create(f.model, runtime::random_inputs(*cfg, f.samples, f.seq, f.seed));
  if (!meter.ok()) return fail(meter.status().to_string());
  for (const auto& plan : plans) {
    auto s = meter->measure(plan);
    if (!s.ok()) return fail(s.status().to_string());
    const int64_t rows = s->rows / std::max<int64_t>(s->samples, 1);
    nlohmann::json j = s->to_json();
    j.update({{"model", f.model}, {"model_type", cfg->family}, {"strategy", plan.strategy}, {"options", plan.options},
              {"devices", plan.world}, {"rows", rows}, {"weights", kernels::weight_type_name(plan.weights)},
              {"wire", core::wire_type_name(plan.wire)}});
    if (f.json) {
      std::cout << j.dump() << '\n';
      continue;
    }
    std::string label = plan.strategy + " weights=" + kernels::weight_type_name(plan.weights) +
                        " wire=" + core::wire_type_name(plan.wire);
    for (const auto& [k, v] : plan.options.items()) label += " " + k + "=" + v.dump();
    std::printf("%s devices=%d samples=%d rows=%lld: cosine %.6f (min %.6f)  max_abs_err %.3g  top1 %s", label.c_str(),
                plan.world, f.samples, static_cast<long long>(rows), s->cosine, s->min_cosine, s->max_abs_err,
                s->top1_agreement >= 0 ? std::to_string(s->top1_agreement).c_str() : "n/a (no head)");
    if (s->next_token_kl >= 0) std::printf("  next-token KL %.3g (max %.3g)", s->next_token_kl, s->next_token_kl_max);
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
