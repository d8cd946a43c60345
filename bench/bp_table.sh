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
# Each measurement: 1 warm-up and 5 timed runs; the tables give the median over the
# rounds of each measurement's median, then of its fastest run (the machine's load comes
# in bursts that can triple one run).
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
# Auto prices its plans on the cached device profile: measure it afresh, so a
# profile taken on a busier machine does not decide (it is the cache `run` reads).
$bin profile --model "$bp" --threads-per-device 1 --reprofile --out "$(mktemp)" >/dev/null
ids=$(seq -s, 1000 1127)
links=(125mbit 250mbit 500mbit 1gbit)
out=$(mktemp)
# MODEL LINK ARGS -> "median_ms min_ms plan auto_sums"
dist() {
  local model=$1 link=$2; shift 2
  $bin run --model "$model" --ids "$ids" --devices 2 --threads-per-device 1 --link "$link" --insecure --stats \
    --warmup 1 --reps 5 "$@" |
    python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['latency_median_ms'],1), round(d['latency_min_ms'],1), d['plan']['options'].get('plan','-'), json.dumps({k: round(v or 0) for k, v in d['plan']['options'].get('auto_ms',{}).items()},separators=(',',':')))"
}
for r in $(seq "$rounds"); do
  s=$($bin bench-local --model "$base" --seq 128 --threads 1 --reps 5 --warmup 1 --json |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['median_ms'],1), round(d['min_ms'],1))")
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
runs = collections.defaultdict(list); plans = collections.defaultdict(list); sums = {}
for line in open(sys.argv[1]):
    r, row, link, rest = line.rstrip('\n').split('|', 3)
    med, best, plan, auto = rest.split(' ', 3)
    runs[(row, link)].append((float(med), float(best))); plans[(row, link)].append(plan); sums[(row, link)] = auto
links = ['125mbit', '250mbit', '500mbit', '1gbit']
for which, name in ((0, 'median of each measurement'), (1, 'fastest run of each measurement')):
    m = {k: statistics.median(x[which] for x in v) for k, v in runs.items()}
    single = m[('single', '-')]
    print(f"Table IV, {name} (median over {len(runs[('single', '-')])} rounds, ms; K = 2 x 1 thread, seq 128)\n")
    print("| link | BP+auto | BP+TP | TP | SP | Voltage | one device | BP+auto vs TP | vs SP | vs one device | auto picked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for l in links:
        a = m[('bp-auto', l)]
        picked = '/'.join(sorted(set(plans[('bp-auto', l)])))
        print(f"| {l} | {a:.0f} | {m[('bp-tp', l)]:.0f} | {m[('tp', l)]:.0f} | {m[('sp', l)]:.0f} | {m[('voltage', l)]:.0f} | "
              f"{single:.0f} | {m[('tp', l)] / a:.2f}x | {m[('sp', l)] / a:.2f}x | {single / a:.2f}x | {picked} |")
    print(f"\nFig. 8, {name}: BP+auto at 500 Mbit/s against the number of original layers N_b\n")
    print("| N_b | ms | one device / BP+auto | auto picked |")
    print("|---|---|---|---|")
    for nb in [1, 2, 3, 4, 6]:
        k = (f'nb{nb}', '500mbit')
        print(f"| {nb} | {m[k]:.0f} | {single / m[k]:.2f}x | {'/'.join(sorted(set(plans[k])))} |")
    print()
print("Auto's linear sums (ms, predicted; allgather / sp / tp): " +
      ", ".join(f"{l}: {sums[('bp-auto', l)]}" for l in links))
PY
rm -f "$out"
