#!/usr/bin/env bash
# Runs one libFuzzer target (or all) for a bounded time on its corpus.
#   scripts/fuzz.sh TARGET SECONDS     e.g. scripts/fuzz.sh fuzz_wire 60
#   scripts/fuzz.sh all SECONDS        every target, as many at a time as there are cores
# Builds build-fuzz (clang, -fsanitize=fuzzer,address,undefined) when needed;
# the other builds are not touched. TESSERA_FUZZ_DIR names another folder
# already configured with TESSERA_FUZZ=ON (scripts/test.sh passes its
# sanitizer build). Seeds come from tests/fuzz/corpus/TARGET (read only);
# what the fuzzer finds goes to DIR/corpus/TARGET, and a crashing input to
# DIR/artifacts/TARGET/ (the run then fails: fix the bug and add the input
# to tests/fuzz/corpus/TARGET as a regression).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/fuzz.sh TARGET|all SECONDS" >&2; exit 2; }
target=$1 seconds=$2
dir=${TESSERA_FUZZ_DIR:-build-fuzz}
targets=(fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_image fuzz_cluster fuzz_wire fuzz_job fuzz_request fuzz_template fuzz_gguf)
if [ "$target" != all ] && [[ ! " ${targets[*]} " =~ " $target " ]]; then
  echo "unknown target '$target' (one of: ${targets[*]}, all)" >&2
  exit 2
fi
if [ "$dir" != build-fuzz ] && ! grep -q '^TESSERA_FUZZ:BOOL=ON' "$dir/CMakeCache.txt" 2>/dev/null; then
  echo "$dir is not a build configured with TESSERA_FUZZ=ON" >&2
  exit 2
fi
if [ ! -f "$dir/build.ninja" ]; then
  # -O1 with line tables: a much shorter build on 2 cores (CI runs a short smoke).
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_FUZZ=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF >/dev/null
fi
if [ "$target" = all ]; then
  cmake --build "$dir" -j"$(nproc)" --target fuzz_all
  run=("${targets[@]}")
else
  cmake --build "$dir" -j"$(nproc)" --target "$target"
  run=("$target")
fi
# One target: its filtered output goes to DIR/logs/TARGET.log.
fuzz_one() {
  local t=$1
  mkdir -p "$dir/corpus/$t" "$dir/artifacts/$t" "$dir/logs"
  # Leaks are reported by the ASan suite; here they would only stop the run.
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$dir/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$t/" "$dir/corpus/$t" "tests/fuzz/corpus/$t" 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==|SUMMARY|ERROR|Done |INFO: Running)|runtime error|deadly signal|Test unit written" \
      >"$dir/logs/$t.log" || true
}
# A libFuzzer run uses one core: as many targets at a time as there are cores
# (on CI's 2 cores the smoke run takes half the time, each target its seconds).
for t in "${run[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=0
for t in "${run[@]}"; do
  echo "== $t: ${seconds}s"
  cat "$dir/logs/$t.log"
  # A crash leaves its input in the artifacts folder and makes the run fail.
  if compgen -G "$dir/artifacts/$t/*" >/dev/null; then
    echo "$t: crashing inputs in $dir/artifacts/$t/" >&2
    failed=1
  fi
done
exit "$failed"
