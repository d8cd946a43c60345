// `tessera serve`: one model behind an OpenAI-compatible HTTP API, loaded
// once on the terminal and its devices, with failover: a device that dies or
// falls silent is dropped, the plan is remade over the devices left, and the
// request is replayed (a generation resumes from the tokens it had produced).
// The request bodies are parsed by the pure functions of serve_api.h.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/strategy.h"
#include "runtime/deployment.h"

namespace tessera::runtime {

struct ServeOptions {
  // The model and the devices (Cluster::open): local workers or a cluster
  // file's daemons and key; links, threads, loading timeout, memory budgets.
  Cluster cluster;
  // strategy "auto": the planner's choice over the devices, made again over
  // the devices left after every failover or re-admission (each device is
  // profiled once, at start). Otherwise this strategy and its options over
  // the devices left, down to the terminal alone.
  parallel::Plan plan;
  bool lossy = false;  // --lossy: auto may choose a lossy strategy, wire or weight type
  double max_loss = 0.01;   // --max-loss, with lossy (DeployRequest::max_loss)
  std::string calibration;  // --calibration, with lossy
  // The prefix cache (Session's prefix_slots): as many generations' KV
  // caches as this many MB hold on the busiest device, at most 8; 0: off.
  int64_t prefix_cache_mb = 0;
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port
  std::string api_key;      // set: requests need "Authorization: Bearer <api_key>"
  int queue = 16;           // requests admitted at once (running or waiting); more get 429
  // Continuous batching (Session's max_batch): up to this many generations
  // run at once, their decode steps batched; 1: one request at a time.
  int max_batch = 1;
  // With max_batch > 1: prompts longer than this are prefilled in chunks of
  // it, the other streams' steps between two (Session's prefill_chunk); 0: whole.
  int64_t prefill_chunk = 256;
  int max_connections = 512;  // HTTP connections served at once, a thread each; more wait
  int64_t max_body_bytes = 8 << 20;
  int64_t deadline_ms = 120000;  // per request, queueing included
  int64_t failover_ms = 1000;    // a device silent this long during a run is dropped
  int64_t readmit_ms = 1000;     // how often dropped cluster devices are asked whether they are back
  // Causal LMs: the context of every generation (--ctx-size; KV caches hold
  // it, prompt plus max_tokens must fit it, device budgets count it). 0: the
  // smaller of max_position_embeddings and 4096.
  int64_t ctx_size = 0;
  core::DType kv_dtype = core::DType::kF32;  // --kv-type
  kernels::WeightType weights = kernels::WeightType::kF32;  // --quantize
  // Once the port is bound, "listening on http://HOST:PORT" is printed to
  // stdout (the port matters with port 0).
};

// Serves until SIGTERM or SIGINT, then drains the requests in flight and
// stops the workers. Errors: the model or the devices could not be started,
// or the port could not be bound.
[[nodiscard]] core::Status serve(const ServeOptions& opts);

}  // namespace tessera::runtime
