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

}  // namespace tessera::cli
