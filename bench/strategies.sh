#!/usr/bin/env bash
# Latency of every strategy against one device, BERT-base seq 128, K devices
# of 1 thread each over emulated links; prints a markdown table. Strategies
# run interleaved per link, so each comparison is taken in one run.
#   bench/strategies.sh [MODEL_DIR] [K] [LINKS]
# Benchmark runs unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/tessera
model=${1:-build/models/bert-base}
k=${2:-2}
links=${3:-"125mbit 250mbit 500mbit 1gbit"}
[ -f "$model/model.safetensors" ] || $bin gen-model --preset bert-base --out "$model" >/dev/null
ids=$(seq -s, 1000 1127)
run() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $bin run --model "$model" --ids "$ids" --threads-per-device 1 \
          --insecure --stats --warmup 3 --reps 10 "$@"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
single=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $bin bench-local --model "$model" --seq 128 --threads 1 --reps 10 --json |
         field "round(d['median_ms'],1)")
echo "single device, 1 thread: $single ms"
echo
echo "| strategy | link | latency ms | vs single | max bytes sent per device | comm ms (rank 0) |"
echo "|---|---|---|---|---|---|"
for link in $links; do
  for s in tp sp voltage pipeline galaxy galaxy-no-overlap; do
    args=(--strategy "${s%-no-overlap}")
    [ "$s" = galaxy-no-overlap ] && args+=(--no-overlap)
    out=$(run "${args[@]}" --devices "$k" --link "$link")
    lat=$(echo "$out" | field "round(d['latency_ms'],1)")
    bytes=$(echo "$out" | field "max(r['bytes_sent'] for r in d['ranks'])")
    comm=$(echo "$out" | field "round(d['ranks'][0]['comm_ms'],1)")
    ratio=$(python3 -c "print(round($lat/$single,2))")
    echo "| $s | $link | $lat | $ratio | $bytes | $comm |"
  done
done
