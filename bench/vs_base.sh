#!/usr/bin/env bash
# This build against an older one (issue 16: the commit before packed weights),
# alternating the two binaries in every round: single-device latency of
# BERT-base (seq 128), GPT-2 (seq 128) and ViT-base, 1 thread; Voltage on 2
# devices x 1 thread at 1 Gbit/s; Galaxy and TP on 2 devices x 1 thread at
# 1 Gbit/s. Prints each round and the medians.
#   bench/vs_base.sh BASE_BIN [ROUNDS] [MODELS_DIR]
# e.g. git worktree add ../wt-base 69f2a8a && (cd ../wt-base && cmake -S . -B build -G Ninja \
#      -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_TESTS=OFF && cmake --build build -j2 --target tessera)
#      bench/vs_base.sh ../wt-base/build/bin/tessera 5
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1
rounds=${2:-5}
models=${3:-build/models}
new=build/bin/tessera
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
for p in bert-base gpt2 vit-base; do
  [ -f "$models/$p/model.safetensors" ] || $new gen-model --preset "$p" --out "$models/$p" >/dev/null
done
ids=$(seq -s, 1000 1127)
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
local_ms() { $1 bench-local --model "$models/$2" --seq 128 --threads 1 --reps 10 --warmup 2 --json | field "d['median_ms']"; }
dist_ms() {
  $1 run --model "$models/bert-base" --ids "$ids" --strategy "$2" --devices 2 --threads-per-device 1 --link 1gbit \
    --insecure --stats --warmup 3 --reps 10 | field "d['latency_ms']"
}
out=$(mktemp)
for r in $(seq "$rounds"); do
  for which in new base; do
    bin=$new
    [ $which = base ] && bin=$base
    line="$which"
    for m in bert-base gpt2 vit-base; do line+=" $m=$(local_ms "$bin" "$m")"; done
    for s in voltage galaxy tp; do line+=" $s=$(dist_ms "$bin" "$s")"; done
    echo "round $r $line" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import statistics, sys
runs = {"new": {}, "base": {}}
for l in open(sys.argv[1]):
    f = l.split()
    for kv in f[3:]:
        k, v = kv.split("=")
        runs[f[2]].setdefault(k, []).append(float(v))
med = {w: {k: statistics.median(v) for k, v in d.items()} for w, d in runs.items()}
print("\n| measure | base ms | new ms | new / base |\n|---|---|---|---|")
for k in med["new"]:
    print(f"| {k} | {med['base'][k]:.1f} | {med['new'][k]:.1f} | {med['new'][k] / med['base'][k]:.3f} |")
for w in ("base", "new"):
    print(f"{w}: voltage / single BERT = {med[w]['voltage'] / med[w]['bert-base']:.3f}, "
          f"galaxy / tp = {med[w]['galaxy'] / med[w]['tp']:.3f}")
print(f"new voltage / faster single device ({min(med['new']['bert-base'], med['base']['bert-base']):.1f} ms) = "
      f"{med['new']['voltage'] / min(med['new']['bert-base'], med['base']['bert-base']):.3f}")
PY
rm -f "$out"
