// `tessera serve`: one model behind an OpenAI-compatible HTTP API, loaded
// once on the terminal and its devices, with failover: a device that dies or
// falls silent is dropped, the plan is remade over the devices left, and the
// request is replayed (a generation resumes from the tokens it had produced).
// The request bodies are parsed by the pure functions of serve_api.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/strategy.h"
#include "runtime/distributed.h"

namespace tessera::runtime {

// A plan and the devices it runs on: members[r] is the device of rank r,
// an index into the devices offered (0 = the terminal). Empty members: the
// first plan.world devices.
struct PlanChoice {
  parallel::Plan plan;
  std::vector<int> members;
};

struct ServeOptions {
  // The model, the devices (local workers: dist.plan.world; or a cluster
  // file and key), links, threads, loading timeout, memory budgets.
  DistributedOptions dist;
  // The plan over `devices` (2 or more indices into the configured devices,
  // the terminal's 0 first): at start and after every change of devices
  // (the planner's under --strategy auto, else the same strategy). The
  // choice's members index into `devices`.
  std::function<core::Result<PlanChoice>(const std::vector<int>& devices)> plan_for;
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port
  std::string api_key;      // set: requests need "Authorization: Bearer <api_key>"
  int queue = 16;           // requests admitted at once (running or waiting); more get 429
  int64_t max_body_bytes = 8 << 20;
  int64_t deadline_ms = 120000;  // per request, queueing included
  int64_t failover_ms = 1000;    // a device silent this long during a run is dropped
  int64_t readmit_ms = 1000;     // how often dropped cluster devices are asked whether they are back
  // Called once the port is bound (the CLI prints it).
  std::function<void(const std::string& host, int port)> on_listening;
};

// Serves until SIGTERM or SIGINT, then drains the requests in flight and
// stops the workers. Errors: the model or the devices could not be started,
// or the port could not be bound.
[[nodiscard]] core::Status serve(const ServeOptions& opts);

}  // namespace tessera::runtime
