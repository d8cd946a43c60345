#!/usr/bin/env bash
# Distributed decode speed, in one run with alternating rounds: ms per token
# of greedy generation (NEW tokens after a PROMPT-token prompt) for GPT-2 and
# GPT-2-medium shapes (seeded random weights), one device (bench-local)
# against K = 2 devices x 1 thread for tp, galaxy and pipeline, at 1 Gbit/s
# with 0.2 ms and 1 ms of latency. Per case: the median ms per token over the
# rounds and the share of each token the terminal (and the average device)
# spent waiting on links (comm_ms / decode_ms of `--stats`). Then one
# --memory-limit case: GPT-2-medium refused on one device and run by the
# pipeline on two.
#   bash bench/decode.sh [ROUNDS] [NEW] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; new=${2:-32}; prompt=${3:-16}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
bin=build/bin/tessera
for m in gpt2 gpt2-medium; do
  [ -f "build/models/$m/model.safetensors" ] || "$bin" gen-model --preset "$m" --out "build/models/$m" >/dev/null
done
ids=$(python3 -c "print(','.join(str(1000 + 7 * i) for i in range($prompt)))")
cases=("single" "tp 1gbit,0.2ms" "galaxy 1gbit,0.2ms" "pipeline 1gbit,0.2ms" "tp 1gbit,1ms" "galaxy 1gbit,1ms" "pipeline 1gbit,1ms")
out=$(mktemp)
measure() {  # MODEL CASE -> "ms/token terminal_wait_share mean_wait_share compute_ms/token of rank 0, rank 1"
  local model=build/models/$1; set -- $2
  if [ "$1" = single ]; then
    "$bin" bench-local --model "$model" --seq "$prompt" --generate "$new" --threads 1 --reps 1 --warmup 0 --json |
      python3 -c "import json,sys; t=json.load(sys.stdin)['decode_ms_per_token']; print(t, 0, 0, t, 0)"
  else
    "$bin" run --model "$model" --ids "$ids" --generate "$new" --greedy --strategy "$1" --devices 2 \
      --threads-per-device 1 --link "$2" --insecure --stats |
      python3 -c "
import json,sys
d=json.load(sys.stdin); w=[r['comm_ms']/d['decode_ms'] for r in d['ranks']]
c=[r['compute_ms']/d['decode_steps'] for r in d['ranks']]
print(d['ms_per_token'], w[0], sum(w)/len(w), c[0], c[1])"
  fi
}
for ((r = 1; r <= rounds; r++)); do
  for m in gpt2 gpt2-medium; do
    for c in "${cases[@]}"; do
      v=$(measure "$m" "$c")
      echo "$m|$c|$v" | tee -a "$out" >&2
    done
  done
done
python3 - "$out" <<'PY'
# Separate machines, from the measured parts: each device's compute per
# token (as measured here, where the emulated devices share one memory
# bus) plus the link as its nominal figures give it. TP and Galaxy's decode
# (K = 2): the ranks compute side by side, and a token crosses 1 + 2L links
# (a broadcast, then two one-hop AllReduce per layer) carrying (2L + 1) * F
# floats; pipeline: the stages compute one after the other and a token
# crosses 2 links.
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m, c, v = line.strip().split('|')
    rows.setdefault((m, c), []).append(tuple(map(float, v.split())))
cfg = {m: json.load(open(f"build/models/{m}/config.json")) for m, _ in rows}
print("| model | case | ms/token (median) | x one device | terminal waiting on links | mean device waiting | compute ms/token (rank 0, 1) | separate machines: ms/token | x one device |")
print("|---|---|---|---|---|---|---|---|---|")
for (m, c), v in rows.items():
    med = lambda i: statistics.median(x[i] for x in v)
    t, one = med(0), statistics.median(x[0] for x in rows[(m, "single")])
    L, F = cfg[m]["n_layer"], cfg[m]["n_embd"]
    if c == "single":
        print(f"| {m} | {c} | {t:.1f} | 1.00 | - | - | {t:.1f} | {t:.1f} | 1.00 |")
        continue
    strategy, link = c.split()
    lat = float(link.split(',')[1].rstrip('ms'))
    bw = 1e9 / 8 / 1e3  # bytes per ms at 1 Gbit/s
    c0, c1 = med(3), med(4)
    if strategy == "pipeline":
        est = c0 + c1 + 2 * lat + 2 * F * 4 / bw
    else:
        est = max(c0, c1) + (1 + 2 * L) * lat + (2 * L + 1) * F * 4 / bw
    print(f"| {m} | {c} | {t:.1f} | {t / one:.2f} | {med(1):.0%} | {med(2):.0%} | {c0:.1f}, {c1:.1f} | {est:.1f} | {est / one:.2f} |")
PY
rm -f "$out"
echo
echo "--memory-limit 1GB (GPT-2-medium's fp32 weights are 1.4 GB):"
if "$bin" run --model build/models/gpt2-medium --ids "$ids" --generate 8 --greedy --memory-limit 1GB >/dev/null 2>"$out.err"; then
  echo "one device: ran (unexpected)"
else
  echo "one device: $(cat "$out.err")"
fi
"$bin" run --model build/models/gpt2-medium --ids "$ids" --generate "$new" --greedy --strategy pipeline --devices 2 \
  --threads-per-device 1 --link 1gbit,1ms --insecure --memory-limit 1GB,1GB --stats |
  python3 -c "
import json,sys
d=json.load(sys.stdin)
print('pipeline on 2 devices: %.1f ms/token, weights per device %s MB' % (d['ms_per_token'], [round(r['weight_bytes']/1e6) for r in d['ranks']]))"
rm -f "$out.err"
