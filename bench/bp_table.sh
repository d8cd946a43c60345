#!/usr/bin/env bash
# DeTransformer's Table IV and Fig. 8 on this machine (issue 14), all rows
# measured in one run with alternating rounds (the machine is shared and
# noisy; ratios within a round are what to compare).
#
# Table IV: K = 2 devices x 1 thread, seq 128, links of 125/250/500/1000
# Mbit/s. Rows: BP+auto and BP+TP on the BERT-base-shaped decoupled model
# (N_div = 4, N_b = 4, original layers 2,5,8,11), TP, SP and Voltage on the
# ordinary BERT-base, and one device (ordinary BERT-base, 1 thread).
# Fig. 8: BP+auto at 500 Mbit/s against N_b in {1,2,3,4,6}.
#   bench/bp_table.sh [ROUNDS] [MODELS_DIR]
# Benchmark runs unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/tessera
rounds=${1:-3}
models=${2:-build/models}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$models"
base=$models/bert-base
[ -f "$base/model.safetensors" ] || $bin gen-model --preset bert-base --out "$base" >/dev/null
declare -A originals=([1]=11 [2]=5,11 [3]=3,7,11 [4]=2,5,8,11 [6]=1,3,5,7,9,11)
for nb in "${!originals[@]}"; do
  d=$models/bert-base-bp4-nb$nb
  [ -f "$d/model.safetensors" ] || $bin gen-model --preset bert-base --bp-div 4 --bp-original "${originals[$nb]}" --out "$d" >/dev/null
done
bp=$models/bert-base-bp4-nb4
ids=$(seq -s, 1000 1127)
links=(125mbit 250mbit 500mbit 1gbit)
out=$(mktemp)
# ROW LINK -> "ms plan"
dist() {
  local model=$1 link=$2; shift 2
  $bin run --model "$model" --ids "$ids" --devices 2 --threads-per-device 1 --link "$link" --insecure --stats \
    --warmup 1 --reps 3 "$@" |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['latency_median_ms'],1), d['plan']['options'].get('plan','-'), json.dumps(d['plan']['options'].get('auto_ms',{}),separators=(',',':')))"
}
for r in $(seq "$rounds"); do
  s=$($bin bench-local --model "$base" --seq 128 --threads 1 --reps 3 --warmup 1 --json |
      python3 -c "import json,sys; print(round(json.load(sys.stdin)['median_ms'],1))")
  echo "$r|single|-|$s - {}" | tee -a "$out" >&2
  for link in "${links[@]}"; do
    echo "$r|bp-auto|$link|$(dist "$bp" "$link" --strategy bp)" | tee -a "$out" >&2
    echo "$r|bp-tp|$link|$(dist "$bp" "$link" --strategy bp --bp-plan tp)" | tee -a "$out" >&2
    for s in tp sp voltage; do echo "$r|$s|$link|$(dist "$base" "$link" --strategy $s)" | tee -a "$out" >&2; done
  done
  for nb in 1 2 3 4 6; do
    echo "$r|nb$nb|500mbit|$(dist "$models/bert-base-bp4-nb$nb" 500mbit --strategy bp)" | tee -a "$out" >&2
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
ms = collections.defaultdict(list); plans = collections.defaultdict(list); sums = {}
for line in open(sys.argv[1]):
    r, row, link, rest = line.rstrip('\n').split('|', 3)
    t, plan, auto = rest.split(' ', 2)
    ms[(row, link)].append(float(t)); plans[(row, link)].append(plan); sums[(row, link)] = auto
med = {k: statistics.median(v) for k, v in ms.items()}
single = med[('single', '-')]
links = ['125mbit', '250mbit', '500mbit', '1gbit']
print("Table IV (median ms over %d rounds; K = 2 x 1 thread, seq 128)\n" % len(ms[('single', '-')]))
print("| link | BP+auto | BP+TP | TP | SP | Voltage | one device | BP+auto vs TP | vs SP | vs one device | auto picked | auto sums (ms, predicted) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for l in links:
    a = med[('bp-auto', l)]
    picked = collections.Counter(plans[('bp-auto', l)]).most_common(1)[0][0]
    print(f"| {l} | {a:.0f} | {med[('bp-tp', l)]:.0f} | {med[('tp', l)]:.0f} | {med[('sp', l)]:.0f} | {med[('voltage', l)]:.0f} | "
          f"{single:.0f} | {med[('tp', l)] / a:.2f}x | {med[('sp', l)] / a:.2f}x | {single / a:.2f}x | {picked} | {sums[('bp-auto', l)]} |")
print("\nFig. 8: BP+auto at 500 Mbit/s against the number of original layers N_b\n")
print("| N_b | median ms | vs one device | auto picked |")
print("|---|---|---|---|")
for nb in [1, 2, 3, 4, 6]:
    k = (f'nb{nb}', '500mbit')
    print(f"| {nb} | {med[k]:.0f} | {single / med[k]:.2f}x | {collections.Counter(plans[k]).most_common(1)[0][0]} |")
PY
rm -f "$out"
