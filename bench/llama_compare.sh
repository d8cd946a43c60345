#!/usr/bin/env bash
# Tessera against llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build, F32 GGUF, F32 KV
# cache, flash attention off) on the same random weights, one thread, alternating rounds:
#   - prefill: 128 tokens with logits for every row (Tessera's forward; llama.cpp
#     prefill_all), median ms, and the GFLOP/s of the FLOPs executed (LM head included);
#   - decode: ms per token after a 128-token prompt (32 new tokens, greedy).
# Writes the model (gen-model PRESET) and its GGUF (../shared/peers/llamacpp) once, in WORK.
#   bash bench/llama_compare.sh [BUILD_DIR] [PRESET] [ROUNDS] [WORK]   (llama-3.2-1b, 3, /tmp/tessera-llama-compare)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin/tessera
preset=${2:-llama-3.2-1b}
rounds=${3:-3}
work=${4:-/tmp/tessera-llama-compare}
peer=$(cd ../shared/peers/llamacpp && pwd)
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$work"
model="$work/$preset" gguf="$work/$preset.gguf"
[ -f "$model/model.safetensors" ] || "$bin" gen-model --preset "$preset" --out "$model" >/dev/null
if [ ! -f "$gguf" ]; then
  # The converter takes one eos id; Llama 3.x configs list several. It reads a
  # copy whose config.json keeps the first (the weights are linked, not copied).
  conv="$work/$preset.convert"
  mkdir -p "$conv"
  ln -sf "$model/model.safetensors" "$conv/model.safetensors"
  python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
if isinstance(c.get('eos_token_id'), list): c['eos_token_id'] = c['eos_token_id'][0]
json.dump(c, open(sys.argv[2], 'w'))" "$model/config.json" "$conv/config.json"
  /usr/bin/python3 "$peer/hf_llama_to_gguf.py" "$conv" "$gguf" >/dev/null
fi
bash "$peer/setup.sh" "$work/peer" >/dev/null
llama() { node "$work/peer/llama_peer.mjs" bench "$gguf" --threads 1 --prompt 128 --kv f32 --fa off "$@"; }
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
for ((r = 0; r < rounds; r++)); do
  tp=$("$bin" bench-local --model "$model" --seq 128 --threads 1 --reps 3 --warmup 1 --json | field median_ms)
  lp=$(llama --mode prefill_all --reps 3 --warmup 1 | field median_ms)
  td=$("$bin" bench-local --model "$model" --seq 128 --generate 32 --threads 1 --reps 1 --warmup 1 --json | field decode_ms_per_token)
  ld=$(llama --mode decode --new 32 --reps 1 --warmup 1 | field decode_ms_per_token)
  echo "$tp $lp $td $ld"
done | python3 -c "
import json, statistics, sys
c = json.load(open('$model/config.json'))
F, L, I, V, H = c['hidden_size'], c['num_hidden_layers'], c['intermediate_size'], c['vocab_size'], c['num_attention_heads']
d = c.get('head_dim', F // H); KV = c['num_key_value_heads']; n = 128
# FLOPs executed for the 128-token prefill: the layers' GEMMs, causal attention as run
# (every score row over all keys, then masked), and the LM head over every row.
layer = 2 * n * F * (H * d + 2 * KV * d) + 2 * n * H * d * F + 2 * n * F * 2 * I + 2 * n * I * F + 4 * n * n * H * d
flops = L * layer + 2 * n * F * V
rows = [tuple(map(float, l.split())) for l in sys.stdin]
tp, lp, td, ld = (statistics.median(r[i] for r in rows) for i in range(4))
print('$preset, 1 thread, %d rounds' % len(rows))
print('prefill 128 (logits of every row): Tessera %.0f ms (%.1f GFLOP/s on %.1f GFLOP), llama.cpp F32 %.0f ms; paired Tessera/llama.cpp %.3f'
      % (tp, flops / tp / 1e6, flops / 1e9, lp, statistics.median(r[0] / r[1] for r in rows)))
print('decode after 128: Tessera %.1f ms/token, llama.cpp F32 %.1f ms/token; paired Tessera/llama.cpp %.3f'
      % (td, ld, statistics.median(r[2] / r[3] for r in rows)))
"
