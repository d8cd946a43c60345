#include "cli/plan_flags.h"

#include <cmath>
#include <set>

#include "core/limits.h"

namespace tessera::cli {

using core::Result;
using nlohmann::json;

namespace {

// Every strategy's flags by flag name, with the strategies that take each.
struct FlagUse {
  parallel::OptionFlag flag;
  std::vector<std::string> strategies;
};

std::map<std::string, FlagUse> all_flags() {
  std::map<std::string, FlagUse> out;
  for (const parallel::Strategy* s : parallel::strategies())
    for (const auto& fl : s->flags()) {
      auto& use = out[fl.flag];
      if (use.strategies.empty()) use.flag = fl;
      else if (use.flag.help.find(fl.help) == std::string::npos) use.flag.help += "; " + fl.help;  // each says its own
      use.strategies.push_back(s->name());
    }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

Result<json> option_value(const parallel::OptionFlag& fl, const std::string& text) {
  switch (fl.kind) {
    case parallel::OptionFlag::Kind::kSetsBool: return json(fl.flag_value);
    case parallel::OptionFlag::Kind::kNumber: {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(text, &used);
      } catch (...) {
        used = 0;
      }
      if (used == 0 || used != text.size() || !std::isfinite(v))
        return core::invalid_argument(fl.flag + " needs a number, not '" + text + "'");
      if (v == std::floor(v) && std::fabs(v) < 9e15) return json(static_cast<int64_t>(v));
      return json(v);
    }
    case parallel::OptionFlag::Kind::kString: break;
  }
  return json(text);
}

json spec_value(const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  size_t used = 0;
  try {
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v))
      return v == std::floor(v) && std::fabs(v) < 9e15 ? json(static_cast<int64_t>(v)) : json(v);
  } catch (...) {
  }
  return text;
}

}  // namespace

void add_plan_flags(CLI::App* cmd, const std::shared_ptr<PlanFlags>& f, bool with_strategy) {
  if (with_strategy) {
    CLI::Option* s = cmd->add_option("--strategy", f->strategy, parallel::strategy_names() + (with_strategy ? ", or auto (run: the planner chooses)" : ""))->capture_default_str();
    cmd->add_option("--prefill-strategy", f->strategy, "--strategy by its name in a pair (with --decode-strategy)")->excludes(s);
    cmd->add_option("--decode-strategy", f->decode_strategy,
                    "a pair: this strategy decodes after the --strategy prefill took the prompt, from the K/V it "
                    "hands over (on every device, or on the terminal alone if it runs on one; docs/generation.md)");
    cmd->add_option("--decode-devices", f->decode_devices,
                    "a pair's decode on the first N of the --devices only (the others idle through the steps)")
        ->check(CLI::Range(1, core::kMaxDevices));
    cmd->add_option("--devices", f->devices, "devices (local worker processes on loopback)")->capture_default_str();
  }
  cmd->add_option("--partition", f->partition, "work share of each device, e.g. 3,1 (default equal)");
  cmd->add_option("--wire", f->wire,
                  "how activations travel between devices: f32 (exact), f16 or q8 (lossy; 0.5x and 0.27x the bytes)")
      ->check(CLI::IsMember({"f32", "f16", "q8"}));
  for (const auto& [name, use] : all_flags()) {
    const std::string help = use.flag.help + " [" + join(use.strategies) + "]";
    const std::string flag = name;
    if (use.flag.kind == parallel::OptionFlag::Kind::kSetsBool) {
      cmd->add_flag_callback(flag, [f, flag] { f->given[flag] = ""; }, help);
    } else {
      cmd->add_option_function<std::string>(flag, [f, flag](const std::string& v) { f->given[flag] = v; }, help);
    }
  }
}

