// The flags that describe the devices (runtime::ClusterOptions), shared by
// the commands that run a model on them (run, generate, chat).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include "runtime/deployment.h"

namespace tessera::cli {

// --threads-per-device, --cpus-per-device, --link, --cluster, --key,
// --insecure, --memory-limit, --device-speed, --profile and --timeout (seconds).
void add_cluster_flags(CLI::App* cmd, runtime::ClusterOptions& o, int64_t& timeout_s);

// A generation's KV caches: --ctx-size (positions, prompt included) and
// --kv-type f32|f16 (generate, run, chat, serve, bench-local).
void add_context_flags(CLI::App* cmd, int64_t& ctx_size, core::DType& kv_type);
// --quantize f32|q8_0|q4_0 (kernels/quant.h): the weight type a deployment loads.
void add_quantize_flag(CLI::App* cmd, kernels::WeightType& type);

}  // namespace tessera::cli
