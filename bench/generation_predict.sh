#!/usr/bin/env bash
# A generation's predicted time to the first token and ms per token against the
# measured ones, for every strategy that decodes, on 2 local devices of 1 thread:
# `plan --generate N` prices each row (its prompt's forward, then one row per step on
# the one-row profile); `run --strategy S --generate N --stats` measures prefill_ms
# and ms_per_token (medians of REPS generations). "voltage+single" is the pair: Voltage's
# prefill, the terminal's decode (--decode-strategy single).
# Each strategy runs with its default (equal) shares, so use equal device speeds: the
# planner's shares are then equal too (the ratios column shows them). --device-speed 1
# keeps one device on the session path, whose --stats give the figures.
#   bench/generation_predict.sh MODEL [LINKS] [SEQ] [NEW] [REPS]
#     (10gbit,0.05ms 1gbit,0.2ms; 512; 32; 3)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
links=${2:-"10gbit,0.05ms 1gbit,0.2ms"}
seq=${3:-512}
new=${4:-32}
reps=${5:-3}
bin=build/bin/tessera
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ids=$(seq -s, 1000 $((1000 + seq - 1)))
echo "link strategy devices ratios pred_ttft_ms meas_prefill_ms pred_ms_per_token meas_ms_per_token err_per_token"
for link in $links; do
  plan=$("$bin" plan --model "$model" --devices 2 --threads-per-device 1 --link "$link" \
         --seq "$seq" --generate "$new" --json 2>/dev/null | tail -1)
  for s in single tp pipeline galaxy voltage+single; do
    prefill=${s%+*}
    decode=$([ "$prefill" != "$s" ] && echo "--decode-strategy ${s#*+}" || true)
    row=$(echo "$plan" | python3 -c "
import json,sys
t=json.load(sys.stdin)
pair='$s'.split('+')
r=[r for r in t['rows'] if r['strategy']==pair[0] and r['exact'] and
   (r['plan'].get('decode') or {}).get('strategy')==(pair[1] if len(pair)>1 else None)][0]
print(len(r['members']), r['prediction']['latency_ms'], r['step_ms'] or 0, ':'.join('%g' % x for x in r['plan']['ratios']))")
    read -r k ttft step ratios <<<"$row"
    [ "$k" = 1 ] && [ "$s" != single ] && continue  # its best plan is the terminal alone
    # The pair's rows as the planner split them (Voltage moves rows off the terminal, which runs the head).
    [ -n "$decode" ] && decode="$decode --partition ${ratios//:/,}"
    m=$("$bin" run --model "$model" --ids "$ids" --generate "$new" --greedy --strategy "$prefill" $decode \
        --devices "$k" --device-speed "$([ "$k" = 1 ] && echo 1 || echo 1,1)" --threads-per-device 1 --link "$link" --reps "$reps" --warmup 1 --stats 2>/dev/null | tail -1)
    echo "$m" | python3 -c "
import json,sys
j=json.load(sys.stdin)
meas=j['ms_per_token_median']
print('$link $s $k $ratios %.1f %.1f %.3f %.3f %+.1f%%' % ($ttft, j['prefill_ms'], $step, meas, 100*($step-meas)/meas))"
  done
done
