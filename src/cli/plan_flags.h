// The plan options every command takes (--strategy, --devices, --partition)
// plus each registered strategy's own flags, listed from the registry; the
// Plan is built from them once.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"
#include "parallel/strategy.h"

namespace tessera::cli {

struct PlanFlags {
  std::string strategy = parallel::single_device_plan().strategy;
  int devices = 1;
  std::string partition;  // "r1,r2,..."; empty = equal
  std::string wire;       // --wire f32|f16|q8; empty = f32 (--lossy: the planner's choice)
  bool lossy = false;     // --lossy: auto may choose a lossy strategy, wire or weight type
  double max_loss = 0.01;   // --max-loss: the top-1 disagreement a lossy choice may have
  std::string calibration;  // --calibration: prompts it is measured on (default: seeded random ids)
  std::map<std::string, std::string> given;  // flag -> value ("" for bare flags), as typed
  // --decode-strategy: a pair's decode layout (Plan::decode) after the
  // --strategy (alias --prefill-strategy) prefill; its own defaults.
  std::string decode_strategy;
  // --decode-devices: the pair's decode on the first N devices (0: all of
  // them, or the terminal for a one-device strategy).
  int decode_devices = 0;
};

// Adds --strategy, --devices and --partition (unless `with_strategy` is
// false), and every strategy's flags (each flag once, its help naming the
// strategies that take it).
void add_plan_flags(CLI::App* cmd, const std::shared_ptr<PlanFlags>& f, bool with_strategy = true);

// The plan for `strategy` on `world` devices from the flags given. With
// `strict`, a flag the strategy does not take is an error (run); otherwise
// it is left out (a sweep over several strategies).
core::Result<parallel::Plan> build_plan(const PlanFlags& f, const std::string& strategy, int world, bool strict);

// --lossy, on the commands that deploy (`auto` chooses with it), with
// --max-loss and --calibration.
void add_lossy_flag(CLI::App* cmd, const std::shared_ptr<PlanFlags>& f);
// --max-loss X and --calibration FILE, which need `lossy` (plan's own --lossy).
void add_max_loss_flags(CLI::App* cmd, CLI::Option* lossy, double& max_loss, std::string& calibration);

// `--strategy auto`: the planner chooses everything but the wire, which
// is the flags' (a lossy wire only when the user names it).
core::Result<parallel::Plan> auto_plan(const PlanFlags& f);

// "name" or "name:key=value:key=value" (values: true, false, a number, or a
// string); "NAME-no-overlap" is short for "NAME:overlap=false";
// "decode=NAME" makes a pair (Plan::decode).
core::Result<parallel::Plan> plan_from_spec(const std::string& spec, const PlanFlags& f, int world);

}  // namespace tessera::cli
