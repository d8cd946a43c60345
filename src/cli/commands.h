// Each file in cli/ registers its subcommands on the one CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_model_commands(CLI::App& app);  // run, generate, bench-local, gen-model

// Turns a failed Status into the one-line error and exit code 1.
int fail(const std::string& what);

}  // namespace tessera::cli
