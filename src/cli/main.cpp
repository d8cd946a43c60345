// `tessera <command>`: thin entry point; the work lives in the libraries.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/comm_cmd.h"
#include "cli/commands.h"
#include "cli/plan_cmd.h"
#include "core/logging.h"
#include "kernels/gemm.h"

namespace tessera::cli {

int fail(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  return 1;
}

}  // namespace tessera::cli

namespace {

// The compute threads a run asks for, read before the arguments are parsed
// because OpenBLAS must be configured before it loads (see gemm.h).
int requested_threads(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" || a == "--threads-per-device") return std::atoi(argv[i + 1]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::kernels::reexec_with_better_blas_core(argv, requested_threads(argc, argv));
  CLI::App app{"Tessera: one transformer inference split across edge devices"};
  app.require_subcommand(1);
  // Errors reach the user as one "error: ..." line; log lines stay quiet
  // unless asked for. A daemon's log is its only output (refused requests,
  // each job's figures, failovers), so `worker` and `serve` log at info.
  const bool daemon = argc > 1 && (std::string(argv[1]) == "worker" || std::string(argv[1]) == "serve");
  tessera::core::init_logging(daemon ? "info" : "error");
  app.add_option_function<std::string>(
      "--log-level", [](const std::string& level) { tessera::core::init_logging(level); },
      "debug, info, warn, error or off (default error; worker: info)");
  tessera::cli::add_model_commands(app);
  tessera::cli::add_worker_commands(app);
  tessera::cli::add_bench_attention(app);
  tessera::cli::add_bench_command(app);
  tessera::cli::add_comm_commands(app);
  tessera::cli::add_plan_commands(app);
  tessera::cli::add_serve_command(app);
  tessera::cli::add_render_chat_command(app);
  tessera::cli::add_tokenize_command(app);
  tessera::cli::add_chat_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
