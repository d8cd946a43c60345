#!/usr/bin/env bash
# A/B of two tessera builds in one run, alternating rounds: single-device
# bench-local (BERT-base, seq 128, 1 thread), Voltage on 2 devices at 1 Gbit/s,
# Galaxy and TP on 2 devices at 500 Mbit/s (1 thread each). Prints, per case,
# the median of the paired ratios B/A over the rounds and each side's median.
#   bash bench/ab.sh OLD_BIN NEW_BIN MODEL_DIR [ROUNDS]
set -euo pipefail
a=$1; b=$2; model=$3; rounds=${4:-7}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ids=$(python3 -c "print(','.join(str(1000 + i) for i in range(128)))")
cases=("single" "voltage 1gbit" "galaxy 500mbit" "tp 500mbit")
measure() {  # BIN CASE -> median ms
  local bin=$1; set -- $2
  if [ "$1" = single ]; then
    "$bin" bench-local --model "$model" --seq 128 --threads 1 --reps 5 --warmup 1 --json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['median_ms'])"
  else
    "$bin" run --model "$model" --ids "$ids" --strategy "$1" --devices 2 --threads-per-device 1 \
      --link "$2" --insecure --reps 5 --warmup 1 --stats |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('latency_median_ms', d['latency_ms']))"
  fi
}
out=$(mktemp)
for ((r = 0; r < rounds; r++)); do
  for c in "${cases[@]}"; do
    ta=$(measure "$a" "$c"); tb=$(measure "$b" "$c")
    echo "$c|$ta|$tb" | tee -a "$out" >&2
  done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    c, a, b = line.strip().split('|')
    rows.setdefault(c, []).append((float(a), float(b)))
print("| case | A median ms | B median ms | median of paired B/A | rounds |")
print("|---|---|---|---|---|")
for c, v in rows.items():
    print(f"| {c} | {statistics.median(x for x, _ in v):.1f} | {statistics.median(y for _, y in v):.1f} | "
          f"{statistics.median(y / x for x, y in v):.3f} | {len(v)} |")
PY
rm -f "$out"
