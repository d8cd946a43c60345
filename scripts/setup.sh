#!/usr/bin/env bash
# Installs the Debian packages Tessera needs (only the missing ones), builds
# it, generates a model with random weights and runs the demo on it.
#   scripts/setup.sh              everything
#   scripts/setup.sh --deps-only  just the packages
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git
  libopenblas-dev libxsmm-dev libzmq3-dev cppzmq-dev coinor-libcbc-dev nlohmann-json3-dev libcli11-dev
  libspdlog-dev libtomlplusplus-dev libcpp-httplib-dev libstb-dev libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
  clang libfuzzer-14-dev libutf8proc-dev libpcre2-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "${1:-}" = "--deps-only" ] && exit 0

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

bin=build/bin/tessera
models=build/models
mkdir -p "$models"
[ -f "$models/bert-demo/model.safetensors" ] || $bin gen-model --preset bert-base --layers 4 --out "$models/bert-demo"
[ -f "$models/gpt2-demo/model.safetensors" ] || $bin gen-model --preset gpt2 --layers 4 --out "$models/gpt2-demo"
ids=$(seq -s, 1000 1127)  # 128 tokens
echo
echo "== The planner: this machine's kernels measured, every strategy priced for 2 devices of 1 thread behind emulated 1 Gbit/s links (4-layer bert-base shape, 128 tokens)"
$bin plan --model "$models/bert-demo" --devices 2 --threads-per-device 1 --link 1gbit --seq 128
echo
echo "== Its choice (--strategy auto), run on 2 local devices of 1 thread each and measured"
$bin run --model "$models/bert-demo" --ids "$ids" --strategy auto --devices 2 --threads-per-device 1 --link 1gbit --warmup 1 --reps 3
echo
echo "== One device of 1 thread, for comparison (median of 3 runs)"
$bin bench-local --model "$models/bert-demo" --seq 128 --threads 1 --reps 3
echo
echo "== BERT classification on 2 devices with Voltage (position-wise), text input"
$bin run --model "$models/bert-demo" --text "Tessera splits one transformer across edge devices." \
  --strategy voltage --devices 2 --link 500mbit,1ms
echo
echo "== Per-device figures of a tensor-parallel run (JSON)"
$bin run --model "$models/bert-demo" --text "Tessera splits one transformer across edge devices." \
  --strategy tp --devices 2 --stats
echo
echo "== GPT-2 greedy generation (4-layer gpt2 shape, random weights), ids"
$bin generate --model "$models/gpt2-demo" --ids 464,3290,318 --max-new-tokens 8 --greedy
