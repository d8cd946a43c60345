#!/usr/bin/env bash
# Builds and runs every test: the Release build (gcc), then the same tests
# built by clang with AddressSanitizer + UndefinedBehaviorSanitizer, then a
# short run of every fuzz target on its corpus (TESSERA_FUZZ_SECONDS each,
# default 20; 0 skips it). The fuzz targets come from the sanitizer build:
# one clang build of the libraries serves both. Extra arguments go to ctest
# (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

run_suite() {
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "${ctest_args[@]}"
}

ctest_args=("$@")
# Each section's start, in seconds from the first: where CI's minutes go.
section() { echo "== $* [at ${SECONDS}s]"; }
section "Layering (libraries and includes)"
bash scripts/check_layers.sh
section "Release build"
run_suite build -DCMAKE_BUILD_TYPE=Release
# The dense layers' OpenBLAS fallback: the model label (every Hugging Face
# fixture) and the kernel tests again with the libxsmm path switched off.
section "Release, TESSERA_GEMM=openblas (model label + packed kernels)"
TESSERA_GEMM=openblas ctest --test-dir build --output-on-failure -j"$jobs" -L model "${ctest_args[@]}"
TESSERA_GEMM=openblas ctest --test-dir build --output-on-failure -j"$jobs" -R 'PackedLinearTest' "${ctest_args[@]}"
section "ASan + UBSan build (clang, with the fuzz targets)"
# -O1 -g1 (line tables): half the compile time of -O2 -g on 2 cores, and the
# sanitizer reports keep their file:line frames. The test sources and the CLI
# at -O0: half of -O1's compile time, and the work is in the libraries.
# clang with TESSERA_FUZZ: the libraries also carry libFuzzer's coverage (not
# the kernels: tests/fuzz/coverage_ignore.txt), so the fuzz smoke run below
# needs no second build of them (that build took 7 of CI's minutes).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite build-asan -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DTESSERA_SANITIZE=ON -DTESSERA_FUZZ=ON -DTESSERA_BUILD_BENCH=OFF -DTESSERA_TEST_OPT=-O0
fuzz_seconds=${TESSERA_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  section "Fuzz smoke run (${fuzz_seconds}s per target)"
  TESSERA_FUZZ_DIR=build-asan bash scripts/fuzz.sh all "$fuzz_seconds"
fi
section "Done"
