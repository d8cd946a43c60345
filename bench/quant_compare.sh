#!/usr/bin/env bash
# Quantized weights against llama.cpp (node-llama-cpp 3.21.1's prebuilt CPU build) on the
# same GGUF file, written by `tessera quantize` from a gen-model folder, in one run with
# alternating rounds:
#   - decode: ms per token after a 128-token prompt (32 new tokens, greedy; F32 KV cache and
#     no flash attention on llama.cpp), Tessera and llama.cpp on the GGUF, and Tessera in F32
#     on the folder;
#   - prefill: 128 tokens with every row's logits, Tessera on the GGUF and in F32;
#   - the streaming-read bandwidth of THREADS threads (BM_StreamRead), for the floor:
#     weight bytes read per token / bandwidth.
#   bench/quant_compare.sh [PRESET] [TYPE] [THREADS] [ROUNDS] [WORK]
#     (gpt2, q8_0, 1, 3, /tmp/tessera-quant-compare)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gpt2}
type=${2:-q8_0}
threads=${3:-1}
rounds=${4:-3}
work=${5:-/tmp/tessera-quant-compare}
bin=build/bin/tessera
peer=$(cd ../shared/peers/llamacpp && pwd)
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
mkdir -p "$work"
model="$work/$preset" gguf="$work/$preset-$type.gguf"
[ -f "$model/model.safetensors" ] || "$bin" gen-model --preset "$preset" --out "$model" >/dev/null
[ -f "$gguf" ] || "$bin" quantize --model "$model" --type "$type" --out "$gguf" >/dev/null
bash "$peer/setup.sh" "$work/peer" >/dev/null
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
llama() { node "$work/peer/llama_peer.mjs" bench "$gguf" --threads "$threads" --prompt 128 --kv f32 --fa off "$@"; }
for ((r = 0; r < rounds; r++)); do
  bw=$(build/bin/tessera_kernel_bench --benchmark_filter="BM_StreamRead/512/$threads/real_time\$" --benchmark_repetitions=3 \
       --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
       python3 -c "import json,sys; d=json.load(sys.stdin); print([b['GB/s'] for b in d['benchmarks'] if b['name'].endswith('_median')][0] / 1e9)")
  js=$("$bin" bench-local --model "$gguf" --seq 128 --generate 32 --threads "$threads" --reps 1 --warmup 1 --json)
  td=$(echo "$js" | field decode_ms_per_token) bytes=$(echo "$js" | field weight_bytes_per_token)
  ld=$(llama --mode decode --new 32 --reps 1 --warmup 1 | field decode_ms_per_token)
  fd=$("$bin" bench-local --model "$model" --seq 128 --generate 32 --threads "$threads" --reps 1 --warmup 1 --json | field decode_ms_per_token)
  tp=$("$bin" bench-local --model "$gguf" --seq 128 --threads "$threads" --reps 3 --warmup 1 --json | field median_ms)
  fp=$("$bin" bench-local --model "$model" --seq 128 --threads "$threads" --reps 3 --warmup 1 --json | field median_ms)
  lp=$(llama --mode prefill_all --reps 3 --warmup 1 | field median_ms)
  echo "$bw $bytes $td $ld $fd $tp $fp $lp"
done | python3 -c "
import statistics, sys
rows = [tuple(map(float, l.split())) for l in sys.stdin]
col = lambda i: statistics.median(r[i] for r in rows)
paired = lambda i, j: statistics.median(r[i] / r[j] for r in rows)
bw, b = col(0), col(1)
floor = b / (bw * 1e9) * 1e3
print('$preset $type, $threads thread(s), %d rounds' % len(rows))
print('decode after 128: Tessera %.2f ms/token, llama.cpp %.2f, Tessera F32 %.2f; paired Tessera/llama.cpp %.3f, Tessera/F32 %.3f'
      % (col(2), col(3), col(4), paired(2, 3), paired(2, 4)))
print('floor: %.1f MB of weights per token at %.2f GB/s stream read = %.2f ms/token; Tessera at %.2fx the floor, llama.cpp %.2fx'
      % (b / 1e6, bw, floor, col(2) / floor, col(3) / floor))
print('prefill 128 (every row\'s logits): Tessera %.0f ms, Tessera F32 %.0f ms, llama.cpp %.0f ms; paired Tessera/F32 %.3f, Tessera/llama.cpp %.3f'
      % (col(5), col(6), col(7), paired(5, 6), paired(5, 7)))
"
