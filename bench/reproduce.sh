#!/usr/bin/env bash
# Every figure of docs/performance.md in one run, on a quiet machine:
#   bench/reproduce.sh [OUT_DIR]     (default build/bench-out)
# Needs a Release build in build/ and, for the ONNX Runtime rows, the peers
# prepared by ../shared/peers/setup.sh 128 (skipped when absent). Benchmark
# runs unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; tests never do.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench-out}
bin=build/bin/tessera
models=build/models
mkdir -p "$out" "$models"
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
for preset in bert-base gpt2 vit-base; do
  [ -f "$models/$preset/model.safetensors" ] || $bin gen-model --preset "$preset" --out "$models/$preset" >/dev/null
done

# 1. One device against ONNX Runtime, alternating, two rounds.
ort=/tmp/ort/bert-base-128.onnx
{
  for round in 1 2; do
    for t in 1 2; do
      $bin bench-local --model "$models/bert-base" --seq 128 --threads "$t" --reps 10 --warmup 2
      if [ -f "$ort" ]; then
        NODE_PATH=/tmp/ort/node_modules node ../shared/peers/ort_peer.js "$ort" 128 "$t"
      fi
    done
  done
  for m in gpt2 vit-base; do
    for t in 1 2; do $bin bench-local --model "$models/$m" --seq 128 --threads "$t" --reps 10 --warmup 2; done
  done
} | tee "$out/single.txt"

# 2. Every strategy, K = 2 devices x 1 thread, four link speeds.
bash bench/strategies.sh "$models/bert-base" 2 "125mbit 250mbit 500mbit 1gbit" | tee "$out/strategies.md"

# 2b. Issue 5's target: Voltage (K = 2 x 1 thread, 1 Gbit/s) against one device, alternating.
bash bench/voltage_target.sh "$models/bert-base" 7 | tee "$out/voltage_target.md"

# 3. Voltage Fig. 6: partitioned attention.
$bin bench-attention | tee "$out/attention.md"

# 4. The papers' sweep: latency vs devices and vs bandwidth, with plots.
$bin bench --model "$models/bert-base" --strategies single,tp,sp,voltage,galaxy,galaxy-no-overlap,pipeline \
  --devices 1,2,3,4 --link 125mbit,250mbit,500mbit,1gbit --seq 128 --reps 5 --out "$out/bert-base.csv" --plot

# 5. PRISM's table (docs/prism.md).
QUIET_WAIT=0 REPS=5 OUT="$out/prism" bash bench/prism_table.sh build | tee "$out/prism.md"
