// Each file in cli/ registers its subcommands on the one CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void add_model_commands(CLI::App& app);   // run, generate, bench-local, gen-model, fidelity
void add_fidelity_command(CLI::App& app);  // fidelity (registered by add_model_commands)
void add_worker_commands(CLI::App& app);
void add_bench_command(CLI::App& app);  // bench (strategy x devices x link sweep, CSV, plots)
void add_serve_command(CLI::App& app);  // serve (OpenAI-compatible HTTP API)
void add_render_chat_command(CLI::App& app);  // render-chat (a chat template for a messages file)
void add_tokenize_command(CLI::App& app);  // tokenize (text <-> ids with the model's tokenizer)
void add_chat_command(CLI::App& app);   // chat (interactive, the model's chat template)
void add_bench_attention(CLI::App& app);  // bench-attention (Voltage Fig. 6)  // worker (daemon), worker-job (local worker process)

// Turns a failed Status into the one-line error and exit code 1.
int fail(const std::string& what);

}  // namespace tessera::cli
