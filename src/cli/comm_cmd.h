// CLI commands of the communication layer: `keygen` (cluster key file) and
// `comm-bench` (K local processes measuring a collective; each process is a
// hidden `comm-bench-rank` started from /proc/self/exe).
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_comm_commands(CLI::App& app);

}  // namespace tessera::cli

using tessera::cli::add_comm_commands;
