// `tessera <command>`: thin entry point; the work lives in the libraries.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "core/logging.h"
#include "kernels/gemm.h"

namespace tessera::cli {

int fail(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  return 1;
}

}  // namespace tessera::cli

namespace {

// OpenBLAS reads OPENBLAS_CORETYPE once, when it is loaded; to correct a
// fallback to generic kernels (see better_blas_core) we set it and restart
// the process once. A user's own OPENBLAS_CORETYPE always wins.
void select_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("TESSERA_KEEP_BLAS_CORE") != nullptr) return;
  const std::string core = tessera::kernels::better_blas_core();
  if (core.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);  // on failure, go on with the kernels we have
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_core(argv);
  CLI::App app{"Tessera: one transformer inference split across edge devices"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")->capture_default_str();
  tessera::cli::add_model_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
