#!/usr/bin/env bash
# GPT-2 (124M) decode against its memory floor, one thread, in one run:
# alternately, one thread's streaming-read bandwidth (Google Benchmark
# BM_StreamRead over 512 MiB, >= 4x the last-level cache) and greedy decoding
# of 64 tokens after a 32-token prompt (bench-local --generate: median ms per
# token). Floor = weight bytes read per token / bandwidth.
#   bench/decode_floor.sh [ROUNDS] [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
model=${2:-build/models/gpt2}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
[ -f "$model/model.safetensors" ] || build/bin/tessera gen-model --preset gpt2 --out "$model" >/dev/null
bws=() toks=() bytes=0
for r in $(seq "$rounds"); do
  bw=$(build/bin/tessera_kernel_bench --benchmark_filter='BM_StreamRead/512/1/real_time$' --benchmark_repetitions=3 \
       --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
       python3 -c "import json,sys; d=json.load(sys.stdin); print([b['GB/s'] for b in d['benchmarks'] if b['name'].endswith('_median')][0] / 1e9)")
  js=$(build/bin/tessera bench-local --model "$model" --seq 32 --generate 64 --threads 1 --reps 3 --warmup 1 --json)
  t=$(echo "$js" | python3 -c "import json,sys; print(json.load(sys.stdin)['decode_ms_per_token'])")
  bytes=$(echo "$js" | python3 -c "import json,sys; print(json.load(sys.stdin)['weight_bytes_per_token'])")
  bws+=("$bw") toks+=("$t")
  echo "round $r: stream read $(printf %.2f "$bw") GB/s, decode $(printf %.2f "$t") ms/token"
done
python3 - "${bws[*]}" "${toks[*]}" "$bytes" <<'PY'
import statistics, sys
bw = statistics.median(map(float, sys.argv[1].split()))
t = statistics.median(map(float, sys.argv[2].split()))
b = float(sys.argv[3])
floor = b / (bw * 1e9) * 1e3
print(f"\nweights per token {b / 1e6:.1f} MB, stream read {bw:.2f} GB/s, floor {floor:.2f} ms/token, "
      f"decode {t:.2f} ms/token = {t / floor:.2f}x the floor")
PY
