// `tessera profile` and `tessera plan`: flags in, the cluster's profile or
// plan table out (runtime/deployment.h profiles and plans).
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_plan_commands(CLI::App& app);  // profile, plan

}  // namespace tessera::cli
