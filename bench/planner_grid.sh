#!/usr/bin/env bash
# Issue 12's whole grid for `tessera bench --planner` (docs/planner.md):
# BERT-base, GPT-2 and ViT-base x links of 125/250/500/1000 Mbit/s x speed
# mixes {1,1}, {1,0.5}, {1,0.25} on 2 local devices, and the memory case
# (BERT-base, budgets 1GB/300MB, where an equal split does not fit). Device
# profiles are measured afresh first (a private cache), then every point is
# planned and its feasible rows measured in alternating rounds. Writes
# OUT/<model>.csv and OUT/memory.csv; bench/planner_grid_table.py summarises.
#   bench/planner_grid.sh [OUT_DIR] [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/build/bin/tessera
out=${1:-planner-grid}
models=${2:-build/models}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$out"
out=$(realpath "$out")
export XDG_CACHE_HOME=$out/cache
rm -rf "$XDG_CACHE_HOME"
for m in bert-base gpt2 vit-base; do
  [ -f "$models/$m/model.safetensors" ] || $bin gen-model --preset "$m" --out "$models/$m" >/dev/null
done
for m in bert-base gpt2 vit-base; do
  $bin bench --planner --model "$models/$m" --link 125mbit,250mbit,500mbit,1gbit \
    --device-speeds 1,1 1,0.5 1,0.25 --full-set galaxy,voltage --seq 128 --reps 5 --warmup 1 --out "$out/$m.csv" 2>"$out/$m.log" | tee "$out/$m.summary"
done
$bin bench --planner --model "$models/bert-base" --link 500mbit,1gbit --device-speeds 1,1 \
  --memory-limit 1GB,300MB --full-set galaxy,voltage --seq 128 --reps 5 --warmup 1 --out "$out/memory.csv" 2>"$out/memory.log" | tee "$out/memory.summary"
