// Benchmark entry point: same BLAS kernel selection as the CLI.
#include <benchmark/benchmark.h>

#include "kernels/gemm.h"

int main(int argc, char** argv) {
  tessera::kernels::reexec_with_better_blas_core(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
