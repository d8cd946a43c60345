#!/usr/bin/env bash
# BERT-base seq 128, batch 1, fp32: Tessera bench-local against ONNX Runtime
# 1.30 (onnxruntime-node, ../shared/peers) in alternating rounds, 1 and 2
# threads; prints each round and the medians and ratio per thread count.
#   bench/ort_compare.sh [ROUNDS]     (needs ../shared/peers/setup.sh 128 first)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
bin=build/bin/tessera
model=build/models/bert-base
[ -f "$model/model.safetensors" ] || $bin gen-model --preset bert-base --out "$model" >/dev/null
peers=$(cd .. && pwd)/shared/peers
out=$(mktemp)
for r in $(seq "$rounds"); do
  for t in 1 2; do
    s=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $bin bench-local --model "$model" --seq 128 --threads "$t" --reps 10 --warmup 2 --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])')
    o=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE NODE_PATH=/tmp/ort/node_modules node "$peers/ort_peer.js" /tmp/ort/bert-base-128.onnx 128 "$t" |
      sed -E 's/.*median ([0-9.]+) ms.*/\1/')
    echo "round $r threads $t: tessera $s ms, onnxruntime $o ms" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import re, statistics, sys
rows = [re.findall(r"[0-9.]+", l) for l in open(sys.argv[1])]
for t in ("1", "2"):
    s = [float(r[2]) for r in rows if r[1] == t]; o = [float(r[3]) for r in rows if r[1] == t]
    ms, mo = statistics.median(s), statistics.median(o)
    print(f"threads {t}: tessera median {ms:.1f} ms, onnxruntime median {mo:.1f} ms, ratio {ms/mo:.2f}")
PY
rm -f "$out"
