#!/usr/bin/env bash
# Several tessera builds on one device's decode, alternating rounds: ms/token of
# `bench-local --seq SEQ --generate 32` (SEQ 16 unless set) for each build on each
# model, one line per (round, model, build).
#   bash bench/ab_local_decode.sh "BIN_A BIN_B ..." "MODEL ..." [THREADS] [ROUNDS]
set -euo pipefail
bins=$1; models=$2; threads=${3:-1}; rounds=${4:-3}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
for ((r = 1; r <= rounds; r++)); do
  for m in $models; do
    for b in $bins; do
      ms=$("$b" bench-local --model "$m" --seq "${SEQ:-16}" --generate 32 --threads "$threads" --reps 1 --warmup 1 --json |
           tail -1 | python3 -c "import json,sys; print('%.2f' % json.loads(sys.stdin.read())['decode_ms_per_token'])")
      echo "$r $(basename "$m") $b $ms"
    done
  done
done
