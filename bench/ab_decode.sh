#!/usr/bin/env bash
# A/B of two tessera builds on decode, alternating rounds: GPT-2 (124M shape), tp on 2 devices x 1 thread, 1 Gbit/s 0.2 ms, 16-token prompt, 32 new tokens; ms/token.
#   bash bench/ab_decode.sh OLD_BIN NEW_BIN GPT2_DIR [ROUNDS]
set -euo pipefail
a=$1; b=$2; model=$3; rounds=${4:-5}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
ids=$(python3 -c "print(','.join(str(1000 + 7 * i) for i in range(16)))")
m() { "$1" run --model "$model" --ids "$ids" --generate 32 --greedy --strategy tp --devices 2 --threads-per-device 1 --link 1gbit,0.2ms --insecure --stats | python3 -c "import json,sys; print(json.load(sys.stdin)['ms_per_token_median'])"; }
for ((r = 0; r < rounds; r++)); do ta=$(m "$a"); tb=$(m "$b"); echo "$ta $tb"; done | python3 -c "
import sys, statistics
rows=[tuple(map(float,l.split())) for l in sys.stdin]
print('decode tp K=2 ms/token: A median %.2f, B median %.2f, median paired B/A %.3f (%d rounds)' % (statistics.median(a for a,_ in rows), statistics.median(b for _,b in rows), statistics.median(b/a for a,b in rows), len(rows)))"