Result<parallel::Plan> build_plan(const PlanFlags& f, const std::string& strategy, int world, bool strict) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* s, parallel::strategy_for(strategy));
  parallel::Plan plan;
  plan.strategy = strategy;
  plan.world = world;
  if (world < 1 || world > core::kMaxDevices)
    return core::invalid_argument("--devices must be in [1, " + std::to_string(core::kMaxDevices) + "]");
  if (!f.partition.empty()) {
    TESSERA_ASSIGN_OR_RETURN(plan.ratios, parallel::parse_ratios(f.partition, world));
  }
  if (!f.wire.empty()) {
    TESSERA_ASSIGN_OR_RETURN(plan.wire, core::parse_wire_type(f.wire));
  }
  if (f.lossy && strict)
    return core::invalid_argument("--lossy lets --strategy auto choose; with a named strategy, name the loss (--wire, --quantize)");
  if (f.decode_devices != 0 && f.decode_strategy.empty())
    return core::invalid_argument("--decode-devices sets a pair's decode: it needs --decode-strategy");
  if (!f.decode_strategy.empty()) {
    TESSERA_RETURN_IF_ERROR(parallel::strategy_for(f.decode_strategy).status());
    parallel::Plan d;
    d.strategy = f.decode_strategy;
    d.world = f.decode_devices;  // 0, complete_plan: the prefill's devices, or the terminal for a one-device strategy
    plan.decode = std::make_shared<const parallel::Plan>(std::move(d));
  }
  const auto flags = all_flags();
  std::set<std::string> mine;
  for (const auto& fl : s->flags()) mine.insert(fl.flag);
  for (const auto& [flag, text] : f.given) {
    const auto it = flags.find(flag);
    if (it == flags.end()) continue;
    if (!mine.count(flag)) {
      if (strict)
        return core::invalid_argument(flag + " applies to strategy " + join(it->second.strategies) + ", not '" + strategy + "'");
      continue;
    }
    for (const auto& fl : s->flags())
      if (fl.flag == flag) {
        TESSERA_ASSIGN_OR_RETURN(plan.options[fl.key], option_value(fl, text));
      }
  }
  return plan;
}

void add_max_loss_flags(CLI::App* cmd, CLI::Option* lossy, double& max_loss, std::string& calibration) {
  cmd->add_option("--max-loss", max_loss,
                  "with --lossy: a lossy plan is chosen only when its measured top-1 disagreement with the exact model "
                  "on the calibration inputs is at most this fraction (PRISM: the highest rate that meets it)")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(lossy)
      ->capture_default_str();
  cmd->add_option("--calibration", calibration,
                  "with --lossy: a text file, one prompt per line, to measure the loss on (default: 8 seeded random "
                  "inputs of the planned length)")
      ->check(CLI::ExistingFile)
      ->needs(lossy);
}

void add_lossy_flag(CLI::App* cmd, const std::shared_ptr<PlanFlags>& f) {
  CLI::Option* lossy = cmd->add_flag("--lossy", f->lossy,
                "--strategy auto may choose what is not exact: PRISM, a f16/q8 wire (unless --wire names one), "
                "weights quantized at load (unless --quantize names them), each only within --max-loss");
  add_max_loss_flags(cmd, lossy, f->max_loss, f->calibration);
}

Result<parallel::Plan> auto_plan(const PlanFlags& f) {
  if (!f.decode_strategy.empty() || f.decode_devices != 0)
    return core::invalid_argument("--decode-strategy pairs with a named --strategy; with auto the planner chooses the pair");
  parallel::Plan plan;
  plan.strategy = "auto";
  if (!f.wire.empty()) {
    TESSERA_ASSIGN_OR_RETURN(plan.wire, core::parse_wire_type(f.wire));
  }
  return plan;
}

Result<parallel::Plan> plan_from_spec(const std::string& spec, const PlanFlags& f, int world) {
  std::string name = spec, rest;
  if (const size_t colon = spec.find(':'); colon != std::string::npos) {
    name = spec.substr(0, colon);
    rest = spec.substr(colon + 1);
  }
  json extra = json::object();
  const std::string kNoOverlap = "-no-overlap";
  if (name.size() > kNoOverlap.size() && name.ends_with(kNoOverlap)) {
    name.resize(name.size() - kNoOverlap.size());
    extra["overlap"] = false;
  }
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string item = rest.substr(0, colon);
    rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return core::invalid_argument("'" + spec + "': options are key=value");
    extra[item.substr(0, eq)] = spec_value(item.substr(eq + 1));
  }
  PlanFlags pf = f;
  pf.decode_strategy.clear();  // a spec is its own plan: a pair only with decode=
  pf.decode_devices = 0;
  if (extra.contains("decode")) {
    if (!extra["decode"].is_string()) return core::invalid_argument("'" + spec + "': decode= names a strategy");
    pf.decode_strategy = extra["decode"].get<std::string>();
    extra.erase("decode");
  }
  if (extra.contains("decode_devices")) {
    if (!extra["decode_devices"].is_number_integer()) return core::invalid_argument("'" + spec + "': decode_devices= is a count");
    pf.decode_devices = extra["decode_devices"].get<int>();
    extra.erase("decode_devices");
  }
  TESSERA_ASSIGN_OR_RETURN(parallel::Plan plan, build_plan(pf, name, world, false));
  for (const auto& [k, v] : extra.items()) plan.options[k] = v;
  return plan;
}

}  // namespace tessera::cli
