#!/usr/bin/env bash
# Issue 5's target in one run: Voltage on K = 2 devices x 1 thread at 1 Gbit/s
# against one device with 1 thread, BERT-base, seq 128. Alternates the two
# ROUNDS times (the machine is shared and noisy) and prints each round's ratio
# and the ratio of the medians.
#   bench/voltage_target.sh [MODEL_DIR] [ROUNDS] [LINK] [SEQ] [REPS]   (seq 128, 10 timed runs)
# Benchmark runs unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/tessera
model=${1:-build/models/bert-base}
rounds=${2:-5}
link=${3:-1gbit}
seq_len=${4:-128}
reps=${5:-10}
warm=$(( reps > 3 ? 3 : 1 ))
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
[ -f "$model/model.safetensors" ] || $bin gen-model --preset bert-base --out "$model" >/dev/null
ids=$(seq -s, 1000 $((1000 + seq_len - 1)))
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
singles=() voltages=()
echo "| round | single ms | voltage ms | comm ms (rank 0) | voltage / single |"
echo "|---|---|---|---|---|"
for r in $(seq "$rounds"); do
  s=$($bin bench-local --model "$model" --seq "$seq_len" --threads 1 --reps "$reps" --warmup $((warm < 2 ? warm : 2)) --json | field "round(d['median_ms'],1)")
  out=$($bin run --model "$model" --ids "$ids" --strategy voltage --devices 2 --threads-per-device 1 --link "$link" \
        --insecure --stats --warmup "$warm" --reps "$reps")
  v=$(echo "$out" | field "round(d['latency_ms'],1)")
  c=$(echo "$out" | field "round(d['ranks'][0]['comm_ms'],1)")
  singles+=("$s") voltages+=("$v")
  echo "| $r | $s | $v | $c | $(python3 -c "print(round($v/$s,3))") |"
done
python3 - "${singles[*]}" "${voltages[*]}" <<'PY'
import statistics, sys
s = statistics.median(map(float, sys.argv[1].split()))
v = statistics.median(map(float, sys.argv[2].split()))
print(f"\nmedians: single {s:.1f} ms, voltage {v:.1f} ms, voltage / single {v / s:.3f}")
PY
