#!/usr/bin/env bash
# How long `tessera profile --cluster` takes for four devices: the terminal
# and three worker daemons on 127.0.0.1 (each a real `tessera worker`
# process, insecure: the loopback payload is zeros), for BERT-base, GPT-2 and
# ViT-base, with emulated links. "cold" measures every device's kernels
# (--reprofile); "cached" reads the device profiles back and measures the
# links only. The device count and link are arguments.
#   bench/profile_cluster.sh [LINK] [MODELS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/build/bin/tessera
link=${1:-125mbit,1ms}
models=$(realpath "${2:-build/models}")
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
for m in bert-base gpt2 vit-base; do
  [ -f "$models/$m/model.safetensors" ] || $bin gen-model --preset "$m" --out "$models/$m" >/dev/null
done
work=$(mktemp -d)
export XDG_CACHE_HOME=$work/cache
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
base=$((10000 + RANDOM % 20000))  # below the ephemeral ports (32768 and up)
{
  echo "terminal = \"tcp://127.0.0.1:$base\""
  for i in 1 2 3; do echo "[[worker]]"; echo "endpoint = \"tcp://127.0.0.1:$((base + 10 * i))\""; done
} >"$work/cluster.toml"
for i in 1 2 3; do
  $bin worker --listen "tcp://127.0.0.1:$((base + 10 * i))" --insecure --models "$models" >"$work/w$i.log" 2>&1 &
  pids+=($!)
done
sleep 1
echo "model,mode,seconds,devices"
for m in bert-base gpt2 vit-base; do
  for mode in cold cached; do
    flag=""
    [ $mode = cold ] && flag=--reprofile
    t0=$(date +%s.%N)
    $bin profile --model "$models/$m" --cluster "$work/cluster.toml" --insecure --link "$link" $flag --out "$work/p.json" >/dev/null
    t1=$(date +%s.%N)
    n=$(python3 -c "import json; print(len(json.load(open('$work/p.json'))['devices']))")
    printf '%s,%s,%.2f,%s\n' "$m" "$mode" "$(echo "$t1 - $t0" | bc)" "$n"
  done
done
