#!/usr/bin/env bash
# --wire f32 against f16 and q8: latency of each strategy on K devices of 1
# thread over one emulated link, the wires alternating within each round so
# every ratio is taken in one run; with the bytes each rank sent (CommStats).
# Fidelity figures come from `tessera fidelity --wire f16,q8` (docs/wire.md).
#   bench/wire_compare.sh [MODEL_DIR] [K] [LINK] [ROUNDS] [STRATEGIES] [SEQ] [REPS] [THREADS]
# THREADS > 1: each device that many threads, pinned to its own cores.
# A missing MODEL_DIR under build/models/ is written by gen-model (its name is the preset).
# Benchmark runs unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/tessera
model=${1:-build/models/bert-base}
k=${2:-2}
link=${3:-125mbit,0.2ms}
rounds=${4:-3}
strategies=${5:-"tp voltage"}
seq=${6:-128}
reps=${7:-5}
threads=${8:-1}
pin=()
[ "$threads" -gt 1 ] && pin=(--cpus-per-device "$threads")
if [ ! -e "$model/config.json" ] && [ ! -f "$model" ]; then
  $bin gen-model --preset "$(basename "$model")" --out "$model" >/dev/null
fi
ids=$(seq -s, 1000 $((999 + seq)))
py=$(command -v /usr/bin/python3 || command -v python3)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "model $model, K=$k x $threads thread(s), link $link, $seq tokens, $rounds rounds x $reps reps; CPU: $(lscpu | sed -n 's/^Model name: *//p')"
for r in $(seq "$rounds"); do
  for s in $strategies; do
    for w in f32 f16 q8; do
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $bin run --model "$model" --ids "$ids" --threads-per-device "$threads" "${pin[@]}" \
        --insecure --stats --warmup 1 --reps "$reps" --strategy "$s" --devices "$k" --link "$link" --wire "$w" |
        $py -c "import json,sys; d=json.load(sys.stdin); print('$s', '$w', d['latency_median_ms'], d['ranks'][0]['bytes_sent'], max(x['bytes_sent'] for x in d['ranks']))" >> "$out"
    done
  done
done
$py - "$out" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for s, w, ms, b0, bmax in rows:
    by.setdefault((s, w), []).append((float(ms), int(b0), int(bmax)))
print("| strategy | wire | latency ms (median of rounds) | vs f32 | bytes sent, rank 0 | vs f32 | max bytes of a rank |")
print("|---|---|---|---|---|---|---|")
for (s, w), v in by.items():
    ms = st.median(x[0] for x in v)
    f = by[(s, 'f32')]
    fms = st.median(x[0] for x in f)
    print(f"| {s} | {w} | {ms:.1f} | {ms / fms:.3f} | {v[0][1]} | {v[0][1] / f[0][1]:.4f} | {v[0][2]} |")
PY
