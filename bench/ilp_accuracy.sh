#!/usr/bin/env bash
# Issue 13: the pipeline ILP's objective T against the measured latency of its
# plan, on 2 local devices (runtime --device-speed emulation), for speed mixes
# {1,1} {1,0.5} {1,0.25}, links of 125..1000 Mbit/s, without a budget and with
# a terminal budget that forces a split; then weight pre-loading on and off on
# a plan that alternates devices, beside Tw's prediction.
# Prints markdown tables (docs/planner.md). Usage: bench/ilp_accuracy.sh [model dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin/tessera}
M=${1:-/tmp/tessera-ilp-acc}
ROWS=${ROWS:-64}
REPS=${REPS:-9}
SPEEDS=${SPEEDS:-"1,1 1,0.5 1,0.25"}
LINKS=${LINKS:-"125mbit 250mbit 500mbit 1000mbit"}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
[ -f "$M/config.json" ] || "$BIN" gen-model --preset gpt2 --layers 6 --hidden 512 --heads 8 --vocab 8000 --out "$M" >/dev/null
IDS=$(python3 -c "print(','.join(str(100 + i) for i in range($ROWS)))")
COMMON=(--threads-per-device 1)
LT=(--load-time)  # the ILP with Tw, so that the table shows T with and without it
RUN=(--cpus-per-device 1 --insecure --stats --reps "$REPS" --warmup 1)
lscpu | grep 'Model name' | sed 's/^/# /'
echo "# load: $(cut -d' ' -f1-3 /proc/loadavg); model $M, $ROWS rows, $REPS timed runs after 1 warm-up"
"$BIN" plan --model "$M" --devices 2 --seq "$ROWS" "${COMMON[@]}" --reprofile --json >/dev/null  # profile once

# The pipeline row of `tessera plan --json`: members, run flags and the ILP's T, Tc, Tx, Tw.
pipeline_row() {
  python3 -c '
import json, re, sys
t = json.load(sys.stdin)
r = next(r for r in t["rows"] if r["strategy"] == "pipeline")
o = r["plan"]["options"]
m = o["layer_map"]
layers = ",".join(f"{i}:{d}" for i, d in enumerate(m))
note = next(n for n in r["notes"] if n.startswith("ILP"))
T, Tc, Tx, Tw = map(float, re.search(r"T ([\d.]+) ms \(Tc ([\d.]+) \+ Tx ([\d.]+) \+ Tw ([\d.]+)\)", note).groups())
print(len(r["members"]), ",".join(map(str, r["members"])), layers, o.get("units", "layers"), T, Tc, Tx, Tw)'
}
# "median min" of the timed runs: on a shared, loaded machine the minimum is
# the run least disturbed by other processes.
measured() { python3 -c 'import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(j["latency_median_ms"], j["latency_min_ms"])'; }
pick() { python3 -c "import sys; v='$1'.split(','); print(','.join(v[int(i)] for i in '$2'.split(',')))"; }

FULL=$("$BIN" plan --model "$M" --devices 1 --seq "$ROWS" "${COMMON[@]}" --json |
  python3 -c 'import json,sys; t=json.load(sys.stdin); print(next(r for r in t["rows"] if r["strategy"]=="single")["prediction"]["devices"][0]["memory_bytes"])')
HALF="$((FULL * 6 / 10)),$((FULL * 2))"

echo
echo "| speeds | link | terminal budget | plan (device of each layer) | T ms | Tc | Tx | Tw | measured median / min ms | T vs min | T - Tw vs min | T vs median |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for speeds in $SPEEDS; do
  for link in $LINKS; do
    for budget in none 60%; do
      mem=()
      [ "$budget" = none ] || mem=(--memory-limit "$HALF")
      read -r K MEMBERS LAYERS UNITS T TC TX TW < <("$BIN" plan --model "$M" --devices 2 --seq "$ROWS" "${COMMON[@]}" "${LT[@]}" \
        --link "$link,1ms" --device-speed "$speeds" "${mem[@]}" --json | pipeline_row)
      read -r med mn < <("$BIN" run --model "$M" --ids "$IDS" --strategy pipeline --devices "$K" --layers "$LAYERS" --units "$UNITS" \
        --link "$link,1ms" --device-speed "$(pick "$speeds" "$MEMBERS")" "${COMMON[@]}" "${RUN[@]}" | measured)
      python3 -c "
T, tw, med, ms = $T, $TW, $med, $mn
map_ = ''.join(x.split(':')[1] for x in '$LAYERS'.split(','))
members = '$MEMBERS'.split(',')
map_ = ''.join(members[int(c)] for c in map_)
print(f'| {\"$speeds\"} | $link | $budget | {map_} | {T:.1f} | {$TC:.1f} | {$TX:.1f} | {tw:.1f} | {med:.1f} / {ms:.1f} | {100*(ms-T)/T:+.0f}% | {100*(ms-(T-tw))/(T-tw):+.0f}% | {100*(med-T)/T:+.0f}% |')"
    done
  done
done

# Pre-loading: blocks alternating between the devices (every hand-over gives
# the receiver idle time to touch its next weights), on and off.
echo
echo "| plan | pre-loading | measured median / min ms | Tw predicted |"
echo "|---|---|---|---|"
# Tw with nothing hidden (Eq. 2 summed over the layers): their weight bytes
# (the safetensors header) over the profiled streaming read.
"$BIN" profile --model "$M" --devices 2 --seq "$ROWS" "${COMMON[@]}" --out /tmp/tessera-ilp-acc-profile.json >/dev/null
TWOFF=$(python3 -c "
import json, struct
f = open('$M/model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
b = sum(v['data_offsets'][1] - v['data_offsets'][0] for k, v in h.items() if '.h.' in k or k.startswith('h.'))
gbps = json.load(open('/tmp/tessera-ilp-acc-profile.json'))['devices'][0]['stream_gbps']
print(f'{b / (gbps * 1e9) * 1e3:.1f}')")
NB=$(python3 -c "import json; print(2 * json.load(open('$M/config.json'))['n_layer'])")
ALT=$(python3 -c "print(','.join(f'{u}:{u % 2}' for u in range($NB)))")
for round in 1 2 3; do  # alternating rounds
  for pre in on off; do
    flag=()
    [ "$pre" = on ] || flag=(--no-preload)
    read -r med mn < <("$BIN" run --model "$M" --ids "$IDS" --strategy pipeline --devices 2 --layers "$ALT" --units blocks "${flag[@]}" \
      --link 1000mbit,1ms --device-speed 1,1 "${COMMON[@]}" "${RUN[@]}" | measured)
    echo "| blocks alternating 0,1,0,1,... (round $round) | $pre | $med / $mn | $([ "$pre" = on ] && echo "0 (every unit follows a hand-over)" || echo "$TWOFF (nothing hidden)") |"
  done
done
