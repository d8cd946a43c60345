#!/usr/bin/env bash
# auto's generation against one device, in alternating rounds on the same machine:
# the time to the first token (prefill_ms) and ms/token of `run --strategy auto
# --generate N` on 2 local devices x 1 thread and of the terminal alone, with the plan
# auto chose (a pair prints its decode strategy).
#   bench/generation_auto.sh MODEL [LINK] [SEQ] [NEW] [ROUNDS]   (1gbit,0.2ms; 512; 32; 5)
# SPEEDS=1,0.5 emulates the devices' speeds (--device-speed; the terminal, first, also
# runs the one-device rounds at its own speed).
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
link=${2:-1gbit,0.2ms}
seq=${3:-512}
new=${4:-32}
rounds=${5:-5}
speeds=${SPEEDS:-1,1}
bin=build/bin/tessera
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ids=$(seq -s, 1000 $((1000 + seq - 1)))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$rounds"); do
  for s in single auto; do
    if [ "$s" = single ]; then
      args="--strategy single --device-speed ${speeds%%,*}"  # the session path, whose --stats give the figures
    else
      args="--strategy auto --devices 2 --link $link --device-speed $speeds"
    fi
    "$bin" run --model "$model" --ids "$ids" --generate "$new" --greedy $args --threads-per-device 1 \
      --reps 1 --warmup 1 --stats 2>/dev/null | tail -1 | python3 -c "
import json,sys
j=json.load(sys.stdin)
print('$s', j['strategy'] + ('+' + j['decode_strategy'] if 'decode_strategy' in j else ''), j['prefill_ms'], j['ms_per_token'],
      j.get('predicted_ttft_ms') or 0, j.get('predicted_ms_per_token') or 0)" >>"$out"
  done
done
python3 - "$out" "$link" "$seq" "$new" "$speeds" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
def med(kind, col): return st.median(float(r[col]) for r in rows if r[0] == kind)
plans = sorted({r[1] for r in rows if r[0] == 'auto'})
new = int(sys.argv[4])
total = lambda kind: med(kind, 2) + (new - 1) * med(kind, 3)
print(f"link {sys.argv[2]}, speeds {sys.argv[5]}, {sys.argv[3]}-token prompt, {new} new tokens, {len(rows)//2} alternating rounds")
for kind in ('single', 'auto'):
    print(f"{kind:7s} prefill {med(kind, 2):8.1f} ms  {med(kind, 3):7.3f} ms/token" +
          (f"  (plan {', '.join(plans)}; predicted {med(kind, 4):.1f} ms, {med(kind, 5):.3f} ms/token)" if kind == 'auto' else ''))
print(f"auto/single: TTFT {med('auto', 2) / med('single', 2):.3f}x, ms/token {med('auto', 3) / med('single', 3):.3f}x, "
      f"generation {total('auto') / total('single'):.3f}x")
print(f"auto predicted/measured: TTFT {med('auto', 4) / med('auto', 2) - 1:+.1%}, ms/token {med('auto', 5) / med('auto', 3) - 1:+.1%}")
PY
